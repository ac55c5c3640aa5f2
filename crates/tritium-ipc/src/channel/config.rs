//! A channel's tunables ([`ChannelConfig`]), the caps on its shared memory ([`ChannelLimits`]),
//! and the fds a new stub inherits ([`PeerFds`]). A leaf: it imports nothing of the other
//! `channel` modules.

use std::os::fd::OwnedFd;
use std::time::Duration;

use crate::ring::{RingGeometry, WaitPolicy};

/// Tunables of a channel.
#[derive(Debug, Clone, Copy)]
pub struct ChannelConfig {
    /// Ring geometry (both rings).
    pub geometry: RingGeometry,
    /// Spin-then-sleep policy for every wait.
    pub wait: WaitPolicy,
    /// Size of each side's default arena segment; larger blocks get a segment of their own.
    pub arena_segment: u64,
    /// How long a send waits for room in a full ring before it fails.
    pub send_timeout: Duration,
    /// What the peer may make this side map, and how much this side's arena may hold.
    pub limits: ChannelLimits,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            geometry: RingGeometry { slot_size: 1024, slot_count: 256 },
            wait: WaitPolicy::default(),
            arena_segment: 256 << 20,
            send_timeout: Duration::from_secs(30),
            limits: ChannelLimits::default(),
        }
    }
}

/// Caps on the shared memory of one channel. The peer's announcements are checked against them
/// before anything is mapped: each peer segment costs an fd and a mapping in this process, so a
/// peer that announces segments without end would otherwise exhaust the fd table (breaking
/// `accept` for every client) or the address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLimits {
    /// Most segments the peer may have mapped here at once.
    pub max_peer_segments: usize,
    /// Largest single segment the peer may announce, in bytes.
    pub max_peer_segment_bytes: u64,
    /// Most bytes of peer segments mapped here at once (address space; pages cost memory only
    /// once the peer touches them).
    pub max_peer_mapped_bytes: u64,
    /// Most bytes of segments this side's own arena may hold at once.
    pub max_own_bytes: u64,
}

impl Default for ChannelLimits {
    fn default() -> Self {
        Self {
            max_peer_segments: 256,
            max_peer_segment_bytes: 32 << 30,
            max_peer_mapped_bytes: 64 << 30,
            max_own_bytes: 64 << 30,
        }
    }
}

/// The stub's ends of a new channel, to be inherited by the stub process.
#[derive(Debug)]
pub struct PeerFds {
    /// The control segment's memfd.
    pub control: OwnedFd,
    /// The stub's end of the fd socket.
    pub socket: OwnedFd,
}
