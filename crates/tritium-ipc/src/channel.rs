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

use std::collections::{HashMap, HashSet};
use std::io::{IoSlice, IoSliceMut};
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tritium_sync::{Locked, RwLocked};

use crate::arena::{Arena, Descriptor, Side};
use crate::error::IpcError;
use crate::protocol::{Control, ToServer, ToStub, REGION_BIT};
use crate::ring::{self, Consumer, Doorbell, Producer, RingGeometry, RingHeader, WaitPolicy, FRAME_APP, FRAME_CONTROL};
use crate::segment::Segment;

/// Magic number at the start of every control segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"TRITIUM1");
/// Layout version of the control segment.
pub const LAYOUT_VERSION: u32 = 1;
const RING_A: usize = 4096;
const RING_B: usize = RING_A + ring::RING_HEADER_SIZE;
const SLOTS: usize = 8192;
/// Descriptors in one `Release` frame: a few slots each, well inside the ring.
const RELEASES_PER_FRAME: usize = 512;
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

/// A received view of bytes in a shared segment. Holding it keeps the mapping alive.
#[derive(Debug, Clone)]
pub struct View {
    /// Where the bytes are.
    pub desc: Descriptor,
    segment: Arc<Segment>,
    ptr: *mut u8,
}

// SAFETY: `ptr` points into `segment`, which the Arc keeps mapped; a View is only a capability to
// access that range, which any thread may use.
unsafe impl Send for View {}
// SAFETY: as above.
unsafe impl Sync for View {}

impl View {
    /// Start of the bytes.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.desc.len as usize
    }

    /// True for a zero-length view.
    pub fn is_empty(&self) -> bool {
        self.desc.len == 0
    }

    /// Copies the bytes out. The peer may still write to shared memory, so the bytes are copied
    /// rather than borrowed. The vector is not zeroed first, and a large copy streams
    /// ([`crate::copy`]): what reads it next is a socket write or a client, not this thread's
    /// caches.
    pub fn to_vec(&self) -> Vec<u8> {
        let len = self.len();
        let mut out = Vec::with_capacity(len);
        // SAFETY: the view's range was bounds-checked against the live mapping when it was made;
        // `out` has room for `len` bytes, all of which the copy writes before `set_len`.
        unsafe {
            crate::copy::copy_for_peer_raw(self.ptr, out.as_mut_ptr(), len);
            out.set_len(len);
        }
        out
    }

    /// Copies the bytes into `dst`, which must have the view's length.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.len(), "destination length");
        // SAFETY: the range was bounds-checked against the live mapping when the view was made.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, dst.as_mut_ptr(), dst.len()) };
    }

    /// Copies `src` into the bytes, which must have the view's length; the peer reads them next,
    /// so a large copy streams ([`crate::copy`]).
    pub fn copy_from(&self, src: &[u8]) {
        assert_eq!(src.len(), self.len(), "source length");
        // SAFETY: as in `copy_to`; `src` is this process's memory, not the view's.
        unsafe { crate::copy::copy_for_peer_raw(src.as_ptr(), self.ptr, src.len()) };
    }

    /// The segment, for keeping it mapped.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.segment
    }
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

/// Sends `fd` over the fd socket, tagged with `id` (what the receiver's `recv_fd` checks).
fn send_fd(socket: RawFd, id: u32, fd: RawFd, what: &str) -> Result<(), IpcError> {
    let data = id.to_le_bytes();
    let iov = [IoSlice::new(&data)];
    let fds = [fd];
    sendmsg::<()>(socket, &iov, &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
        .map_err(|e| IpcError::os(what, e))?;
    Ok(())
}

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

    /// Sends one message, waking the peer if it sleeps. Pending releases go first.
    pub fn send(&self, msg: &S) -> Result<(), IpcError> {
        self.send_waking(msg, true)
    }

    /// Sends one message without waking the peer: it reads it with the next message sent by
    /// [`Self::send`] (or when it next looks). For messages the peer has no use for before a
    /// later one, such as a batch's responses ahead of its `ExecuteDone`: the peer then wakes
    /// once for the batch instead of once per message.
    pub fn send_lazy(&self, msg: &S) -> Result<(), IpcError> {
        self.send_waking(msg, false)
    }

    fn send_waking(&self, msg: &S, wake: bool) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        self.flush_releases_locked(&mut tx)?;
        let Tx { producer, buf } = &mut *tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a message: {e}")))?;
        producer.send(FRAME_APP, buf, wake, self.config.send_timeout)
    }

    /// Sends one message only if that needs no waiting: false when another thread of this side
    /// is sending or the ring has no room for it now (a peer that does not read). For requests
    /// that must never hold up their sender (a `/metrics` scrape, an event loop). A message
    /// larger than the whole ring is `IpcError::TooLarge`, as with [`Self::send`].
    pub fn try_send(&self, msg: &S) -> Result<bool, IpcError> {
        let mut tx = match self.tx.try_lock() {
            Ok(tx) => tx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(false),
        };
        let Tx { producer, buf } = &mut *tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a message: {e}")))?;
        let need = producer.slots_for(buf.len());
        // A message that could never fit goes on to `send`, which refuses it.
        if need <= producer.slot_count() && producer.free_slots() < need {
            return Ok(false);
        }
        producer.send(FRAME_APP, buf, true, Duration::ZERO)?;
        Ok(true)
    }

    fn send_control_locked(&self, tx: &mut Tx, msg: &Control, wake: bool) -> Result<(), IpcError> {
        let Tx { producer, buf } = tx;
        buf.clear();
        postcard::to_io(msg, &mut *buf).map_err(|e| IpcError::Protocol(format!("encoding a control frame: {e}")))?;
        producer.send(FRAME_CONTROL, buf, wake, self.config.send_timeout)
    }

    fn flush_releases_locked(&self, tx: &mut Tx) -> Result<(), IpcError> {
        let pending = std::mem::take(&mut *self.pending_release.locked());
        if pending.is_empty() {
            return Ok(());
        }
        // Keep each frame well inside the ring.
        for chunk in pending.chunks(RELEASES_PER_FRAME) {
            self.send_control_locked(tx, &Control::Release(chunk.to_vec()), false)?;
        }
        Ok(())
    }

    /// Sends pending releases only while they fit in the ring now with half of it left free,
    /// never waiting for room; the rest stay pending. On the receive path the peer may not read
    /// for a long time (a stub's main thread in `execute` sending many responses, each of whose
    /// output blocks this side releases): waiting for room there, while the peer waits for this
    /// side to read its full ring, would deadlock both.
    fn flush_releases_with_room(&self, tx: &mut Tx) -> Result<(), IpcError> {
        let mut pending = std::mem::take(&mut *self.pending_release.locked());
        let reserve = tx.producer.slot_count() / 2;
        while !pending.is_empty() {
            let n = pending.len().min(RELEASES_PER_FRAME);
            let frame = Control::Release(pending[pending.len() - n..].to_vec());
            let Tx { producer, buf } = &mut *tx;
            buf.clear();
            postcard::to_io(&frame, &mut *buf)
                .map_err(|e| IpcError::Protocol(format!("encoding a control frame: {e}")))?;
            if producer.free_slots() < producer.slots_for(buf.len()).saturating_add(reserve) {
                break;
            }
            producer.send(FRAME_CONTROL, buf, false, self.config.send_timeout)?;
            pending.truncate(pending.len() - n);
        }
        if !pending.is_empty() {
            self.pending_release.locked().extend(pending);
        }
        Ok(())
    }

    /// Sends pending releases now (lazily: the peer picks them up when it next wakes).
    pub fn flush_releases(&self) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        self.flush_releases_locked(&mut tx)
    }

    /// Sends pending releases unless another thread is sending: a sender waiting for room
    /// holds the producer until the peer reads, and the peer may itself be waiting for this side
    /// to read. Waiting here for that sender would deadlock both; its next send (or this side's
    /// next receive) takes the releases along instead. For the same reason only what fits now
    /// goes ([`Self::flush_releases_with_room`]).
    fn try_flush_releases(&self) -> Result<(), IpcError> {
        let mut tx = match self.tx.try_lock() {
            Ok(tx) => tx,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Ok(()),
        };
        self.flush_releases_with_room(&mut tx)
    }

    /// Receives the next application message, handling control frames on the way. Returns
    /// `Ok(None)` if nothing arrived within `timeout`. Never waits for a sender of this side.
    pub fn recv(&self, timeout: Duration) -> Result<Option<R>, IpcError> {
        self.try_flush_releases()?;
        let started = Instant::now();
        let deadline = started + timeout;
        let mut rx = self.rx.locked();
        // Whether this wait spins depends on how long the last wait for an application message
        // took, not on the control frames taken on the way: the peer's releases come right after
        // each answer, and counting them made a model that gets a request every few milliseconds
        // spin its whole budget after each one.
        let hot = rx.consumer.hot();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Rx { consumer, buf } = &mut *rx;
            consumer.set_hot(hot);
            let kind = match consumer.recv(buf, left) {
                Ok(kind) => kind,
                Err(IpcError::Timeout(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
            if let Some(msg) = self.frame(kind, buf)? {
                let within = started.elapsed() <= consumer.spin_budget();
                consumer.set_hot(within);
                return Ok(Some(msg));
            }
        }
    }

    /// Receives the next application message if one is there now, handling control frames on
    /// the way; never waits or spins (for an event loop, with [`Channel::arm_doorbell`]).
    pub fn try_recv(&self) -> Result<Option<R>, IpcError> {
        self.try_flush_releases()?;
        let mut rx = self.rx.locked();
        loop {
            let Rx { consumer, buf } = &mut *rx;
            let Some(kind) = consumer.try_recv(buf)? else { return Ok(None) };
            if let Some(msg) = self.frame(kind, buf)? {
                return Ok(Some(msg));
            }
        }
    }

    /// Asks the peer to ring this side's doorbell when it next sends (or closes its ring), for a
    /// receiver about to wait on the doorbell's eventfd instead of in [`Channel::recv`]. False
    /// when something is there already (the request is withdrawn): receive it first.
    pub fn arm_doorbell(&self) -> bool {
        self.rx.locked().consumer.arm_doorbell()
    }

    /// Whether a message (or the peer's close) is there to receive now, without taking it.
    pub fn ready(&self) -> bool {
        self.rx.locked().consumer.ready()
    }

    /// Withdraws [`Channel::arm_doorbell`]'s request once the receiver is awake.
    pub fn disarm_doorbell(&self) {
        self.rx.locked().consumer.disarm_doorbell()
    }

    /// An application message out of a received frame; `None` for a control frame, handled here.
    fn frame(&self, kind: u16, buf: &[u8]) -> Result<Option<R>, IpcError> {
        match kind {
            FRAME_APP => {
                postcard::from_bytes(buf).map(Some).map_err(|e| IpcError::Protocol(format!("undecodable message: {e}")))
            }
            FRAME_CONTROL => {
                let ctl: Control = postcard::from_bytes(buf)
                    .map_err(|e| IpcError::Protocol(format!("undecodable control frame: {e}")))?;
                self.handle_control(ctl)?;
                Ok(None)
            }
            other => Err(IpcError::Protocol(format!("unknown frame kind {other}"))),
        }
    }

    fn handle_control(&self, ctl: Control) -> Result<(), IpcError> {
        let peer_bit = match self.side {
            Side::Server => Side::Stub.id_bit(),
            Side::Stub => Side::Server.id_bit(),
        };
        match ctl {
            Control::SegmentAdded { id, len } => {
                if id & crate::arena::STUB_OWNED != peer_bit {
                    return Err(IpcError::Protocol(format!("peer announced segment {id} with our owner bit")));
                }
                // Take the fd off the socket first, so a refused announcement leaves no fd queued.
                let fd = self.recv_fd(id)?;
                self.check_peer_segment(peer_bit, id, len)?;
                let seg = Arc::new(Segment::open(fd, len)?);
                self.segments.write_locked().insert(id, seg);
            }
            Control::SegmentRemoved { id } => {
                if id & crate::arena::STUB_OWNED != peer_bit {
                    return Err(IpcError::Protocol(format!("peer removed segment {id}, which is not its own")));
                }
                // Views still holding the Arc keep the mapping until they drop.
                self.segments.write_locked().remove(&id);
            }
            Control::RegionAdded { id, offset, len } => {
                if self.side != Side::Stub || id & REGION_BIT == 0 || id & crate::arena::STUB_OWNED != 0 {
                    return Err(IpcError::Protocol(format!(
                        "peer announced client region {id}, which is not a region id"
                    )));
                }
                let fd = self.recv_fd(id)?;
                self.check_peer_segment(peer_bit, id, len)?;
                let seg = Arc::new(Segment::open_region(fd, offset, len)?);
                self.segments.write_locked().insert(id, seg);
            }
            Control::Release(blocks) => {
                let mut retired = Vec::new();
                {
                    let mut arena = self.arena.locked();
                    // Blocks of client regions belong to no arena: the region outlives them (a
                    // peer's release of one is ignored, as `release` never sends one).
                    for desc in blocks.into_iter().filter(|d| !d.in_client_region()) {
                        if let Some(id) = arena.free(desc)? {
                            retired.push(id);
                        }
                    }
                }
                self.retire(&retired)?;
            }
        }
        Ok(())
    }

    /// Checks a peer's new segment against [`ChannelLimits`] before it is mapped.
    fn check_peer_segment(&self, peer_bit: u32, id: u32, len: u64) -> Result<(), IpcError> {
        let limits = self.config.limits;
        if len > limits.max_peer_segment_bytes {
            return Err(IpcError::Protocol(format!(
                "peer announced segment {id} of {len} bytes; the limit is {} bytes",
                limits.max_peer_segment_bytes
            )));
        }
        let segs = self.segments.read_locked();
        let peer: Vec<&Arc<Segment>> = segs
            .iter()
            .filter(|(&seg_id, _)| seg_id & crate::arena::STUB_OWNED == peer_bit && seg_id != id)
            .map(|(_, seg)| seg)
            .collect();
        if peer.len() >= limits.max_peer_segments {
            return Err(IpcError::Protocol(format!(
                "peer announced more than {} segments at once",
                limits.max_peer_segments
            )));
        }
        let mapped: u64 = peer.iter().map(|seg| seg.len()).sum();
        if mapped.saturating_add(len) > limits.max_peer_mapped_bytes {
            return Err(IpcError::Protocol(format!(
                "peer segments would reach {} bytes; the limit is {} bytes",
                mapped.saturating_add(len),
                limits.max_peer_mapped_bytes
            )));
        }
        Ok(())
    }

    fn recv_fd(&self, id: u32) -> Result<OwnedFd, IpcError> {
        let mut data = [0u8; 4];
        let mut iov = [IoSliceMut::new(&mut data)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        // The fd was sent before the ring frame that announced it, so it is already queued.
        let msg = recvmsg::<()>(
            self.socket.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| IpcError::os("recvmsg of a segment fd", e))?;
        let mut fd = None;
        for cmsg in msg.cmsgs().map_err(|e| IpcError::os("reading control messages", e))? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for raw in fds {
                    // SAFETY: SCM_RIGHTS installed this fd in our table just now; we own it.
                    let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        let got = u32::from_le_bytes(data);
        if got != id {
            return Err(IpcError::Protocol(format!("segment {id} announced but fd for segment {got} received")));
        }
        fd.ok_or_else(|| IpcError::Protocol(format!("segment {id} announced without an fd")))
    }

    fn announce(&self, id: u32, seg: &Segment) -> Result<(), IpcError> {
        let mut tx = self.tx.locked();
        send_fd(self.socket.as_raw_fd(), id, seg.fd().as_raw_fd(), "sendmsg of a segment fd")?;
        self.send_control_locked(&mut tx, &Control::SegmentAdded { id, len: seg.len() }, false)
    }

    /// Maps `len` bytes from `offset` of a client's registered shared-memory file into the stub
    /// as segment `id` (which must have [`REGION_BIT`] set), so descriptors into it reach the
    /// model without a copy. Done once per region and stub ([`Channel::has_region`]); the fd
    /// goes over the socket first, as for arena segments.
    pub fn add_region(&self, id: u32, fd: BorrowedFd<'_>, offset: u64, len: u64) -> Result<(), IpcError> {
        if id & REGION_BIT == 0 || id & crate::arena::STUB_OWNED != 0 {
            return Err(IpcError::Protocol(format!("{id} is not a client region id")));
        }
        let mut tx = self.tx.locked();
        send_fd(self.socket.as_raw_fd(), id, fd.as_raw_fd(), "sendmsg of a region fd")?;
        self.send_control_locked(&mut tx, &Control::RegionAdded { id, offset, len }, false)?;
        self.regions.locked().insert(id);
        Ok(())
    }

    /// Whether client region `id` was announced to the peer.
    pub fn has_region(&self, id: u32) -> bool {
        self.regions.locked().contains(&id)
    }

    /// The client regions announced to the peer.
    pub fn region_ids(&self) -> Vec<u32> {
        self.regions.locked().iter().copied().collect()
    }

    /// Tells the peer to unmap client region `id` (arrays over it keep their mapping until
    /// they are dropped).
    pub fn remove_region(&self, id: u32) -> Result<(), IpcError> {
        if !self.regions.locked().remove(&id) {
            return Ok(());
        }
        let mut tx = self.tx.locked();
        self.send_control_locked(&mut tx, &Control::SegmentRemoved { id }, false)
    }

    /// Allocates `len` bytes in this side's arena, announcing a new segment to the peer if one
    /// was needed. The block belongs to this side until it is sent; free it with
    /// [`Channel::free_own`] if it never is.
    pub fn alloc(&self, len: u64) -> Result<View, IpcError> {
        let a = self.arena.locked().alloc(len)?;
        if let Some((id, seg)) = &a.created {
            self.segments.write_locked().insert(*id, seg.clone());
            self.announce(*id, seg)?;
        }
        let ptr = a
            .segment
            .range(a.desc.offset, a.desc.len)
            .ok_or_else(|| IpcError::Protocol("allocator returned an out-of-range block".into()))?;
        Ok(View { desc: a.desc, segment: a.segment, ptr })
    }

    /// Allocates adjacent blocks of `lens` bytes ([`Arena::alloc_run`]), announcing a new segment
    /// to the peer if one was needed; `None` when `lens` is empty or holds a 0.
    pub fn alloc_run(&self, lens: &[u64]) -> Result<Option<Vec<View>>, IpcError> {
        let Some(run) = self.arena.locked().alloc_run(lens)? else {
            return Ok(None);
        };
        let mut views = Vec::with_capacity(run.len());
        for a in run {
            if let Some((id, seg)) = &a.created {
                self.segments.write_locked().insert(*id, seg.clone());
                self.announce(*id, seg)?;
            }
            let ptr = a
                .segment
                .range(a.desc.offset, a.desc.len)
                .ok_or_else(|| IpcError::Protocol("allocator returned an out-of-range block".into()))?;
            views.push(View { desc: a.desc, segment: a.segment, ptr });
        }
        Ok(Some(views))
    }

    /// Frees a block of this side's that was never handed to the peer; a block of a client's
    /// region belongs to no arena, and freeing it does nothing.
    pub fn free_own(&self, desc: Descriptor) -> Result<(), IpcError> {
        if desc.in_client_region() {
            return Ok(());
        }
        let retired = self.arena.locked().free(desc)?;
        self.retire(retired.as_slice())
    }

    /// Unmaps segments of this side's that the arena retired and tells the peer to unmap them.
    fn retire(&self, ids: &[u32]) -> Result<(), IpcError> {
        if ids.is_empty() {
            return Ok(());
        }
        {
            let mut segs = self.segments.write_locked();
            for id in ids {
                segs.remove(id);
            }
        }
        let mut tx = self.tx.locked();
        for &id in ids {
            self.send_control_locked(&mut tx, &Control::SegmentRemoved { id }, false)?;
        }
        Ok(())
    }

    /// Whether client region `id` is mapped here and its client shrank it under an access
    /// ([`Segment::faulted`]): what the model read from it or wrote to it is not the client's.
    pub fn region_faulted(&self, id: u32) -> bool {
        let segs = self.segments.read_locked();
        segs.get(&id).is_some_and(|s| s.faulted())
    }

    /// Resolves a descriptor received from the peer, checking that it lies inside a known segment.
    pub fn view(&self, desc: Descriptor) -> Result<View, IpcError> {
        let segs = self.segments.read_locked();
        let segment = segs
            .get(&desc.segment)
            .ok_or_else(|| IpcError::Protocol(format!("descriptor names unknown segment {}", desc.segment)))?
            .clone();
        let ptr = segment.range(desc.offset, desc.len).ok_or_else(|| {
            IpcError::Protocol(format!(
                "descriptor {}+{} is outside segment {} of {} bytes",
                desc.offset,
                desc.len,
                desc.segment,
                segment.len()
            ))
        })?;
        Ok(View { desc, segment, ptr })
    }

    /// Queues a block of the peer's for release; it is sent with the next message or wait. A
    /// block of a client's region is nobody's to release and is not queued.
    pub fn release(&self, desc: Descriptor) {
        if !desc.in_client_region() {
            self.pending_release.locked().push(desc);
        }
    }

    /// Closes this end's sending ring, waking the peer.
    pub fn close(&self) {
        self.tx.locked().producer.close();
    }

    /// True when the peer closed its ring and everything it sent has been received.
    pub fn peer_closed(&self) -> bool {
        self.rx.locked().consumer.is_closed()
    }

    /// Bytes of shared memory in this side's arena segments plus the control segment.
    pub fn own_shm_bytes(&self) -> u64 {
        let own = self.arena.locked().mapped_bytes();
        own + if self.side == Side::Server { self.control.len() } else { 0 }
    }

    /// Bytes of shared memory this channel really uses (pages touched so far) across the
    /// control segment and every arena segment of both sides. Mapped address space is larger:
    /// arena segments are reserved at 256 MiB and filled on demand.
    pub fn shm_bytes(&self) -> u64 {
        let segs = self.segments.read_locked();
        // Client regions are the client's memory, not the channel's.
        self.control.allocated_bytes()
            + segs.iter().filter(|(id, _)| *id & REGION_BIT == 0).map(|(_, s)| s.allocated_bytes()).sum::<u64>()
    }

    /// Live blocks in this side's arena (allocated, not yet released).
    pub fn live_blocks(&self) -> usize {
        self.arena.locked().live_blocks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Request, StubError};

    fn pair() -> (ServerChannel, StubChannel) {
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        (server, stub)
    }

    const T: Duration = Duration::from_secs(5);

    #[test]
    fn messages_and_tensor_bytes_cross_in_both_directions() {
        let (server, stub) = pair();
        assert_eq!(server.stub_pid(), std::process::id());
        let block = server.alloc(5).expect("alloc");
        block.copy_from(b"hello");
        server
            .send(&ToStub::Execute { batch: 1, requests: vec![Request { id: 7, ..Default::default() }] })
            .expect("send");
        // The segment announcement travels ahead of the message, so the stub can resolve the block.
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Execute { batch: 1, .. })));
        assert_eq!(stub.view(block.desc).expect("view").to_vec(), b"hello");
        stub.release(block.desc);
        stub.send(&ToServer::ExecuteDone { batch: 1, error: None }).expect("done");
        assert_eq!(server.live_blocks(), 1);
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::ExecuteDone { batch: 1, error: None })));
        assert_eq!(server.live_blocks(), 0, "the release arrived before the message");
    }

    #[test]
    fn a_run_of_blocks_is_one_range_in_the_peer_and_is_released_block_by_block() {
        let (server, stub) = pair();
        let run = server.alloc_run(&[8, 4, 8]).expect("alloc_run").expect("a run");
        for (view, bytes) in run.iter().zip([&b"abcdefgh"[..], b"ijkl", b"mnopqrst"]) {
            view.copy_from(bytes);
        }
        server.send(&ToStub::Execute { batch: 1, requests: vec![] }).expect("send");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Execute { batch: 1, .. })));
        let views: Vec<View> = run.iter().map(|v| stub.view(v.desc).expect("view")).collect();
        for pair in views.windows(2) {
            assert_eq!(pair[0].as_ptr().wrapping_add(pair[0].len()), pair[1].as_ptr(), "adjacent in the stub");
        }
        // SAFETY: the three blocks are adjacent in one mapping (checked above), 20 bytes in all.
        let joined = unsafe { std::slice::from_raw_parts(views[0].as_ptr(), 20) };
        assert_eq!(joined, b"abcdefghijklmnopqrst");
        for v in &views {
            stub.release(v.desc);
        }
        stub.send(&ToServer::ExecuteDone { batch: 1, error: None }).expect("done");
        assert_eq!(server.live_blocks(), 3);
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::ExecuteDone { .. })));
        assert_eq!(server.live_blocks(), 0);
        assert!(server.alloc_run(&[8, 0]).expect("a zero").is_none());
    }

    #[test]
    fn only_the_wait_for_messages_decides_whether_a_receiver_spins() {
        // A model that gets a request every few milliseconds: after each answer the server's
        // releases reach the stub at once, and the next request comes much later than the spin
        // budget. The release must not make the stub spin through its budget waiting for it.
        let policy = WaitPolicy { spin: Duration::from_millis(20), slice: Duration::from_millis(100) };
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, policy, 2 << 20).expect("connect");
        let ping_after = |gap: Duration| {
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(gap);
                    server.send(&ToStub::Ping { seq: 1 }).expect("ping");
                });
                assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
            });
        };
        let spun = || stub.rx.locked().consumer.spun;

        // A wait longer than the budget leaves the stub cold.
        ping_after(Duration::from_millis(60));
        // An answer's block, read by the server, whose release the server sends at its next
        // receive: it is in the stub's ring before the stub waits.
        let block = stub.alloc(64).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("pong");
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: 1 })));
        server.release(block.desc);
        assert!(server.recv(Duration::from_millis(1)).expect("flush").is_none());
        let before = spun();
        ping_after(Duration::from_millis(60));
        assert_eq!(stub.live_blocks(), 0, "the release was taken on the way");
        assert_eq!(spun(), before, "a release taken at once made the wait for the next message spin");

        // A message that was there at once makes the next wait spin.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        ping_after(Duration::from_millis(200));
        assert_eq!(spun(), before + 1, "a hot receiver waited without spinning");
    }

    #[test]
    fn a_receive_that_only_looks_leaves_the_next_wait_spinning() {
        // The stub's heartbeat thread pumps the ring with a zero timeout while the model runs.
        // Finding nothing there says nothing about how soon the next request comes, so the main
        // loop's next wait must still spin.
        let policy = WaitPolicy { spin: Duration::from_millis(20), slice: Duration::from_millis(100) };
        let config = ChannelConfig { arena_segment: 2 << 20, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, policy, 2 << 20).expect("connect");
        let spun = || stub.rx.locked().consumer.spun;
        // A message that was there at once: the receiver is hot.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        // The heartbeat's look at an empty ring.
        assert!(stub.recv(Duration::ZERO).expect("poll").is_none());
        let before = spun();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(5));
                server.send(&ToStub::Ping { seq: 2 }).expect("ping");
            });
            assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 2 })));
        });
        assert_eq!(spun(), before + 1, "a zero-timeout receive made the next wait skip its spin");
    }

    /// A plain (unsealable) file of `len` bytes, like a client's `/dev/shm` object.
    fn client_file(len: u64) -> OwnedFd {
        let file = tempfile_in_tmp();
        file.set_len(len).expect("set_len");
        OwnedFd::from(file)
    }

    fn tempfile_in_tmp() -> std::fs::File {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "tritium-region-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let file =
            std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("create file");
        std::fs::remove_file(&path).expect("unlink");
        file
    }

    #[test]
    fn a_client_region_is_mapped_in_the_stub_and_never_freed_by_a_release() {
        let (server, stub) = pair();
        let fd = client_file(3 * 4096);
        // Offsets need not be page-aligned: the stub's view starts exactly at `offset`.
        nix::sys::uio::pwrite(&fd, b"region bytes", 100 + 7).expect("pwrite");
        let id = REGION_BIT | 3;
        assert!(server.add_region(1, std::os::fd::AsFd::as_fd(&fd), 0, 8).is_err(), "not a region id");
        server.add_region(id, std::os::fd::AsFd::as_fd(&fd), 100, 4096).expect("add");
        assert!(server.has_region(id));
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        let view = stub.view(Descriptor { segment: id, offset: 7, len: 12 }).expect("view");
        assert_eq!(view.to_vec(), b"region bytes");
        // Bounds are the registered range, not the file.
        assert!(stub.view(Descriptor { segment: id, offset: 4090, len: 7 }).is_err());
        // The stub writes an output straight into a region it got read-write.
        stub.view(Descriptor { segment: id, offset: 0, len: 3 }).expect("view").copy_from(b"out");
        let mut back = [0u8; 3];
        nix::sys::uio::pread(&fd, &mut back, 100).expect("pread");
        assert_eq!(&back, b"out");
        // A region sent as a read-only descriptor is mapped read-only: model code can read it,
        // never write it.
        let read_only = nix::fcntl::open(
            format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .expect("reopen");
        // SAFETY: `open` just returned this descriptor, and nothing else owns it.
        let read_only = unsafe { OwnedFd::from_raw_fd(read_only) };
        let ro_id = REGION_BIT | 4;
        server.add_region(ro_id, std::os::fd::AsFd::as_fd(&read_only), 100, 4096).expect("add");
        server.send(&ToStub::Ping { seq: 9 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 9 })));
        let ro_view = stub.view(Descriptor { segment: ro_id, offset: 0, len: 3 }).expect("view");
        assert_eq!(ro_view.to_vec(), b"out");
        let addr = ro_view.as_ptr() as usize;
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let perms = maps
            .lines()
            .find_map(|line| {
                let (range, rest) = line.split_once(' ')?;
                let (start, end) = range.split_once('-')?;
                let (start, end) = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
                (start <= addr && addr < end).then(|| rest[..4].to_string())
            })
            .expect("mapped");
        assert_eq!(perms, "r--s", "a read-only shared mapping");
        // A region block is not released (no arena owns it), and one a peer releases anyway is
        // ignored, not a protocol error.
        stub.release(view.desc);
        assert!(stub.pending_release.locked().is_empty());
        assert!(stub.free_own(view.desc).is_ok());
        stub.pending_release.locked().push(view.desc);
        stub.send(&ToServer::Pong { seq: 2 }).expect("pong");
        assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: 2 })));
        // Removal unmaps it for new descriptors; the view taken before keeps its mapping.
        server.remove_region(id).expect("remove");
        assert!(!server.has_region(id));
        server.send(&ToStub::Ping { seq: 3 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 3 })));
        assert!(stub.view(Descriptor { segment: id, offset: 7, len: 12 }).is_err());
        assert_eq!(view.to_vec(), b"region bytes");
    }

    #[test]
    fn a_region_past_the_end_of_its_file_is_refused() {
        let fd = client_file(4096);
        let err = Segment::open_region(fd, 4000, 200).expect_err("past the end");
        assert!(err.to_string().contains("needs a file of 4200 bytes"), "{err}");
    }

    #[test]
    fn a_receive_does_not_wait_for_a_sender_waiting_for_room() {
        // A model thread fills the stub's ring and waits for room while the stub's main thread,
        // with releases pending, receives: the receive must not wait for that thread, because
        // the server may be waiting (to send its own frames) for the stub to read.
        let (server, stub) = pair();
        let stub = Arc::new(stub);
        let block = server.alloc(8).expect("alloc");
        server.send(&ToStub::Ping { seq: 0 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 0 })));
        let slots = ChannelConfig::default().geometry.slot_count as u64;
        for seq in 0..slots {
            stub.send(&ToServer::Pong { seq }).expect("room for one slot each");
        }
        let sender = {
            let stub = stub.clone();
            std::thread::spawn(move || stub.send(&ToServer::Pong { seq: slots }))
        };
        std::thread::sleep(Duration::from_millis(100));
        stub.release(block.desc);
        let started = Instant::now();
        assert!(stub.recv(Duration::from_millis(50)).expect("recv").is_none());
        assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
        // The server reads: the waiting sender goes on, and the release left pending goes with
        // the stub's next receive.
        for seq in 0..=slots {
            assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: s }) if s == seq));
        }
        sender.join().expect("sender thread").expect("sent");
        assert_eq!(server.live_blocks(), 1);
        assert!(stub.recv(Duration::ZERO).expect("recv").is_none());
        assert!(server.recv(Duration::from_millis(50)).expect("recv").is_none());
        assert_eq!(server.live_blocks(), 0);
    }

    #[test]
    fn a_receive_never_waits_for_room_to_send_releases() {
        // A stub sends many responses from `execute` without reading: the server receives each
        // and releases its block. Releases must not fill the server's ring and block the
        // receive, or the server stops reading while the stub waits for it to.
        let (server, stub) = pair();
        let slots = ChannelConfig::default().geometry.slot_count as u64;
        for seq in 0..4 * slots {
            let block = stub.alloc(4).expect("alloc");
            stub.send(&ToServer::Pong { seq }).expect("room: the server reads as we go");
            let started = Instant::now();
            assert!(matches!(server.recv(T).expect("recv"), Some(ToServer::Pong { seq: s }) if s == seq));
            assert!(started.elapsed() < Duration::from_secs(2), "waited {:?}", started.elapsed());
            server.release(block.desc);
        }
        assert_eq!(stub.live_blocks(), 4 * slots as usize);
        // The stub reads: the releases (batched in few frames) free its blocks.
        server.send(&ToStub::Ping { seq: 1 }).expect("ping");
        assert!(matches!(stub.recv(T).expect("recv"), Some(ToStub::Ping { seq: 1 })));
        assert_eq!(stub.live_blocks(), 0);
    }

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
    fn bad_descriptors_are_refused_not_followed() {
        let (server, stub) = pair();
        let block = stub.alloc(64).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        server.recv(T).expect("recv");
        assert!(server.view(block.desc).is_ok());
        let cases = [
            Descriptor { len: 3 << 20, ..block.desc },
            Descriptor { offset: u64::MAX - 1, ..block.desc },
            Descriptor { segment: 12345, ..block.desc },
        ];
        for bad in cases {
            assert!(matches!(server.view(bad), Err(IpcError::Protocol(_))), "{bad:?}");
        }
    }

    #[test]
    fn a_bogus_release_is_a_protocol_error() {
        let (server, stub) = pair();
        stub.release(Descriptor { segment: 1, offset: 4096, len: 8 });
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        assert!(matches!(server.recv(T), Err(IpcError::Protocol(_))));
    }

    fn pair_with(limits: ChannelLimits) -> (ServerChannel, StubChannel) {
        let config = ChannelConfig { arena_segment: 2 << 20, limits, ..ChannelConfig::default() };
        let (server, fds) = ServerChannel::create("test", config).expect("create");
        let stub = StubChannel::connect(fds.control, fds.socket, WaitPolicy::default(), 2 << 20).expect("connect");
        (server, stub)
    }

    #[test]
    fn a_peer_announcing_too_many_segments_is_refused() {
        let (server, stub) = pair_with(ChannelLimits { max_peer_segments: 2, ..ChannelLimits::default() });
        // Each block larger than the default segment gets a segment of its own.
        let _blocks: Vec<View> = (0..3).map(|_| stub.alloc(3 << 20).expect("alloc")).collect();
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("third segment refused");
        assert!(err.to_string().contains("more than 2 segments"), "{err}");
    }

    #[test]
    fn a_peer_segment_over_the_size_or_mapped_limit_is_refused() {
        let (server, stub) = pair_with(ChannelLimits { max_peer_segment_bytes: 4 << 20, ..ChannelLimits::default() });
        let _big = stub.alloc(6 << 20).expect("alloc");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("too large");
        assert!(err.to_string().contains("the limit is 4194304 bytes"), "{err}");

        let (server, stub) = pair_with(ChannelLimits { max_peer_mapped_bytes: 5 << 20, ..ChannelLimits::default() });
        let _a = stub.alloc(1).expect("first segment, 2 MiB");
        let _b = stub.alloc(3 << 20).expect("second segment, 4 MiB");
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        let err = server.recv(T).expect_err("mapped bytes over the limit");
        assert!(err.to_string().contains("would reach 6291456 bytes"), "{err}");
    }

    #[test]
    fn an_arena_stops_growing_at_its_limit() {
        let (server, _stub) = pair_with(ChannelLimits { max_own_bytes: 4 << 20, ..ChannelLimits::default() });
        let _a = server.alloc(2 << 20).expect("first 2 MiB segment");
        let _b = server.alloc(2 << 20).expect("second 2 MiB segment");
        let err = server.alloc(1).expect_err("a third segment is over the limit");
        assert!(matches!(err, IpcError::OutOfMemory(..)), "{err}");
        assert!(err.to_string().contains("its limit is 4194304 bytes"), "{err}");
    }

    #[test]
    fn large_blocks_grow_and_retire_segments() {
        let (server, stub) = pair();
        let big = server.alloc(8 << 20).expect("big");
        assert!(server.own_shm_bytes() >= 8 << 20);
        // Large enough that both copies stream (`copy::STREAM_THRESHOLD`), and odd-sized.
        let bytes: Vec<u8> = (0..(8 << 20) - 5).map(|i: usize| (i % 253) as u8).collect();
        let block = server.view(Descriptor { len: bytes.len() as u64, ..big.desc }).expect("view");
        block.copy_from(&bytes);
        server.send(&ToStub::Ping { seq: 1 }).expect("send");
        stub.recv(T).expect("recv");
        let seen = stub.view(Descriptor { len: bytes.len() as u64, ..big.desc }).expect("stub maps the new segment");
        assert!(seen.to_vec() == bytes, "the stub reads exactly the bytes the server copied in");
        drop((block, seen));
        stub.view(big.desc).expect("stub maps the new segment");
        stub.release(big.desc);
        stub.send(&ToServer::InitializeDone(Err(StubError { message: "x".into(), code: 1, traceback: None })))
            .expect("send");
        server.recv(T).expect("recv");
        assert!(server.own_shm_bytes() < 8 << 20, "the oversized segment was retired");
        server.send(&ToStub::Ping { seq: 2 }).expect("send");
        stub.recv(T).expect("recv");
        assert!(stub.view(big.desc).is_err(), "the stub unmapped it too");
    }

    #[test]
    fn the_stub_rings_the_doorbell_only_while_the_server_waits_for_it() {
        let (server, stub) = pair();
        let bell = server.doorbell().expect("the server has a doorbell").clone();
        assert!(matches!(server.try_recv(), Ok(None)), "nothing sent yet");
        // Not armed: a send wakes nobody through the doorbell.
        stub.send(&ToServer::Pong { seq: 1 }).expect("send");
        assert!(!bell.clear(), "rung without being armed");
        assert!(!server.arm_doorbell(), "a message is waiting: arming refuses");
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 1 }))));
        // Armed: the next waking send rings it, a lazy one does not.
        assert!(server.arm_doorbell(), "the ring is empty");
        stub.send_lazy(&ToServer::Pong { seq: 2 }).expect("lazy send");
        assert!(!bell.clear(), "a lazy send rang the doorbell");
        stub.send(&ToServer::Pong { seq: 3 }).expect("send");
        assert!(bell.clear(), "a waking send to an armed server rings the doorbell");
        server.disarm_doorbell();
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 2 }))));
        assert!(matches!(server.try_recv(), Ok(Some(ToServer::Pong { seq: 3 }))));
        assert!(matches!(server.try_recv(), Ok(None)));
        // The stub closing its ring, and the interrupter, ring it too.
        assert!(server.arm_doorbell());
        stub.close();
        assert!(bell.clear(), "closing rings an armed doorbell");
        assert!(matches!(server.try_recv(), Err(IpcError::Closed)), "empty and closed");
        server.interrupter().interrupt();
        assert!(bell.clear(), "the interrupter rings the doorbell");
    }

    #[test]
    fn try_send_refuses_what_could_never_fit_and_waits_for_nothing() {
        let (server, stub) = pair();
        assert!(server.try_send(&ToStub::Ping { seq: 0 }).expect("room"), "a small message goes");
        let big = ToServer::Log(crate::protocol::LogRecord {
            level: crate::protocol::LogLevel::Info,
            logger: String::new(),
            file: String::new(),
            line: 0,
            message: "x".repeat(1 << 20),
        });
        let err = stub.try_send(&big).expect_err("larger than the ring");
        assert!(matches!(err, IpcError::TooLarge { .. }), "{err}");
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

    #[test]
    fn close_wakes_the_peer() {
        let (server, stub) = pair();
        let t = std::thread::spawn(move || stub.recv(Duration::from_secs(30)).map(|m| m.is_some()));
        std::thread::sleep(Duration::from_millis(50));
        server.close();
        assert!(matches!(t.join().expect("thread"), Err(IpcError::Closed)));
    }
}
