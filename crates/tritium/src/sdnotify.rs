//! systemd's service notification protocol (`sd_notify`), without libsystemd: each message is one
//! datagram of `KEY=VALUE` lines sent to the unix socket named by `$NOTIFY_SOCKET` (a path, or an
//! abstract name written with a leading `@`).
//!
//! `tritium serve` sends `READY=1` once every model of the startup load has been attempted and
//! the frontends listen, `STATUS=...` lines as it goes, `RELOADING=1` while a SIGHUP re-scan
//! runs, `STOPPING=1` when it shuts down, and, when systemd set `$WATCHDOG_USEC` (for this
//! process: `$WATCHDOG_PID`, if set, must be ours), `WATCHDOG=1` every half of that interval from a
//! task on the tokio runtime, so a runtime that stops making progress stops the pings and
//! systemd restarts the service. Without `$NOTIFY_SOCKET` nothing is sent. A failed send is
//! logged once and never stops the server.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, warn};

/// Where notifications go; cheap to share.
#[derive(Debug)]
pub(crate) struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
    failed: AtomicBool,
}

impl Notifier {
    /// The notifier for `$NOTIFY_SOCKET`, or None when systemd did not ask for notifications
    /// (or the variable names no usable socket, which is logged).
    pub(crate) fn from_env() -> Option<Arc<Self>> {
        let path = std::env::var_os("NOTIFY_SOCKET")?;
        match Self::new(&path.to_string_lossy()) {
            Ok(n) => Some(Arc::new(n)),
            Err(e) => {
                warn!("NOTIFY_SOCKET={path:?} cannot be used ({e}); systemd is not notified");
                None
            }
        }
    }

    fn new(path: &str) -> std::io::Result<Self> {
        let addr = if let Some(name) = path.strip_prefix('@') {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        } else if path.starts_with('/') {
            SocketAddr::from_pathname(path)?
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "neither an absolute path nor an abstract name",
            ));
        };
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        Ok(Self { socket, addr, failed: AtomicBool::new(false) })
    }

    /// Sends one message (`READY=1\nSTATUS=...`); never blocks.
    pub(crate) fn notify(&self, message: &str) {
        match self.socket.send_to_addr(message.as_bytes(), &self.addr) {
            Ok(_) => debug!(message, "sd_notify"),
            Err(e) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    warn!("sd_notify to NOTIFY_SOCKET failed ({e}); later failures are not logged");
                }
            }
        }
    }

    /// `STATUS=<text>` (one line: newlines become spaces).
    pub(crate) fn status(&self, text: &str) {
        self.notify(&format!("STATUS={}", text.replace('\n', " ")));
    }
}

/// Half of `$WATCHDOG_USEC` when systemd's watchdog is on for this process (`$WATCHDOG_PID`
/// unset or ours), as sd_watchdog_enabled says to ping.
pub(crate) fn watchdog_interval() -> Option<Duration> {
    interval_of(
        std::env::var("WATCHDOG_USEC").ok().as_deref(),
        std::env::var("WATCHDOG_PID").ok().as_deref(),
        std::process::id(),
    )
}

fn interval_of(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok() != Some(me) {
            return None;
        }
    }
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Pings systemd's watchdog every `every` from a task of the current tokio runtime.
pub(crate) fn spawn_watchdog(notifier: Arc<Notifier>, every: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            notifier.notify("WATCHDOG=1");
        }
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_interval_is_half_the_usec_for_this_pid_only() {
        assert_eq!(interval_of(Some("2000000"), None, 7), Some(Duration::from_secs(1)));
        assert_eq!(interval_of(Some("2000000"), Some("7"), 7), Some(Duration::from_secs(1)));
        assert_eq!(interval_of(Some("2000000"), Some("8"), 7), None);
        assert_eq!(interval_of(Some("0"), None, 7), None);
        assert_eq!(interval_of(Some("x"), None, 7), None);
        assert_eq!(interval_of(None, None, 7), None);
    }

    #[test]
    fn messages_arrive_as_datagrams_on_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("tritium-sdnotify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let receiver = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.to_str().unwrap()).unwrap();
        n.notify("READY=1");
        n.status("two\nlines");
        let mut buf = [0u8; 256];
        let len = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1");
        let len = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STATUS=two lines");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("tritium-sdnotify-test-{}", std::process::id());
        let receiver = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        Notifier::new(&format!("@{name}")).unwrap().notify("WATCHDOG=1");
        let len = receiver.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
        assert!(Notifier::new("relative").is_err());
    }
}
