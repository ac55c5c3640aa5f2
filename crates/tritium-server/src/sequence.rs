//! Triton's sequence batcher (`sequence_batching`, core `sequence_batch_scheduler.cc`) for a
//! model version: every request of a sequence (one correlation id, from a START request to an
//! END request) reaches the same instance, in order, and carries the control inputs the model
//! asks for.
//!
//! Each instance has sequence slots: `max_batch_size` (at least 1) with the `direct` strategy,
//! `max_candidate_sequences` with `oldest`. A START request takes the free slot with the lowest
//! index (instances in turn), and its sequence holds the slot until its END request is taken
//! into a batch, its client cancels one of its requests, or it is idle for
//! `max_sequence_idle_microseconds` (measured from its last request, as Triton does, or from when
//! it got its slot out of the backlog; the release is logged). A sequence that finds no free slot
//! waits in the backlog (Triton's) until one is released; its requests expire there only by their
//! own `timeout`. Unlike Triton's, the backlog is bounded (`--max-sequence-backlog` requests per
//! model version; a request past it is refused) and indexed by correlation id and by expiry, so
//! a push, a release and a reap cost a logarithm, not a scan of the backlog.
//!
//! A worker takes a batch from its own instance's slots only, at most one request per sequence:
//! - `direct`: slot `i` is batch index `i`. The batch runs from slot 0 to the highest slot with
//!   a request; a slot without one gets a *null request* (the inputs of another request of the
//!   batch, zeroed, with READY false and CORRID 0) whose answer is dropped and not counted, as
//!   in Triton. With `max_queue_delay_microseconds` and `minimum_slot_utilization` it waits up to
//!   the delay for that share of the slots to have a request.
//! - `oldest`: the sequences' next requests, oldest first, up to `max_batch_size`; it waits up to
//!   `max_queue_delay_microseconds` for a `preferred_batch_size` or a full batch.
//!
//! The control tensors have shape `[1]` (`[1, 1]` for a batching model); START, END and READY
//! take the config's `*_false_true` values, CORRID the request's id in its `data_type`.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{error, info, warn};
use tritium_config::proto::model_config::SchedulingChoice;
use tritium_config::proto::model_sequence_batching::StrategyChoice;
use tritium_config::proto::ModelConfig;
use tritium_config::{BoolControl, ConfigError};
use tritium_sync::Locked;

use crate::pending::{Next, Pending, Refused, Reply, CANCELLED};
use crate::stats::Stats;
use crate::types::{
    CorrelationId, DataType, ErrorKind, InferError, InferRequest, InputTensor, FLAG_SEQUENCE_END, FLAG_SEQUENCE_START,
};

mod backlog;
mod control;

use backlog::Backlog;
use control::{corrid_bytes, zeros, NullRequest};

/// Triton's text for backlogged requests whose `timeout` passed.
const BACKLOG_TIMEOUT: &str = "timeout of the corresponding sequence has been expired";

/// A sequence's correlation id (never 0 nor empty).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    U64(u64),
    Str(String),
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Key::U64(v) => write!(f, "{v}"),
            Key::Str(s) => write!(f, "{s}"),
        }
    }
}

/// How an instance's batches are formed.
#[derive(Debug, Clone, PartialEq)]
enum Strategy {
    /// One slot per batch index.
    Direct { delay: Duration, min_utilization: f32 },
    /// The oldest next requests of the candidate sequences.
    Oldest { preferred: Vec<usize>, delay: Duration },
}

/// An instance's slots and how its batches are formed.
struct Layout {
    strategy: Strategy,
    /// Sequence slots per instance.
    slots: usize,
    /// Requests per batch at most (`max_batch_size`, at least 1).
    max_batch_size: usize,
    /// `max_sequence_idle_microseconds`.
    idle: Duration,
    /// The model batches (`max_batch_size` > 0).
    batching: bool,
    /// Requests the backlog holds at most (`--max-sequence-backlog`).
    max_backlog: usize,
}

/// A boolean control input, with its two values as one element's bytes.
#[derive(Debug, Clone)]
struct Control {
    name: String,
    dtype: DataType,
    off: Bytes,
    on: Bytes,
}

impl Control {
    fn new(c: &BoolControl) -> Option<Self> {
        Some(Self {
            name: c.name.clone(),
            dtype: crate::validate::wire_type(c.data_type as i32)?,
            off: Bytes::from(c.false_bytes.clone()),
            on: Bytes::from(c.true_bytes.clone()),
        })
    }
}

/// What waits in a slot.
enum Item {
    /// A request of the slot's sequence.
    Request(Box<Pending>),
    /// The sequence went idle: the slot is released when this reaches the front.
    Release,
}

/// One sequence slot of an instance.
#[derive(Default)]
struct Slot {
    /// The sequence whose requests the slot holds (also after its END was queued).
    key: Option<Key>,
    queue: VecDeque<Item>,
}

impl Slot {
    fn front_request(&self) -> Option<&Pending> {
        match self.queue.front() {
            Some(Item::Request(p)) => Some(p),
            _ => None,
        }
    }
}

/// One instance's slots.
struct Lane {
    slots: Vec<Slot>,
    /// The instance stopped for good: its slots are never handed out again.
    gone: bool,
}

impl Lane {
    fn is_empty(&self) -> bool {
        self.slots.iter().all(|s| s.queue.is_empty())
    }
}

/// A slot, ordered as Triton hands out free slots: lowest slot index first (instances in turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct SlotRef {
    slot: usize,
    lane: usize,
}

struct State {
    closed: bool,
    lanes: Vec<Lane>,
    free: BTreeSet<SlotRef>,
    /// Sequences holding a slot whose END has not been queued.
    assigned: HashMap<Key, SlotRef>,
    /// When each live sequence last sent a request.
    last_seen: HashMap<Key, Instant>,
    /// No sequence can be idle before this.
    next_reap: Option<Instant>,
    backlog: Backlog,
    /// Requests waiting (in slots and in the backlog).
    len: usize,
}

/// What a worker's look at its slots found.
enum Taken {
    Batch(Vec<Pending>),
    /// Nothing to run yet; look again at this time (or when woken).
    Wait(Option<Instant>),
}

/// The sequence batcher of one model version.
pub(crate) struct Sequences {
    model: String,
    /// The instances' names, in lane order.
    instances: Vec<String>,
    strategy: Strategy,
    idle: Duration,
    /// The model batches: control tensors have a batch dimension.
    batching: bool,
    /// Requests per batch at most (`max_batch_size`, at least 1).
    max_batch_size: usize,
    /// Requests the backlog holds at most (`--max-sequence-backlog`).
    max_backlog: usize,
    start: Option<Control>,
    end: Option<Control>,
    ready: Option<Control>,
    corrid: Option<(String, DataType)>,
    state: Mutex<State>,
    cv: Condvar,
    /// Where requests answered here (cancelled, expired) are counted.
    stats: Arc<Stats>,
}

impl Sequences {
    /// The sequence batcher of a model whose config has `sequence_batching` (None otherwise),
    /// over its `instances` (names, one lane each), with a backlog of at most `max_backlog`
    /// requests.
    pub(crate) fn for_config(
        model: &str,
        config: &ModelConfig,
        instances: Vec<String>,
        max_backlog: usize,
        stats: Arc<Stats>,
    ) -> Result<Option<Self>, ConfigError> {
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else { return Ok(None) };
        tritium_config::check_sequence_supported(sb, model)?;
        let controls = tritium_config::sequence_controls(sb, model)?;
        let max_batch_size = config.max_batch_size.max(1) as usize;
        let (strategy, slots) = match &sb.strategy_choice {
            Some(StrategyChoice::Oldest(o)) => {
                let slots =
                    if o.max_candidate_sequences > 0 { o.max_candidate_sequences as usize } else { max_batch_size };
                let preferred = o.preferred_batch_size.iter().map(|&p| p.max(1) as usize).collect();
                (Strategy::Oldest { preferred, delay: Duration::from_micros(o.max_queue_delay_microseconds) }, slots)
            }
            Some(StrategyChoice::Direct(d)) => (
                Strategy::Direct {
                    delay: Duration::from_micros(d.max_queue_delay_microseconds),
                    min_utilization: d.minimum_slot_utilization,
                },
                max_batch_size,
            ),
            None => (Strategy::Direct { delay: Duration::ZERO, min_utilization: 0.0 }, max_batch_size),
        };
        let control = |c: &Option<BoolControl>| c.as_ref().and_then(Control::new);
        let corrid =
            controls.corrid.as_ref().and_then(|(name, t)| Some((name.clone(), crate::validate::wire_type(*t as i32)?)));
        let layout = Layout {
            strategy,
            slots,
            max_batch_size,
            idle: Duration::from_micros(sb.max_sequence_idle_microseconds),
            batching: config.max_batch_size > 0,
            max_backlog,
        };
        Ok(Some(Self::new(
            model,
            instances,
            layout,
            [control(&controls.start), control(&controls.end), control(&controls.ready)],
            corrid,
            stats,
        )))
    }

    fn new(
        model: &str,
        instances: Vec<String>,
        layout: Layout,
        [start, end, ready]: [Option<Control>; 3],
        corrid: Option<(String, DataType)>,
        stats: Arc<Stats>,
    ) -> Self {
        let Layout { strategy, slots, max_batch_size, idle, batching, max_backlog } = layout;
        let lanes: Vec<Lane> = instances
            .iter()
            .map(|_| Lane { slots: (0..slots).map(|_| Slot::default()).collect(), gone: false })
            .collect();
        let free = (0..instances.len()).flat_map(|lane| (0..slots).map(move |slot| SlotRef { slot, lane })).collect();
        Self {
            model: model.to_string(),
            instances,
            strategy,
            idle,
            batching,
            max_batch_size,
            max_backlog,
            start,
            end,
            ready,
            corrid,
            state: Mutex::new(State {
                closed: false,
                lanes,
                free,
                assigned: HashMap::new(),
                last_seen: HashMap::new(),
                next_reap: None,
                backlog: Backlog::default(),
                len: 0,
            }),
            cv: Condvar::new(),
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().len
    }

    /// Checks a request against Triton's sequence rules and queues it in its sequence's slot,
    /// in the backlog, or in a free slot (a START request).
    pub(crate) fn push(&self, p: Pending) -> Result<(), Refused> {
        let model = &self.model;
        self.check_corrid_type(&p.req)?;
        if p.batch_size > 1 {
            return Err(Refused::Invalid(InferError::invalid(format!(
                "inference request to model '{model}' must specify batch-size 1 due to requirements of sequence batcher"
            ))));
        }
        let key = match &p.req.correlation_id {
            CorrelationId::U64(v) if *v != 0 => Key::U64(*v),
            CorrelationId::Str(s) if !s.is_empty() => Key::Str(s.clone()),
            _ => {
                return Err(Refused::Invalid(InferError::invalid(format!(
                    "inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
                ))))
            }
        };
        let start = p.req.flags & FLAG_SEQUENCE_START != 0;
        let end = p.req.flags & FLAG_SEQUENCE_END != 0;
        let now = Instant::now();
        let mut st = self.lock();
        if st.closed {
            return Err(Refused::Closed);
        }
        self.reap(&mut st, now);
        let assigned = st.assigned.get(&key).copied();
        let backlogged = st.backlog.open_of(&key);
        if !start && assigned.is_none() && backlogged.is_none() {
            return Err(Refused::Invalid(InferError::invalid(format!(
                "inference request for sequence {key} to model '{model}' must specify the START flag on the first \
                 request of the sequence"
            ))));
        }
        let to_backlog = assigned.is_none() && (backlogged.is_some() || st.free.is_empty());
        if to_backlog && st.backlog.requests >= self.max_backlog {
            return Err(Refused::Full(InferError::new(
                ErrorKind::Unavailable,
                format!(
                    "the sequence backlog of model '{model}' is full: {} requests of sequences wait for a free \
                     sequence slot, the limit (server flag --max-sequence-backlog); try again later",
                    st.backlog.requests
                ),
            )));
        }
        if start && (assigned.is_some() || backlogged.is_some()) {
            warn!(
                "sequence {key} for model '{model}' has a conflict. The previous sequence did not end before this \
                 sequence start. Previous sequence will be terminated early."
            );
        }
        // A backlogged sequence's idle time counts from when it gets a slot (`release`).
        if end || to_backlog {
            st.last_seen.remove(&key);
        } else {
            st.last_seen.insert(key.clone(), now);
            let due = now + self.idle;
            st.next_reap = Some(st.next_reap.map_or(due, |r| r.min(due)));
        }
        let expires = (p.req.timeout_us != 0).then(|| now + Duration::from_micros(p.req.timeout_us));
        st.len += 1;
        if let Some(at) = assigned {
            st.lanes[at.lane].slots[at.slot].queue.push_back(Item::Request(Box::new(p)));
            if end {
                st.assigned.remove(&key);
            }
        } else if let Some(n) = backlogged {
            st.backlog.join(n, p, end, expires);
        } else if let Some(at) = st.free.pop_first() {
            let slot = &mut st.lanes[at.lane].slots[at.slot];
            slot.key = Some(key.clone());
            slot.queue.push_back(Item::Request(Box::new(p)));
            if !end {
                st.assigned.insert(key, at);
            }
        } else {
            st.backlog.push(key, !end, p, expires);
        }
        drop(st);
        self.cv.notify_all();
        Ok(())
    }

    /// Triton's `ValidateCorrelationId`: the id's type must suit the CORRID control's.
    fn check_corrid_type(&self, req: &InferRequest) -> Result<(), Refused> {
        let Some((name, dtype)) = &self.corrid else { return Ok(()) };
        let sent = match &req.correlation_id {
            CorrelationId::Str(_) if *dtype != DataType::Bytes => "BYTES",
            CorrelationId::U64(_) | CorrelationId::None
                if !matches!(dtype, DataType::Uint64 | DataType::Int64 | DataType::Uint32 | DataType::Int32) =>
            {
                "UINT64"
            }
            _ => return Ok(()),
        };
        let id = if req.id.is_empty() { "<id_unknown>" } else { &req.id };
        Err(Refused::Invalid(InferError::invalid(format!(
            "[request id: {id}] sequence batching control '{name}' data-type is '{sent}', but model '{}' expects '{}'",
            self.model,
            dtype.wire_name()
        ))))
    }

    /// Blocks until instance `instance` has a batch to run, the version is closed and the
    /// instance's slots are empty, `interrupted()` holds, or `idle` passes without work.
    pub(crate) fn next_batch(&self, instance: &str, interrupted: &dyn Fn() -> bool, idle: Duration) -> Next {
        let Some(lane) = self.instances.iter().position(|n| n == instance) else {
            error!("instance '{instance}' of model '{}' has no sequence slots", self.model);
            return Next::Closed;
        };
        let idle_until = Instant::now() + idle;
        let mut st = self.lock();
        loop {
            if interrupted() {
                return Next::Interrupted;
            }
            let now = Instant::now();
            self.reap(&mut st, now);
            let wait = match self.take(&mut st, lane, now) {
                Taken::Batch(batch) => {
                    drop(st);
                    // Released slots may have taken backlogged sequences for other instances.
                    self.cv.notify_all();
                    return Next::Batch(batch);
                }
                Taken::Wait(until) => until,
            };
            if st.closed && st.lanes[lane].is_empty() {
                return Next::Closed;
            }
            if now >= idle_until {
                return Next::Idle;
            }
            let until = wait.map_or(idle_until, |w| w.min(idle_until));
            st = self.cv.wait_timeout(st, until.saturating_duration_since(now)).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The next batch of lane `lane`, if its strategy says it is time.
    fn take(&self, st: &mut State, lane: usize, now: Instant) -> Taken {
        for slot in 0..st.lanes[lane].slots.len() {
            self.settle(st, lane, slot);
        }
        let slots = &st.lanes[lane].slots;
        let mut ready: Vec<(Instant, usize)> =
            slots.iter().enumerate().filter_map(|(i, s)| s.front_request().map(|p| (p.enqueued, i))).collect();
        let Some(oldest) = ready.iter().map(|(t, _)| *t).min() else { return Taken::Wait(None) };
        let chosen: Vec<usize> = match &self.strategy {
            Strategy::Direct { delay, min_utilization } => {
                let waiting = !delay.is_zero() && *min_utilization > 0.0;
                let utilized = ready.len() as f32 / self.max_batch_size as f32 >= *min_utilization;
                if waiting && !utilized && now.saturating_duration_since(oldest) <= *delay {
                    return Taken::Wait(Some(oldest + *delay));
                }
                let top = ready.iter().map(|(_, i)| *i).max().unwrap_or(0);
                (0..=top).collect()
            }
            Strategy::Oldest { preferred, delay } => {
                ready.sort();
                let count = ready.len().min(self.max_batch_size);
                let size = if count == self.max_batch_size {
                    count
                } else if let Some(p) = preferred.iter().copied().filter(|&p| p <= count).max() {
                    p
                } else if now.saturating_duration_since(oldest) >= *delay {
                    count
                } else {
                    return Taken::Wait(Some(oldest + *delay));
                };
                ready.iter().take(size).map(|(_, i)| *i).collect()
            }
        };
        // A null request stands in for a direct batch's slots without a request.
        let template = match &self.strategy {
            Strategy::Direct { .. } if chosen.len() > ready.len() => {
                ready.iter().find_map(|(_, i)| slots[*i].front_request()).map(|p| self.null_request(p))
            }
            _ => None,
        };
        let mut batch = Vec::with_capacity(chosen.len());
        for slot in chosen {
            match st.lanes[lane].slots[slot].queue.pop_front() {
                Some(Item::Request(p)) => {
                    st.len -= 1;
                    let mut p = *p;
                    let end = p.req.flags & FLAG_SEQUENCE_END != 0;
                    self.add_controls(&mut p.req, false);
                    batch.push(p);
                    if end {
                        self.release(st, lane, slot);
                    }
                }
                other => {
                    if let Some(Item::Release) = other {
                        // Settled above: cannot happen; keep the marker's meaning anyway.
                        self.release(st, lane, slot);
                    }
                    if let Some(t) = &template {
                        batch.push(t.duplicate());
                    }
                }
            }
        }
        Taken::Batch(batch)
    }

    /// Handles what sits at the front of a slot before a batch is formed: an idle release
    /// frees it (for the backlog), and a request whose client went away ends its sequence,
    /// whose queued requests are answered as cancelled (Triton's `ReleaseSequenceSlot`).
    fn settle(&self, st: &mut State, lane: usize, slot: usize) {
        loop {
            let s = &mut st.lanes[lane].slots[slot];
            match s.queue.front() {
                Some(Item::Release) => {
                    s.queue.pop_front();
                    self.release(st, lane, slot);
                }
                Some(Item::Request(p)) if p.tx.is_closed() => {
                    let key = s.key.clone();
                    let drained: Vec<Item> = s.queue.drain(..).collect();
                    for item in drained {
                        if let Item::Request(p) = item {
                            st.len -= 1;
                            self.answer(*p, ErrorKind::Cancelled, CANCELLED);
                        }
                    }
                    if let Some(key) = key {
                        if st.assigned.get(&key) == Some(&SlotRef { slot, lane }) {
                            st.assigned.remove(&key);
                            st.last_seen.remove(&key);
                        }
                        info!("sequence {key} of model '{}' ended: a client cancelled one of its requests", self.model);
                    }
                    self.release(st, lane, slot);
                }
                _ => return,
            }
        }
    }

    /// Frees a slot whose sequence ended, giving it to the oldest backlogged sequence, if any.
    fn release(&self, st: &mut State, lane: usize, slot: usize) {
        st.lanes[lane].slots[slot].key = None;
        if st.lanes[lane].gone {
            return;
        }
        while let Some(b) = st.backlog.pop_front() {
            if b.requests.iter().any(|p| p.tx.is_closed()) {
                // Triton cancels a backlogged sequence one of whose requests was cancelled.
                if b.open {
                    st.last_seen.remove(&b.key);
                }
                for p in b.requests {
                    st.len -= 1;
                    self.answer(p, ErrorKind::Cancelled, CANCELLED);
                }
                continue;
            }
            let s = &mut st.lanes[lane].slots[slot];
            s.key = Some(b.key.clone());
            s.queue.extend(b.requests.into_iter().map(|p| Item::Request(Box::new(p))));
            if b.open {
                // Its idle time counts from now: waiting for a slot is not the client's idleness
                // (Triton counts from its last request, and may release it at once).
                let now = Instant::now();
                st.last_seen.insert(b.key.clone(), now);
                let due = now + self.idle;
                st.next_reap = Some(st.next_reap.map_or(due, |r| r.min(due)));
                st.assigned.insert(b.key, SlotRef { slot, lane });
            }
            return;
        }
        st.free.insert(SlotRef { slot, lane });
    }

    /// Releases the sequences idle for `max_sequence_idle_microseconds` (their slots free once
    /// their queued requests ran), and rejects backlogged sequences whose requests timed out.
    fn reap(&self, st: &mut State, now: Instant) {
        if st.next_reap.is_some_and(|r| now >= r) {
            let mut next = None::<Instant>;
            let mut idle = Vec::new();
            for (key, seen) in &st.last_seen {
                let due = *seen + self.idle;
                if now >= due {
                    idle.push(key.clone());
                } else {
                    next = Some(next.map_or(due, |n| n.min(due)));
                }
            }
            for key in idle {
                if let Some(at) = st.assigned.remove(&key) {
                    st.last_seen.remove(&key);
                    st.lanes[at.lane].slots[at.slot].queue.push_back(Item::Release);
                    info!(
                        "sequence {key} of model '{}' was idle for longer than max_sequence_idle_microseconds ({}); \
                         released its slot on instance '{}'",
                        self.model,
                        self.idle.as_micros(),
                        self.instances[at.lane]
                    );
                } else {
                    // A backlogged sequence is not in `last_seen`: it is kept, as Triton keeps
                    // it, and its idle time starts once it has a slot.
                    st.last_seen.remove(&key);
                }
            }
            st.next_reap = next;
        }
        for b in st.backlog.take_expired(now) {
            for p in b.requests {
                st.len -= 1;
                self.answer(p, ErrorKind::Unavailable, BACKLOG_TIMEOUT);
            }
        }
    }

    /// Answers a request that never reaches the model, counting it as failed.
    fn answer(&self, p: Pending, kind: ErrorKind, message: &str) {
        self.stats.failure(p.enqueued.elapsed(), kind, false);
        p.tx.send(Err(InferError::new(kind, message)));
    }

    /// Adds the control inputs the model asks for to a request (replacing inputs of the same
    /// name, as Triton's override inputs do); `not_ready` for a null request.
    fn add_controls(&self, req: &mut InferRequest, not_ready: bool) {
        let shape = if self.batching { vec![1, 1] } else { vec![1] };
        let mut controls = Vec::with_capacity(4);
        let flag = |c: &Option<Control>, on: bool, out: &mut Vec<InputTensor>| {
            if let Some(c) = c {
                let data = if on { c.on.clone() } else { c.off.clone() };
                out.push(InputTensor { name: c.name.clone(), datatype: c.dtype, shape: shape.clone(), data });
            }
        };
        flag(&self.start, !not_ready && req.flags & FLAG_SEQUENCE_START != 0, &mut controls);
        flag(&self.end, !not_ready && req.flags & FLAG_SEQUENCE_END != 0, &mut controls);
        flag(&self.ready, !not_ready, &mut controls);
        if let Some((name, dtype)) = &self.corrid {
            let data = corrid_bytes(if not_ready { &CorrelationId::None } else { &req.correlation_id }, *dtype);
            controls.push(InputTensor { name: name.clone(), datatype: *dtype, shape: shape.clone(), data });
        }
        req.inputs.retain(|t| !controls.iter().any(|c| c.name == t.name));
        req.inputs.extend(controls);
    }

    /// Triton's `CopyAsNull`: `like`'s inputs with their shapes, zeroed (empty strings), and the
    /// not-ready controls; its answer is dropped.
    fn null_request(&self, like: &Pending) -> NullRequest {
        let inputs = like
            .req
            .inputs
            .iter()
            .map(|t| {
                let len = if t.datatype == DataType::Bytes {
                    4 * t.shape.iter().map(|&d| d.max(0) as usize).product::<usize>()
                } else {
                    t.data.len()
                };
                InputTensor { name: t.name.clone(), datatype: t.datatype, shape: t.shape.clone(), data: zeros(len) }
            })
            .collect();
        let mut req =
            InferRequest { model: like.req.model.clone(), version: like.req.version, inputs, ..Default::default() };
        self.add_controls(&mut req, true);
        NullRequest { req, batch_size: like.batch_size }
    }

    /// Wakes every waiting worker.
    pub(crate) fn wake_all(&self) {
        let _st = self.lock();
        self.cv.notify_all();
    }

    /// Stops taking requests; what is queued in slots still runs.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }

    /// Closes and returns every request still waiting, in slots and in the backlog.
    pub(crate) fn drain(&self) -> Vec<Pending> {
        let mut st = self.lock();
        st.closed = true;
        let mut rest = Vec::with_capacity(st.len);
        for lane in &mut st.lanes {
            for slot in &mut lane.slots {
                slot.key = None;
                rest.extend(slot.queue.drain(..).filter_map(|item| match item {
                    Item::Request(p) => Some(*p),
                    Item::Release => None,
                }));
            }
        }
        for b in st.backlog.drain() {
            rest.extend(b.requests);
        }
        st.assigned.clear();
        st.last_seen.clear();
        st.len = 0;
        drop(st);
        self.cv.notify_all();
        rest
    }

    /// Instance `instance` stopped for good (it failed, or the version is unloading): its
    /// slots are not handed out again, and the requests waiting in them are answered.
    pub(crate) fn instance_gone(&self, instance: &str) {
        let Some(lane) = self.instances.iter().position(|n| n == instance) else { return };
        let mut st = self.lock();
        st.lanes[lane].gone = true;
        st.free.retain(|s| s.lane != lane);
        st.assigned.retain(|_, at| at.lane != lane);
        let mut answered = Vec::new();
        let State { lanes, len, .. } = &mut *st;
        for slot in &mut lanes[lane].slots {
            if let Some(key) = slot.key.take() {
                answered.push(key);
            }
            for item in slot.queue.drain(..) {
                if let Item::Request(p) = item {
                    *len -= 1;
                    self.answer(
                        *p,
                        ErrorKind::Unavailable,
                        &format!("model '{}' instance '{instance}' stopped; its sequences cannot continue", self.model),
                    );
                }
            }
        }
        for key in answered {
            st.last_seen.remove(&key);
        }
    }
}

#[cfg(test)]
#[path = "sequence_tests.rs"]
mod tests;
