//! A channel: one stub's control segment (header and two rings), its fd socket, the segments both
//! sides have announced, and this side's arena. The same type serves the server
//! (`Channel<ToStub, ToServer>`) and the stub (`Channel<ToServer, ToStub>`).
//!
//! Control segment layout (offsets in bytes):
//!
//! ```text
//! 0      ControlHeader   magic, version, ring geometry, pids, heartbeat
//! 4096   RingHeader      server -> stub
//! 4224   RingHeader      stub -> server
//! 8192   slots           server -> stub   (slot_count * slot_size)
//! ...    slots           stub -> server   (slot_count * slot_size)
//! ```
//!
//! - [`config`]: [`ChannelConfig`], [`ChannelLimits`], [`PeerFds`].
//! - [`view`]: [`View`], bytes in a shared segment.
//! - [`rings`]: sending and receiving messages, control frames, releases, the doorbell.
//! - [`segments`]: the segment table, client regions, this side's arena.

use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tritium_sync::Locked;

use crate::arena::{Arena, Descriptor, Side};
use crate::error::IpcError;
use crate::protocol::{ToServer, ToStub};
use crate::ring::{self, Consumer, Doorbell, Producer, RingGeometry, RingHeader, WaitPolicy};
use crate::segment::Segment;

mod config;
mod rings;
mod segments;
mod view;

pub use config::{ChannelConfig, ChannelLimits, PeerFds};
use segments::send_fd;
pub use view::View;

/// Magic number at the start of every control segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TRITIUM1");
/// Layout version of the control segment.
pub const LAYOUT_VERSION: u32 = 1;
const RING_A: usize = 4096;
const RING_B: usize = RING_A + ring::RING_HEADER_SIZE;
const SLOTS: usize = 8192;
/// The tag the server's doorbell eventfd travels with over the fd socket, ahead of any segment
/// (segment ids never reach it: the top bit marks the stub's, and region ids stay below).
const DOORBELL_TAG: u32 = u32::MAX;

/// The fixed header at the start of the control segment.
#[repr(C)]
struct ControlHeader {
    magic: u64,
    version: u32,
    slot_size: u32,
    slot_count: u32,
    server_pid: u32,
    stub_pid: AtomicU32,
    _reserved: u32,
    /// Incremented by the stub's native heartbeat thread; it never needs the GIL.
    heartbeat: AtomicU64,
}

struct Rx {
    consumer: Consumer,
    buf: Vec<u8>,
}

/// A handle that can interrupt a channel's receiver from another thread, without taking the
/// receiver's lock (which a waiting `recv` holds).
#[derive(Clone)]
pub struct Interrupter {
    control: Arc<Segment>,
    doorbell: Option<Doorbell>,
}

impl Interrupter {
    /// Closes both rings: a waiting (and every later) `recv` on the channel fails with
    /// `IpcError::Closed` once what was already sent is consumed, and a `send` waiting for room
    /// in a full ring fails with `IpcError::Closed` at once instead of waiting out its timeout.
    /// Use it when the peer process is known to be dead.
    pub fn interrupt(&self) {
        for ring in [RING_A, RING_B] {
            // SAFETY: both ring headers lie at fixed offsets of the control segment, initialised
            // at creation and kept mapped by the Arc.
            unsafe { ring::interrupt(self.control.as_ptr().add(ring) as *const RingHeader, self.doorbell.as_ref()) };
        }
    }
}

struct Tx {
    producer: Producer,
    buf: Vec<u8>,
}

/// One end of a server-stub channel. `S` is what this end sends, `R` what it receives.
pub struct Channel<S, R> {
    side: Side,
    config: ChannelConfig,
    control: Arc<Segment>,
    tx: Mutex<Tx>,
    rx: Mutex<Rx>,
    socket: OwnedFd,
    segments: RwLock<HashMap<u32, Arc<Segment>>>,
    arena: Mutex<Arena>,
    pending_release: Mutex<Vec<Descriptor>>,
    /// Client regions announced to the peer (server side; see [`Channel::add_region`]).
    regions: Mutex<HashSet<u32>>,
    /// The server's doorbell, rung by the stub for a consumer waiting with
    /// [`Channel::arm_doorbell`] (server side only).
    doorbell: Option<Doorbell>,
    _types: PhantomData<fn(S) -> R>,
}

/// The server's end.
pub type ServerChannel = Channel<ToStub, ToServer>;
/// The stub's end.
pub type StubChannel = Channel<ToServer, ToStub>;

impl ServerChannel {
    /// Creates a channel for a new stub: the control segment, the fd socket and the server's first
    /// arena segment. The returned fds are for the stub process to inherit.
    pub fn create(name: &str, config: ChannelConfig) -> Result<(Self, PeerFds), IpcError> {
        let geo = config.geometry;
        geo.validate()?;
        let len = (SLOTS + 2 * geo.slots_bytes()) as u64;
        let control = Arc::new(Segment::create(&format!("{name}-control"), len)?);
        let base = control.as_ptr();
        // SAFETY: the fresh mapping is zeroed, page-aligned and at least SLOTS bytes long, so the
        // header and both ring headers fit at their offsets.
        unsafe {
            std::ptr::write(
                base as *mut ControlHeader,
                ControlHeader {
                    magic: MAGIC,
                    version: LAYOUT_VERSION,
                    slot_size: geo.slot_size,
                    slot_count: geo.slot_count,
                    server_pid: std::process::id(),
                    stub_pid: AtomicU32::new(0),
                    _reserved: 0,
                    heartbeat: AtomicU64::new(0),
                },
            );
            ring::init_header(base.add(RING_A) as *mut RingHeader);
            ring::init_header(base.add(RING_B) as *mut RingHeader);
        }
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| IpcError::os("socketpair", e))?;
        let peer_control = control.fd().try_clone_to_owned().map_err(|e| IpcError::Io("dup".into(), e))?;
        // The doorbell goes first on the socket: the stub takes it while it attaches.
        let doorbell = Doorbell::new()?;
        send_fd(ours.as_raw_fd(), DOORBELL_TAG, doorbell.fd().as_raw_fd(), "sendmsg of the doorbell")?;
        let mut chan = Self::assemble(Side::Server, name, config, control, ours, RING_A, RING_B)?;
        chan.doorbell = Some(doorbell);
        Ok((chan, PeerFds { control: peer_control, socket: theirs }))
    }

    /// A handle that interrupts this channel's `recv` from another thread.
    pub fn interrupter(&self) -> Interrupter {
        Interrupter { control: self.control.clone(), doorbell: self.doorbell.clone() }
    }

    /// The eventfd the stub rings while this side waits with [`Channel::arm_doorbell`] (and
    /// that [`Interrupter::interrupt`] rings), for an event loop to poll.
    pub fn doorbell(&self) -> Option<&Doorbell> {
        self.doorbell.as_ref()
    }

    /// The stub's heartbeat counter (advanced by a native thread in the stub).
    pub fn heartbeat(&self) -> u64 {
        self.header().heartbeat.load(Ordering::Acquire)
    }
}

impl StubChannel {
    /// Attaches to a control segment and fd socket inherited from the server, checking the header.
    pub fn connect(
        control_fd: OwnedFd,
        socket: OwnedFd,
        wait: WaitPolicy,
        arena_segment: u64,
    ) -> Result<Self, IpcError> {
        let stat = nix::sys::stat::fstat(control_fd.as_raw_fd()).map_err(|e| IpcError::os("fstat", e))?;
        let len = stat.st_size as u64;
        if len < SLOTS as u64 {
            return Err(IpcError::Protocol(format!("control segment of {len} bytes is too small")));
        }
        let control = Arc::new(Segment::open(control_fd, len)?);
        // SAFETY: the mapping is at least SLOTS bytes; the header is plain data plus atomics.
        let header = unsafe { &*(control.as_ptr() as *const ControlHeader) };
        if header.magic != MAGIC || header.version != LAYOUT_VERSION {
            return Err(IpcError::Protocol(format!(
                "control segment has magic {:#x} version {}, expected {MAGIC:#x} version {LAYOUT_VERSION}",
                header.magic, header.version
            )));
        }
        let geometry = RingGeometry { slot_size: header.slot_size, slot_count: header.slot_count };
        geometry.validate()?;
        if (SLOTS + 2 * geometry.slots_bytes()) as u64 > len {
            return Err(IpcError::Protocol("control segment smaller than its rings".into()));
        }
        header.stub_pid.store(std::process::id(), Ordering::Release);
        let config = ChannelConfig { geometry, wait, arena_segment, ..ChannelConfig::default() };
        let chan = Self::assemble(Side::Stub, "tritium-stub", config, control, socket, RING_B, RING_A)?;
        let bell = chan.recv_fd(DOORBELL_TAG)?;
        chan.tx.locked().producer.set_doorbell(Doorbell::from_fd(bell));
        Ok(chan)
    }

    /// Advances the heartbeat counter the server watches.
    pub fn beat(&self) {
        self.header().heartbeat.fetch_add(1, Ordering::AcqRel);
    }

    /// The pid of the server that created this channel.
    pub fn server_pid(&self) -> u32 {
        self.header().server_pid
    }
}

impl<S: Serialize, R: DeserializeOwned> Channel<S, R> {
    fn assemble(
        side: Side,
        name: &str,
        config: ChannelConfig,
        control: Arc<Segment>,
        socket: OwnedFd,
        tx_ring: usize,
        rx_ring: usize,
    ) -> Result<Self, IpcError> {
        let geo = config.geometry;
        let base = control.as_ptr();
        let slots_of = |ring_off: usize| if ring_off == RING_A { SLOTS } else { SLOTS + geo.slots_bytes() };
        // SAFETY: the control segment was created or checked for this geometry above, and the Arc
        // stored in the channel keeps it mapped for as long as the rings are used.
        let (producer, consumer) = unsafe {
            let (p, _) =
                ring::attach(base.add(tx_ring) as *const RingHeader, base.add(slots_of(tx_ring)), geo, config.wait);
            let (_, c) =
                ring::attach(base.add(rx_ring) as *const RingHeader, base.add(slots_of(rx_ring)), geo, config.wait);
            (p, c)
        };
        Ok(Self {
            side,
            config,
            control,
            tx: Mutex::new(Tx { producer, buf: Vec::with_capacity(4096) }),
            rx: Mutex::new(Rx { consumer, buf: Vec::with_capacity(4096) }),
            socket,
            segments: RwLock::new(HashMap::new()),
            arena: Mutex::new({
                let mut arena = Arena::new(side, name, config.arena_segment);
                arena.set_max_bytes(config.limits.max_own_bytes);
                arena
            }),
            pending_release: Mutex::new(Vec::new()),
            regions: Mutex::new(HashSet::new()),
            doorbell: None,
            _types: PhantomData,
        })
    }

    fn header(&self) -> &ControlHeader {
        // SAFETY: the control segment starts with a ControlHeader and stays mapped while `self` lives.
        unsafe { &*(self.control.as_ptr() as *const ControlHeader) }
    }

    /// Which end this is.
    pub fn side(&self) -> Side {
        self.side
    }

    /// The pid the stub wrote into the control header when it attached (0 before).
    pub fn stub_pid(&self) -> u32 {
        self.header().stub_pid.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod testing {
    //! Channel pairs for the unit tests of every `channel` module.

    use std::time::Duration;

    use super::{ChannelConfig, ChannelLimits, ServerChannel, StubChannel};
    use crate::ring::WaitPolicy;

    pub(super) fn pair() -> (ServerChannel, StubChannel) {
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        (server, stub)
    }

    pub(super) fn pair_with(limits: ChannelLimits) -> (ServerChannel, StubChannel) {
        let config = ChannelConfig { arena_segment: 2 << 20, limits, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        (server, stub)
    }

    /// How long a test waits for a message that should come.
    pub(super) const T: Duration = Duration::from_secs(5);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::channel::testing::pair;
    use crate::protocol::ToStub;

    #[test]
    fn an_interrupt_ends_a_send_waiting_for_room_at_once() {
        // A small ring and a long send timeout: the stub never reads, as if it had died.
        let config = ChannelConfig {
            geometry: RingGeometry { slot_size: 256, slot_count: 4 },
            send_timeout: Duration::from_secs(30),
            ..ChannelConfig::default()
        };
        let (server, _fds) = ServerChannel::create("interrupt-send", config).expect("create");
        for seq in 0..4 {
            server.send(&ToStub::Ping { seq }).expect("room for one slot each");
        }
        let interrupter = server.interrupter();
        let started = Instant::now();
        let waker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            interrupter.interrupt();
        });
        let full = server.send(&ToStub::Ping { seq: 4 });
        waker.join().expect("interrupter thread");
        assert!(matches!(full, Err(IpcError::Closed)), "{full:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "waited {:?}", started.elapsed());
        // The receiving direction is closed too.
        assert!(matches!(server.recv(Duration::from_secs(5)), Err(IpcError::Closed)));
    }

    #[test]
    fn interrupt_wakes_a_waiting_receiver() {
        let (server, _stub) = pair();
        let server = Arc::new(server);
        let interrupter = server.interrupter();
        let s2 = server.clone();
        let t = std::thread::spawn(move || s2.recv(Duration::from_secs(30)).map(|m| m.is_some()));
        std::thread::sleep(Duration::from_millis(50));
        interrupter.interrupt();
        assert!(matches!(t.join().expect("thread"), Err(IpcError::Closed)));
    }
}
