//! What the benchmarks read about a running server: the CPU time of its processes (from /proc)
//! and how many requests a model has served (from its statistics over HTTP).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::servers::tail;

/// /proc counts CPU time in USER_HZ ticks, 100 per second on Linux.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU time of a server's process and of all its descendants (its stubs), in clock ticks.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct TreeCpu {
    /// The server process itself (all its threads, live and exited).
    pub server: u64,
    /// Every process below it.
    pub stubs: u64,
    /// Minor page faults of the server process, and of every process below it.
    pub server_faults: u64,
    pub stub_faults: u64,
}

impl TreeCpu {
    /// Reads the tree of `pid` now.
    pub(crate) fn of(pid: u32) -> Self {
        let server = own_ticks(pid);
        let server_faults = minor_faults(pid);
        let (mut stubs, mut stub_faults) = (0, 0);
        let mut stack = children(pid);
        while let Some(p) = stack.pop() {
            stubs += own_ticks(p);
            stub_faults += minor_faults(p);
            stack.extend(children(p));
        }
        Self { server, stubs, server_faults, stub_faults }
    }

    /// Minor page faults per request of each part between `self` (earlier) and `later`; NaN
    /// when no request was served.
    pub(crate) fn faults_per_request(&self, later: &Self, requests: u64) -> (f64, f64) {
        let per = |a: u64, b: u64| if requests == 0 { f64::NAN } else { b.saturating_sub(a) as f64 / requests as f64 };
        (per(self.server_faults, later.server_faults), per(self.stub_faults, later.stub_faults))
    }

    /// CPU microseconds per request of each part between `self` (earlier) and `later`, for
    /// `requests` served in between; NaN when none were.
    pub(crate) fn per_request_us(&self, later: &Self, requests: u64) -> (f64, f64) {
        let us = |a: u64, b: u64| ticks_per_request_us(b.saturating_sub(a), requests);
        (us(self.server, later.server), us(self.stubs, later.stubs))
    }
}

/// CPU time, in clock ticks, of this process's children that have exited and been waited for
/// (`cutime` + `cstime`): read before and after running a client to completion, the difference is
/// what that client spent (the servers, also children, are only reaped at the end).
pub(crate) fn reaped_children_ticks() -> u64 {
    // cutime and cstime are fields 16 and 17 of the line: the 14th and 15th after the command.
    stat_ticks("/proc/self/stat", 13)
}

/// CPU microseconds per request of `ticks` clock ticks spent on `requests`; NaN when none were.
pub(crate) fn ticks_per_request_us(ticks: u64, requests: u64) -> f64 {
    if requests == 0 {
        return f64::NAN;
    }
    ticks as f64 * 1e6 / TICKS_PER_SECOND / requests as f64
}

/// utime + stime of process `pid` (every thread it has had), 0 if it is gone.
fn own_ticks(pid: u32) -> u64 {
    // utime and stime are fields 14 and 15 of the line: the 12th and 13th after the command.
    stat_ticks(&format!("/proc/{pid}/stat"), 11)
}

/// Minor page faults of process `pid` (`minflt`, every thread), 0 if it is gone.
fn minor_faults(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0 };
    // minflt is field 10 of the line: the 8th after the command.
    stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(7)?.parse().ok()).unwrap_or(0)
}

/// The sum of the two tick counts at `first` and `first + 1` (counted from 0 after the command)
/// of the /proc stat file at `path`; 0 if it cannot be read.
fn stat_ticks(path: &str, first: usize) -> u64 {
    let Ok(stat) = std::fs::read_to_string(path) else { return 0 };
    // Fields after the command (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    ticks(first) + ticks(first + 1)
}

/// The children of every thread of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return out };
    for task in tasks.flatten() {
        if let Ok(children) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(children.split_whitespace().filter_map(|c| c.parse::<u32>().ok()));
        }
    }
    out
}

/// `model`'s `inference_count` from the server's statistics (HTTP), retried a few times (a busy
/// server may drop the connection); `None` if it cannot be read.
pub(crate) fn inference_count(port: u16, model: &str) -> Option<u64> {
    for _ in 0..5 {
        match inference_count_once(port, model) {
            Ok(n) => return Some(n),
            Err(e) => eprintln!("xtask: reading statistics on port {port}: {e:#}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

fn inference_count_once(port: u16, model: &str) -> Result<u64> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    // One write: `write!` on the stream sends each formatted piece as its own segment, and
    // Triton's HTTP server, given the request line in pieces, read the model name with the
    // byte after it (`add_sub"`, `batched_scalee`) and answered 400.
    let request = format!("GET /v2/models/{model}/stats HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(request.as_bytes())?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    let key = "\"inference_count\":";
    let at = body.find(key).with_context(|| format!("no inference_count in {}", tail(&body, 5)))?;
    let digits: String = body[at + key.len()..].trim_start().chars().take_while(char::is_ascii_digit).collect();
    digits.parse().with_context(|| format!("bad inference_count in {}", tail(&body, 5)))
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn counts_this_process_and_its_children() {
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(50) {
            std::hint::black_box(0u64);
        }
        let mut child = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 5"])
            .spawn()
            .expect("sh");
        std::thread::sleep(Duration::from_millis(800));
        let cpu = TreeCpu::of(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(cpu.server > 0, "{cpu:?}");
        assert!(cpu.stubs > 0, "{cpu:?}");
        // Every process faults pages in to start.
        assert!(cpu.server_faults > 0 && cpu.stub_faults > 0, "{cpu:?}");
        let later = TreeCpu {
            server: cpu.server + 100,
            stubs: cpu.stubs + 50,
            server_faults: cpu.server_faults + 30,
            stub_faults: cpu.stub_faults + 10,
        };
        assert_eq!(cpu.per_request_us(&later, 1000), (1000.0, 500.0));
        assert!(cpu.per_request_us(&later, 0).0.is_nan());
        assert_eq!(cpu.faults_per_request(&later, 10), (3.0, 1.0));
    }

    #[test]
    fn a_waited_for_child_is_counted_once_it_has_exited() {
        let before = reaped_children_ticks();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh");
        assert!(status.success());
        assert!(reaped_children_ticks() > before);
    }
}
