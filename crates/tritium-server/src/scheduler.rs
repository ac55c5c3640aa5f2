//! A model version's request queue, feeding its instances, with Triton's dynamic batching and
//! queue policies.
//!
//! Instance workers are OS threads that block in [`Queue::next_batch_unless`]; the async frontends push
//! into the queue and await a oneshot answer (a stream of answers for a decoupled model: [`crate::pending::Reply`]). Without `dynamic_batching` each `execute` gets one
//! request. With it, a worker gathers queued requests while their batch sizes fit
//! `max_batch_size`, and waits up to `max_queue_delay_microseconds` (counted from the oldest
//! request) for more unless it already has `max_batch_size` or a preferred batch size.
//!
//! Queue policies follow Triton's `PriorityQueue` (`scheduler_utils.cc`): one FIFO per priority
//! level, the lowest level number first; each level has its own [`Policy`]. A level holding
//! `max_queue_size` requests refuses the next one (`Exceeds maximum queue size`, UNAVAILABLE). A
//! request whose queue timeout passes is rejected (`Request timeout expired`, UNAVAILABLE, counted
//! as a `REJECTED` failure) or, with `timeout_action: DELAY`, moved behind the level's requests
//! that have not timed out and still executed. Timeouts are checked when a worker takes work, on
//! every push, and by [`Queue::expire`], which the server calls at a request's deadline so that a
//! request times out even while every instance is busy.
//!
//! Triton applies queue policies only with `dynamic_batching` (without it a request goes straight
//! to an instance and its `timeout` is not enforced); tritium does the same, and adds one bound of
//! its own: `--max-queue-size` caps every level that has no `max_queue_size` of its own, with or
//! without dynamic batching.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tritium_config::proto::model_config::SchedulingChoice;
use tritium_config::proto::{model_queue_policy, ModelConfig, ModelQueuePolicy};
use tritium_sync::Locked;

use crate::pending::{Next, Pending, Refused, CANCELLED};
use crate::sequence::Sequences;
use crate::stats::Stats;
use crate::types::{ErrorKind, InferError};

/// Triton's text for a request rejected by its queue timeout (`dynamic_batch_scheduler.cc`).
pub(crate) const TIMEOUT_EXPIRED: &str = "Request timeout expired";

/// What a worker on the async runtime gets from the queue, without waiting
/// ([`Queue::try_next_batch`]).
pub(crate) enum TryNext {
    /// Requests to execute together.
    Batch(Vec<Pending>),
    /// The queue is closed and empty.
    Closed,
    /// Nothing to run now: look again when the worker's [`Lane`] is notified or at this
    /// instant (when a forming dynamic batch's `max_queue_delay_microseconds` ends).
    Wait(Option<Instant>),
}

/// The batch dynamic batching would form from the queue now ([`Batching::scan`]).
struct Formable {
    /// How many requests from the front it takes.
    count: usize,
    /// Whether it stops gathering now ([`Batching::ends_wait`]).
    ends: bool,
    /// When its oldest request was queued.
    oldest: Instant,
    /// One of its requests' client went away.
    cancelled: bool,
}

/// Dynamic batching settings.
#[derive(Debug, Clone)]
pub(crate) struct Batching {
    pub max_batch_size: u64,
    pub preferred: Vec<u64>,
    pub max_delay: Duration,
}

impl Batching {
    /// Whether a batch of `size` stops gathering at `now`: it is full (or the next request,
    /// `more_behind`, does not fit), has a preferred size, or its oldest request, queued at
    /// `oldest`, has waited `max_queue_delay_microseconds`.
    fn ends_wait(&self, size: u64, more_behind: bool, oldest: Instant, now: Instant) -> bool {
        more_behind || size >= self.max_batch_size || self.preferred.contains(&size) || now >= oldest + self.max_delay
    }

    /// The batch the gathering worker would form from what is queued in `st` at `now`, counted
    /// without taking it; `None` when nothing is queued.
    fn scan(&self, st: &State, now: Instant) -> Option<Formable> {
        let oldest = st.front()?.enqueued;
        let (mut size, mut count, mut more_behind, mut cancelled) = (0, 0, false, false);
        for p in st.queued() {
            let n = p.batch_size.max(1);
            if size + n > self.max_batch_size {
                more_behind = true;
                break;
            }
            cancelled |= p.tx.is_closed();
            size += n;
            count += 1;
        }
        Some(Formable { count, ends: count > 0 && self.ends_wait(size, more_behind, oldest, now), oldest, cancelled })
    }
}

/// What a timed-out request does (Triton's `ModelQueuePolicy.TimeoutAction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimeoutAction {
    /// It leaves the queue with [`TIMEOUT_EXPIRED`].
    Reject,
    /// It moves behind the requests that have not timed out, and still executes.
    Delay,
}

/// Where a level's `max_queue_size` comes from, for the error text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BoundFrom {
    /// The model's config, at this field.
    Config(String),
    /// The server's `--max-queue-size`.
    Flag,
}

/// One priority level's queue policy (Triton's `ModelQueuePolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Requests the level holds at most (delayed ones included); 0: unbounded.
    pub max_queue_size: usize,
    /// Where `max_queue_size` comes from.
    pub bound_from: BoundFrom,
    /// The queue timeout of a request; `None`: none.
    pub default_timeout: Option<Duration>,
    /// Whether a request's `timeout` parameter may shorten `default_timeout`.
    pub allow_timeout_override: bool,
    /// What a timed-out request does.
    pub timeout_action: TimeoutAction,
}

impl Policy {
    /// No bound, no timeout: Triton's default.
    pub(crate) fn unbounded() -> Self {
        Self {
            max_queue_size: 0,
            bound_from: BoundFrom::Flag,
            default_timeout: None,
            allow_timeout_override: false,
            timeout_action: TimeoutAction::Reject,
        }
    }

    /// Only the server's `--max-queue-size` (0: unbounded).
    pub(crate) fn bounded_by_flag(max_queue_size: usize) -> Self {
        Self { max_queue_size, ..Self::unbounded() }
    }

    /// A config's `ModelQueuePolicy` at `field`; `flag_max` bounds it when it has no
    /// `max_queue_size` of its own.
    fn from_config(p: &ModelQueuePolicy, field: String, flag_max: usize) -> Self {
        let (max_queue_size, bound_from) = if p.max_queue_size > 0 {
            (p.max_queue_size as usize, BoundFrom::Config(field))
        } else {
            (flag_max, BoundFrom::Flag)
        };
        Self {
            max_queue_size,
            bound_from,
            default_timeout: (p.default_timeout_microseconds > 0)
                .then(|| Duration::from_micros(p.default_timeout_microseconds)),
            allow_timeout_override: p.allow_timeout_override,
            timeout_action: if p.timeout_action == model_queue_policy::TimeoutAction::Delay as i32 {
                TimeoutAction::Delay
            } else {
                TimeoutAction::Reject
            },
        }
    }

    /// A request's timeout under this policy, as Triton's `PolicyQueue::Enqueue` computes it:
    /// the request's own `timeout` counts only when overrides are allowed, and only to shorten
    /// the default (so without a `default_timeout_microseconds` there is no timeout at all).
    fn timeout_for(&self, request_timeout_us: u64) -> Option<Duration> {
        let default = self.default_timeout?;
        let own = Duration::from_micros(request_timeout_us);
        Some(if self.allow_timeout_override && request_timeout_us != 0 && own < default { own } else { default })
    }
}

/// A version's queue policies: Triton's `priority_levels`, `default_priority_level`,
/// `default_queue_policy` and `priority_queue_policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Priorities {
    /// Levels 1..=`levels`; 0: one level (0), and every request's priority is ignored.
    pub levels: u64,
    /// The level of a request with priority 0 or out of range.
    pub default_level: u64,
    /// The policy of a level without one of its own.
    pub default_policy: Policy,
    /// Levels with a policy of their own.
    pub per_level: BTreeMap<u64, Policy>,
}

impl Priorities {
    /// One level under `policy`.
    pub(crate) fn single(policy: Policy) -> Self {
        Self { levels: 0, default_level: 0, default_policy: policy, per_level: BTreeMap::new() }
    }

    /// The policies of `config` (which `tritium_config::normalize` has checked with Triton's
    /// texts: levels in range, no DELAY with `preserve_ordering`), each bounded by `flag_max`
    /// (`--max-queue-size`) where the config sets no `max_queue_size`.
    pub(crate) fn for_config(config: &ModelConfig, flag_max: usize) -> Self {
        let Some(SchedulingChoice::DynamicBatching(db)) = &config.scheduling_choice else {
            return Self::single(Policy::bounded_by_flag(flag_max));
        };
        let levels = db.priority_levels;
        let default = db.default_queue_policy.unwrap_or_default();
        let default_policy =
            Policy::from_config(&default, "dynamic_batching.default_queue_policy.max_queue_size".into(), flag_max);
        // Triton instantiates the per-level policies only with priority levels.
        let per_level = if levels == 0 {
            BTreeMap::new()
        } else {
            db.priority_queue_policy
                .iter()
                .map(|(&level, p)| {
                    let field = format!("dynamic_batching.priority_queue_policy[{level}].max_queue_size");
                    (level, Policy::from_config(p, field, flag_max))
                })
                .collect()
        };
        let default_level = if levels == 0 { 0 } else { db.default_priority_level };
        Self { levels, default_level, default_policy, per_level }
    }

    /// The level of a request with `priority` (Triton's `InferenceRequest::SetPriority`).
    pub(crate) fn level_of(&self, priority: u64) -> u64 {
        if priority == 0 || priority > self.levels {
            self.default_level
        } else {
            priority
        }
    }

    fn policy(&self, level: u64) -> &Policy {
        self.per_level.get(&level).unwrap_or(&self.default_policy)
    }
}

/// A request in its level's queue, with its deadline.
struct Queued {
    p: Pending,
    deadline: Option<Instant>,
}

/// One priority level: requests in arrival order, then the delayed ones.
#[derive(Default)]
struct Level {
    items: VecDeque<Queued>,
    delayed: VecDeque<Pending>,
}

impl Level {
    fn len(&self) -> usize {
        self.items.len() + self.delayed.len()
    }
}

struct State {
    levels: BTreeMap<u64, Level>,
    len: usize,
    closed: bool,
    /// A worker is forming a batch; the others wait, so that idle instances do not split
    /// requests that arrive together into batches of one.
    gathering: bool,
    /// Workers waiting for work (not gathering): while one is, nobody takes a batch ahead.
    idle_workers: usize,
    /// Thread workers asleep on the queue's condvar (idle or gathering). std's `Condvar`
    /// makes the futex system call on every notify, waiter or not, and workers on the async
    /// runtime never sleep on it: the queue notifies it only while this is above zero.
    sleepers: usize,
    /// Workers on the async runtime waiting for work, the longest idle first: a push wakes the
    /// first, so that idle instances take requests in turn.
    idle_lanes: VecDeque<Lane>,
}

/// A worker on the async runtime, as the queue knows it: [`Queue::try_next_batch`] lists it as
/// idle when it has nothing to hand it, and a push (or a close, or [`Queue::wake_all`]) notifies
/// it. `Notify::notify_one` keeps the wake-up for a worker that is not waiting yet.
#[derive(Clone)]
pub(crate) struct Lane {
    id: u64,
    /// What the worker awaits between looks at the queue.
    pub notify: Arc<tokio::sync::Notify>,
}

impl State {
    /// Notifies every idle worker on the runtime (each looks at the queue and its own flags).
    fn wake_lanes(&self) {
        for lane in &self.idle_lanes {
            lane.notify.notify_one();
        }
    }

    /// The queued requests in the order they are handed out: level by level, each level's in
    /// arrival order, then its delayed ones.
    fn queued(&self) -> impl Iterator<Item = &Pending> {
        self.levels.values().flat_map(|l| l.items.iter().map(|q| &q.p).chain(l.delayed.iter()))
    }

    /// The next request to hand out.
    fn front(&self) -> Option<&Pending> {
        self.queued().next()
    }

    /// Answers and drops the requests at the front whose client went away, so they are never
    /// executed nor take a place in a batch; each is counted as a cancelled failure.
    fn drop_cancelled_front(&mut self, stats: &Stats) {
        while self.front().is_some_and(|p| p.tx.is_closed()) {
            if let Some(p) = self.pop_front() {
                stats.failure(p.enqueued.elapsed(), ErrorKind::Cancelled, false);
                p.tx.send(Err(InferError::new(ErrorKind::Cancelled, CANCELLED)));
            }
        }
    }

    fn pop_front(&mut self) -> Option<Pending> {
        let (&level, l) = self.levels.iter_mut().find(|(_, l)| l.len() > 0)?;
        let p = l.items.pop_front().map(|q| q.p).or_else(|| l.delayed.pop_front())?;
        if l.len() == 0 {
            self.levels.remove(&level);
        }
        self.len -= 1;
        Some(p)
    }
}

/// The queue of one model version.
pub(crate) struct Queue {
    state: Mutex<State>,
    cv: Condvar,
    /// Hands out the ids of the workers on the async runtime ([`Queue::lane`]).
    next_lane: std::sync::atomic::AtomicU64,
    /// Signalled when the queue closes (for workers backing off, which take no work).
    closing: Condvar,
    batching: Option<Batching>,
    priorities: Priorities,
    /// Where requests rejected in the queue are counted.
    stats: Arc<Stats>,
    /// A sequence model's batcher, which takes every request instead of the levels.
    sequences: Option<Sequences>,
}

impl Queue {
    pub(crate) fn new(batching: Option<Batching>, priorities: Priorities, stats: Arc<Stats>) -> Self {
        Self {
            state: Mutex::new(State {
                levels: BTreeMap::new(),
                len: 0,
                closed: false,
                gathering: false,
                idle_workers: 0,
                sleepers: 0,
                idle_lanes: VecDeque::new(),
            }),
            cv: Condvar::new(),
            next_lane: std::sync::atomic::AtomicU64::new(1),
            closing: Condvar::new(),
            batching,
            priorities,
            stats,
            sequences: None,
        }
    }

    /// The queue of a sequence model: `sequences` takes its requests and forms its batches;
    /// only `--max-queue-size` (in `priorities`) applies of the queue policies, as a bound on
    /// the requests waiting.
    pub(crate) fn sequenced(sequences: Sequences, priorities: Priorities, stats: Arc<Stats>) -> Self {
        Self { sequences: Some(sequences), ..Self::new(None, priorities, stats) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// A thread worker sleeps on the condvar for at most `timeout`, counted in `sleepers`.
    fn sleep<'a>(&self, mut st: MutexGuard<'a, State>, timeout: Duration) -> MutexGuard<'a, State> {
        st.sleepers += 1;
        let mut st = self.cv.wait_timeout(st, timeout).unwrap_or_else(|p| p.into_inner()).0;
        st.sleepers -= 1;
        st
    }

    /// Releases the lock and wakes every thread worker asleep on the condvar, if any.
    fn wake_sleepers(&self, st: MutexGuard<'_, State>) {
        let sleepers = st.sleepers;
        drop(st);
        if sleepers > 0 {
            self.cv.notify_all();
        }
    }

    /// Queues a request at the level of its `priority`; returns its queue deadline, if it has
    /// one (the caller calls [`Queue::expire`] then). Refuses it if the queue is closed or the
    /// level is full.
    pub(crate) fn push(&self, p: Pending) -> Result<Option<Instant>, Refused> {
        if let Some(sequences) = &self.sequences {
            let policy = &self.priorities.default_policy;
            if policy.max_queue_size != 0 && sequences.len() >= policy.max_queue_size {
                return Err(Refused::Full(full_error(&p.req.id, policy, 0)));
            }
            return sequences.push(p).map(|()| None);
        }
        let now = Instant::now();
        let mut st = self.lock();
        if st.closed {
            return Err(Refused::Closed);
        }
        self.expire_locked(&mut st, now);
        let level = self.priorities.level_of(p.req.priority);
        let policy = self.priorities.policy(level);
        let held = st.levels.get(&level).map_or(0, Level::len);
        if policy.max_queue_size != 0 && held >= policy.max_queue_size {
            return Err(Refused::Full(full_error(&p.req.id, policy, level)));
        }
        let deadline = policy.timeout_for(p.req.timeout_us).map(|t| now + t);
        st.levels.entry(level).or_default().items.push_back(Queued { p, deadline });
        st.len += 1;
        let lane = st.idle_lanes.pop_front();
        let sleepers = st.sleepers;
        drop(st);
        if sleepers > 0 {
            self.cv.notify_one();
        }
        if let Some(lane) = lane {
            lane.notify.notify_one();
        }
        Ok(deadline)
    }

    /// Applies the timeouts that have passed: rejected requests are answered and counted,
    /// delayed ones move behind their level's other requests.
    pub(crate) fn expire(&self) {
        let now = Instant::now();
        let mut st = self.lock();
        self.expire_locked(&mut st, now);
    }

    fn expire_locked(&self, st: &mut State, now: Instant) {
        let mut rejected = Vec::new();
        for (&level, l) in st.levels.iter_mut() {
            if self.priorities.policy(level).default_timeout.is_none()
                || !l.items.iter().any(|q| q.deadline.is_some_and(|d| now >= d))
            {
                continue;
            }
            let mut kept = VecDeque::with_capacity(l.items.len());
            for q in l.items.drain(..) {
                match q.deadline {
                    Some(d) if now >= d => rejected.push(q.p),
                    _ => kept.push_back(q),
                }
            }
            l.items = kept;
        }
        // Sort the expired by their level's action; levels keep their order.
        let mut gone = 0;
        for p in rejected {
            let level = self.priorities.level_of(p.req.priority);
            match self.priorities.policy(level).timeout_action {
                TimeoutAction::Delay => st.levels.entry(level).or_default().delayed.push_back(p),
                TimeoutAction::Reject => {
                    gone += 1;
                    self.stats.failure(p.enqueued.elapsed(), ErrorKind::Unavailable, false);
                    p.tx.send(Err(InferError::unavailable(TIMEOUT_EXPIRED)));
                }
            }
        }
        st.len -= gone;
        st.levels.retain(|_, l| l.len() > 0);
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().len + self.sequences.as_ref().map_or(0, Sequences::len)
    }

    /// Stops taking requests; what is queued is still handed out by `next_batch`.
    pub(crate) fn close_gracefully(&self) {
        if let Some(sequences) = &self.sequences {
            sequences.close();
        }
        let mut st = self.lock();
        st.closed = true;
        st.wake_lanes();
        self.wake_sleepers(st);
        self.closing.notify_all();
    }

    /// Closes the queue and returns what was still waiting.
    pub(crate) fn close(&self) -> Vec<Pending> {
        let mut st = self.lock();
        st.closed = true;
        let mut rest = Vec::with_capacity(st.len);
        while let Some(p) = st.pop_front() {
            rest.push(p);
        }
        if let Some(sequences) = &self.sequences {
            rest.extend(sequences.drain());
        }
        st.wake_lanes();
        self.wake_sleepers(st);
        self.closing.notify_all();
        rest
    }

    /// Waits up to `timeout` for the queue to close; true if it is closed.
    pub(crate) fn wait_closed(&self, timeout: Duration) -> bool {
        let st = self.lock();
        let (st, _) = self.closing.wait_timeout_while(st, timeout, |st| !st.closed).unwrap_or_else(|p| p.into_inner());
        st.closed
    }

    /// Wakes every waiting worker, so that each re-checks its own interruption condition.
    pub(crate) fn wake_all(&self) {
        if let Some(sequences) = &self.sequences {
            sequences.wake_all();
        }
        let st = self.lock();
        st.wake_lanes();
        self.wake_sleepers(st);
    }

    /// The next batch of instance `instance`: from its sequence slots for a sequence model,
    /// otherwise as [`Queue::next_batch_unless`].
    pub(crate) fn next_batch_of(&self, instance: &str, interrupted: &dyn Fn() -> bool, idle: Duration) -> Next {
        match &self.sequences {
            Some(sequences) => sequences.next_batch(instance, interrupted, idle),
            None => self.next_batch_unless(interrupted, idle),
        }
    }

    /// Instance `instance` stopped for good: a sequence model answers the requests waiting in
    /// its slots and hands them out no more.
    pub(crate) fn instance_gone(&self, instance: &str) {
        if let Some(sequences) = &self.sequences {
            sequences.instance_gone(instance);
        }
    }

    /// Blocks until there is work and returns the next batch; `None` once the queue is closed.
    #[cfg(test)]
    pub(crate) fn next_batch(&self) -> Option<Vec<Pending>> {
        loop {
            match self.next_batch_unless(&|| false, Duration::from_secs(3600)) {
                Next::Batch(b) => return Some(b),
                Next::Closed | Next::Interrupted => return None,
                Next::Idle => {}
            }
        }
    }

    /// Blocks until there is work, the queue is closed, `interrupted()` holds (checked whenever
    /// the worker wakes; wake it with [`Queue::wake_all`]), or `idle` passes without work.
    pub(crate) fn next_batch_unless(&self, interrupted: &dyn Fn() -> bool, idle: Duration) -> Next {
        let idle_until = Instant::now() + idle;
        let mut st = self.lock();
        // Without batching nobody ever gathers, so this takes the next request at once.
        let first = loop {
            if interrupted() {
                return Next::Interrupted;
            }
            if !st.gathering {
                self.expire_locked(&mut st, Instant::now());
                st.drop_cancelled_front(&self.stats);
                if let Some(p) = st.pop_front() {
                    break p;
                }
                if st.closed {
                    return Next::Closed;
                }
            }
            let now = Instant::now();
            if now >= idle_until {
                return Next::Idle;
            }
            st.idle_workers += 1;
            st = self.sleep(st, idle_until - now);
            st.idle_workers -= 1;
        };
        let Some(b) = &self.batching else { return Next::Batch(vec![first]) };
        st.gathering = true;
        let oldest = first.enqueued;
        let deadline = oldest + b.max_delay;
        let mut size = first.batch_size.max(1);
        let mut batch = vec![first];
        loop {
            self.expire_locked(&mut st, Instant::now());
            st.drop_cancelled_front(&self.stats);
            while let Some(next) = st.front() {
                let n = next.batch_size.max(1);
                if size + n > b.max_batch_size {
                    break;
                }
                size += n;
                batch.extend(st.pop_front());
                st.drop_cancelled_front(&self.stats);
            }
            let now = Instant::now();
            if st.closed || b.ends_wait(size, st.front().is_some(), oldest, now) {
                break;
            }
            st = self.sleep(st, deadline - now);
        }
        st.gathering = false;
        st.wake_lanes();
        // Another worker may start the next batch with what this one left behind.
        self.wake_sleepers(st);
        Next::Batch(batch)
    }

    /// A batch to run next on a busy instance, taken only if it is ready now: for a worker whose
    /// stub is executing, so that the stub finds its next batch in the ring when it ends
    /// (pipelining). Nothing while another worker is idle or gathering (an idle instance runs it
    /// sooner), for a sequence model (its slots decide), or when a dynamic batch would still wait
    /// for more requests (it is formed by the normal path then, with its delay).
    pub(crate) fn ready_batch(&self) -> Option<Vec<Pending>> {
        if self.sequences.is_some() {
            return None;
        }
        let mut st = self.lock();
        if st.gathering || st.idle_workers > 0 || !st.idle_lanes.is_empty() || st.closed {
            return None;
        }
        self.expire_locked(&mut st, Instant::now());
        st.drop_cancelled_front(&self.stats);
        let Some(b) = &self.batching else { return st.pop_front().map(|p| vec![p]) };
        // A cancelled request inside the batch: the normal path sorts it out.
        let f = b.scan(&st, Instant::now()).filter(|f| f.ends && !f.cancelled)?;
        Some((0..f.count).filter_map(|_| st.pop_front()).collect())
    }

    /// Whether a sequence batcher forms this queue's batches (its workers block in it).
    pub(crate) fn is_sequenced(&self) -> bool {
        self.sequences.is_some()
    }

    /// A new worker on the async runtime, for [`Queue::try_next_batch`].
    pub(crate) fn lane(&self) -> Lane {
        let id = self.next_lane.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Lane { id, notify: Arc::new(tokio::sync::Notify::new()) }
    }

    /// The worker `lane` stopped: it is no longer idle.
    pub(crate) fn forget_lane(&self, lane: &Lane) {
        self.lock().idle_lanes.retain(|l| l.id != lane.id);
    }

    /// The next batch if one can run now, for a worker on the async runtime that must not
    /// block: without batching the next request; with dynamic batching the batch
    /// [`Queue::next_batch_unless`] would form, once it stops gathering (full, a preferred size,
    /// or its delay passed), and until then when to look again. Requests are only taken once
    /// the batch is complete, so idle workers never split one.
    /// While it hands `lane` nothing, `lane` is listed as idle (behind those idle longer, in the
    /// same lock as the look, so no push is missed), and a push notifies it when its turn comes.
    pub(crate) fn try_next_batch(&self, lane: &Lane) -> TryNext {
        let mut st = self.lock();
        let next = self.next_locked(&mut st);
        let listed = st.idle_lanes.iter().position(|l| l.id == lane.id);
        match (&next, listed) {
            (TryNext::Wait(_), None) => st.idle_lanes.push_back(lane.clone()),
            (TryNext::Batch(_) | TryNext::Closed, Some(i)) => {
                st.idle_lanes.remove(i);
            }
            _ => {}
        }
        next
    }

    fn next_locked(&self, st: &mut State) -> TryNext {
        loop {
            if st.gathering {
                // A thread worker is forming a batch; it notifies when it is done.
                return TryNext::Wait(None);
            }
            let now = Instant::now();
            self.expire_locked(st, now);
            st.drop_cancelled_front(&self.stats);
            let Some(b) = &self.batching else {
                return match st.pop_front() {
                    Some(p) => TryNext::Batch(vec![p]),
                    None if st.closed => TryNext::Closed,
                    None => TryNext::Wait(None),
                };
            };
            let Some(f) = b.scan(st, now) else {
                return if st.closed { TryNext::Closed } else { TryNext::Wait(None) };
            };
            if !f.ends && !st.closed {
                return TryNext::Wait(Some(f.oldest + b.max_delay));
            }
            let mut batch = Vec::with_capacity(f.count);
            for p in (0..f.count).filter_map(|_| st.pop_front()) {
                if p.tx.is_closed() {
                    self.stats.failure(p.enqueued.elapsed(), ErrorKind::Cancelled, false);
                    p.tx.send(Err(InferError::new(ErrorKind::Cancelled, CANCELLED)));
                } else {
                    batch.push(p);
                }
            }
            // Every request of it was cancelled: look again.
            if !batch.is_empty() {
                return TryNext::Batch(batch);
            }
        }
    }

    /// Puts requests taken by [`Queue::ready_batch`] back at the front of their levels, in the
    /// order given (their stub died before it could start them: the next instance or stub runs
    /// them, as if they had never left the queue).
    pub(crate) fn requeue(&self, batch: Vec<Pending>) {
        let mut st = self.lock();
        for p in batch.into_iter().rev() {
            let level = self.priorities.level_of(p.req.priority);
            let deadline = self.priorities.policy(level).timeout_for(p.req.timeout_us).map(|t| p.enqueued + t);
            st.levels.entry(level).or_default().items.push_front(Queued { p, deadline });
            st.len += 1;
        }
        st.wake_lanes();
        self.wake_sleepers(st);
    }
}

/// Triton's text for a full level (`PolicyQueue::Enqueue`: the request's log prefix, then
/// `Exceeds maximum queue size`), followed by the limit and what sets it.
fn full_error(id: &str, policy: &Policy, level: u64) -> InferError {
    let id = if id.is_empty() { "<id_unknown>" } else { id };
    let max = policy.max_queue_size;
    let at = if level == 0 { String::new() } else { format!(" at priority level {level}") };
    let knob = match &policy.bound_from {
        BoundFrom::Config(field) => format!("the model's {field}"),
        BoundFrom::Flag => "the server's --max-queue-size, or the model's \
                           dynamic_batching.default_queue_policy.max_queue_size"
            .to_string(),
    };
    InferError::unavailable(format!(
        "[request id: {id}] Exceeds maximum queue size: {max} requests wait{at}; the limit is {knob}"
    ))
}

#[cfg(test)]
#[path = "scheduler_tests.rs"]
mod tests;
