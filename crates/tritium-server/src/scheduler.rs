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

use crate::locks::Locked;
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
mod tests {
    use super::*;
    use crate::pending::Reply;
    use crate::types::{InferRequest, InferResponse, Streamed};
    use tokio::sync::oneshot;

    type Rx = oneshot::Receiver<Result<InferResponse, InferError>>;

    fn stats() -> Arc<Stats> {
        Arc::new(Stats::new("m", 1))
    }

    fn queue(batching: Option<Batching>) -> Queue {
        Queue::new(batching, Priorities::single(Policy::unbounded()), stats())
    }

    fn request(id: &str, priority: u64, timeout_us: u64, batch_size: u64) -> (Pending, Rx) {
        let (tx, rx) = oneshot::channel();
        let req = InferRequest { id: id.into(), priority, timeout_us, ..Default::default() };
        (Pending { req, batch_size, outputs: vec![], enqueued: Instant::now(), tx: Reply::Unary(tx), trace: None }, rx)
    }

    #[test]
    fn a_stream_reply_ends_with_its_final_answer_and_a_unary_one_ignores_stream_messages() {
        let (tx, mut rx) = crate::types::response_stream();
        let reply = Reply::Stream(tx);
        reply.stream(Streamed::Response { result: Err(InferError::internal("partial")), last: false });
        assert!(!reply.is_closed());
        reply.send(Err(InferError::internal("gone")));
        let first = rx.try_recv().expect("first");
        assert!(!first.is_last());
        let last = rx.try_recv().expect("last");
        assert_eq!(last, Streamed::Response { result: Err(InferError::internal("gone")), last: true });
        assert!(last.is_last() && Streamed::Final.is_last());
        assert!(rx.try_recv().is_err());

        let (tx, mut rx) = oneshot::channel();
        let reply = Reply::Unary(tx);
        reply.stream(Streamed::Final);
        assert!(!reply.is_closed());
        reply.send(Err(InferError::internal("once")));
        assert_eq!(rx.try_recv().expect("answer"), Err(InferError::internal("once")));
    }

    /// The request of a client that keeps waiting (a dropped receiver would cancel it).
    fn live((p, rx): (Pending, Rx)) -> Pending {
        std::mem::forget(rx);
        p
    }

    fn pending(batch_size: u64) -> (Pending, Rx) {
        request("", 0, 0, batch_size)
    }

    fn sizes(batch: &[Pending]) -> Vec<u64> {
        batch.iter().map(|p| p.batch_size).collect()
    }

    fn ids(batch: &[Pending]) -> Vec<&str> {
        batch.iter().map(|p| p.req.id.as_str()).collect()
    }

    fn config(dynamic_batching: &str) -> ModelConfig {
        let text =
            format!("name: \"m\" backend: \"python\" max_batch_size: 8 dynamic_batching {{ {dynamic_batching} }}");
        tritium_config::parse_config(&text, std::path::Path::new("config.pbtxt")).expect("config parses")
    }

    fn refused_text(r: Result<Option<Instant>, Refused>) -> String {
        match r {
            Err(Refused::Full(e)) => {
                assert_eq!(e.kind, ErrorKind::Unavailable);
                e.message
            }
            Err(Refused::Closed) => panic!("closed, not full"),
            Err(Refused::Invalid(e)) => panic!("invalid, not full: {e}"),
            Ok(_) => panic!("queued"),
        }
    }

    /// Takes every queued request, one per batch, in order.
    fn drain_ids(q: &Queue) -> Vec<String> {
        let mut out = Vec::new();
        while q.len() > 0 {
            for p in q.next_batch().expect("batch") {
                out.push(p.req.id);
            }
        }
        out
    }

    #[test]
    fn requests_whose_client_went_away_never_join_a_batch_and_count_as_cancelled() {
        let stats = stats();
        let batching = Batching { max_batch_size: 3, preferred: vec![], max_delay: Duration::from_secs(60) };
        let q = Queue::new(Some(batching), Priorities::single(Policy::unbounded()), stats.clone());
        let mut kept = Vec::new();
        for id in ["gone0", "a", "gone1", "b", "c", "d"] {
            let (p, rx) = request(id, 0, 0, 1);
            assert!(q.push(p).is_ok());
            if id.starts_with("gone") {
                drop(rx);
            } else {
                kept.push(rx);
            }
        }
        assert_eq!(ids(&q.next_batch().expect("batch")), vec!["a", "b", "c"]);
        assert_eq!(stats.snapshot().fail_reasons.canceled, 2);
        assert_eq!(q.len(), 1);

        // Without batching too, and a stream's receiver counts the same way.
        let q = Queue::new(None, Priorities::single(Policy::unbounded()), stats.clone());
        let (tx, rx) = crate::types::response_stream();
        let req = InferRequest { id: "stream".into(), ..Default::default() };
        let p = Pending {
            req,
            batch_size: 0,
            outputs: vec![],
            enqueued: Instant::now(),
            tx: Reply::Stream(tx),
            trace: None,
        };
        assert!(q.push(p).is_ok());
        drop(rx);
        let (p, _rx) = request("live", 0, 0, 0);
        assert!(q.push(p).is_ok());
        assert_eq!(ids(&q.next_batch().expect("batch")), vec!["live"]);
        assert_eq!(stats.snapshot().fail_reasons.canceled, 3);
    }

    fn live_id(id: &str) -> Pending {
        live(request(id, 0, 0, 1))
    }

    #[test]
    fn a_busy_worker_takes_the_next_request_ahead_unless_another_worker_idles() {
        let q = queue(None);
        assert!(q.ready_batch().is_none(), "nothing queued");
        q.push(live_id("a")).expect("queued");
        q.push(live_id("b")).expect("queued");
        assert_eq!(q.ready_batch().as_deref().map(ids), Some(vec!["a"]));
        // While a worker waits for work, the next request is its: nobody takes it ahead.
        q.lock().idle_workers = 1;
        assert!(q.ready_batch().is_none(), "an idle worker runs it sooner");
        q.lock().idle_workers = 0;
        assert_eq!(q.ready_batch().as_deref().map(ids), Some(vec!["b"]));
    }

    #[test]
    fn a_worker_counts_as_idle_only_while_it_waits_for_work() {
        let q = Arc::new(queue(None));
        let worker = {
            let q = q.clone();
            std::thread::spawn(move || matches!(q.next_batch_unless(&|| false, Duration::from_millis(300)), Next::Idle))
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while q.lock().idle_workers == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(q.lock().idle_workers, 1);
        assert!(worker.join().expect("worker"), "no work came");
        assert_eq!(q.lock().idle_workers, 0);
    }

    #[test]
    fn a_thread_worker_asleep_on_the_queue_is_counted_and_woken_by_a_push() {
        let q = Arc::new(queue(Some(Batching {
            max_batch_size: 2,
            preferred: vec![],
            max_delay: Duration::from_secs(30),
        })));
        // Without sleepers a push notifies no condvar (the runtime's lanes never sleep on it).
        q.push(live_id("a")).expect("queued");
        assert_eq!(q.lock().sleepers, 0);
        let worker = {
            let q = q.clone();
            std::thread::spawn(move || {
                q.next_batch().map(|b| ids(&b).into_iter().map(str::to_owned).collect::<Vec<_>>())
            })
        };
        // The worker takes "a" and gathers, asleep until the batch fills.
        let deadline = Instant::now() + Duration::from_secs(5);
        while q.lock().sleepers == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(q.lock().sleepers, 1);
        q.push(live_id("b")).expect("queued");
        let taken = worker.join().expect("worker");
        assert_eq!(taken.as_deref(), Some(&["a".to_owned(), "b".to_owned()][..]), "the push woke the gathering worker");
        assert_eq!(q.lock().sleepers, 0);
    }

    fn batch_of(next: TryNext) -> Option<Vec<u64>> {
        match next {
            TryNext::Batch(b) => Some(sizes(&b)),
            TryNext::Wait(_) | TryNext::Closed => None,
        }
    }

    #[test]
    fn a_runtime_worker_takes_a_batch_only_once_it_is_complete_and_is_told_when_to_look_again() {
        let b = Batching { max_batch_size: 4, preferred: vec![3], max_delay: Duration::from_millis(60_000) };
        let q = queue(Some(b));
        let lane = q.lane();
        assert!(matches!(q.try_next_batch(&lane), TryNext::Wait(None)), "nothing queued: wait for a push");
        let first = live(pending(1));
        let oldest = first.enqueued;
        q.push(first).expect("queued");
        q.push(live(pending(1))).expect("queued");
        // Partial: nothing is taken, and the worker looks again when the oldest's delay ends.
        match q.try_next_batch(&lane) {
            TryNext::Wait(Some(at)) => assert_eq!(at, oldest + Duration::from_millis(60_000)),
            _ => panic!("a partial batch must wait for its delay"),
        }
        assert_eq!(q.len(), 2, "nothing was taken");
        // A preferred size ends the wait; the request behind it stays queued.
        q.push(live(pending(1))).expect("queued");
        assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1, 1, 1]));
        assert_eq!(q.len(), 0);
        // Full at once.
        for bs in [2, 2, 1] {
            q.push(live(pending(bs))).expect("queued");
        }
        assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![2, 2]));
        // Closing hands out what is left without waiting, then says closed.
        q.close_gracefully();
        assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1]));
        assert!(matches!(q.try_next_batch(&lane), TryNext::Closed));
    }

    #[test]
    fn a_runtime_worker_leaves_out_cancelled_requests_and_takes_one_at_a_time_without_batching() {
        let q = queue(Some(Batching { max_batch_size: 4, preferred: vec![], max_delay: Duration::ZERO }));
        let lane = q.lane();
        q.push(live(pending(1))).expect("queued");
        let (gone, rx) = pending(1);
        q.push(gone).expect("queued");
        drop(rx);
        q.push(live(pending(1))).expect("queued");
        assert_eq!(batch_of(q.try_next_batch(&lane)), Some(vec![1, 1]), "the cancelled request is answered, not run");
        let q = queue(None);
        let lane = q.lane();
        q.push(live_id("a")).expect("queued");
        q.push(live_id("b")).expect("queued");
        match q.try_next_batch(&lane) {
            TryNext::Batch(b) => assert_eq!(ids(&b), vec!["a"]),
            _ => panic!("a request without batching runs at once"),
        }
    }

    #[tokio::test]
    async fn idle_runtime_workers_are_notified_in_turn_and_none_is_missed() {
        let q = Arc::new(queue(None));
        let (a, b) = (q.lane(), q.lane());
        let notified = |lane: &Lane| {
            let n = lane.notify.clone();
            async move { tokio::time::timeout(Duration::from_millis(200), n.notified()).await.is_ok() }
        };
        assert!(matches!(q.try_next_batch(&a), TryNext::Wait(None)));
        assert!(matches!(q.try_next_batch(&b), TryNext::Wait(None)));
        assert!(q.ready_batch().is_none(), "an idle worker runs it sooner: nobody takes it ahead");
        // The push comes before either waits: the longest idle one keeps its wake-up, the other
        // gets none.
        q.push(live_id("1")).expect("queued");
        assert!(notified(&a).await, "the longest idle worker is notified");
        assert!(!notified(&b).await, "only one worker is woken for one request");
        assert!(matches!(q.try_next_batch(&a), TryNext::Batch(_)));
        assert!(matches!(q.try_next_batch(&a), TryNext::Wait(None)), "a is idle again, behind b");
        q.push(live_id("2")).expect("queued");
        assert!(notified(&b).await, "now it is b's turn");
        assert!(!notified(&a).await);
        assert!(matches!(q.try_next_batch(&b), TryNext::Batch(_)));
        // wake_all (a restart, a dead stub) and closing notify every idle worker.
        assert!(matches!(q.try_next_batch(&b), TryNext::Wait(None)));
        q.wake_all();
        assert!(notified(&a).await && notified(&b).await);
        q.forget_lane(&a);
        q.close_gracefully();
        assert!(notified(&b).await && !notified(&a).await, "a forgotten worker is not notified");
        assert!(matches!(q.try_next_batch(&b), TryNext::Closed));
    }

    #[test]
    fn a_dynamic_batch_is_taken_ahead_only_when_it_would_not_wait() {
        let b = |preferred: Vec<u64>, delay_ms: u64| Batching {
            max_batch_size: 4,
            preferred,
            max_delay: Duration::from_millis(delay_ms),
        };
        // Partial, no preferred size, delay not over: it waits for the normal path.
        let q = queue(Some(b(vec![], 60_000)));
        q.push(live(pending(1))).expect("queued");
        q.push(live(pending(1))).expect("queued");
        assert!(q.ready_batch().is_none());
        assert_eq!(q.len(), 2, "nothing was taken");
        // Full: taken at once, up to the largest batch.
        for bs in [1, 1, 3] {
            q.push(live(pending(bs))).expect("queued");
        }
        assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1, 1, 1, 1]));
        assert_eq!(q.len(), 1);
        // A preferred size.
        let q = queue(Some(b(vec![2], 60_000)));
        q.push(live(pending(1))).expect("queued");
        q.push(live(pending(1))).expect("queued");
        assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1, 1]));
        // The delay of the oldest is over.
        let q = queue(Some(b(vec![], 0)));
        q.push(live(pending(1))).expect("queued");
        assert_eq!(q.ready_batch().as_deref().map(sizes), Some(vec![1]));
    }

    #[test]
    fn requeued_requests_go_back_to_the_front_in_their_order() {
        let q = queue(None);
        for id in ["a", "b", "c"] {
            q.push(live_id(id)).expect("queued");
        }
        let first = q.ready_batch().expect("a");
        let second = q.ready_batch().expect("b");
        q.requeue(first.into_iter().chain(second).collect());
        assert_eq!(drain_ids(&q), vec!["a", "b", "c"]);
    }

    #[test]
    fn without_batching_each_request_goes_alone() {
        let q = queue(None);
        for _ in 0..3 {
            assert!(q.push(live(pending(1))).is_ok());
        }
        assert_eq!(q.next_batch().map(|b| b.len()), Some(1));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn batches_fill_up_to_max_batch_size_without_waiting() {
        let q = queue(Some(Batching { max_batch_size: 4, preferred: vec![], max_delay: Duration::from_secs(60) }));
        for bs in [2, 1, 1, 3] {
            assert!(q.push(live(pending(bs))).is_ok());
        }
        let t = Instant::now();
        assert_eq!(sizes(&q.next_batch().expect("batch")), vec![2, 1, 1]);
        assert!(t.elapsed() < Duration::from_secs(30), "a full batch does not wait for the delay");
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn a_partial_batch_waits_for_the_delay_and_collects_late_arrivals() {
        let q = Arc::new(queue(Some(Batching {
            max_batch_size: 8,
            preferred: vec![],
            max_delay: Duration::from_millis(300),
        })));
        assert!(q.push(live(pending(1))).is_ok());
        let q2 = q.clone();
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            assert!(q2.push(live(pending(2))).is_ok());
        });
        let batch = q.next_batch().expect("batch");
        late.join().expect("thread");
        assert_eq!(sizes(&batch), vec![1, 2]);
    }

    #[test]
    fn a_preferred_size_ends_the_wait() {
        let q = queue(Some(Batching { max_batch_size: 8, preferred: vec![2], max_delay: Duration::from_secs(60) }));
        assert!(q.push(live(pending(1))).is_ok());
        assert!(q.push(live(pending(1))).is_ok());
        assert_eq!(sizes(&q.next_batch().expect("batch")), vec![1, 1]);
    }

    #[test]
    fn idle_workers_do_not_split_a_forming_batch() {
        let q = Arc::new(queue(Some(Batching {
            max_batch_size: 8,
            preferred: vec![],
            max_delay: Duration::from_millis(200),
        })));
        let workers: Vec<_> = (0..3)
            .map(|_| {
                let q = q.clone();
                std::thread::spawn(move || q.next_batch().map(|b| b.len()))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        for _ in 0..4 {
            assert!(q.push(live(pending(1))).is_ok());
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(300));
        q.close();
        let mut sizes: Vec<_> = workers.into_iter().map(|w| w.join().expect("worker")).collect();
        sizes.sort();
        assert_eq!(sizes, vec![None, None, Some(4)]);
    }

    #[test]
    fn wait_closed_returns_at_once_when_the_queue_closes() {
        let q = Arc::new(queue(None));
        assert!(!q.wait_closed(Duration::from_millis(1)));
        let closer = {
            let q = q.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                q.close_gracefully();
            })
        };
        let t = Instant::now();
        assert!(q.wait_closed(Duration::from_secs(30)));
        assert!(t.elapsed() < Duration::from_secs(10));
        let _ = closer.join();
    }

    #[test]
    fn close_wakes_workers_and_returns_the_rest() {
        let q = Arc::new(queue(None));
        let q2 = q.clone();
        let worker = std::thread::spawn(move || q2.next_batch().is_none());
        std::thread::sleep(Duration::from_millis(20));
        assert!(q.close().is_empty());
        assert!(worker.join().expect("worker"));
        assert!(matches!(q.push(live(pending(1))), Err(Refused::Closed)));
    }

    #[test]
    fn a_full_queue_refuses_with_tritons_text_naming_the_field() {
        let p = Priorities::for_config(&config("default_queue_policy { max_queue_size: 2 }"), 0);
        let q = Queue::new(None, p, stats());
        assert!(q.push(live(request("a", 0, 0, 1))).is_ok());
        assert!(q.push(live(request("b", 0, 0, 1))).is_ok());
        let text = refused_text(q.push(live(request("c", 0, 0, 1))));
        assert!(text.starts_with("[request id: c] Exceeds maximum queue size"), "{text}");
        assert!(text.contains("2 requests"), "{text}");
        assert!(text.contains("dynamic_batching.default_queue_policy.max_queue_size"), "{text}");
        let text = refused_text(q.push(live(request("", 0, 0, 1))));
        assert!(text.starts_with("[request id: <id_unknown>] Exceeds maximum queue size"), "{text}");
        // Taking one makes room for one.
        assert_eq!(q.next_batch().map(|b| b.len()), Some(1));
        assert!(q.push(live(request("d", 0, 0, 1))).is_ok());
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn the_server_flag_bounds_models_without_a_bound_of_their_own() {
        let mut plain = config("");
        plain.scheduling_choice = None;
        let p = Priorities::for_config(&plain, 1);
        assert_eq!(p, Priorities::single(Policy::bounded_by_flag(1)));
        let q = Queue::new(None, p, stats());
        assert!(q.push(live(pending(1))).is_ok());
        let text = refused_text(q.push(live(pending(1))));
        assert!(text.contains("Exceeds maximum queue size: 1 requests"), "{text}");
        assert!(text.contains("--max-queue-size"), "{text}");
        // The model's own bound wins over the flag.
        let own = Priorities::for_config(&config("default_queue_policy { max_queue_size: 3 }"), 1);
        assert_eq!(own.default_policy.max_queue_size, 3);
        let unbounded = Priorities::for_config(&plain, 0);
        assert_eq!(unbounded.default_policy.max_queue_size, 0);
    }

    #[test]
    fn higher_priorities_go_first_and_out_of_range_ones_take_the_default_level() {
        let p = Priorities::for_config(&config("priority_levels: 3 default_priority_level: 2"), 0);
        let q = Queue::new(None, p, stats());
        for (id, priority) in [("low", 3), ("zero", 0), ("high", 1), ("seven", 7), ("mid", 2)] {
            assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
        }
        assert_eq!(drain_ids(&q), ["high", "zero", "seven", "mid", "low"]);
    }

    #[test]
    fn without_priority_levels_the_priority_is_ignored() {
        let q = queue(None);
        for (id, priority) in [("a", 5), ("b", 1), ("c", 0)] {
            assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
        }
        assert_eq!(drain_ids(&q), ["a", "b", "c"]);
    }

    #[test]
    fn a_batch_is_gathered_in_priority_order() {
        let p = Priorities::for_config(&config("priority_levels: 2 default_priority_level: 2"), 0);
        let batching = Batching { max_batch_size: 2, preferred: vec![], max_delay: Duration::from_secs(60) };
        let q = Queue::new(Some(batching), p, stats());
        for (id, priority) in [("l1", 2), ("l2", 2), ("h1", 1)] {
            assert!(q.push(live(request(id, priority, 0, 1))).is_ok());
        }
        assert_eq!(ids(&q.next_batch().expect("batch")), ["h1", "l1"]);
    }

    #[test]
    fn each_level_has_its_own_policy() {
        let p = Priorities::for_config(
            &config(
                "priority_levels: 2 default_priority_level: 2 \
                 priority_queue_policy { key: 1 value: { max_queue_size: 1 } }",
            ),
            0,
        );
        let q = Queue::new(None, p, stats());
        assert!(q.push(live(request("h1", 1, 0, 1))).is_ok());
        let text = refused_text(q.push(live(request("h2", 1, 0, 1))));
        assert!(text.contains("at priority level 1"), "{text}");
        assert!(text.contains("dynamic_batching.priority_queue_policy[1].max_queue_size"), "{text}");
        for _ in 0..3 {
            assert!(q.push(live(request("l", 2, 0, 1))).is_ok());
        }
    }

    #[test]
    fn a_timed_out_request_is_rejected_and_counted() {
        let p = Priorities::for_config(&config("default_queue_policy { default_timeout_microseconds: 1000 }"), 0);
        let s = stats();
        let q = Queue::new(None, p, s.clone());
        let (a, mut rx) = request("a", 0, 0, 1);
        assert!(matches!(q.push(a), Ok(Some(_))), "the request is queued with a deadline");
        std::thread::sleep(Duration::from_millis(20));
        q.expire();
        assert_eq!(q.len(), 0);
        let e = rx.try_recv().expect("answered").expect_err("an error");
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::Unavailable, TIMEOUT_EXPIRED));
        let snap = s.snapshot();
        assert_eq!((snap.fail.count, snap.fail_reasons.rejected), (1, 1));
    }

    #[test]
    fn a_delayed_request_goes_behind_the_others_and_still_runs() {
        let p = Priorities::for_config(
            &config(
                "default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 60000000 \
                 allow_timeout_override: true }",
            ),
            0,
        );
        let q = Queue::new(None, p, stats());
        assert!(q.push(live(request("late", 0, 1000, 1))).is_ok());
        assert!(q.push(live(request("on_time", 0, 0, 1))).is_ok());
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(drain_ids(&q), ["on_time", "late"]);
    }

    #[test]
    fn a_request_timeout_only_shortens_an_allowed_default() {
        let policy = |default_us: u64, allow: bool| Policy {
            default_timeout: (default_us > 0).then(|| Duration::from_micros(default_us)),
            allow_timeout_override: allow,
            ..Policy::unbounded()
        };
        let us = Duration::from_micros;
        assert_eq!(policy(0, true).timeout_for(500), None);
        assert_eq!(policy(1000, false).timeout_for(500), Some(us(1000)));
        assert_eq!(policy(1000, true).timeout_for(500), Some(us(500)));
        assert_eq!(policy(1000, true).timeout_for(5000), Some(us(1000)));
        assert_eq!(policy(1000, true).timeout_for(0), Some(us(1000)));
    }
}
