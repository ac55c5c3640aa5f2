//! Asking a stub for the Python stacks of its threads ([`StackProbe`]), over a socketpair of its
//! own (`--stacks-fd`), answered by a native thread in the stub that needs no GIL
//! (`stub/src/stacks.rs`).
//!
//! Each request is a sequence number; the answer is one `SOCK_SEQPACKET` message that starts
//! with it, so an answer that comes after its asker gave up is recognized and dropped by the
//! next one.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest answer read: the stub cuts its answers shorter.
const MAX_ANSWER: usize = 192 << 10;

/// Why a stub's stacks could not be had.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// The stub did not answer in time (frozen, or its stacks thread is stuck).
    #[error("the stub did not answer within {0:?}")]
    Timeout(Duration),
    /// The socket failed: the stub has exited, most likely.
    #[error("cannot reach the stub's stacks thread: {0}")]
    Io(#[from] std::io::Error),
    /// Another caller is asking this stub now and did not finish in time.
    #[error("another request for this stub's stacks is in progress")]
    Busy,
}

/// Asks one stub for its threads' stacks; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct StackProbe(Arc<Inner>);

struct Inner {
    socket: Mutex<UnixDatagram>,
    next: AtomicU64,
}

/// The two ends of a new stack channel: the server's probe and the stub's end, which it
/// inherits.
pub(crate) fn pair() -> std::io::Result<(StackProbe, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds socketpair writes.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0, fds.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    let (ours, theirs) = unsafe {
        (
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]),
            <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]),
        )
    };
    let size: libc::c_int = 256 << 10;
    // SAFETY: a valid int option value on the stub's end; a refusal leaves the default size,
    // which only shortens the answers the stub can send.
    unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&theirs),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
    let probe = StackProbe(Arc::new(Inner { socket: Mutex::new(UnixDatagram::from(ours)), next: AtomicU64::new(1) }));
    Ok((probe, theirs))
}

impl StackProbe {
    /// The stacks of every Python thread of the stub (and its asyncio tasks, when its GIL could
    /// be had), waiting at most `timeout` in all.
    pub fn stacks(&self, timeout: Duration) -> Result<String, StackError> {
        let deadline = Instant::now() + timeout;
        let socket = loop {
            match self.0.socket.try_lock() {
                Ok(s) => break s,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(std::sync::TryLockError::WouldBlock) => return Err(StackError::Busy),
            }
        };
        let seq = self.0.next.fetch_add(1, Ordering::Relaxed);
        socket.set_write_timeout(Some(timeout.max(Duration::from_millis(1))))?;
        socket.send(&seq.to_le_bytes())?;
        let mut buf = vec![0u8; MAX_ANSWER];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(StackError::Timeout(timeout));
            }
            socket.set_read_timeout(Some(left))?;
            let n = match socket.recv(&mut buf) {
                Ok(0) => return Err(StackError::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => n,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Err(StackError::Timeout(timeout));
                }
                Err(e) => return Err(e.into()),
            };
            let Some((head, text)) = buf[..n].split_first_chunk::<8>() else { continue };
            // An answer to an earlier request whose asker gave up: skip it.
            if u64::from_le_bytes(*head) == seq {
                return Ok(String::from_utf8_lossy(text).into_owned());
            }
        }
    }

    /// [`StackProbe::stacks`] as one text for the log: the stacks, or why there are none.
    pub fn for_log(&self, timeout: Duration) -> String {
        match self.stacks(timeout) {
            Ok(text) => text,
            Err(e) => format!("(no stacks: {e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_to_given_up_requests_are_skipped_and_silence_times_out() {
        let (probe, theirs) = pair().expect("socketpair");
        let stub = UnixDatagram::from(theirs);
        // Nobody answers: a timeout, not a hang.
        let e = probe.stacks(Duration::from_millis(20)).expect_err("no answer");
        assert!(matches!(e, StackError::Timeout(_)), "{e}");
        let mut req = [0u8; 8];
        assert_eq!(stub.recv(&mut req).expect("request 1"), 8);
        let answerer = std::thread::spawn(move || {
            // The late answer to request 1 comes first, then the answer to request 2.
            let mut late = req.to_vec();
            late.extend_from_slice(b"stale");
            stub.send(&late).expect("late answer");
            let mut req = [0u8; 8];
            stub.recv(&mut req).expect("request 2");
            let mut answer = req.to_vec();
            answer.extend_from_slice(b"Thread 0x1 (most recent call first):\n");
            stub.send(&answer).expect("answer");
            stub
        });
        let text = probe.stacks(Duration::from_secs(10)).expect("stacks");
        assert_eq!(text, "Thread 0x1 (most recent call first):\n");
        drop(answerer.join().expect("answerer"));
        // The stub is gone: an error at once.
        assert!(probe.for_log(Duration::from_secs(10)).starts_with("(no stacks: "));
    }
}
