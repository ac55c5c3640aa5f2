//! Run to completion: an instance of a model that has no sequence batcher is served by a task on
//! the server's async runtime instead of by its worker thread. This file serves models that are
//! not decoupled; `lane/stream.rs` serves decoupled ones with the same doorbell and timers.
//!
//! The task takes a batch from the queue when a request is pushed (the queue notifies the
//! longest idle task, so idle instances take requests in turn: [`crate::scheduler::Lane`]), places
//! its inputs, sends its `Execute`, and waits for the stub's answer on the channel's doorbell: an
//! eventfd the stub writes instead of waking a futex while the server waits this way
//! (`Channel::arm_doorbell`), which the runtime polls like a socket. The request's frontend task,
//! the queue, the placement and the answer all run on one runtime thread, so a request costs
//! two wake-ups (the runtime wakes the stub, the stub wakes the runtime) instead of four (the
//! runtime wakes the instance thread, which wakes the stub, which wakes the thread, which wakes
//! the runtime). The steps of a batch are the worker thread's own ([`place_inputs`](super::batch::place_inputs),
//! [`answer_batch`](super::batch::answer_batch)), and so is pipelining: the same [`Ring`] and its
//! rules (`pipeline.rs`), only sending and waiting done here.
//!
//! The supervisor task starts the stub, hands it to [`serve`] and awaits the lane's task until it
//! ends with a [`Served`], then finalizes, restarts or gives up. Nothing
//! here blocks the runtime for long: a send waits for room by sleeping on a timer, never on the
//! futex, and the stub's death reaches the task through the doorbell (its watcher interrupts the
//! channel, which rings it) and the queue's notification.

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tracing::{error, Instrument};
use tritium_host::{HostError, Stub, LIVENESS_SLICE, WATCH_SLICE};
use tritium_ipc::{Doorbell, ToServer, ToStub};
use tritium_sync::Locked;

use super::pipeline::Event;
use super::{
    died_idle, gate, prepare_batch, served_by_task, take_ready, Head, Instance, Ring, Running, Served, Step,
    VersionContext,
};
use crate::off_runtime;
use crate::scheduler::{Lane, TryNext};

mod stream;

/// How long a send waits for room in the stub's ring, in timer ticks of [`SEND_RETRY`], before
/// the stub counts as hung (a stub reads its ring from a thread of its own; a full ring means
/// it stopped).
const SEND_PATIENCE: Duration = Duration::from_secs(30);
/// How often a send that found the ring full tries again.
const SEND_RETRY: Duration = Duration::from_micros(200);

/// Whether `ctx`'s instances are served on the runtime: models without a sequence batcher
/// (those stay on their worker threads, which block in the sequence slots), decoupled or not
/// ([`stream`]), when a runtime is there and `--run-to-completion` is on.
pub(super) fn eligible(ctx: &VersionContext) -> bool {
    ctx.settings.run_to_completion && !ctx.queue.is_sequenced() && ctx.runtime.is_some()
}

/// Serves `stub` from a task on the runtime until the queue closes, a restart is asked for, or
/// the stub dies; the supervisor awaits it.
pub(super) async fn serve(ctx: &Arc<VersionContext>, instance: &Arc<Instance>, stub: &Arc<Stub>) -> Served {
    let Some(runtime) = ctx.runtime.clone() else {
        let (c, i, s) = (ctx.clone(), instance.clone(), stub.clone());
        return super::blocking(ctx, move || super::serve(&c, &i, &s)).await;
    };
    let (c, i, s) = (ctx.clone(), instance.clone(), stub.clone());
    let task = runtime.spawn(
        async move {
            let served = match Bell::new(&s).and_then(|bell| Ok((bell, Timer::new()?))) {
                Ok((bell, timer)) => run(&c, &i, &s, &bell, &timer).await,
                Err(e) => {
                    let exit = off_runtime(|| s.kill());
                    Served::Died(format!("cannot wait for the stub on the runtime: {e}"), exit)
                }
            };
            // The supervisor may drop or restart the stub once it has the answer.
            i.inflight.store(0, Ordering::Relaxed);
            drop(s);
            served
        }
        .instrument(tracing::Span::current()),
    );
    served_by_task(task.await, instance, stub)
}

/// The runtime's side of a stub's doorbell.
struct Bell {
    /// A duplicate of the eventfd, registered with the runtime.
    fd: AsyncFd<OwnedFd>,
    /// The eventfd itself, for resetting it.
    doorbell: Doorbell,
    /// Ends waits that pass their limit. Not tokio's timer: registering a tokio timer that
    /// expires sooner than the runtime's next wake-up makes the runtime wake itself (a write to
    /// its eventfd and one more `epoll_wait`), which a timeout per wait did on every request.
    watch: Timer,
    /// Whether the runtime's spin ([`park_spin`]) has been paying for this stub: its last batch
    /// ended within twice the spin budget of the lane's wait. A batch that runs longer than the
    /// budget is never caught by a spin, and its wait is not listed for one: a model whose
    /// `execute` takes 80 us had the worker spin its whole budget for nothing on every request.
    spin_pays: AtomicBool,
    /// When the stub's last batch ended: a batch that comes to an idle stub long after it
    /// ([`SPIN_GAP`]) is waited for without the spin (see [`Bell::wait_executing`]).
    last_end: std::sync::Mutex<Option<Instant>>,
}

/// The longest a stub may have been idle before a batch for the runtime to spin for that batch:
/// the stub's spin budget under `--stub-spin-us auto` (`tritium_ipc::spin::SPIN_BUDGET`; a
/// budget set by the flag does not move it). Requests that follow their
/// predecessors' answers this closely come from clients that wait for those answers (a client
/// at concurrency 1, a pipeline), where the wake-up the spin saves is on the path of the next
/// request too. Requests that come further apart (an offered load of 1,000 or 2,500 requests/s,
/// each client on its own clock) gain only that request's latency from a spin, at up to the
/// budget's CPU each: at 1,000 add_sub requests/s over gRPC the spin was a third of the server's
/// CPU (perf, with a 100 us budget).
const SPIN_GAP: Duration = tritium_ipc::spin::SPIN_BUDGET;

impl Bell {
    fn new(stub: &Stub) -> std::io::Result<Self> {
        let Some(doorbell) = stub.channel().doorbell().cloned() else {
            return Err(std::io::Error::other("the channel has no doorbell"));
        };
        let dup = doorbell.fd().as_fd().try_clone_to_owned()?;
        // SAFETY: `dup` is an open fd this AsyncFd owns; it stays open, on the same eventfd,
        // until the AsyncFd drops it.
        let fd = unsafe { AsyncFd::register_with_interest(dup, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self {
            fd,
            doorbell,
            watch: Timer::new()?,
            spin_pays: AtomicBool::new(true),
            last_end: std::sync::Mutex::new(None),
        })
    }

    /// [`Bell::wait`] for a stub that executes a batch: while it waits, the runtime's worker
    /// about to park spins briefly on the stub's ring first ([`park_spin`]), unless spinning has
    /// not been paying for this stub ([`Bell::batch_ended`]) or the batch came to a stub idle
    /// for longer than [`SPIN_GAP`] (`since`: when the lane began to wait for it).
    async fn wait_executing(&self, stub: &Stub, limit: Duration, since: Instant) -> bool {
        let _listed = self.spins_for(since).then(|| Executing::list(stub, since));
        self.wait(stub, limit).await
    }

    /// Whether the wait for a batch the lane began to wait for at `since` is listed for the spin.
    fn spins_for(&self, since: Instant) -> bool {
        if !self.spin_pays.load(Ordering::Relaxed) {
            return false;
        }
        came_soon(*self.last_end.locked(), since)
    }

    /// A batch ended `waited` after its lane began to wait for it. Within the spin budget, a
    /// spin would have caught its end (or did); a lane whose worker slept sees the end a wake-up
    /// later, which costs about the budget (auto sets the budget to the wake-up's cost), hence
    /// twice the budget. Longer: its next batch is waited for without a spin, and the batch after
    /// a quick one with.
    fn batch_ended(&self, waited: Duration) {
        let budget = Duration::from_nanos(PARK_SPIN_NS.load(Ordering::Relaxed));
        self.spin_pays.store(waited <= budget * 2, Ordering::Relaxed);
        *self.last_end.locked() = Some(Instant::now());
    }

    /// Waits up to `limit` for the stub to send something (or for its channel to be
    /// interrupted): true when there may be something to read, false when the wait's time
    /// passed. That time is the watch timer's deadline when one within `limit` is armed already
    /// (a wait may end sooner than `limit`, never later), so that waits in quick succession, one
    /// or two per request, arm it once per slice rather than once each.
    async fn wait(&self, stub: &Stub, limit: Duration) -> bool {
        let Some(_armed) = Armed::arm(stub) else {
            // Something is there already; let the runtime's other tasks run first (a stub that
            // sends without pause must not hold the runtime thread).
            tokio::task::yield_now().await;
            return true;
        };
        let rung = async {
            loop {
                let Ok(mut ready) = self.fd.readable().await else { return };
                let was_rung = self.doorbell.clear();
                ready.clear_ready();
                if was_rung {
                    return;
                }
            }
        };
        let deadline = self.watch.armed_within(limit);
        tokio::select! {
            biased;
            () = rung => true,
            () = self.watch.sleep_until(deadline) => false,
        }
    }
}

/// Whether a batch whose lane began to wait at `since` came within [`SPIN_GAP`] of the end of
/// the stub's previous batch (`last_end`; none yet counts as soon).
fn came_soon(last_end: Option<Instant>, since: Instant) -> bool {
    last_end.is_none_or(|end| since.saturating_duration_since(end) <= SPIN_GAP)
}

/// The stubs executing a batch whose lane waits for it on its doorbell, each with the time its
/// lane began to wait for that batch; `LISTED` counts them, for a look without the lock.
static EXECUTING: std::sync::Mutex<Vec<(Arc<tritium_ipc::ServerChannel>, Instant)>> = std::sync::Mutex::new(Vec::new());
static LISTED: AtomicUsize = AtomicUsize::new(0);
/// [`park_spin`]'s budget, for [`Bell::batch_ended`].
static PARK_SPIN_NS: AtomicU64 = AtomicU64::new(0);
/// Whether a worker is in [`park_spin`]'s loop: one spinner is enough for every listed stub.
static SPINNING: AtomicBool = AtomicBool::new(false);

/// A stub listed in [`EXECUTING`] while its lane waits; unlisted when dropped.
struct Executing(Arc<tritium_ipc::ServerChannel>);

impl Executing {
    fn list(stub: &Stub, since: Instant) -> Self {
        let channel = stub.channel().clone();
        let mut listed = EXECUTING.locked();
        listed.push((channel.clone(), since));
        LISTED.store(listed.len(), Ordering::Release);
        Self(channel)
    }
}

impl Drop for Executing {
    fn drop(&mut self) {
        let mut listed = EXECUTING.locked();
        if let Some(i) = listed.iter().position(|(c, _)| Arc::ptr_eq(c, &self.0)) {
            listed.swap_remove(i);
        }
        LISTED.store(listed.len(), Ordering::Release);
    }
}

/// Called by a runtime worker about to park (sleep in `epoll_wait` until its next event): while
/// a lane waits for a stub that executes a batch, the worker spins until one of those stubs has
/// sent something, for at most `budget` after the latest of them began (ski rental: a batch
/// that runs longer than a wake-up costs is slept through, however often the worker parks). The
/// stub's doorbell is rung by then, so the park finds its eventfd readable and returns at once,
/// without the sleep and the wake-up of a second CPU. One worker spins at a time, and it yields
/// its CPU to any other runnable thread as it goes.
pub fn park_spin(budget: Duration) {
    PARK_SPIN_NS.store(u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    if budget.is_zero() || LISTED.load(Ordering::Acquire) == 0 {
        return;
    }
    if SPINNING.swap(true, Ordering::AcqRel) {
        return;
    }
    let mut yields = Instant::now();
    loop {
        let listed = EXECUTING.locked();
        let until = spin_until(listed.iter().map(|(c, since)| (c.ready(), *since)), budget);
        drop(listed);
        let Some(until) = until else { break };
        let now = Instant::now();
        if now >= until {
            break;
        }
        if now.duration_since(yields) >= PARK_YIELD_EVERY {
            std::thread::yield_now();
            yields = now;
        } else {
            std::hint::spin_loop();
        }
    }
    SPINNING.store(false, Ordering::Release);
}

/// Until when [`park_spin`] spins for the listed stubs, each `(whether it sent something, when
/// its lane began to wait)`: `budget` after the latest began, or not at all once one has sent
/// something (or none is listed).
fn spin_until(listed: impl Iterator<Item = (bool, Instant)>, budget: Duration) -> Option<Instant> {
    let mut latest = None;
    for (ready, since) in listed {
        if ready {
            return None;
        }
        latest = latest.max(Some(since));
    }
    latest.map(|l| l + budget)
}

/// How often [`park_spin`] yields its CPU.
const PARK_YIELD_EVERY: Duration = Duration::from_micros(10);

/// The doorbell armed; disarmed when dropped (also when the wait is abandoned in a `select!`).
struct Armed<'a>(&'a Stub);

impl<'a> Armed<'a> {
    /// `None` when something is there to read already.
    fn arm(stub: &'a Stub) -> Option<Self> {
        stub.channel().arm_doorbell().then_some(Self(stub))
    }
}

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        self.0.channel().disarm_doorbell();
    }
}

/// The serve loop: what the worker thread's `serve_with` does for these models, on the runtime.
async fn run(ctx: &VersionContext, instance: &Instance, stub: &Stub, bell: &Bell, timer: &Timer) -> Served {
    let lane = ctx.queue.lane();
    let on = On { ctx, instance, stub, bell };
    let served = if ctx.decoupled {
        let mut streams = stream::Streams::default();
        let served = serve_lane(&on, timer, &lane, &mut streams).await;
        streams.end(ctx, stub, &served);
        served
    } else {
        serve_lane(&on, timer, &lane, &mut Batches).await
    };
    ctx.queue.forget_lane(&lane);
    served
}

/// What a lane serves with: the version, the instance, its stub and the stub's doorbell.
struct On<'a> {
    ctx: &'a VersionContext,
    instance: &'a Instance,
    stub: &'a Stub,
    bell: &'a Bell,
}

/// What differs between the lanes of models that are not decoupled ([`Batches`]) and decoupled
/// ones ([`stream::Streams`]); the loop around them ([`serve_lane`]) is the same.
trait Serving {
    /// Runs a batch taken from the queue (its permit held, if rate limited).
    async fn run(&mut self, on: &On<'_>, batch: Vec<crate::pending::Pending>) -> Result<(), HostError>;
    /// How long an idle lane waits on the doorbell before it looks at the stub unasked.
    fn idle_wait(&self) -> Duration;
    /// Handles the end of an idle wait: `Some(rung)` when it was the doorbell's (`rung` false
    /// when its time passed), `None` when the queue's.
    async fn idle(&mut self, on: &On<'_>, rung: Option<bool>) -> Result<(), HostError>;
    /// Before a restart ends serving (`recycling`: a replacement is ready).
    async fn before_restart(&mut self, on: &On<'_>, recycling: bool) -> Result<(), HostError>;
}

/// The lane of a model that is not decoupled: batches run by the pipelining rules.
struct Batches;

impl Serving for Batches {
    async fn run(&mut self, on: &On<'_>, batch: Vec<crate::pending::Pending>) -> Result<(), HostError> {
        run_batches(on.ctx, on.instance, on.stub, on.bell, batch).await
    }

    fn idle_wait(&self) -> Duration {
        IDLE_CHECK
    }

    async fn idle(&mut self, on: &On<'_>, rung: Option<bool>) -> Result<(), HostError> {
        rung.map_or(Ok(()), |rung| idle_messages(on.stub, rung))
    }

    async fn before_restart(&mut self, _: &On<'_>, _: bool) -> Result<(), HostError> {
        Ok(())
    }
}

/// The serve loop: what the worker thread's `serve_with` does, on the runtime.
async fn serve_lane(on: &On<'_>, timer: &Timer, lane: &Lane, serving: &mut impl Serving) -> Served {
    let On { ctx, instance, stub, bell } = *on;
    loop {
        if instance.died.load(Ordering::Acquire) {
            return off_runtime(|| died_idle(stub));
        }
        if instance.restart.load(Ordering::Acquire) {
            if let Err(e) = serving.before_restart(on, instance.recycling.load(Ordering::Acquire)).await {
                let exit = off_runtime(|| stub.kill());
                return Served::Died(e.to_string(), exit);
            }
            return Served::Restart;
        }
        match ctx.queue.try_next_batch(lane) {
            TryNext::Closed => return Served::Closed,
            TryNext::Batch(batch) => {
                // Under `--rate-limit execution_count` the batch waits for the instance's resources.
                let _permit = match ctx.rate_limits.get(&instance.spec.name) {
                    Some(member) => Some(member.acquire().await.logged(&ctx.model, ctx.version, &instance.spec.name)),
                    None => None,
                };
                instance.inflight.store(batch.len() as u64, Ordering::Relaxed);
                instance.took(batch.len());
                let result = serving.run(on, batch).await;
                instance.inflight.store(0, Ordering::Relaxed);
                if let Err(e) = result {
                    error!("{e}");
                    let exit = off_runtime(|| super::kill_failed(stub, &e));
                    return Served::Died(e.to_string(), exit);
                }
            }
            TryNext::Wait(until) => {
                // A batch that gathers until `until` (its `max_queue_delay_microseconds`) is
                // looked at again then, on the kernel's timer: tokio's ticks are 1 ms, which
                // would make a 100 us delay 1-2 ms.
                // Each request that joins the batch ends this wait with the same `until`: the
                // timer stays armed for it rather than being armed again.
                let rung = tokio::select! {
                    _ = lane.notify.notified() => None,
                    rung = bell.wait(stub, serving.idle_wait()) => Some(rung),
                    () = timer.sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => None,
                };
                if let Err(e) = serving.idle(on, rung).await {
                    let exit = off_runtime(|| stub.kill());
                    return Served::Died(e.to_string(), exit);
                }
            }
        }
    }
}

/// How often an idle lane checks on its stub unasked. What the stub sends for it to handle (logs,
/// calls from model threads) rings the doorbell, and so does its exit (the watch thread's
/// interrupter), so this only takes the releases sent meanwhile, which wake nobody, and notices
/// the exit of a stub whose process could not be watched. Every 50 ms woke each idle instance of
/// the server twenty times a second.
const IDLE_CHECK: Duration = Duration::from_millis(250);

/// A one-shot timer with the kernel's precision (a timerfd polled by the runtime), for the
/// batch delays of dynamic batching, which are often shorter than tokio's 1 ms timer tick.
struct Timer {
    fd: AsyncFd<OwnedFd>,
    /// The deadline the timerfd is armed for and has not yet been seen to pass.
    armed: std::sync::Mutex<Option<Instant>>,
}

impl Timer {
    fn new() -> std::io::Result<Self> {
        // SAFETY: creates a new fd (or fails with -1); nothing else is touched.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is the open fd just created, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the AsyncFd owns `fd`, which stays open on the same timerfd until it drops it.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self { fd, armed: std::sync::Mutex::new(None) })
    }

    /// Returns once `deadline` has passed. A sleep until the deadline the timer is already armed
    /// for (one abandoned in a `select!`) waits for that expiry without a system call; another
    /// deadline arms it again, which replaces the previous expiry and clears its count.
    async fn sleep_until(&self, deadline: Instant) {
        let now = Instant::now();
        if deadline <= now {
            return;
        }
        let after = deadline - now;
        let fell_back = {
            let mut armed = self.armed.locked();
            if *armed == Some(deadline) {
                false
            } else if self.arm(after) {
                *armed = Some(deadline);
                false
            } else {
                *armed = None;
                true
            }
        };
        if fell_back {
            tokio::time::sleep(after).await;
            return;
        }
        self.expired().await;
        *self.armed.locked() = None;
    }

    /// The deadline the timer is armed for if it is still ahead and at most `limit` away,
    /// else `limit` from now.
    fn armed_within(&self, limit: Duration) -> Instant {
        let now = Instant::now();
        match *self.armed.locked() {
            Some(d) if d > now && d - now <= limit => d,
            _ => now + limit,
        }
    }

    /// Arms the timerfd to expire once, `after` from now; false if the kernel refused.
    fn arm(&self, after: Duration) -> bool {
        let value = libc::timespec {
            tv_sec: after.as_secs().try_into().unwrap_or(libc::time_t::MAX),
            tv_nsec: after.subsec_nanos().into(),
        };
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let spec = libc::itimerspec { it_interval: zero, it_value: value };
        // SAFETY: `spec` is a valid itimerspec and the fd is a timerfd this struct owns.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) == 0 }
    }

    /// Returns once the armed timerfd has expired (at once if it already has).
    async fn expired(&self) {
        loop {
            let Ok(mut ready) = self.fd.readable().await else {
                // The runtime cannot poll the fd (not in practice): a short tokio sleep instead,
                // never a spin; the caller looks at the queue again either way.
                tokio::time::sleep(Duration::from_millis(1)).await;
                return;
            };
            let mut expirations = [0u8; 8];
            // SAFETY: reads 8 bytes into a buffer of 8 from the timerfd this struct owns.
            let read = ready.try_io(|fd| {
                let n = unsafe { libc::read(fd.as_raw_fd(), expirations.as_mut_ptr().cast(), expirations.len()) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            // `Err`: not yet (a readiness left from an earlier expiry), wait again.
            if let Ok(result) = read {
                if result.is_err() {
                    // Not a timerfd read's failure in practice; never spin on one.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                return;
            }
        }
    }
}

/// Handles what an idle stub sent (logs and calls from model threads go through
/// `Stub::try_message`); anything else is a protocol error. `rung` is false when the wait
/// timed out: then the process is checked.
fn idle_messages(stub: &Stub, rung: bool) -> Result<(), HostError> {
    if let Some(other) = try_message(stub)? {
        return Err(stub.protocol_error(format!("sent {other:?} while idle")));
    }
    if !rung {
        check_alive(stub)?;
    }
    Ok(())
}

/// Runs `batch` and, while the stub executes it, the batches that are ready behind it, by the
/// rules the worker thread's `run_batches` follows ([`Ring`], `pipeline.rs`); only sending and
/// waiting are done here, on the runtime.
async fn run_batches(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    bell: &Bell,
    batch: Vec<crate::pending::Pending>,
) -> Result<(), HostError> {
    let Some(first) = start_batch(ctx, stub, batch).await? else { return Ok(()) };
    let gate = || gate(ctx, instance);
    let mut ring = Ring::new(first);
    let mut event = Event::HeadSent(gate());
    loop {
        event = match ring.step(ctx, stub, event, &gate) {
            Step::Report(event) => event,
            Step::Over(result) => return result,
            Step::SendAhead => {
                let sent = match take_ready(ctx, instance) {
                    Some(batch) => start_batch(ctx, stub, batch).await,
                    None => Ok(None),
                };
                ring.sent(sent)
            }
            Step::Wait => {
                instance.inflight.store(ring.requests() as u64, Ordering::Relaxed);
                let mut head = ring.take_head();
                let started = Instant::now();
                let completed = match &mut head {
                    Head::Sent(running) => complete(ctx, stub, bell, running).await,
                    _ => Ok(()),
                };
                ring.waited(head.end(stub, completed.map(|()| (started, Instant::now()))), gate())
            }
        }
    }
}

/// Places a batch's inputs and sends it ([`send`]); `None` when nothing was sent (every request
/// was answered already, or the batch is too large for the ring).
async fn start_batch(
    ctx: &VersionContext,
    stub: &Stub,
    batch: Vec<crate::pending::Pending>,
) -> Result<Option<Running>, HostError> {
    let Some(prepared) = prepare_batch(ctx, stub, batch) else { return Ok(None) };
    let sent = send(stub, &prepared.msg).await;
    prepared.sent(ctx, stub, sent)
}

/// Sends `msg` once the ring has room, waiting on a timer (never on the futex) up to
/// [`SEND_PATIENCE`].
async fn send(stub: &Stub, msg: &ToStub) -> Result<(), HostError> {
    let start = Instant::now();
    while !try_send(stub, msg)? {
        if start.elapsed() >= SEND_PATIENCE {
            return Err(HostError::Timeout {
                instance: stub.instance().to_string(),
                what: "make room in its ring",
                after: SEND_PATIENCE,
            });
        }
        tokio::time::sleep(SEND_RETRY).await;
    }
    Ok(())
}

/// Waits for the responses and the end of `running` (the oldest batch in the ring), up to the
/// execute timeout. Meanwhile, every [`WATCH_SLICE`], a request whose client went away gets its
/// `Cancel` (the model sees it in `is_cancelled()`), and every [`LIVENESS_SLICE`] the process
/// is checked.
async fn complete(ctx: &VersionContext, stub: &Stub, bell: &Bell, running: &mut Running) -> Result<(), HostError> {
    let start = Instant::now();
    let timeout = ctx.settings.execute_timeout;
    let mut told = HashSet::new();
    let mut checked = start;
    loop {
        while let Some(msg) = try_message(stub)? {
            if stub.batch_message(&mut running.submitted, msg)? {
                bell.batch_ended(start.elapsed());
                return Ok(());
            }
        }
        let limit = execute_wait(stub, timeout, start)?;
        if bell.wait_executing(stub, limit, start).await {
            continue;
        }
        for (id, p) in &running.placed.waiting {
            if p.tx.is_closed() && !told.contains(id) && try_send(stub, &ToStub::Cancel { request: *id })? {
                told.insert(*id);
            }
        }
        if checked.elapsed() >= LIVENESS_SLICE {
            checked = Instant::now();
            if let Err(e) = check_alive(stub) {
                // Take whatever it managed to send before dying (`e` is settled already; an error
                // here ends the drain and needs no settling).
                while let Ok(Some(msg)) = stub.try_message() {
                    if let Ok(true) = stub.batch_message(&mut running.submitted, msg) {
                        return Ok(());
                    }
                }
                return Err(e);
            }
        }
    }
}

/// How long the wait for an executing batch (sent at `start`) may last: a [`WATCH_SLICE`], or
/// what is left of the execute timeout; the timeout's error once it has passed.
fn execute_wait(stub: &Stub, timeout: Option<Duration>, start: Instant) -> Result<Duration, HostError> {
    let Some(t) = timeout else { return Ok(WATCH_SLICE) };
    let left = t.saturating_sub(start.elapsed());
    if left.is_zero() {
        return Err(HostError::Timeout { instance: stub.instance().to_string(), what: "finish execute", after: t });
    }
    Ok(WATCH_SLICE.min(left))
}

/// [`Stub::try_message`], with a dying stub's exit settled ([`settled`]).
fn try_message(stub: &Stub) -> Result<Option<ToServer>, HostError> {
    stub.try_message().map_err(|e| settled(stub, e))
}

/// [`Stub::try_send`], with a dying stub's exit settled ([`settled`]).
fn try_send(stub: &Stub, msg: &ToStub) -> Result<bool, HostError> {
    stub.try_send(msg).map_err(|e| settled(stub, e))
}

/// [`Stub::check_alive`], with a dying stub's exit settled ([`settled`]).
fn check_alive(stub: &Stub) -> Result<(), HostError> {
    stub.check_alive().map_err(|e| settled(stub, e))
}

/// The error a failed call on `stub` ends its requests with: for a stub that is exiting, how it
/// ended and its last stderr lines, which take waiting for (up to half a second for a process
/// that closed its channel and lingers), so the wait happens off the runtime's hands: the other
/// models' requests on this thread go on meanwhile.
fn settled(stub: &Stub, e: HostError) -> HostError {
    match e {
        HostError::Exiting { .. } => off_runtime(|| stub.settle(e)),
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime")
    }

    #[test]
    fn the_runtime_spins_only_for_batches_that_follow_the_last_one_closely() {
        let end = Instant::now();
        assert!(came_soon(None, end), "the first batch");
        assert!(came_soon(Some(end), end + Duration::from_micros(70)), "a client waiting for each answer");
        assert!(came_soon(Some(end), end + SPIN_GAP), "at the gap");
        // 1,000 requests/s offered: the stub idles most of a millisecond between them.
        assert!(!came_soon(Some(end), end + Duration::from_micros(800)));
        assert!(!came_soon(Some(end), end + SPIN_GAP + Duration::from_micros(1)));
    }

    #[test]
    fn the_timer_ends_its_sleeps_also_after_one_was_abandoned() {
        runtime().block_on(async {
            let timer = Timer::new().expect("a timerfd");
            timer.sleep_until(Instant::now() + Duration::from_micros(100)).await;
            timer.sleep_until(Instant::now()).await;
            // A sleep abandoned in a select! leaves the timer armed; the next one re-arms it.
            tokio::select! {
                () = timer.sleep_until(Instant::now() + Duration::from_secs(3600)) => panic!("an hour passed"),
                () = tokio::task::yield_now() => {}
            }
            let started = Instant::now();
            timer.sleep_until(started + Duration::from_millis(2)).await;
            assert!(started.elapsed() >= Duration::from_millis(2), "a sleep ends once its time has passed, not before");
        });
    }

    #[test]
    fn the_runtime_spins_for_executing_stubs_until_one_answers_or_the_budget_from_the_latest_passes() {
        let budget = Duration::from_micros(40);
        let t0 = Instant::now();
        let later = t0 + Duration::from_micros(25);
        assert_eq!(spin_until(std::iter::empty(), budget), None, "no stub executing: no spin");
        assert_eq!(spin_until([(false, t0), (false, later)].into_iter(), budget), Some(later + budget));
        assert_eq!(spin_until([(false, t0), (true, later)].into_iter(), budget), None, "one answered: stop");
        // Nothing listed: a worker about to park returns at once, whatever its budget.
        park_spin(Duration::from_secs(1));
        park_spin(Duration::ZERO);
    }

    #[test]
    fn a_wait_takes_the_armed_deadline_only_when_it_is_within_its_limit() {
        runtime().block_on(async {
            let timer = Timer::new().expect("a timerfd");
            let armed = Instant::now() + Duration::from_secs(30);
            tokio::select! {
                () = timer.sleep_until(armed) => panic!("the deadline passed at once"),
                () = tokio::task::yield_now() => {}
            }
            assert_eq!(timer.armed_within(Duration::from_secs(60)), armed, "within the limit: the armed deadline");
            let sooner = timer.armed_within(Duration::from_millis(5));
            assert!(sooner < armed, "beyond the limit: the limit from now");
            timer.sleep_until(sooner).await;
            assert!(Instant::now() < armed, "the sooner deadline re-armed the timer");
        });
    }

    #[test]
    fn a_sleep_until_the_deadline_already_armed_waits_for_that_expiry() {
        runtime().block_on(async {
            let timer = Timer::new().expect("a timerfd");
            let started = Instant::now();
            let deadline = started + Duration::from_millis(3);
            // Abandoned twice, as a gathering batch's wait is when requests join it.
            for _ in 0..2 {
                tokio::select! {
                    () = timer.sleep_until(deadline) => panic!("the deadline passed at once"),
                    () = tokio::task::yield_now() => {}
                }
            }
            timer.sleep_until(deadline).await;
            assert!(started.elapsed() >= Duration::from_millis(3), "the sleep ends at the armed deadline, not before");
            // Once it has passed, a later deadline arms the timer again.
            let again = Instant::now();
            timer.sleep_until(again + Duration::from_millis(2)).await;
            assert!(again.elapsed() >= Duration::from_millis(2), "a new deadline is armed");
        });
    }
}
