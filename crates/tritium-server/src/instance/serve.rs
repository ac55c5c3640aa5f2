//! The worker thread's serve loop ([`serve()`]) for models that do not run to completion on the
//! runtime, and decoupled requests: the [`OpenRequests`] table keeps each request after its `execute`
//! and forwards its responses as they arrive, with credit and cancellation, until the final one.

use super::*;

/// How often an idle worker handles what its stub sent unasked (logs and calls from model
/// threads).
pub(super) const IDLE_POLL: Duration = Duration::from_millis(50);

/// How long an idle worker of a decoupled model with open requests waits for their responses
/// before it looks at its queue again.
pub(super) const STREAM_POLL: Duration = Duration::from_millis(2);

pub(super) fn serve(ctx: &VersionContext, instance: &Instance, stub: &Stub) -> Served {
    let mut open = OpenRequests::default();
    let served = serve_with(ctx, instance, stub, &mut open);
    open.end(ctx, stub, &served);
    served
}

pub(super) fn serve_with(ctx: &VersionContext, instance: &Instance, stub: &Stub, open: &mut OpenRequests) -> Served {
    let interrupted = || instance.died.load(Ordering::Acquire) || instance.restart.load(Ordering::Acquire);
    // Set when the last poll stopped at its bound: the queue is then looked at without waiting.
    let mut more = false;
    loop {
        let streaming = !open.0.is_empty();
        let idle = if more || streaming { Duration::ZERO } else { IDLE_POLL };
        match ctx.queue.next_batch_of(&instance.spec.name, &interrupted, idle) {
            Next::Closed => return Served::Closed,
            Next::Idle => {
                let wait = if streaming && !more { STREAM_POLL } else { Duration::ZERO };
                let mut route = |r: Response| open.route(ctx, stub, r);
                match stub.poll(wait, &mut route) {
                    Ok(m) => {
                        more = m;
                        open.watch(stub, ctx.settings.max_inflight_responses);
                    }
                    Err(e) => {
                        let exit = stub.kill();
                        return Served::Died(e.to_string(), exit);
                    }
                }
            }
            Next::Interrupted => {
                if instance.died.load(Ordering::Acquire) {
                    return died_idle(stub);
                }
                if instance.recycling.load(Ordering::Acquire) {
                    // A recycled stub's open streams end on it: nothing of theirs fails.
                    if let Err(e) = drain_open(ctx, instance, stub, open) {
                        let exit = stub.kill();
                        return Served::Died(e.to_string(), exit);
                    }
                }
                return Served::Restart;
            }
            Next::Batch(batch) => {
                // Under `--rate-limit execution_count` the batch waits for the instance's
                // resources; a restart or a dead stub meanwhile puts it back in the queue.
                let _permit = match ctx.rate_limits.get(&instance.spec.name) {
                    Some(member) => match member.acquire_blocking(&interrupted) {
                        Some(permit) => Some(permit.logged(&ctx.model, ctx.version, &instance.spec.name)),
                        None => {
                            ctx.queue.requeue(batch);
                            continue;
                        }
                    },
                    None => None,
                };
                instance.inflight.store(batch.len() as u64, Ordering::Relaxed);
                instance.took(batch.len());
                let result = if ctx.decoupled {
                    run_decoupled_batch(ctx, stub, batch, open)
                } else {
                    run_batches(ctx, instance, stub, batch)
                };
                instance.inflight.store(0, Ordering::Relaxed);
                if let Err(e) = result {
                    error!("{e}");
                    let exit = kill_failed(stub, &e);
                    return Served::Died(e.to_string(), exit);
                }
            }
        }
    }
}

/// How long a recycled stub's open streams may take to end before those left fail.
pub(super) const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// Forwards the responses of a decoupled model's open requests until every one has ended (or
/// [`DRAIN_LIMIT`] passed, or the stub died), taking no new batch: a recycled stub finishes
/// what it has.
fn drain_open(
    ctx: &VersionContext,
    instance: &Instance,
    stub: &Stub,
    open: &mut OpenRequests,
) -> Result<(), HostError> {
    let until = Instant::now() + DRAIN_LIMIT;
    while !open.0.is_empty() && Instant::now() < until && !instance.died.load(Ordering::Acquire) {
        let mut route = |r: Response| open.route(ctx, stub, r);
        stub.poll(STREAM_POLL, &mut route)?;
        open.watch(stub, ctx.settings.max_inflight_responses);
    }
    Ok(())
}

/// Kills a stub that failed with `e`. One that timed out (hung in `execute`) has its Python
/// stacks logged first, so the log shows where it hung.
pub(super) fn kill_failed(stub: &Stub, e: &HostError) -> StubExit {
    if matches!(e, HostError::Timeout { .. }) {
        stub.log_stacks_before_kill(&e.to_string());
    }
    stub.kill()
}

/// The stub's watcher saw it exit while no batch ran.
pub(super) fn died_idle(stub: &Stub) -> Served {
    let status = stub.kill();
    Served::Died(
        format!("stub {} exited while idle ({status}); last stderr lines:\n{}", stub.instance(), stub.stderr_tail()),
        status,
    )
}

/// A decoupled model's request between its `execute` and its final response.
pub(super) struct OpenRequest {
    pub(super) p: Pending,
    /// Its time in the queue.
    pub(super) queue: Duration,
    /// When its batch was taken.
    pub(super) started: Instant,
    /// The stub was told that the client went away.
    pub(super) cancelled: bool,
    /// The count of responses taken by the client that the stub was last told (its `Credit`).
    pub(super) credited: u64,
    /// A response (not the final flag alone) was forwarded.
    pub(super) responded: bool,
}

/// The open requests of a decoupled model's instance, by the id the stub knows them by.
#[derive(Default)]
pub(super) struct OpenRequests(pub(super) HashMap<u64, OpenRequest>);

impl OpenRequests {
    /// Forwards one response to its request's stream, reading its outputs out of shared memory
    /// and releasing them; the final one closes the request and counts it in the statistics
    /// once. A response to a request that is not open (unknown, or already final), or one whose
    /// descriptors do not match its tensors, is refused with why: the stub broke the protocol.
    pub(super) fn route(&mut self, ctx: &VersionContext, stub: &Stub, resp: Response) -> Result<(), String> {
        let Some(open) = self.0.get_mut(&resp.request) else {
            stub.release_outputs(&resp);
            return Err(format!("responded to request {}, which is unknown or already final", resp.request));
        };
        let bytes = match output_bytes(&resp) {
            Ok(bytes) => bytes,
            Err(why) => {
                stub.release_outputs(&resp);
                return Err(why);
            }
        };
        let last = resp.final_response;
        let limit = ctx.settings.max_output_bytes;
        // The final flag alone is not a response; an empty response with the flag is one.
        let message = if last && resp.flag_only && resp.outputs.is_empty() && resp.error.is_none() {
            Streamed::Final
        } else {
            let result = match &resp.error {
                Some(e) => Err(InferError::new(ErrorKind::from_triton_code(e.code), e.message.clone())),
                None if bytes > limit => Err(RequestError::OutputTooLarge { bytes, limit }.into()),
                None => read_outputs(stub, &resp, &open.p.outputs)
                    .and_then(|outputs| shape_outputs(outputs, &open.p.outputs, &ctx.reshapes, &ctx.classes))
                    .map(|outputs| InferResponse {
                        model: ctx.model.clone(),
                        version: ctx.version,
                        id: open.p.req.id.clone(),
                        outputs,
                        parameters: resp.parameters.clone(),
                    })
                    .map_err(InferError::from),
            };
            Streamed::Response { result, last }
        };
        stub.release_outputs(&resp);
        // Never waits for room in the ring (this may run on the runtime): a message that does
        // not go now goes at the next watch.
        open.watch(resp.request, ctx.settings.max_inflight_responses, &mut |m| try_sent(stub, &m));
        if !open.responded && matches!(message, Streamed::Response { .. }) && !open.p.tx.discards() {
            open.responded = true;
            ctx.stats.first_response(open.p.enqueued.elapsed());
        }
        if !last {
            open.p.tx.stream(message);
            return Ok(());
        }
        if let Some(mut open) = self.0.remove(&resp.request).filter(|o| !o.p.tx.discards()) {
            if let Some(trace) = open.p.trace.as_mut() {
                trace.stamp(Activity::ComputeEnd, Instant::now());
            }
            let total = open.p.enqueued.elapsed();
            match &message {
                Streamed::Response { result: Err(e), .. } => ctx.stats.failure(total, e.kind, true),
                _ => ctx.stats.request_success(&open.p.req, open.p.batch_size, total, open.queue, open.times()),
            }
            open.p.tx.stream(message);
        }
        Ok(())
    }

    /// Tells the stub, for each open request, that its client went away (once) and how many
    /// responses its client has taken (when that advanced by half of `window`), even while the
    /// model sends nothing: called while the worker is idle and while `execute` runs.
    pub(super) fn watch(&mut self, stub: &Stub, window: u32) {
        // A stub that cannot take the message is noticed by the worker's next receive.
        self.watch_by(window, &mut |m| {
            let _ = stub.send(&m);
            true
        });
    }

    /// [`OpenRequests::watch`] with `send` for sending, which says whether the message went (or
    /// need not be sent again): one that did not is sent at a later watch.
    pub(super) fn watch_by(&mut self, window: u32, send: &mut dyn FnMut(ToStub) -> bool) {
        for (id, open) in self.0.iter_mut() {
            open.watch(*id, window, send);
        }
    }

    /// Ends the open requests among `ids` with `error` as their final response.
    pub(super) fn fail(&mut self, ctx: &VersionContext, ids: &[u64], error: &InferError) {
        for id in ids {
            if let Some(open) = self.0.remove(id) {
                answer_request(ctx, open.p, Err(error.clone()), None);
            }
        }
    }

    /// Ends the requests still open when serving `stub` ended with `served`: they get the
    /// error every other request of this stub gets, and a clean stop answers them too, never
    /// leaving a stream open.
    pub(super) fn end(&mut self, ctx: &VersionContext, stub: &Stub, served: &Served) {
        let message = match served {
            Served::Died(why, _) => why.clone(),
            Served::Closed | Served::Restart => {
                format!("model instance '{}' stopped before the model sent the final response", stub.instance())
            }
        };
        self.fail_all(ctx, &message);
    }

    /// Whether `response` is the first its request gets (and it is open).
    pub(super) fn first_response(&self, response: &Response) -> bool {
        self.0.get(&response.request).is_some_and(|o| !o.responded)
    }

    /// Ends every open request with `message` (an internal error) as its final response.
    pub(super) fn fail_all(&mut self, ctx: &VersionContext, message: &str) {
        for (_, open) in self.0.drain() {
            answer_request(ctx, open.p, Err(InferError::internal(message.to_string())), None);
        }
    }
}

impl OpenRequest {
    /// [`OpenRequests::watch_by`] for one request, `id` to the stub.
    pub(super) fn watch(&mut self, id: u64, window: u32, send: &mut dyn FnMut(ToStub) -> bool) {
        let Reply::Stream(tx) = &self.p.tx else { return };
        if tx.is_closed() {
            // The model sees it in `is_cancelled()` and may stop early; a send waiting for
            // credit stops waiting.
            if !self.cancelled {
                self.cancelled = send(ToStub::Cancel { request: id });
            }
            return;
        }
        if let Some(consumed) = credit_due(self.credited, tx.taken(), window) {
            if send(ToStub::Credit { request: id, consumed }) {
                self.credited = consumed;
            }
        }
    }

    /// The request's times for the statistics: all of it since its batch was taken is counted
    /// as inference, since a decoupled model computes while it sends.
    pub(super) fn times(&self) -> ExecTimes {
        ExecTimes {
            compute_input: Duration::ZERO,
            compute_infer: self.started.elapsed(),
            compute_output: Duration::ZERO,
        }
    }
}

/// Sends `msg` if the ring has room now: false when it has not, to be sent again later; a
/// stub that cannot take it at all counts as told (whoever reads its channel next finds out).
pub(super) fn try_sent(stub: &Stub, msg: &ToStub) -> bool {
    !matches!(stub.try_send(msg), Ok(false))
}

/// The count to pass to the stub when a client that was credited `credited` responses has taken
/// `taken`: when it advanced by at least half the stub's current window
/// ([`tritium_ipc::window_now`] for `credited`; at least one), so a model blocked on a full
/// window wakes before its client runs dry, with one message per half window.
pub(super) fn credit_due(credited: u64, taken: u64, window: u32) -> Option<u64> {
    let step = (tritium_ipc::window_now(u64::from(window), credited) / 2).max(1);
    (window > 0 && taken >= credited.saturating_add(step)).then_some(taken)
}

/// Runs one batch of a decoupled model: its requests become open, and each response is
/// forwarded as it arrives, during `execute` and after it (through the idle worker's poll). An
/// error raised by `execute` ends the batch's requests that are still open.
pub(super) fn run_decoupled_batch(
    ctx: &VersionContext,
    stub: &Stub,
    batch: Vec<Pending>,
    open: &mut OpenRequests,
) -> Result<(), HostError> {
    let Some((opened, requests)) = open_batch(ctx, stub, batch, open) else { return Ok(()) };
    // Responses and the watch both need the open table; the stub calls one at a time.
    let table = std::cell::RefCell::new(&mut *open);
    let window = ctx.settings.max_inflight_responses;
    let mut route = |r: Response| table.borrow_mut().route(ctx, stub, r);
    let mut watch = |stub: &Stub| table.borrow_mut().watch(stub, window);
    let executed = stub.execute_decoupled(requests, ctx.settings.execute_timeout, &mut route, &mut watch);
    end_batch(ctx, stub, opened, executed, open)
}

/// A decoupled batch whose requests are open and whose `execute` was (or is about to be) sent.
pub(super) struct OpenedBatch {
    ids: Vec<u64>,
    /// Its input blocks, freed here if the batch never reached the stub.
    blocks: Vec<tritium_ipc::Descriptor>,
    batch_size: u64,
    t0: Instant,
    t1: Instant,
}

/// Places `batch`'s inputs and makes its requests open: the requests to send in its `Execute`,
/// or `None` when none is left to run (each was answered already).
pub(super) fn open_batch(
    ctx: &VersionContext,
    stub: &Stub,
    batch: Vec<Pending>,
    open: &mut OpenRequests,
) -> Option<(OpenedBatch, Vec<Request>)> {
    let t0 = Instant::now();
    let mut placed = place_inputs(ctx, stub, batch);
    if placed.requests.is_empty() {
        return None;
    }
    let t1 = Instant::now();
    let blocks = input_blocks(&placed.requests);
    let ids: Vec<u64> = placed.waiting.keys().copied().collect();
    for (id, mut p) in placed.waiting.drain() {
        // The inputs are in shared memory now: the server's copy is not needed any more.
        p.req.inputs = Vec::new();
        if let Some(trace) = p.trace.as_mut() {
            trace.stamp(Activity::ComputeStart, t0);
            trace.stamp(Activity::ComputeInputEnd, t1);
        }
        let queue = t0.saturating_duration_since(p.enqueued);
        open.0.insert(id, OpenRequest { p, queue, started: t0, cancelled: false, credited: 0, responded: false });
    }
    let opened = OpenedBatch { ids, blocks, batch_size: placed.batch_size, t0, t1 };
    Some((opened, std::mem::take(&mut placed.requests)))
}

/// Settles a decoupled batch once its `execute` returned (`executed`: the error it raised, if
/// it did) or failed: the statistics, and the batch's requests still open when it failed.
pub(super) fn end_batch(
    ctx: &VersionContext,
    stub: &Stub,
    opened: OpenedBatch,
    executed: Result<Option<tritium_ipc::StubError>, HostError>,
    open: &mut OpenRequests,
) -> Result<(), HostError> {
    let OpenedBatch { ids, blocks, batch_size, t0, t1 } = opened;
    match executed {
        Ok(error) => {
            let times =
                ExecTimes { compute_input: t1 - t0, compute_infer: t1.elapsed(), compute_output: Duration::ZERO };
            ctx.stats.execution(batch_size, times);
            if let Some(e) = error {
                open.fail(ctx, &ids, &InferError::internal(client_text(ctx, e)));
            }
            Ok(())
        }
        Err(HostError::Ipc { source: IpcError::TooLarge { len, capacity }, .. }) => {
            for desc in blocks {
                let _ = stub.channel().free_own(desc);
            }
            let message = too_large_batch(&ctx.model, len, capacity, ctx.settings.max_request_metadata_bytes);
            for id in &ids {
                if let Some(o) = open.0.remove(id) {
                    answer_request(ctx, o.p, Err(InferError::invalid(message.clone())), None);
                }
            }
            Ok(())
        }
        Err(e) => {
            let message = execute_failure(&ctx.model, stub.instance(), &e);
            open.fail(ctx, &ids, &InferError::internal(message));
            Err(e)
        }
    }
}
