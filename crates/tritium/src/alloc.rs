//! The server's allocator settings, made before anything else allocates much.
//!
//! mimalloc hands freed memory back to the kernel ("purges" it) once it has stayed free for
//! `purge_delay` milliseconds, 1,000 by default. The frontends' request and response buffers for
//! large tensors (a 4 MiB output copied out of a stub's arena, a gRPC message being decoded or
//! encoded) are freed at the end of each request, and a purge that lands between two requests
//! returns them, so the next request faults every page back in: `cargo xtask bench shm` with the
//! tensors in the bodies measured 8-17 minor faults per request in the server with mimalloc's
//! default, 1-2 with a 10 s delay and none with purging off, at the same throughput. 10 s keeps
//! a steady stream of large requests on memory it already has and still returns what a burst
//! left behind within seconds.
//!
//! `MIMALLOC_PURGE_DELAY` in the server's environment wins over this default (mimalloc reads
//! its own variables), and so does every other `MIMALLOC_*` option.

use std::ffi::OsStr;

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_e`, the same in mimalloc 2
/// and 3); `libmimalloc-sys` names no constant for it.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// The purge delay tritium sets unless the environment sets one.
pub(crate) const PURGE_DELAY_MS: i64 = 10_000;

/// What [`tune`] did, for the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tuning {
    /// tritium's default delay was set.
    Default(i64),
    /// `MIMALLOC_PURGE_DELAY` was set; mimalloc uses it.
    FromEnvironment(String),
}

impl std::fmt::Display for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default(ms) => {
                write!(
                    f,
                    "allocator: freed memory goes back to the kernel after {ms} ms (MIMALLOC_PURGE_DELAY overrides)"
                )
            }
            Self::FromEnvironment(v) => write!(f, "allocator: MIMALLOC_PURGE_DELAY={v} from the environment"),
        }
    }
}

/// The setting for a given `MIMALLOC_PURGE_DELAY` value (absent: tritium's default).
fn choose(env: Option<&OsStr>) -> Tuning {
    match env {
        Some(v) => Tuning::FromEnvironment(v.to_string_lossy().into_owned()),
        None => Tuning::Default(PURGE_DELAY_MS),
    }
}

/// Applies the allocator settings; call it first thing in `tritium serve`.
pub(crate) fn tune() -> Tuning {
    let tuning = choose(std::env::var_os("MIMALLOC_PURGE_DELAY").as_deref());
    if let Tuning::Default(ms) = tuning {
        // SAFETY: mi_option_set takes an option index and a value; 15 is a valid index
        // (see MI_OPTION_PURGE_DELAY) and mimalloc reads options with relaxed atomics.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ms as _) };
    }
    tuning
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_wins_over_the_default() {
        assert_eq!(choose(None), Tuning::Default(PURGE_DELAY_MS));
        assert_eq!(choose(Some(OsStr::new("-1"))), Tuning::FromEnvironment("-1".into()));
        assert!(Tuning::Default(10_000).to_string().contains("10000 ms"));
    }

    #[test]
    fn the_delay_lands_in_mimallocs_purge_delay_option() {
        if std::env::vars_os().any(|(k, _)| k.to_string_lossy().starts_with("MIMALLOC_")) {
            return;
        }
        // SAFETY: reads an option by a valid index.
        let before = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        // mimalloc 3's default purge delay (mimalloc 2's is 10): the index is the purge delay's.
        assert!(before == 1000 || before == 10, "option {MI_OPTION_PURGE_DELAY} was {before}");
        tune();
        // SAFETY: as above.
        let after = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(after as i64, PURGE_DELAY_MS);
    }
}
