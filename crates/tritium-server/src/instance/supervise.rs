//! The instance's supervisor, a task: [`spawn`] starts it, [`supervise()`] starts the stub
//! (`initialize`, warmup), serves it, and restarts it with back-off when it dies or hangs, until
//! the version retires or the restarts exceed their limit. Model code's custom-metric and
//! model-control calls are answered here ([`call_handler`]).

use super::*;
use tracing::Instrument;

pub(super) static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// Answers model code's custom-metric calls from the instance's session, and its model-control
/// calls through the server.
pub(super) fn call_handler(session: Arc<MetricsSession>, calls: Arc<dyn ModelCalls>, model: String) -> CallHandler {
    Arc::new(move |op| {
        let result = match op {
            op @ (CallOp::ModelReady { .. } | CallOp::ModelLoad { .. } | CallOp::ModelUnload { .. }) => {
                return calls.model_control(&model, op);
            }
            CallOp::MetricFamilyNew { name, description, kind } => {
                let kind = match kind {
                    tritium_ipc::MetricKind::Counter => MetricKind::Counter,
                    tritium_ipc::MetricKind::Gauge => MetricKind::Gauge,
                    tritium_ipc::MetricKind::Histogram => MetricKind::Histogram,
                };
                session.family(&name, &description, kind).map(CallResult::Id)
            }
            CallOp::MetricFamilyDrop { id } => session.drop_family(id).map(|()| CallResult::Done),
            CallOp::MetricNew { family, labels, buckets } => {
                session.metric(family, labels, buckets).map(CallResult::Id)
            }
            CallOp::MetricDrop { id } => session.drop_metric(id).map(|()| CallResult::Done),
            CallOp::MetricOp { id, op, value } => {
                let op = match op {
                    tritium_ipc::MetricOp::Increment => MetricOp::Increment,
                    tritium_ipc::MetricOp::Set => MetricOp::Set,
                    tritium_ipc::MetricOp::Observe => MetricOp::Observe,
                };
                session.apply(id, op, value).map(|()| CallResult::Done)
            }
            CallOp::MetricValue { id } => session.value(id).map(CallResult::Value),
        };
        result.map_err(|e| e.to_string())
    })
}

/// How starting a stub went.
pub(super) enum Started {
    Ready(Arc<Stub>),
    /// Deterministic: `initialize` raised or took too long. Not retried.
    Failed(String),
    /// The process could not start or died on the way: worth a retry after a crash.
    Died(String, StubExit),
}

/// Starts the instance's stub, through the supervisor's states (starting, initializing).
pub(super) fn start_stub(ctx: &Arc<VersionContext>, instance: &Arc<Instance>) -> Started {
    instance.on(Event::Spawn);
    launch(ctx, instance, |stub| instance.on(Event::Spawned { pid: stub.pid(), channel: stub.channel().clone() }))
}

/// Starts a stub to replace the running one (recycling): the instance stays ready meanwhile.
fn prestart(ctx: &Arc<VersionContext>, instance: &Arc<Instance>) -> Started {
    launch(ctx, instance, |_| {})
}

/// Spawns a stub (`spawned` runs once it said hello), initializes it and runs the warmup.
fn launch(ctx: &Arc<VersionContext>, instance: &Arc<Instance>, spawned: impl FnOnce(&Stub)) -> Started {
    let spec = &instance.spec;
    let sup = &ctx.settings;
    let stub = match Stub::spawn_with_limits(&ctx.stub, &spec.name, sup.init_timeout, sup.channel) {
        Ok(stub) => stub,
        Err(e) => return Started::Died(e.to_string(), StubExit::Other(e.to_string())),
    };
    spawned(&stub);
    stub.set_call_handler(call_handler(instance.metrics.clone(), ctx.calls.clone(), ctx.model.clone()));
    stub.set_bls_handler(ctx.calls.bls_handler(ctx, instance, stub.channel()));
    let args = [
        ("model_config", ctx.config_json.clone()),
        ("model_instance_kind", spec.kind.to_string()),
        ("model_instance_name", spec.name.clone()),
        ("model_instance_device_id", spec.device_id.to_string()),
        ("model_repository", ctx.model_dir.display().to_string()),
        ("model_version", ctx.version.to_string()),
        ("model_name", ctx.model.clone()),
    ];
    let init = Initialize {
        model_file: ctx.model_file.display().to_string(),
        args: args.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        max_inflight_responses: sup.max_inflight_responses,
    };
    match stub.initialize(init, sup.init_timeout) {
        Ok(()) => {
            // Warmup runs before the instance is ready; a failing sample fails it (and the load).
            let next_id = || NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
            match crate::warmup::run(&stub, &ctx.warmup, ctx.decoupled, sup.execute_timeout, &next_id) {
                Ok(()) => Started::Ready(Arc::new(stub)),
                Err(why) => {
                    stub.kill();
                    Started::Failed(why)
                }
            }
        }
        Err(HostError::Timeout { after, .. }) => {
            stub.kill();
            Started::Failed(format!(
                "model '{}' instance '{}' did not finish initialize within {}s and was killed; raise the limit with \
                 --stub-init-timeout-secs or the model's parameters {{ key: \"stub_init_timeout_secs\" value: {{ string_value: \"N\" }} }}",
                ctx.model,
                spec.name,
                after.as_secs_f64()
            ))
        }
        Err(HostError::Model(e)) => {
            stub.kill();
            if e.traceback.is_some() {
                error!(model = %ctx.model, instance = %spec.name, "initialize failed: {e:#}");
            }
            Started::Failed(e.to_string())
        }
        Err(e) => {
            let exit = stub.kill();
            Started::Died(e.to_string(), exit)
        }
    }
}

/// How an instance's supervisor is waited for when its version retires.
pub(crate) enum Worker {
    /// A task on the runtime: the receiver sees its sender dropped when the task ends (or is
    /// dropped with the runtime).
    Task(mpsc::Receiver<()>),
    /// A thread of its own, where the server has no runtime (unit tests).
    Thread(std::thread::JoinHandle<()>),
}

impl Worker {
    /// Waits until the supervisor has ended. Blocks: not for the runtime's threads.
    pub(crate) fn join(self) {
        match self {
            Worker::Task(done) => while done.recv().is_ok() {},
            Worker::Thread(handle) => {
                let _ = handle.join();
            }
        }
    }
}

/// Starts the instance's supervisor ([`supervise()`]): a task on the server's runtime, so that
/// an instance costs the server no thread of its own; on a thread where there is no runtime.
/// `ready` receives the outcome of its first `initialize`.
pub(crate) fn spawn(
    ctx: Arc<VersionContext>,
    spec: InstanceSpec,
    ready: mpsc::Sender<Result<(), String>>,
) -> std::io::Result<Worker> {
    let instance = Arc::new(Instance::new(spec, ctx.metrics.session()));
    ctx.instances.locked().push(instance.clone());
    ctx.live_workers.fetch_add(1, Ordering::SeqCst);
    let span =
        tracing::info_span!("instance", model = %ctx.model, version = ctx.version, instance = %instance.spec.name);
    // The supervisor itself broke (serve's panics are caught inside it): the instance cannot
    // go on, so it is marked failed instead of staying "ready" without a worker.
    let ended = |ctx: &VersionContext, instance: &Instance, panicked: Option<String>| {
        if let Some(why) = panicked {
            error!("instance supervisor panicked: {why}");
            instance.on(Event::Died(format!("the instance worker panicked: {why}"), StubExit::Other(why.clone())));
            instance.on(Event::GaveUp(format!("the instance worker panicked and stopped: {why}")));
        }
        ctx.queue.instance_gone(&instance.spec.name);
        retire_worker(ctx);
    };
    if let Some(runtime) = ctx.runtime.clone() {
        let (done, joined) = mpsc::channel::<()>();
        let (c, i) = (ctx.clone(), instance.clone());
        let supervisor = runtime.spawn(async move { supervise(&c, &i, ready).await }.instrument(span.clone()));
        runtime.spawn(
            async move {
                let _done = done;
                match supervisor.await {
                    Ok(()) => ended(&ctx, &instance, None),
                    Err(e) if e.is_panic() => ended(&ctx, &instance, Some(panic_message(&*e.into_panic()))),
                    // Cancelled: the runtime shuts down, and the server with it.
                    Err(_) => {}
                }
            }
            .instrument(span),
        );
        return Ok(Worker::Task(joined));
    }
    let ctx2 = ctx.clone();
    let name = format!("instance-{}", instance.spec.name);
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let _enter = span.enter();
        let panicked = unwind_to_error(|| block_on(supervise(&ctx, &instance, ready))).err();
        ended(&ctx, &instance, panicked);
    });
    match spawned {
        Ok(handle) => Ok(Worker::Thread(handle)),
        Err(e) => {
            ctx2.live_workers.fetch_sub(1, Ordering::SeqCst);
            Err(e)
        }
    }
}

/// Runs `future` to completion on this thread, parking it between polls: the supervisor's
/// executor where the server has no runtime. Its blocking steps then run inline ([`blocking`]),
/// so it never waits for anything but them.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// Runs `f`, which blocks (starting a stub, `finalize`, a serve loop that waits on the ring),
/// on the runtime's blocking pool, in the current span; inline where there is no runtime. A
/// panic in `f` resumes here.
pub(super) async fn blocking<T: Send + 'static>(ctx: &VersionContext, f: impl FnOnce() -> T + Send + 'static) -> T {
    let Some(runtime) = &ctx.runtime else { return f() };
    let span = tracing::Span::current();
    match runtime.spawn_blocking(move || span.in_scope(f)).await {
        Ok(out) => out,
        Err(e) => match e.try_into_panic() {
            Ok(payload) => std::panic::resume_unwind(payload),
            // Cancelled before it ran: the runtime shuts down, and this task ends with it.
            Err(_) => std::future::pending().await,
        },
    }
}

/// A supervisor of `ctx` ends: the last one to go closes the queue and fails what is queued.
pub(super) fn retire_worker(ctx: &VersionContext) {
    if ctx.live_workers.fetch_sub(1, Ordering::SeqCst) == 1 {
        for p in ctx.queue.close() {
            p.tx.send(Err(InferError::unavailable(format!(
                "model '{}' version {} has no running instances",
                ctx.model, ctx.version
            ))));
        }
    }
}

/// Runs `f`, turning a panic into its message.
pub(super) fn unwind_to_error<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| panic_message(&*payload))
}

/// A panic's message, from its payload.
pub(super) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Why serving stopped.
pub(super) enum Served {
    /// The queue closed: unload or shutdown.
    Closed,
    /// An operator asked for a restart.
    Restart,
    /// The stub died or hung: why, and how its process ended.
    Died(String, StubExit),
}

/// The supervisor loop: start, serve, and on a crash back off and start again, until the queue
/// closes or the crashes exceed the limit. A task: its blocking steps run on the runtime's
/// blocking pool ([`blocking`]), and a run-to-completion lane is awaited, so that an instance
/// whose stub serves from a lane holds no thread.
pub(super) async fn supervise(
    ctx: &Arc<VersionContext>,
    instance: &Arc<Instance>,
    ready: mpsc::Sender<Result<(), String>>,
) {
    let sup = &ctx.settings;
    let mut ready = Some(ready);
    let mut crashes = Crashes::default();
    let mut backoff = sup.backoff_initial;
    if (sup.max_rss_bytes.is_some() || sup.max_requests.is_some()) && !recycles(ctx) {
        warn!("stub_max_rss_bytes and stub_max_requests do not apply to models with sequence batching (the state of their sequences lives in the stub): this instance is not recycled");
    }
    // A replacement started and ready while the stub it replaces served (recycling).
    let mut replacement: Option<(Arc<Stub>, RecycleReason)> = None;
    loop {
        instance.died.store(false, Ordering::Release);
        let (started, recycled) = match replacement.take() {
            Some((stub, reason)) => (Started::Ready(stub), Some(reason)),
            None => {
                let (c, i) = (ctx.clone(), instance.clone());
                (blocking(ctx, move || start_stub(&c, &i)).await, None)
            }
        };
        let stub = match started {
            Started::Ready(stub) => stub,
            Started::Failed(why) => {
                instance.on(Event::InitFailed(why.clone()));
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(why));
                }
                return;
            }
            Started::Died(why, exit) => {
                if let Some(tx) = ready.take() {
                    // A stub that cannot even start at load time fails the load.
                    instance.on(Event::InitFailed(why.clone()));
                    let _ = tx.send(Err(why));
                    return;
                }
                instance.on(Event::Died(why, exit));
                if !back_off(ctx, instance, &mut crashes, &mut backoff, true).await {
                    return;
                }
                continue;
            }
        };
        let watched = {
            let instance = instance.clone();
            let queue = ctx.queue.clone();
            stub.watch(sup.heartbeat_timeout, move || {
                instance.died.store(true, Ordering::Release);
                queue.wake_all();
            })
        };
        if let Err(e) = watched {
            warn!("cannot watch the stub process ({e}); crashes are noticed on the next request only");
        }
        *instance.probe.locked() = Some(Arc::new(crate::scrape::StubProbe::new(stub.metrics_probe())));
        *instance.stacks.locked() = Some(stub.stack_probe());
        instance.taken.store(0, Ordering::Relaxed);
        let rss_at_ready = rss_of(stub.pid()).unwrap_or(0);
        instance.rss_at_ready.store(rss_at_ready, Ordering::Relaxed);
        if let Some(max) = sup.max_rss_bytes.filter(|max| rss_at_ready >= *max) {
            warn!(
                "the stub holds {rss_at_ready} bytes resident once ready, at least stub_max_rss_bytes ({max}): \
                 it is not recycled for its memory (raise the limit)"
            );
        }
        match recycled {
            Some(reason) => {
                instance.recycled[reason as usize].fetch_add(1, Ordering::Relaxed);
                instance.on(Event::Recycled { pid: stub.pid(), channel: stub.channel().clone() });
            }
            None => instance.on(Event::Initialized),
        }
        if let Some(tx) = ready.take() {
            let _ = tx.send(Ok(()));
        }
        let ready_at = Instant::now();
        let served = if recycles(ctx) {
            let (served, next) = serve_within_limits(ctx, instance, &stub).await;
            replacement = next;
            served
        } else {
            serve_caught(ctx, instance, &stub).await
        };
        if let (Some((next, reason)), Served::Restart) = (&replacement, &served) {
            // The old stub took its last batch and answered it: the replacement serves from now
            // on, and the old one is finalized beside it, on a thread of its own.
            instance.restart.store(false, Ordering::Release);
            instance.recycling.store(false, Ordering::Release);
            info!(old = stub.pid(), new = next.pid(), reason = reason.as_str(), "stub recycled");
            finalize_beside(instance, stub, "the recycled stub");
            continue;
        }
        instance.recycling.store(false, Ordering::Release);
        if let Some((next, _)) = replacement.take() {
            // The old stub died or the version stops: the replacement is not needed.
            blocking(ctx, move || {
                if let Err(e) = next.finalize(Duration::from_secs(30)) {
                    warn!("finalize of an unused replacement stub: {e}");
                }
            })
            .await;
        }
        match served {
            Served::Closed => {
                instance.on(Event::Stop);
                blocking(ctx, move || {
                    if let Err(e) = stub.finalize(Duration::from_secs(30)) {
                        warn!("finalize: {e}");
                    }
                })
                .await;
                instance.on(Event::Stopped);
                return;
            }
            Served::Restart => {
                // The old stub has answered its last batch: it finalizes while its replacement
                // starts, so a restart waits for the new stub's start only, not for both.
                instance.restart.store(false, Ordering::Release);
                instance.on(Event::RestartRequested);
                finalize_beside(instance, stub, "the restarted stub");
            }
            Served::Died(why, exit) => {
                // A stub killed by SIGBUS while a client's region it had mapped is shorter than
                // registered died of the client's truncation, not of the model's code: the crash
                // is not counted against the restart limit.
                let client_fault = matches!(exit, StubExit::Signal { signal: libc::SIGBUS, .. })
                    .then(|| crate::shm::shrunk_region(&stub.channel().region_ids()))
                    .flatten();
                // The last reference: dropping it reaps the process.
                blocking(ctx, move || drop(stub)).await;
                let why = match &client_fault {
                    Some(key) => format!(
                        "{why} (the client shrank shared memory region '{key}' while the model used it; \
                         not counted against the restart limit)"
                    ),
                    None => why,
                };
                instance.on(Event::Died(why, exit));
                if ready_at.elapsed() >= sup.healthy_after {
                    backoff = sup.backoff_initial;
                }
                if !back_off(ctx, instance, &mut crashes, &mut backoff, client_fault.is_none()).await {
                    return;
                }
            }
        }
    }
}

/// Finalizes `old` (a stub that has answered its last batch and takes no more) on a thread of
/// its own, so that its `finalize` (up to 30 s, then a kill) does not delay the stub that
/// replaces it. Its exit is no longer watched: it is not a crash of the instance. Without a
/// thread it is finalized here.
fn finalize_beside(instance: &Instance, old: Arc<Stub>, what: &'static str) {
    old.unwatch();
    let moved = old.clone();
    let spawned = std::thread::Builder::new().name(format!("finalize-{}", instance.spec.name)).spawn(move || {
        if let Err(e) = moved.finalize(Duration::from_secs(30)) {
            warn!("finalize of {what}: {e}");
        }
    });
    if let Err(e) = spawned {
        warn!("cannot finalize {what} on a thread of its own ({e}); it is finalized first");
        if let Err(e) = old.finalize(Duration::from_secs(30)) {
            warn!("finalize of {what}: {e}");
        }
    }
}

/// Serves `stub` until it stops, turning a panic of the worker into a crash of the stub: from
/// a lane on the runtime where the model can be served so, else by the serve loop on a thread
/// of the blocking pool.
async fn serve_caught(ctx: &Arc<VersionContext>, instance: &Arc<Instance>, stub: &Arc<Stub>) -> Served {
    if lane::eligible(ctx) {
        return lane::serve(ctx, instance, stub).await;
    }
    let (c, i, s) = (ctx.clone(), instance.clone(), stub.clone());
    blocking(ctx, move || {
        // A panic while serving (a bug in the worker) must not leave the instance "ready" with
        // nobody taking its queue: it ends this stub like a crash, and the supervisor restarts
        // (or gives up) as for any other. The batch in flight is answered as dropped.
        unwind_to_error(|| serve(&c, &i, &s)).unwrap_or_else(|why| {
            error!("instance worker panicked: {why}");
            i.inflight.store(0, Ordering::Relaxed);
            let exit = s.kill();
            Served::Died(format!("the instance worker panicked: {why}"), exit)
        })
    })
    .await
}

/// What the end of a task that served `stub` means to the supervisor: its answer; a panic ends
/// the stub like a crash; cancelled, the runtime shuts down and the server stops.
pub(super) fn served_by_task(
    joined: Result<Served, tokio::task::JoinError>,
    instance: &Instance,
    stub: &Stub,
) -> Served {
    match joined {
        Ok(served) => served,
        Err(e) if e.is_panic() => {
            let why = panic_message(&*e.into_panic());
            error!("instance task panicked: {why}");
            instance.inflight.store(0, Ordering::Relaxed);
            let exit = crate::off_runtime(|| stub.kill());
            Served::Died(format!("the instance worker panicked: {why}"), exit)
        }
        Err(_) => Served::Closed,
    }
}

/// Whether the version's stubs are recycled: it has a limit, and no sequence batcher (a
/// sequence's state lives in its stub, and would be lost).
fn recycles(ctx: &VersionContext) -> bool {
    let sup = &ctx.settings;
    (sup.max_rss_bytes.is_some() || sup.max_requests.is_some()) && !ctx.queue.is_sequenced()
}

/// How often a stub with limits (`stub_max_rss_bytes`, `stub_max_requests`) is checked.
const LIMIT_CHECK: Duration = Duration::from_millis(250);

/// [`serve_caught`] for a version with recycling limits: while the stub serves, its limits are
/// checked every [`LIMIT_CHECK`]. A stub over one gets a replacement, started while the old one
/// goes on serving; once it is ready the old one is asked to stop taking batches (the restart
/// flag), and serving ends with [`Served::Restart`] and the replacement. A replacement that
/// fails to start is retried after the longest restart delay; the old stub serves on meanwhile.
async fn serve_within_limits(
    ctx: &Arc<VersionContext>,
    instance: &Arc<Instance>,
    stub: &Arc<Stub>,
) -> (Served, Option<(Arc<Stub>, RecycleReason)>) {
    let Some(runtime) = ctx.runtime.clone() else {
        warn!("recycling needs the server's runtime; the stub is served without recycling");
        return (serve_caught(ctx, instance, stub).await, None);
    };
    // Served by a task of its own, so that it goes on while a replacement starts.
    let serving = {
        let (c, i, s) = (ctx.clone(), instance.clone(), stub.clone());
        runtime.spawn(async move { serve_caught(&c, &i, &s).await }.instrument(tracing::Span::current()))
    };
    let mut serving = std::pin::pin!(serving);
    let mut next = None;
    let mut retry_at = Instant::now();
    loop {
        tokio::select! {
            served = &mut serving => return (served_by_task(served, instance, stub), next),
            () = tokio::time::sleep(LIMIT_CHECK) => {}
        }
        if next.is_some() || Instant::now() < retry_at {
            continue;
        }
        let Some((reason, why)) = over_limit(&ctx.settings, instance, stub) else { continue };
        info!(reason = reason.as_str(), "stub {why}; starting its replacement");
        let (c, i) = (ctx.clone(), instance.clone());
        match blocking(ctx, move || prestart(&c, &i)).await {
            Started::Ready(fresh) => {
                next = Some((fresh, reason));
                instance.recycling.store(true, Ordering::Release);
                instance.request_restart(&ctx.queue);
            }
            Started::Failed(e) | Started::Died(e, _) => {
                warn!("the replacement of the stub over its limit did not start: {e}; the stub serves on");
                retry_at = Instant::now() + ctx.settings.backoff_max;
            }
        }
    }
}

/// Which limit the running stub is over, if any, and how, in words.
fn over_limit(sup: &InstanceSettings, instance: &Instance, stub: &Stub) -> Option<(RecycleReason, String)> {
    if let Some(max) = sup.max_requests {
        let taken = instance.taken.load(Ordering::Relaxed);
        if taken >= max {
            return Some((RecycleReason::Requests, format!("took {taken} requests (stub_max_requests {max})")));
        }
    }
    // A stub that starts over the limit would be replaced by another one over it, again and again.
    if let Some(max) = sup.max_rss_bytes.filter(|max| instance.rss_at_ready.load(Ordering::Relaxed) < *max) {
        let rss = rss_of(stub.pid()).unwrap_or(0);
        if rss > max {
            return Some((RecycleReason::Rss, format!("holds {rss} bytes resident (stub_max_rss_bytes {max})")));
        }
    }
    None
}

/// The crashes within the restart window.
#[derive(Debug, Default)]
pub(super) struct Crashes(pub(super) VecDeque<Instant>);

impl Crashes {
    /// Records a crash at `now` and returns how many fell within `window` of it.
    pub(super) fn record(&mut self, now: Instant, window: Duration) -> usize {
        self.0.push_back(now);
        while self.0.front().is_some_and(|t| now.duration_since(*t) > window) {
            self.0.pop_front();
        }
        self.0.len()
    }
}

/// Records a crash (when `counted`: a client's fault is not), then either gives up (too many
/// crashes) or enters backing off and sleeps the delay. False when the instance gives up or the
/// queue closes meanwhile (the instance then stops).
pub(super) async fn back_off(
    ctx: &VersionContext,
    instance: &Instance,
    crashes: &mut Crashes,
    backoff: &mut Duration,
    counted: bool,
) -> bool {
    let sup = &ctx.settings;
    let recent = if counted { crashes.record(Instant::now(), sup.restart_window) } else { 0 };
    if recent as u64 > u64::from(sup.restart_limit) {
        instance.on(Event::GaveUp(format!(
            "crashed {recent} times within {}s; marked failed (limits: --stub-restart-limit, --stub-restart-window-secs). Last: {}",
            sup.restart_window.as_secs(),
            instance.reason()
        )));
        return false;
    }
    instance.on(Event::BackOff);
    let delay = *backoff;
    *backoff = (*backoff * 2).min(sup.backoff_max);
    let queue = ctx.queue.clone();
    if blocking(ctx, move || queue.wait_closed(delay)).await {
        instance.on(Event::Stop);
        instance.on(Event::Stopped);
        return false;
    }
    true
}
