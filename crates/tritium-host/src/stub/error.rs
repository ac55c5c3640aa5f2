//! What can go wrong with a stub ([`HostError`]), and the server flag named in a shared-memory
//! limit's error. A leaf: it imports nothing of the other `stub` modules.

use std::time::Duration;

use tritium_ipc::{IpcError, StubError};

use crate::process::StubExit;

/// Everything that can go wrong with a stub.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The interpreter could not be started.
    #[error("cannot start the Python stub with {python:?}: {source}")]
    Spawn {
        /// The interpreter path.
        python: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The stub process ended.
    #[error(
        "stub {instance} (pid {pid}) exited unexpectedly ({status}{}){}",
        killed_suffix(.killed),
        stderr_suffix(.stderr)
    )]
    Exited {
        /// Instance name.
        instance: String,
        /// Process id.
        pid: u32,
        /// How it ended.
        status: StubExit,
        /// Why the server killed it, when it did (a lost heartbeat).
        killed: Option<String>,
        /// Its last lines of stderr.
        stderr: String,
    },
    /// The stub's channel closed or its process ended, seen by a call that never waits
    /// ([`Stub::try_send`](super::Stub::try_send), [`Stub::try_message`](super::Stub::try_message),
    /// [`Stub::check_alive`](super::Stub::check_alive)): how the process ended and its last
    /// stderr lines take waiting for, which [`Stub::settle`](super::Stub::settle) does (off an
    /// event loop).
    #[error("stub {instance} is exiting (its channel closed)")]
    Exiting {
        /// Instance name.
        instance: String,
    },
    /// The stub did not answer in time.
    #[error("stub {instance} did not {what} within {after:?}")]
    Timeout {
        /// Instance name.
        instance: String,
        /// What it was asked to do.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The shared-memory channel failed.
    #[error("stub {instance}: {source}")]
    Ipc {
        /// Instance name.
        instance: String,
        /// Why.
        #[source]
        source: IpcError,
    },
    /// The stub sent something the protocol does not allow here.
    #[error("stub {instance} broke the protocol: {message}")]
    Protocol {
        /// Instance name.
        instance: String,
        /// What it did.
        message: String,
    },
    /// Model code raised an error (in `auto_complete_config`, `initialize`, `execute` or `finalize`).
    #[error("{0}")]
    Model(StubError),
}

fn killed_suffix(killed: &Option<String>) -> String {
    killed.as_ref().map_or_else(String::new, |why| format!(", {why}"))
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; last stderr lines:\n{stderr}")
    }
}

/// Names the server flag behind a shared-memory limit the channel enforced.
pub(super) fn with_flag_hint(e: IpcError) -> IpcError {
    match e {
        IpcError::Protocol(m) if m.contains("the limit is") => {
            IpcError::Protocol(format!("{m} (server flags --max-stub-segments and --max-stub-shm-bytes)"))
        }
        IpcError::OutOfMemory(len, m) if m.contains("limit") => {
            IpcError::OutOfMemory(len, format!("{m} (server flag --max-server-shm-bytes-per-stub)"))
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_errors_name_their_flags() {
        let e = with_flag_hint(IpcError::Protocol("peer has 2 segments; the limit is 2".into()));
        assert!(e.to_string().contains("--max-stub-segments"), "{e}");
        let e = with_flag_hint(IpcError::OutOfMemory(5, "its limit is 4 bytes".into()));
        assert!(e.to_string().contains("--max-server-shm-bytes-per-stub"), "{e}");
        let e = with_flag_hint(IpcError::Protocol("bad descriptor".into()));
        assert_eq!(e.to_string(), "protocol violation: bad descriptor");
    }
}
