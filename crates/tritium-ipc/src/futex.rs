//! Shared (inter-process) futex wait and wake on a 32-bit word in shared memory.

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Outcome of a futex wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Woken, or the word no longer held the expected value, or a signal interrupted the wait.
    Woken,
    /// The timeout elapsed.
    TimedOut,
}

/// Sleeps while `*word == expected`, for at most `timeout`.
///
/// The futex is a shared one (no `FUTEX_PRIVATE_FLAG`): the word lives in a memfd mapped by two
/// processes at different addresses, and the kernel keys it by the backing page.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wait {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `word` is a valid, aligned 32-bit word for the duration of the call; FUTEX_WAIT only
    // reads it, and `ts` outlives the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        )
    };
    if rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ETIMEDOUT) {
        Wait::TimedOut
    } else {
        Wait::Woken
    }
}

/// Wakes up to `count` waiters sleeping on `word`.
pub(crate) fn wake(word: &AtomicU32, count: i32) {
    // SAFETY: `word` is a valid, aligned 32-bit word; FUTEX_WAKE does not access memory through it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            count,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn wait_times_out_when_nobody_wakes() {
        let w = AtomicU32::new(7);
        assert_eq!(wait(&w, 7, Duration::from_millis(5)), Wait::TimedOut);
    }

    #[test]
    fn wait_returns_at_once_on_changed_value() {
        let w = AtomicU32::new(7);
        assert_eq!(wait(&w, 8, Duration::from_secs(5)), Wait::Woken);
    }

    #[test]
    fn wake_ends_a_wait() {
        let w = Arc::new(AtomicU32::new(0));
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            while w2.load(Ordering::SeqCst) == 0 {
                if wait(&w2, 0, Duration::from_secs(10)) == Wait::TimedOut {
                    return false;
                }
            }
            true
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(1, Ordering::SeqCst);
        wake(&w, 1);
        assert!(t.join().expect("waiter thread"));
    }
}
