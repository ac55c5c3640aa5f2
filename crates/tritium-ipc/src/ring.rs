//! Single-producer/single-consumer message rings with futex doorbells.
//!
//! A ring is a header ([`RingHeader`]) and `slot_count` fixed-size slots, all inside the control
//! segment. Each slot starts with a [`SlotHeader`]; a message longer than one slot's payload
//! continues in the following slots and is published at once, so the consumer only ever sees whole
//! messages. `head` and `tail` are free-running `u32` counters and double as futex words: the
//! consumer sleeps on `head` while the ring is empty, the producer sleeps on `tail` while it is
//! full. A sleeper raises its `*_waiting` flag first, so the other side skips the wake syscall
//! when nobody sleeps. Every wait has a timeout, so a dead peer is always noticed.
//!
//! A consumer that is not a thread of its own (the server's async runtime) waits on a
//! [`Doorbell`] instead of the futex: it raises the flag with [`WAITING_DOORBELL`]
//! ([`Consumer::arm_doorbell`]), and a producer that sees that value writes the doorbell's eventfd,
//! which the runtime polls like a socket.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::error::IpcError;
use crate::futex;

/// The shared header of one ring. Producer-written and consumer-written words live on separate
/// cache lines.
#[repr(C, align(64))]
pub struct RingHeader {
    head: AtomicU32,
    producer_waiting: AtomicU32,
    _pad0: [u8; 56],
    tail: AtomicU32,
    consumer_waiting: AtomicU32,
    closed: AtomicU32,
    _pad1: [u8; 52],
}

/// Size of [`RingHeader`] in the control segment.
pub const RING_HEADER_SIZE: usize = std::mem::size_of::<RingHeader>();

/// The fixed header at the start of every slot.
#[repr(C)]
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct SlotHeader {
    /// Total message length in bytes (first slot of a message); 0 in continuation slots.
    pub len: u32,
    /// Message class: [`FRAME_CONTROL`] or [`FRAME_APP`].
    pub kind: u16,
    /// Number of slots this message occupies (first slot); 0 in continuation slots.
    pub slots: u16,
    /// Sequence number of the message, for debugging and sanity checks.
    pub seq: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// Bytes of [`SlotHeader`] at the start of each slot.
pub const SLOT_HEADER_SIZE: usize = std::mem::size_of::<SlotHeader>();
/// Frame class of control messages handled by the channel itself (segments, releases).
pub const FRAME_CONTROL: u16 = 1;
/// Frame class of application messages (the stub protocol).
pub const FRAME_APP: u16 = 2;

/// Geometry of a ring, fixed when the control segment is created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingGeometry {
    /// Bytes per slot, header included; a multiple of 64.
    pub slot_size: u32,
    /// Number of slots; a power of two.
    pub slot_count: u32,
}

impl RingGeometry {
    /// Payload bytes per slot.
    pub fn payload(&self) -> usize {
        self.slot_size as usize - SLOT_HEADER_SIZE
    }

    /// Bytes the slots of one ring take.
    pub fn slots_bytes(&self) -> usize {
        self.slot_size as usize * self.slot_count as usize
    }

    /// Checks the invariants the ring code relies on.
    pub fn validate(&self) -> Result<(), IpcError> {
        let ok = self.slot_size >= 128
            && self.slot_size.is_multiple_of(64)
            && self.slot_count.is_power_of_two()
            && self.slot_count >= 2
            && self.slot_count <= 1 << 16;
        if ok {
            Ok(())
        } else {
            Err(IpcError::Protocol(format!("invalid ring geometry {self:?}")))
        }
    }
}

/// How long a waiter spins before it sleeps on the futex.
///
/// Spinning is adaptive: a waiter spins (for at most `spin`) only while messages have been
/// arriving within `spin` of each other, so a busy stub answers without a futex wake-up (tens of
/// microseconds on a virtual machine) and an idle one costs no CPU.
#[derive(Debug, Clone, Copy)]
pub struct WaitPolicy {
    /// Longest busy-poll before sleeping (zero disables spinning).
    pub spin: Duration,
    /// Longest single futex sleep; waits are sliced so that callers can check on the peer.
    pub slice: Duration,
}

impl Default for WaitPolicy {
    fn default() -> Self {
        Self { spin: crate::spin::SPIN_BUDGET, slice: Duration::from_millis(100) }
    }
}

/// `consumer_waiting` of a consumer asleep on the futex word `head`.
const WAITING_FUTEX: u32 = 1;
/// `consumer_waiting` of a consumer waiting for its [`Doorbell`].
const WAITING_DOORBELL: u32 = 2;

/// An eventfd a producer writes to wake a consumer that waits in an event loop rather than on
/// the futex (see [`Consumer::arm_doorbell`]). Cloning shares the one eventfd.
#[derive(Debug, Clone)]
pub struct Doorbell(Arc<OwnedFd>);

impl Doorbell {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> Result<Self, IpcError> {
        // SAFETY: eventfd takes an initial value and flags and returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(IpcError::Io("eventfd".into(), std::io::Error::last_os_error()));
        }
        // SAFETY: eventfd just returned this fd to us.
        Ok(Self(Arc::new(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })))
    }

    /// Wraps an eventfd received from the peer.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self(Arc::new(fd))
    }

    /// The eventfd, for sending it to the peer or polling it.
    pub fn fd(&self) -> &OwnedFd {
        &self.0
    }

    /// Rings it (adds one to the counter; never blocks, and a full counter is rung already).
    pub fn ring(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to an fd we own.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Resets the counter; true if it had been rung since the last reset.
    pub fn clear(&self) -> bool {
        let mut buf = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live buffer from a non-blocking fd we own.
        let n = unsafe { libc::read(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        n == 8
    }
}

/// Raw view of one ring inside a mapped control segment.
#[derive(Clone, Copy)]
struct RingPtr {
    header: *const RingHeader,
    slots: *mut u8,
    geo: RingGeometry,
}

// SAFETY: the pointers refer to a shared mapping that outlives every RingPtr (the channel owns the
// control segment), and all shared words are accessed through atomics or whole-slot copies that
// the SPSC protocol orders.
unsafe impl Send for RingPtr {}
// SAFETY: as above.
unsafe impl Sync for RingPtr {}

impl RingPtr {
    fn header(&self) -> &RingHeader {
        // SAFETY: `header` points at an initialised, aligned RingHeader inside a live mapping.
        unsafe { &*self.header }
    }

    fn slot(&self, index: u32) -> *mut u8 {
        let i = (index & (self.geo.slot_count - 1)) as usize;
        // SAFETY: i < slot_count, so the slot lies inside the slots area.
        unsafe { self.slots.add(i * self.geo.slot_size as usize) }
    }
}

/// The producing half of a ring. Exactly one exists per ring, in one process.
pub struct Producer {
    ring: RingPtr,
    head: u32,
    seq: u32,
    policy: WaitPolicy,
    hot: bool,
    /// A message was published without waking the consumer, which may be asleep on it.
    unwoken: bool,
    /// Rung instead of the futex when the consumer waits with [`WAITING_DOORBELL`].
    doorbell: Option<Doorbell>,
}

/// The consuming half of a ring. Exactly one exists per ring, in one process.
pub struct Consumer {
    ring: RingPtr,
    tail: u32,
    policy: WaitPolicy,
    hot: bool,
    /// Waits that began with the ring empty and spinning allowed (tests check who spins).
    #[cfg(test)]
    pub(crate) spun: u32,
}

/// Initialises a ring header in fresh (zeroed) shared memory.
///
/// # Safety
/// `header` must point to writable memory of at least [`RING_HEADER_SIZE`] bytes, 64-aligned.
pub(crate) unsafe fn init_header(header: *mut RingHeader) {
    // SAFETY: guaranteed by the caller; an all-zero RingHeader is a valid empty ring.
    unsafe { std::ptr::write_bytes(header as *mut u8, 0, RING_HEADER_SIZE) };
}

/// Builds the two halves' views of a ring.
///
/// # Safety
/// `header` and `slots` must point into a mapping that outlives the returned values and was laid
/// out for `geo`.
pub(crate) unsafe fn attach(
    header: *const RingHeader,
    slots: *mut u8,
    geo: RingGeometry,
    policy: WaitPolicy,
) -> (Producer, Consumer) {
    let ring = RingPtr { header, slots, geo };
    let h = ring.header();
    let head = h.head.load(Ordering::Acquire);
    let tail = h.tail.load(Ordering::Acquire);
    (
        Producer { ring, head, seq: 0, policy, hot: true, unwoken: false, doorbell: None },
        Consumer {
            ring,
            tail,
            policy,
            hot: true,
            #[cfg(test)]
            spun: 0,
        },
    )
}

/// Marks a ring closed and wakes both its consumer (sleeping on `head`) and its producer
/// (sleeping on `tail` for room), for when the process at the other end is known to be gone.
///
/// # Safety
/// `header` must point to a live, initialised ring header.
pub(crate) unsafe fn interrupt(header: *const RingHeader, doorbell: Option<&Doorbell>) {
    // SAFETY: guaranteed by the caller.
    let h = unsafe { &*header };
    h.closed.store(1, Ordering::Release);
    futex::wake(&h.head, 1);
    futex::wake(&h.tail, 1);
    if let Some(bell) = doorbell {
        bell.ring();
    }
}

/// Spins (if `hot`), then sleeps on `word` until `ready()` holds, `closed` is set, or `timeout`
/// passes. Leaves `hot` set when the wait was no longer than the spin budget. A wait that times
/// out before the budget is up (a look with a zero timeout, as the stub's heartbeat pump takes)
/// says nothing about how soon the peer answers and leaves `hot` as it was.
fn wait_for(
    word: &AtomicU32,
    waiting: &AtomicU32,
    closed: &AtomicU32,
    policy: WaitPolicy,
    timeout: Duration,
    hot: &mut bool,
    mut ready: impl FnMut() -> bool,
) -> Result<(), IpcError> {
    if ready() {
        *hot = true;
        return Ok(());
    }
    let start = Instant::now();
    let spin = if *hot { policy.spin.min(timeout) } else { Duration::ZERO };
    if !spin.is_zero() {
        let until = start + spin;
        loop {
            for _ in 0..64 {
                if ready() {
                    return Ok(());
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= until {
                break;
            }
            // Let any runnable thread have the core: on a busy machine spinning must not delay
            // the threads that produce what we wait for.
            std::thread::yield_now();
        }
    }
    let result = sleep_until_ready(word, waiting, closed, policy, timeout, start + timeout, &mut ready);
    match result {
        Ok(()) => *hot = start.elapsed() <= policy.spin,
        Err(IpcError::Timeout(_)) if timeout < policy.spin => {}
        Err(_) => *hot = false,
    }
    result
}

fn sleep_until_ready(
    word: &AtomicU32,
    waiting: &AtomicU32,
    closed: &AtomicU32,
    policy: WaitPolicy,
    timeout: Duration,
    deadline: Instant,
    ready: &mut impl FnMut() -> bool,
) -> Result<(), IpcError> {
    loop {
        let observed = word.load(Ordering::Acquire);
        waiting.store(WAITING_FUTEX, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if ready() {
            waiting.store(0, Ordering::Relaxed);
            return Ok(());
        }
        if closed.load(Ordering::Acquire) != 0 {
            waiting.store(0, Ordering::Relaxed);
            return Err(IpcError::Closed);
        }
        let now = Instant::now();
        if now >= deadline {
            waiting.store(0, Ordering::Relaxed);
            return Err(IpcError::Timeout(timeout));
        }
        futex::wait(word, observed, (deadline - now).min(policy.slice));
        waiting.store(0, Ordering::Relaxed);
        if ready() {
            return Ok(());
        }
    }
}

impl Producer {
    /// Largest message this ring can carry.
    pub fn capacity(&self) -> usize {
        self.ring.geo.payload() * self.ring.geo.slot_count as usize
    }

    /// Slots free right now (none when the peer's `tail` is out of range).
    pub fn free_slots(&self) -> u32 {
        let count = self.ring.geo.slot_count;
        let used = self.head.wrapping_sub(self.ring.header().tail.load(Ordering::Acquire));
        count.saturating_sub(used)
    }

    /// The slots a message of `len` bytes takes.
    pub fn slots_for(&self, len: usize) -> u32 {
        len.div_ceil(self.ring.geo.payload()).max(1).try_into().unwrap_or(u32::MAX)
    }

    /// The ring's number of slots.
    pub fn slot_count(&self) -> u32 {
        self.ring.geo.slot_count
    }

    /// Publishes one message. Waits up to `timeout` for room; wakes the consumer only if it sleeps
    /// and `wake` is set (a lazy message is picked up with the next one). A producer that must
    /// wait for room first wakes a consumer left asleep by lazy messages, which would otherwise
    /// never make the room.
    pub fn send(&mut self, kind: u16, payload: &[u8], wake: bool, timeout: Duration) -> Result<(), IpcError> {
        let geo = self.ring.geo;
        let per = geo.payload();
        let need = payload.len().div_ceil(per).max(1);
        if need > geo.slot_count as usize || payload.len() > u32::MAX as usize {
            return Err(IpcError::TooLarge { len: payload.len(), capacity: self.capacity() });
        }
        let need = need as u32;
        let ring = self.ring;
        let h = ring.header();
        let head = self.head;
        let count = geo.slot_count;
        // `used` comes from the peer's `tail`: a value that puts it ahead of our head (more than
        // `count` slots in use) is a protocol violation, reported rather than computed with.
        let used = |tail: u32| head.wrapping_sub(tail);
        let room = || {
            let used = used(h.tail.load(Ordering::Acquire));
            used > count || count - used >= need
        };
        if self.unwoken && !room() {
            self.wake_consumer();
        }
        wait_for(&h.tail, &h.producer_waiting, &h.closed, self.policy, timeout, &mut self.hot, room)?;
        let in_use = used(h.tail.load(Ordering::Acquire));
        if in_use > count {
            return Err(IpcError::Protocol(format!("ring tail ran ahead of head ({in_use} slots in use of {count})")));
        }
        self.seq = self.seq.wrapping_add(1);
        for i in 0..need {
            let slot = self.ring.slot(head.wrapping_add(i));
            let header = if i == 0 {
                SlotHeader { len: payload.len() as u32, kind, slots: need as u16, seq: self.seq, reserved: 0 }
            } else {
                SlotHeader { len: 0, kind, slots: 0, seq: self.seq, reserved: i }
            };
            let start = i as usize * per;
            let chunk = &payload[start.min(payload.len())..(start + per).min(payload.len())];
            // SAFETY: the slot is free (checked above), lies inside the ring and holds
            // SLOT_HEADER_SIZE + payload bytes; only this producer writes free slots.
            unsafe {
                std::ptr::copy_nonoverlapping(header.as_bytes().as_ptr(), slot, SLOT_HEADER_SIZE);
                std::ptr::copy_nonoverlapping(chunk.as_ptr(), slot.add(SLOT_HEADER_SIZE), chunk.len());
            }
        }
        self.head = head.wrapping_add(need);
        h.head.store(self.head, Ordering::Release);
        fence(Ordering::SeqCst);
        if wake {
            self.wake_consumer();
        } else {
            self.unwoken = true;
        }
        Ok(())
    }

    /// Sets the doorbell rung for a consumer that waits with [`Consumer::arm_doorbell`].
    pub fn set_doorbell(&mut self, doorbell: Doorbell) {
        self.doorbell = Some(doorbell);
    }

    /// Wakes the consumer if it sleeps (everything published so far is then its to read).
    fn wake_consumer(&mut self) {
        self.unwoken = false;
        self.wake_waiting();
    }

    fn wake_waiting(&self) {
        let h = self.ring.header();
        match (h.consumer_waiting.load(Ordering::Relaxed), &self.doorbell) {
            (0, _) => {}
            (WAITING_DOORBELL, Some(bell)) => bell.ring(),
            _ => {
                futex::wake(&h.head, 1);
            }
        }
    }

    /// Marks the ring closed and wakes a sleeping consumer.
    pub fn close(&self) {
        let h = self.ring.header();
        h.closed.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        futex::wake(&h.head, 1);
        futex::wake(&h.tail, 1);
        self.wake_waiting();
    }
}

impl Consumer {
    /// Receives the next message into `buf` (cleared first) and returns its frame kind, waiting up
    /// to `timeout`. Every field the producer wrote is checked before use.
    pub fn recv(&mut self, buf: &mut Vec<u8>, timeout: Duration) -> Result<u16, IpcError> {
        let h = self.ring.header();
        let tail = self.tail;
        #[cfg(test)]
        if self.hot && !self.policy.spin.is_zero() && h.head.load(Ordering::Acquire) == tail {
            self.spun += 1;
        }
        match wait_for(&h.head, &h.consumer_waiting, &h.closed, self.policy, timeout, &mut self.hot, || {
            h.head.load(Ordering::Acquire) != tail
        }) {
            Ok(()) => {}
            // Drain whatever was published before the close.
            Err(IpcError::Closed) if h.head.load(Ordering::Acquire) != tail => {}
            Err(e) => return Err(e),
        }
        self.read(buf)
    }

    /// Whether the next wait spins: its last wait ended within the spin budget.
    pub(crate) fn hot(&self) -> bool {
        self.hot
    }

    /// Overrides [`Consumer::hot`], for a caller whose wait spans several messages.
    pub(crate) fn set_hot(&mut self, hot: bool) {
        self.hot = hot;
    }

    /// The longest a wait spins.
    pub(crate) fn spin_budget(&self) -> Duration {
        self.policy.spin
    }

    /// Receives the next message if one is published now, never waiting or spinning: `None`
    /// when the ring is empty, `Err(Closed)` when it is empty and closed.
    pub fn try_recv(&mut self, buf: &mut Vec<u8>) -> Result<Option<u16>, IpcError> {
        let h = self.ring.header();
        if h.head.load(Ordering::Acquire) == self.tail {
            if h.closed.load(Ordering::Acquire) != 0 && h.head.load(Ordering::Acquire) == self.tail {
                return Err(IpcError::Closed);
            }
            return Ok(None);
        }
        self.read(buf).map(Some)
    }

    /// Whether a message or the close is there to receive now (no wait, no spin).
    pub fn ready(&self) -> bool {
        let h = self.ring.header();
        h.head.load(Ordering::Acquire) != self.tail || h.closed.load(Ordering::Acquire) != 0
    }

    /// Asks the producer to ring its doorbell (not the futex) when it next publishes or closes,
    /// for a consumer about to wait on the doorbell's eventfd. False, with the request withdrawn,
    /// when a message or the close is already there: receive instead of waiting.
    pub fn arm_doorbell(&self) -> bool {
        let h = self.ring.header();
        h.consumer_waiting.store(WAITING_DOORBELL, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if h.head.load(Ordering::Acquire) != self.tail || h.closed.load(Ordering::Acquire) != 0 {
            h.consumer_waiting.store(0, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Withdraws [`Consumer::arm_doorbell`]'s request: the consumer is awake.
    pub fn disarm_doorbell(&self) {
        self.ring.header().consumer_waiting.store(0, Ordering::Relaxed);
    }

    /// Reads the published message at `tail`.
    fn read(&mut self, buf: &mut Vec<u8>) -> Result<u16, IpcError> {
        let h = self.ring.header();
        let tail = self.tail;
        let geo = self.ring.geo;
        let available = h.head.load(Ordering::Acquire).wrapping_sub(tail);
        if available > geo.slot_count {
            return Err(IpcError::Protocol(format!("ring head ran {available} slots ahead of tail")));
        }
        let mut first = [0u8; SLOT_HEADER_SIZE];
        // SAFETY: the slot lies inside the ring and was published (Acquire on head above).
        unsafe { std::ptr::copy_nonoverlapping(self.ring.slot(tail), first.as_mut_ptr(), SLOT_HEADER_SIZE) };
        let header = SlotHeader::read_from_bytes(&first).map_err(|_| IpcError::Protocol("short slot header".into()))?;
        let per = geo.payload();
        let len = header.len as usize;
        let need = len.div_ceil(per).max(1);
        if header.slots as usize != need || need as u32 > available {
            return Err(IpcError::Protocol(format!(
                "slot header claims {} bytes in {} slots with {available} published",
                header.len, header.slots
            )));
        }
        buf.clear();
        buf.reserve(len);
        for i in 0..need {
            let slot = self.ring.slot(tail.wrapping_add(i as u32));
            let n = (len - i * per).min(per);
            // SAFETY: the slot is published and inside the ring; `n <= per` bytes of payload follow
            // its header; `buf` has capacity for `len` bytes and we copy exactly `len` in total.
            unsafe {
                std::ptr::copy_nonoverlapping(slot.add(SLOT_HEADER_SIZE), buf.as_mut_ptr().add(buf.len()), n);
                buf.set_len(buf.len() + n);
            }
        }
        self.tail = tail.wrapping_add(need as u32);
        h.tail.store(self.tail, Ordering::Release);
        fence(Ordering::SeqCst);
        if h.producer_waiting.load(Ordering::Relaxed) != 0 {
            futex::wake(&h.tail, 1);
        }
        Ok(header.kind)
    }

    /// True when the producer closed the ring and everything published has been consumed.
    pub fn is_closed(&self) -> bool {
        let h = self.ring.header();
        h.closed.load(Ordering::Acquire) != 0 && h.head.load(Ordering::Acquire) == self.tail
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(geo: RingGeometry) -> (crate::segment::Segment, Producer, Consumer) {
        ring_with(geo, WaitPolicy::default())
    }

    fn ring_with(geo: RingGeometry, policy: WaitPolicy) -> (crate::segment::Segment, Producer, Consumer) {
        let seg = crate::segment::Segment::create("ring-test", (RING_HEADER_SIZE + geo.slots_bytes()) as u64)
            .expect("segment");
        let base = seg.as_ptr();
        // SAFETY: the fresh page-aligned mapping holds the header and the slots and outlives the
        // halves within each test.
        let (p, c) = unsafe {
            init_header(base as *mut RingHeader);
            attach(base as *const RingHeader, base.add(RING_HEADER_SIZE), geo, policy)
        };
        (seg, p, c)
    }

    #[test]
    fn messages_of_every_length_round_trip_in_order() {
        let geo = RingGeometry { slot_size: 128, slot_count: 8 };
        let (_mem, mut p, mut c) = ring(geo);
        let mut buf = Vec::new();
        for len in [0usize, 1, 111, 112, 113, 500, 896] {
            let msg: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            p.send(FRAME_APP, &msg, true, Duration::from_secs(1)).expect("send");
            assert_eq!(c.recv(&mut buf, Duration::from_secs(1)).expect("recv"), FRAME_APP);
            assert_eq!(buf, msg, "length {len}");
        }
    }

    #[test]
    fn lazy_messages_that_fill_the_ring_wake_a_sleeping_consumer() {
        // The consumer never spins and sleeps in one long slice: only a wake gets it to read.
        let policy = WaitPolicy { spin: Duration::ZERO, slice: Duration::from_secs(120) };
        let geo = RingGeometry { slot_size: 128, slot_count: 4 };
        let (mem, mut p, mut c) = ring_with(geo, policy);
        let total = 3 * geo.slot_count as usize;
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for _ in 0..total {
                c.recv(&mut buf, Duration::from_secs(120)).expect("recv");
                got.push(buf[0]);
            }
            got
        });
        // SAFETY: the segment starts with the ring's header and outlives this test.
        let header = unsafe { &*(mem.as_ptr() as *const RingHeader) };
        while header.consumer_waiting.load(Ordering::Acquire) == 0 {
            std::thread::yield_now();
        }
        // Lazy sends only: once the ring is full, the producer must wake the consumer to make room
        // (else its send times out while the consumer sleeps on).
        for i in 0..total {
            p.send(FRAME_APP, &[i as u8], false, Duration::from_secs(10)).expect("lazy send");
        }
        p.send(FRAME_APP, &[0xff], true, Duration::from_secs(10)).expect("the last one wakes");
        let got = reader.join().expect("reader");
        assert_eq!(got, (0..total as u8).collect::<Vec<_>>());
        drop(mem);
    }

    #[test]
    fn a_consumer_whose_messages_come_300_us_apart_stops_spinning() {
        // 2,500 requests/s offered to a stub that spends about 100 us on each leaves it 300 us
        // of waiting between them: with the 500 us budget it spun through all of it, tripling
        // the CPU per request (462 against 153 us, add_sub over gRPC), for that request's
        // latency only. A client waiting for each answer comes back in about 70 us.
        let geo = RingGeometry { slot_size: 128, slot_count: 4 };
        let (_mem, mut p, mut c) = ring(geo);
        assert!(crate::spin::SPIN_BUDGET < Duration::from_micros(300), "{:?}", crate::spin::SPIN_BUDGET);
        let mut buf = Vec::new();
        p.send(FRAME_APP, b"first", true, Duration::from_secs(1)).expect("send");
        c.recv(&mut buf, Duration::from_secs(1)).expect("recv");
        assert!(c.hot(), "a message that was there keeps the consumer hot");
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_micros(300));
            p.send(FRAME_APP, b"later", true, Duration::from_secs(1)).expect("send");
            p
        });
        c.recv(&mut buf, Duration::from_secs(1)).expect("recv");
        let _p = sender.join().expect("sender");
        assert!(!c.hot(), "a 300 us wait left the consumer spinning on its next one");
    }

    #[test]
    fn oversized_message_is_refused() {
        let geo = RingGeometry { slot_size: 128, slot_count: 4 };
        let (_mem, mut p, _c) = ring(geo);
        let err = p.send(FRAME_APP, &[0; 449], true, Duration::from_millis(10)).expect_err("too large");
        assert!(matches!(err, IpcError::TooLarge { .. }));
    }

    #[test]
    fn full_ring_times_out_then_drains() {
        let geo = RingGeometry { slot_size: 128, slot_count: 2 };
        let (_mem, mut p, mut c) = ring(geo);
        p.send(FRAME_APP, b"a", true, Duration::from_millis(10)).expect("1");
        p.send(FRAME_APP, b"b", true, Duration::from_millis(10)).expect("2");
        assert!(matches!(p.send(FRAME_APP, b"c", true, Duration::from_millis(10)), Err(IpcError::Timeout(_))));
        let mut buf = Vec::new();
        c.recv(&mut buf, Duration::from_millis(10)).expect("recv");
        assert_eq!(buf, b"a");
        p.send(FRAME_APP, b"c", true, Duration::from_millis(10)).expect("3");
    }

    #[test]
    fn empty_ring_times_out_and_close_is_seen() {
        let geo = RingGeometry { slot_size: 128, slot_count: 2 };
        let (_mem, p, mut c) = ring(geo);
        let mut buf = Vec::new();
        assert!(matches!(c.recv(&mut buf, Duration::from_millis(5)), Err(IpcError::Timeout(_))));
        p.close();
        assert!(matches!(c.recv(&mut buf, Duration::from_millis(5)), Err(IpcError::Closed)));
        assert!(c.is_closed());
    }

    #[test]
    fn corrupt_slot_header_is_a_protocol_error() {
        let geo = RingGeometry { slot_size: 128, slot_count: 4 };
        let (mem, mut p, mut c) = ring(geo);
        p.send(FRAME_APP, b"hello", true, Duration::from_millis(10)).expect("send");
        // Overwrite the first slot's length with garbage, as a buggy peer might.
        let base = mem.as_ptr();
        // SAFETY: inside the segment.
        unsafe { (base.add(RING_HEADER_SIZE) as *mut u32).write_unaligned(100_000) };
        let mut buf = Vec::new();
        assert!(matches!(c.recv(&mut buf, Duration::from_millis(10)), Err(IpcError::Protocol(_))));
    }

    #[test]
    fn a_tail_written_ahead_of_head_is_a_protocol_error() {
        let geo = RingGeometry { slot_size: 128, slot_count: 4 };
        let (mem, mut p, _c) = ring(geo);
        // The consumer's `tail` word (second cache line of the header), set past the head as a
        // malicious peer could.
        // SAFETY: inside the header at the start of the segment.
        unsafe { (mem.as_ptr().add(64) as *mut u32).write_volatile(1000) };
        let err = p.send(FRAME_APP, b"x", true, Duration::from_millis(10)).expect_err("tail ahead");
        assert!(matches!(err, IpcError::Protocol(_)), "{err}");
    }

    #[test]
    fn threads_exchange_many_messages() {
        let geo = RingGeometry { slot_size: 256, slot_count: 16 };
        let (_mem, mut p, mut c) = ring(geo);
        let t = std::thread::spawn(move || {
            for i in 0u32..20_000 {
                let len = (i % 700) as usize;
                let msg = vec![(i % 251) as u8; len];
                p.send(FRAME_APP, &msg, true, Duration::from_secs(10)).expect("send");
            }
        });
        let mut buf = Vec::new();
        for i in 0u32..20_000 {
            c.recv(&mut buf, Duration::from_secs(10)).expect("recv");
            assert_eq!(buf.len(), (i % 700) as usize);
            assert!(buf.iter().all(|&b| b == (i % 251) as u8));
        }
        t.join().expect("producer");
    }
}
