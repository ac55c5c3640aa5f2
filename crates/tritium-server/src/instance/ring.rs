//! One run of batches in the stub's ring, driven by the rules of [`Pipeline`]: the [`Ring`]
//! (the head as far as the stub got with it, and the stub's error once it failed) carries out
//! what the pipeline decides, and its two drivers differ only in how they send a batch and wait
//! for the head: [`run_batches`] on the worker thread, `lane.rs` on the runtime.

use super::pipeline::{Action, Event, Gate, Pipeline};
use super::*;

/// Runs `batch` and, while the stub executes it, the batches that are ready behind it, by the
/// rules of [`Pipeline`]: each is placed and sent before the one ahead of it is answered, so the
/// stub starts it the moment it ends the other, without waiting for the worker (pipelining; the
/// model still runs one batch at a time, in queue order). A restart or a dead stub stops taking
/// batches ahead, so the worker gets back to its loop.
pub(super) fn run_batches(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    batch: Vec<Pending>,
) -> Result<(), HostError> {
    let Some(first) = start_batch(ctx, stub, batch)? else { return Ok(()) };
    let gate = || gate(ctx, instance);
    let mut ring = Ring::new(first);
    let mut event = Event::HeadSent(gate());
    loop {
        event = match ring.step(ctx, stub, event, &gate) {
            Step::Report(event) => event,
            Step::Over(result) => return result,
            Step::SendAhead => {
                let sent = take_ready(ctx, instance).map_or(Ok(None), |batch| start_batch(ctx, stub, batch));
                ring.sent(sent)
            }
            Step::Wait => {
                instance.inflight.store(ring.requests() as u64, Ordering::Relaxed);
                let waited = wait_for_head(ctx, stub, ring.take_head());
                ring.waited(waited, gate())
            }
        }
    }
}

/// The error a run of batches stops with when its driver fell out of step with [`Pipeline`]
/// (a bug in the server, never seen): the stub restarts, and its requests fail with this.
fn out_of_step(stub: &Stub) -> HostError {
    stub.protocol_error("the server's pipelining fell out of step (a server bug, not the model's)".into())
}

/// Whether `instance` may send a batch ahead now ([`Pipeline`]'s rules).
pub(super) fn gate(ctx: &VersionContext, instance: &Instance) -> Gate {
    Gate {
        interrupted: instance.died.load(Ordering::Acquire) || instance.restart.load(Ordering::Acquire),
        rate_limited: ctx.rate_limits.is_limited(),
    }
}

/// The queue's batch that is ready now, counted as taken by `instance`.
pub(super) fn take_ready(ctx: &VersionContext, instance: &Instance) -> Option<Vec<Pending>> {
    let batch = ctx.queue.ready_batch()?;
    instance.took(batch.len());
    Some(batch)
}

/// Waits for the stub to end the head of the ring (the worker thread's wait): the head ended,
/// or the head the stub failed to end, with its error.
fn wait_for_head(ctx: &VersionContext, stub: &Stub, head: Head) -> (Head, Result<(), HostError>) {
    let Head::Sent(Running { placed, submitted, t0, t1 }) = head else { return (head, Ok(())) };
    // A batch sent behind another runs from when the worker turns to it, not from when it was
    // sent: the one ahead of it ran meanwhile.
    let started = Instant::now();
    // A client that goes away while its request runs: the model sees it in `is_cancelled()`.
    let mut told = std::collections::HashSet::new();
    let mut on_wait = |stub: &Stub| {
        for (id, p) in &placed.waiting {
            if p.tx.is_closed() && told.insert(*id) {
                let _ = stub.cancel(*id);
            }
        }
    };
    match stub.complete(submitted, ctx.settings.execute_timeout, Some(&mut on_wait)) {
        Ok(executed) => {
            let stamps = Stamps { taken: t0, placed: t1, started, ended: Instant::now() };
            (Head::Ended(Ended { placed, executed, stamps }), Ok(()))
        }
        Err(error) => (Head::Broken(placed), Err(error)),
    }
}

/// A batch sent to the stub whose answers are still to be read.
pub(super) struct Running {
    pub(super) placed: Placed,
    pub(super) submitted: tritium_host::Submitted,
    /// When it was taken, and when its inputs were placed.
    pub(super) t0: Instant,
    pub(super) t1: Instant,
}

/// The batch at the head of the ring, as far as the stub got with it.
pub(super) enum Head {
    /// Sent; the stub has not ended it yet.
    Sent(Running),
    /// Ended: its responses are there to read.
    Ended(Ended),
    /// The stub failed before ending it; its requests wait for the error.
    Broken(Placed),
    /// Answered or failed: nothing of it is left.
    Settled,
}

/// A batch the stub has ended, with its responses and its times.
pub(super) struct Ended {
    pub(super) placed: Placed,
    pub(super) executed: tritium_host::Executed,
    pub(super) stamps: Stamps,
}

impl Head {
    /// The requests of the head still waiting for their answers.
    fn requests(&self) -> usize {
        match self {
            Head::Sent(r) => r.placed.waiting.len(),
            Head::Ended(e) => e.placed.waiting.len(),
            Head::Broken(p) => p.waiting.len(),
            Head::Settled => 0,
        }
    }

    /// A sent head once `ended` says whether the stub ended it (`Ok`, with when the driver
    /// turned to it and when it ended) or failed first: its responses taken from the
    /// submission (and released, if it failed).
    pub(super) fn end(
        self,
        stub: &Stub,
        ended: Result<(Instant, Instant), HostError>,
    ) -> (Head, Result<(), HostError>) {
        let Head::Sent(Running { placed, submitted, t0, t1 }) = self else { return (self, ended.map(|_| ())) };
        match (stub.executed(submitted), ended) {
            (Some(executed), Ok((started, ended))) => {
                let stamps = Stamps { taken: t0, placed: t1, started, ended };
                (Head::Ended(Ended { placed, executed, stamps }), Ok(()))
            }
            (None, Ok(_)) => (Head::Broken(placed), Err(stub.protocol_error("ended a batch it never ended".into()))),
            (_, Err(error)) => (Head::Broken(placed), Err(error)),
        }
    }

    /// Answers each request of the head with the stub's failure `e`, releasing what the stub
    /// had sent for it.
    fn fail(self, ctx: &VersionContext, stub: &Stub, e: &HostError) {
        let waiting = match self {
            Head::Sent(Running { placed, submitted, .. }) => {
                let _ = stub.executed(submitted);
                placed.waiting
            }
            Head::Ended(Ended { placed, executed, .. }) => {
                for r in &executed.responses {
                    stub.release_outputs(r);
                }
                placed.waiting
            }
            Head::Broken(placed) => placed.waiting,
            Head::Settled => return,
        };
        fail_waiting(ctx, stub, waiting, e);
    }

    /// Reads the ended head's responses, records its times and answers every request in it.
    /// Returns the stub's error if the stub is unusable (a response broke the protocol, or the
    /// head never ended).
    fn answer(self, ctx: &VersionContext, stub: &Stub) -> Result<(), HostError> {
        match self {
            Head::Ended(Ended { placed, executed, stamps }) => answer_batch(ctx, stub, placed, executed, stamps),
            Head::Settled => Ok(()),
            other => {
                let e = stub.protocol_error("ended a batch it never ended".into());
                other.fail(ctx, stub, &e);
                Err(e)
            }
        }
    }
}

/// One run of batches in the stub's ring: the [`Pipeline`] that decides, the head as far as the
/// stub got with it, and the stub's error once it failed. The worker thread and the async lane
/// drive it alike; they differ only in how they send a batch and wait for the head.
pub(super) struct Ring {
    pipeline: Pipeline<Running>,
    head: Head,
    error: Option<HostError>,
}

/// What the driver of a [`Ring`] does next.
pub(super) enum Step {
    /// Report this event to [`Ring::step`].
    Report(Event<Running>),
    /// Send the queue's ready batch, if any, behind the head; report it with [`Ring::sent`].
    SendAhead,
    /// Wait for the stub to end the head ([`Ring::take_head`]); report it with [`Ring::waited`].
    Wait,
    /// The run is over.
    Over(Result<(), HostError>),
}

impl Ring {
    /// A ring whose first batch is `head`; its first event is [`Event::HeadSent`].
    pub(super) fn new(head: Running) -> Self {
        Self { pipeline: Pipeline::new(), head: Head::Sent(head), error: None }
    }

    /// The requests in the ring waiting for their answers.
    pub(super) fn requests(&self) -> usize {
        self.head.requests() + self.pipeline.behind().map_or(0, |b| b.placed.waiting.len())
    }

    /// The head, for the driver to wait for; it hands it back through [`Ring::waited`].
    pub(super) fn take_head(&mut self) -> Head {
        std::mem::replace(&mut self.head, Head::Settled)
    }

    /// The event for how sending a batch ahead went.
    pub(super) fn sent(&mut self, sent: Result<Option<Running>, HostError>) -> Event<Running> {
        match sent {
            Ok(batch) => Event::Sent(batch),
            Err(e) => {
                self.error = Some(e);
                Event::SendFailed
            }
        }
    }

    /// The event for how waiting for the head went; `gate` is read once it ended.
    pub(super) fn waited(&mut self, (head, waited): (Head, Result<(), HostError>), gate: Gate) -> Event<Running> {
        self.head = head;
        match waited {
            Ok(()) => Event::Ended(gate),
            Err(e) => {
                self.error = Some(e);
                Event::WaitFailed
            }
        }
    }

    /// Hands `event` to the pipeline and carries out its action, unless sending or waiting is
    /// what it asks for: that is the driver's. `gate` says whether the instance may send a
    /// batch ahead now.
    pub(super) fn step(
        &mut self,
        ctx: &VersionContext,
        stub: &Stub,
        event: Event<Running>,
        gate: &dyn Fn() -> Gate,
    ) -> Step {
        match self.pipeline.on(event) {
            Action::SendAhead => Step::SendAhead,
            Action::Wait => Step::Wait,
            Action::Answer => match self.take_head().answer(ctx, stub) {
                Ok(()) => Step::Report(Event::Answered),
                Err(e) => {
                    self.error = Some(e);
                    Step::Report(Event::AnswerFailed)
                }
            },
            Action::Promote(next) => {
                self.head = Head::Sent(next);
                Step::Report(Event::HeadSent(gate()))
            }
            Action::FailHead => {
                let head = self.take_head();
                head.fail(ctx, stub, self.error.get_or_insert_with(|| out_of_step(stub)));
                Step::Report(Event::Applied)
            }
            Action::Fail(batch) => {
                Head::Sent(batch).fail(ctx, stub, self.error.get_or_insert_with(|| out_of_step(stub)));
                Step::Report(Event::Applied)
            }
            Action::Requeue(batch) => {
                requeue_unstarted(ctx, batch.placed);
                Step::Report(Event::Applied)
            }
            Action::Done => Step::Over(Ok(())),
            Action::Stop => Step::Over(Err(self.error.take().unwrap_or_else(|| out_of_step(stub)))),
        }
    }
}

/// Puts the requests of a batch the stub never started (it died running the one ahead) back at
/// the front of the queue, in their order, for the restarted stub or another instance.
pub(super) fn requeue_unstarted(ctx: &VersionContext, placed: Placed) {
    let mut waiting: Vec<(u64, Pending)> = placed.waiting.into_iter().collect();
    waiting.sort_by_key(|(id, _)| *id);
    ctx.queue.requeue(waiting.into_iter().map(|(_, p)| p).collect());
}

/// A batch whose inputs are in the stub's memory, with its `Execute` ready to send.
pub(super) struct Prepared {
    pub(super) running: Running,
    pub(super) msg: ToStub,
    /// Its input blocks, freed if the message is too large for the ring.
    pub(super) blocks: Vec<Descriptor>,
}

impl Prepared {
    /// The batch once `sent` says how sending it went: running; `None` when it was too large for
    /// the ring (its requests are answered and the stub is fine); or the stub's error.
    pub(super) fn sent(
        self,
        ctx: &VersionContext,
        stub: &Stub,
        sent: Result<(), HostError>,
    ) -> Result<Option<Running>, HostError> {
        match sent {
            Ok(()) => Ok(Some(self.running)),
            Err(e) => not_submitted(ctx, stub, self.running.placed, self.blocks, e).map(|()| None),
        }
    }
}

/// Places a batch's inputs and prepares its `Execute`. `None` when every request was answered
/// already (its client went away, or its inputs did not fit).
pub(super) fn prepare_batch(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Option<Prepared> {
    let t0 = Instant::now();
    let mut placed = place_inputs(ctx, stub, batch);
    if placed.requests.is_empty() {
        return None;
    }
    let t1 = Instant::now();
    let blocks = input_blocks(&placed.requests);
    let (msg, submitted) = stub.prepare_execute(std::mem::take(&mut placed.requests));
    Some(Prepared { running: Running { placed, submitted, t0, t1 }, msg, blocks })
}

/// Places a batch's inputs and sends it to the stub, waiting for room in the ring. `None` when
/// nothing was sent: every request was answered already (its client went away, its inputs did
/// not fit, or the batch is too large for the ring).
pub(super) fn start_batch(
    ctx: &VersionContext,
    stub: &Stub,
    batch: Vec<Pending>,
) -> Result<Option<Running>, HostError> {
    let Some(prepared) = prepare_batch(ctx, stub, batch) else { return Ok(None) };
    let sent = stub.send(&prepared.msg);
    prepared.sent(ctx, stub, sent)
}

/// Answers a placed batch that could not be sent with `e`. A batch too large for the ring
/// reached nothing of the stub (the message was refused before a byte of it was written), so
/// the stub is fine: only this batch fails, its inputs `blocks` are freed, and this returns
/// `Ok`. Any other error means the stub is unusable and is handed back.
pub(super) fn not_submitted(
    ctx: &VersionContext,
    stub: &Stub,
    mut placed: Placed,
    blocks: Vec<Descriptor>,
    e: HostError,
) -> Result<(), HostError> {
    if let HostError::Ipc { source: IpcError::TooLarge { len, capacity }, .. } = e {
        for desc in blocks {
            let _ = stub.channel().free_own(desc);
        }
        let message = too_large_batch(&ctx.model, len, capacity, ctx.settings.max_request_metadata_bytes);
        for (_, p) in placed.waiting.drain() {
            answer_request(ctx, p, Err(InferError::invalid(message.clone())), None);
        }
        return Ok(());
    }
    fail_waiting(ctx, stub, placed.waiting, &e);
    Err(e)
}

/// Answers every request waiting for a batch with the stub's failure `e` (the stub is unusable).
pub(super) fn fail_waiting(ctx: &VersionContext, stub: &Stub, waiting: HashMap<u64, Pending>, e: &HostError) {
    let message = execute_failure(&ctx.model, stub.instance(), e);
    for (_, p) in waiting {
        answer_request(ctx, p, Err(InferError::internal(message.clone())), None);
    }
}
