//! Which local process is at the other end of a TCP connection, from `/proc`: the server asks
//! when a caller on loopback wants something that interrupts service, because a model's stub (or
//! a process a model started) is on loopback too and must not count as the operator.
//!
//! The caller's socket is found by its address in `/proc/net/tcp` and `/proc/net/tcp6` (its
//! inode), its process by that inode among the `socket:[inode]` links of `/proc/<pid>/fd`, and
//! its ancestry by the parent pids in `/proc/<pid>/stat`. Processes of other users cannot be
//! read, so they are never found; the server's stubs run as its own user.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The pid of the local process holding the TCP socket whose own address is `peer` (the
/// caller's side of a connection to this server), if it can be found.
pub fn socket_owner(peer: SocketAddr) -> Option<u32> {
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|table| std::fs::read_to_string(table).ok())
        .find_map(|text| inode_of(&text, peer))?;
    let link = format!("socket:[{inode}]");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t.as_os_str() == link.as_str())) {
            return Some(pid);
        }
    }
    None
}

/// Whether `pid` is one of `roots` or a descendant of one (following parent pids up to init).
pub fn descends_from(pid: u32, roots: &HashSet<u32>) -> bool {
    let mut current = pid;
    // A parent chain is short; the bound only guards against a malformed /proc.
    for _ in 0..4096 {
        if roots.contains(&current) {
            return true;
        }
        match parent_of(current) {
            Some(parent) if parent != 0 && parent != current => current = parent,
            _ => return false,
        }
    }
    false
}

/// The parent pid of `pid` (the field after the command name in `/proc/<pid>/stat`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The inode of the socket whose local address is `peer` in a `/proc/net/tcp{,6}` table.
fn inode_of(table: &str, peer: SocketAddr) -> Option<u64> {
    let want = (peer.ip().to_canonical(), peer.port());
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local = parse_address(fields.get(1)?)?;
        let inode = fields.get(9)?.parse::<u64>().ok()?;
        (inode != 0 && (local.ip().to_canonical(), local.port()) == want).then_some(inode)
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit word as the kernel
/// prints it, in the machine's byte order.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |hex: &str| u32::from_str_radix(hex, 16).ok().map(u32::to_ne_bytes);
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(ip)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, chunk) in bytes.chunks_mut(4).enumerate() {
                chunk.copy_from_slice(&word(ip.get(i * 8..i * 8 + 8)?)?);
            }
            IpAddr::V6(Ipv6Addr::from(bytes))
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_read_as_the_kernel_prints_them() {
        if cfg!(target_endian = "little") {
            assert_eq!(parse_address("0100007F:1F90"), Some("127.0.0.1:8080".parse().expect("addr")));
            assert_eq!(
                parse_address("0000000000000000FFFF00000100007F:AECC").map(|a| a.ip().to_canonical()),
                Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
            );
            assert_eq!(parse_address("00000000000000000000000001000000:0050"), Some("[::1]:80".parse().expect("addr")));
        }
        assert_eq!(parse_address("zz:1"), None);
        assert_eq!(parse_address("0100007F"), None);
    }

    #[test]
    fn a_connection_is_traced_to_its_process_and_its_ancestors() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (_server_side, peer) = listener.accept().expect("accept");
        assert_eq!(peer, client.local_addr().expect("addr"));
        let me = std::process::id();
        assert_eq!(socket_owner(peer), Some(me));
        let parent = parent_of(me).expect("parent");
        assert!(descends_from(me, &HashSet::from([parent])));
        assert!(descends_from(me, &HashSet::from([me])));
        assert!(!descends_from(parent, &HashSet::from([me])));
        assert_eq!(socket_owner("127.0.0.1:1".parse().expect("addr")), None);
    }
}
