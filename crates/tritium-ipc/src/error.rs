//! The IPC error type.

use std::time::Duration;

/// Everything that can go wrong moving messages and tensors through shared memory.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    /// A system call failed.
    #[error("{0} failed: {1}")]
    Io(String, #[source] std::io::Error),
    /// The peer broke the protocol: a bad descriptor, a malformed message, an unknown segment.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A message does not fit the ring even when it has the whole ring to itself.
    #[error("message of {len} bytes exceeds the ring capacity of {capacity} bytes")]
    TooLarge {
        /// Encoded message length.
        len: usize,
        /// Total payload bytes the ring can hold.
        capacity: usize,
    },
    /// The peer did not make room or send anything in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The peer closed its side of the channel.
    #[error("the peer closed the channel")]
    Closed,
    /// The peer process is gone.
    #[error("the peer process exited")]
    PeerGone,
    /// Shared memory for a tensor could not be allocated.
    #[error("cannot allocate {0} bytes of shared memory: {1}")]
    OutOfMemory(u64, String),
}

impl IpcError {
    pub(crate) fn os(what: &str, e: nix::Error) -> Self {
        IpcError::Io(what.to_string(), std::io::Error::from_raw_os_error(e as i32))
    }
}
