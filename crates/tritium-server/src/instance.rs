//! One model instance: a supervised worker thread that owns a stub, takes batches from the
//! version's queue, turns stub responses into client responses, and restarts the stub when it
//! dies or hangs.
//!
//! The supervisor's state changes in one place, [`Status::on`]: one event enum, one `match`,
//! every transition logged inside the instance's span and counted. The worker thread spawns its
//! own stubs, so a stub's `PR_SET_PDEATHSIG` is tied to a thread that lives as long as the
//! instance.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tracing::{error, info, warn};
use tritium_host::{CallHandler, HostError, Stub, StubCommand, StubExit};
use tritium_ipc::{CallOp, CallResult, Initialize, Request, TensorData};
use tritium_metrics::{CustomMetrics, MetricKind, MetricOp, MetricsSession};

use crate::scheduler::{Next, Pending, Queue};
use crate::stats::{ExecTimes, Stats};
use crate::types::{ErrorKind, InferError, InferResponse, InstanceInfo, InstanceState, OutputTensor};

/// Supervision limits: server-wide flags, overridable per model in `parameters`.
#[derive(Debug, Clone)]
pub struct Supervision {
    /// Starting a stub and running `initialize` (`stub_init_timeout_secs`).
    pub init_timeout: Duration,
    /// One `execute` call (`execute_timeout_secs`); `None` waits for ever.
    pub execute_timeout: Option<Duration>,
    /// A stub whose native heartbeat stops for this long is killed as hung.
    pub heartbeat_timeout: Option<Duration>,
    /// Crashes within `restart_window` after which the instance is marked failed
    /// (`stub_restart_limit`).
    pub restart_limit: u32,
    /// The window for `restart_limit` (`stub_restart_window_secs`).
    pub restart_window: Duration,
    /// First restart delay; doubles with each crash up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest restart delay (`stub_backoff_max_secs`).
    pub backoff_max: Duration,
    /// An instance ready this long has its backoff reset.
    pub healthy_after: Duration,
}

impl Default for Supervision {
    fn default() -> Self {
        Self {
            init_timeout: Duration::from_secs(300),
            execute_timeout: None,
            heartbeat_timeout: Some(Duration::from_secs(10)),
            restart_limit: 5,
            restart_window: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            healthy_after: Duration::from_secs(30),
        }
    }
}

/// Everything an instance of one model version needs.
pub(crate) struct VersionContext {
    pub model: String,
    pub version: i64,
    pub model_file: PathBuf,
    pub model_dir: PathBuf,
    pub config_json: String,
    pub queue: Arc<Queue>,
    pub stats: Arc<Stats>,
    pub stub: StubCommand,
    pub supervision: Supervision,
    /// Workers still serving; the last one to leave fails whatever is queued.
    pub live_workers: AtomicUsize,
    /// The instances, for reporting and for restart requests.
    pub instances: Mutex<Vec<Arc<Instance>>>,
    /// The server's custom-metric registry.
    pub metrics: CustomMetrics,
}

/// Which instance this is, as `initialize(args)` reports it.
#[derive(Debug, Clone)]
pub(crate) struct InstanceSpec {
    pub name: String,
    pub kind: &'static str,
    pub device_id: i32,
}

/// What happens to an instance; fed to [`Status::on`].
#[derive(Debug)]
enum Event {
    /// A stub process is being started.
    Spawn,
    /// The process started and said hello.
    Spawned(u32),
    /// `initialize` returned.
    Initialized,
    /// `initialize` raised or timed out: a deterministic failure, not retried.
    InitFailed(String),
    /// The stub exited, was killed, hung, or broke the protocol: why, and how its process ended.
    Died(String, StubExit),
    /// The restart delay is over.
    BackoffOver,
    /// An operator asked for a restart; the stub finishes its batch and is finalized.
    RestartRequested,
    /// Too many crashes in the window.
    GaveUp(String),
    /// The version is being unloaded or the server stops.
    Stop,
    /// The stub is gone for good.
    Stopped,
}

/// The supervisor's view of one instance.
struct Status {
    state: InstanceState,
    pid: Option<u32>,
    started: Option<(Instant, SystemTime)>,
    restarts: u64,
    last_exit: Option<(StubExit, SystemTime)>,
    reason: String,
    transitions: BTreeMap<&'static str, u64>,
    /// The running stub's channel, for reporting its shared memory when asked.
    channel: Option<Arc<tritium_ipc::ServerChannel>>,
}

impl Status {
    /// The one place where the state changes.
    fn on(&mut self, event: Event) {
        use InstanceState as S;
        let from = self.state;
        let to = match (&event, from) {
            (Event::Spawn, _) => {
                self.channel = None;
                S::Starting
            }
            (Event::Spawned(pid), _) => {
                self.pid = Some(*pid);
                self.started = Some((Instant::now(), SystemTime::now()));
                S::Initializing
            }
            (Event::Initialized, _) => {
                self.reason.clear();
                S::Ready
            }
            (Event::InitFailed(why), _) | (Event::GaveUp(why), _) => {
                self.reason = why.clone();
                S::Failed
            }
            (Event::Died(why, exit), _) => {
                self.last_exit = Some((exit.clone(), SystemTime::now()));
                self.reason = why.clone();
                self.pid = None;
                self.channel = None;
                self.started = None;
                S::Crashed
            }
            (Event::BackoffOver, _) => {
                self.restarts += 1;
                S::BackingOff
            }
            (Event::RestartRequested, _) => {
                self.restarts += 1;
                S::Draining
            }
            (Event::Stop, S::Failed) => S::Failed,
            (Event::Stop, _) => S::Stopping,
            (Event::Stopped, S::Failed) => S::Failed,
            (Event::Stopped, _) => {
                self.pid = None;
                self.channel = None;
                self.started = None;
                S::Stopped
            }
        };
        // Backing off is entered on a crash and left on the next spawn.
        let to = if matches!(event, Event::Died(..)) { S::Crashed } else { to };
        *self.transitions.entry(to.as_str()).or_default() += 1;
        self.state = to;
        match to {
            S::Failed | S::Crashed => {
                error!(from = from.as_str(), to = to.as_str(), reason = %self.reason, "instance state")
            }
            _ => info!(from = from.as_str(), to = to.as_str(), "instance state"),
        }
    }
}

/// One instance: its supervisor status and its control flags.
pub(crate) struct Instance {
    pub spec: InstanceSpec,
    /// The custom metrics this instance's model code holds. It outlives stub restarts, so that
    /// counters keep counting; it is released when the instance stops.
    metrics: Arc<MetricsSession>,
    status: Mutex<Status>,
    /// The stub died (set by its watcher thread).
    died: AtomicBool,
    /// An operator asked for a restart.
    restart: AtomicBool,
    inflight: AtomicU64,
    executions: AtomicU64,
}

impl Instance {
    fn new(spec: InstanceSpec, metrics: MetricsSession) -> Self {
        Self {
            spec,
            metrics: Arc::new(metrics),
            status: Mutex::new(Status {
                state: InstanceState::Starting,
                pid: None,
                started: None,
                restarts: 0,
                last_exit: None,
                reason: String::new(),
                transitions: BTreeMap::new(),
                channel: None,
            }),
            died: AtomicBool::new(false),
            restart: AtomicBool::new(false),
            inflight: AtomicU64::new(0),
            executions: AtomicU64::new(0),
        }
    }

    fn on(&self, event: Event) {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).on(event);
    }

    /// The current state.
    pub(crate) fn state(&self) -> InstanceState {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).state
    }

    /// Why it is failed or crashed, if it is.
    pub(crate) fn reason(&self) -> String {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).reason.clone()
    }

    /// Restarts so far.
    pub(crate) fn restarts(&self) -> u64 {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).restarts
    }

    /// Asks the worker to drain and restart the stub.
    pub(crate) fn request_restart(&self, queue: &Queue) {
        self.restart.store(true, Ordering::Release);
        queue.wake_all();
    }

    /// A report for the CLI and metrics.
    pub(crate) fn info(&self, model: &str, version: i64) -> InstanceInfo {
        let st = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let rss_bytes = st.pid.and_then(rss_of).unwrap_or(0);
        InstanceInfo {
            model: model.to_string(),
            version,
            instance: self.spec.name.clone(),
            pid: st.pid,
            state: st.state,
            uptime: st.started.map(|(t, _)| t.elapsed()),
            restarts: st.restarts,
            last_exit: st.last_exit.clone(),
            reason: st.reason.clone(),
            rss_bytes,
            shm_bytes: st.channel.as_ref().map_or(0, |c| c.shm_bytes()),
            inflight: self.inflight.load(Ordering::Relaxed),
            executions: self.executions.load(Ordering::Relaxed),
            transitions: st.transitions.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }
    }
}

/// Resident set size of a process, from `/proc/PID/statm`.
fn rss_of(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Some(pages * page)
}

static NEXT_REQUEST: AtomicU64 = AtomicU64::new(1);

/// Answers model code's custom-metric calls from the instance's session.
fn call_handler(session: Arc<MetricsSession>) -> CallHandler {
    Arc::new(move |op| {
        let result = match op {
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
enum Started {
    Ready(Box<Stub>),
    /// Deterministic: `initialize` raised or took too long. Not retried.
    Failed(String),
    /// The process could not start or died on the way: worth a retry after a crash.
    Died(String, StubExit),
}

fn start(ctx: &VersionContext, instance: &Instance) -> Started {
    let spec = &instance.spec;
    let sup = &ctx.supervision;
    instance.on(Event::Spawn);
    let stub = match Stub::spawn(&ctx.stub, &spec.name, sup.init_timeout) {
        Ok(stub) => stub,
        Err(e) => return Started::Died(e.to_string(), StubExit::Other(e.to_string())),
    };
    instance.on(Event::Spawned(stub.pid()));
    stub.set_call_handler(call_handler(instance.metrics.clone()));
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
    };
    match stub.initialize(init, sup.init_timeout) {
        Ok(()) => Started::Ready(Box::new(stub)),
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
            Started::Failed(e.to_string())
        }
        Err(e) => {
            let exit = stub.kill();
            Started::Died(e.to_string(), exit)
        }
    }
}

/// Starts the instance's worker thread. `ready` receives the outcome of its first `initialize`.
pub(crate) fn spawn(
    ctx: Arc<VersionContext>,
    spec: InstanceSpec,
    ready: mpsc::Sender<Result<(), String>>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let instance = Arc::new(Instance::new(spec, ctx.metrics.session()));
    ctx.instances.lock().unwrap_or_else(|p| p.into_inner()).push(instance.clone());
    ctx.live_workers.fetch_add(1, Ordering::SeqCst);
    let name = format!("instance-{}", instance.spec.name);
    let ctx2 = ctx.clone();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let span =
            tracing::info_span!("instance", model = %ctx.model, version = ctx.version, instance = %instance.spec.name);
        let _enter = span.enter();
        supervise(&ctx, &instance, ready);
        leave(&ctx);
    });
    if spawned.is_err() {
        ctx2.live_workers.fetch_sub(1, Ordering::SeqCst);
    }
    spawned
}

fn leave(ctx: &VersionContext) {
    if ctx.live_workers.fetch_sub(1, Ordering::SeqCst) == 1 {
        for p in ctx.queue.close() {
            let _ = p.tx.send(Err(InferError::unavailable(format!(
                "model '{}' version {} has no running instances",
                ctx.model, ctx.version
            ))));
        }
    }
}

/// Why serving stopped.
enum Served {
    /// The queue closed: unload or shutdown.
    Closed,
    /// An operator asked for a restart.
    Restart,
    /// The stub died or hung: why, and how its process ended.
    Died(String, StubExit),
}

/// The supervisor loop: start, serve, and on a crash back off and start again, until the queue
/// closes or the crashes exceed the limit.
fn supervise(ctx: &Arc<VersionContext>, instance: &Arc<Instance>, ready: mpsc::Sender<Result<(), String>>) {
    let sup = &ctx.supervision;
    let mut ready = Some(ready);
    let mut crashes: VecDeque<Instant> = VecDeque::new();
    let mut backoff = sup.backoff_initial;
    loop {
        instance.died.store(false, Ordering::Release);
        let stub = match start(ctx, instance) {
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
                if !back_off(ctx, instance, &mut crashes, &mut backoff) {
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
        instance.status.lock().unwrap_or_else(|p| p.into_inner()).channel = Some(stub.channel().clone());
        instance.on(Event::Initialized);
        if let Some(tx) = ready.take() {
            let _ = tx.send(Ok(()));
        }
        let ready_at = Instant::now();
        match serve(ctx, instance, &stub) {
            Served::Closed => {
                instance.on(Event::Stop);
                if let Err(e) = stub.finalize(Duration::from_secs(30)) {
                    warn!("finalize: {e}");
                }
                instance.on(Event::Stopped);
                return;
            }
            Served::Restart => {
                instance.restart.store(false, Ordering::Release);
                instance.on(Event::RestartRequested);
                if let Err(e) = stub.finalize(Duration::from_secs(30)) {
                    warn!("finalize before restart: {e}");
                }
            }
            Served::Died(why, exit) => {
                drop(stub);
                instance.on(Event::Died(why, exit));
                if ready_at.elapsed() >= sup.healthy_after {
                    backoff = sup.backoff_initial;
                }
                if !back_off(ctx, instance, &mut crashes, &mut backoff) {
                    return;
                }
            }
        }
    }
}

/// Records a crash and sleeps the backoff; false when the instance gives up (or the queue
/// closed meanwhile).
fn back_off(
    ctx: &VersionContext,
    instance: &Instance,
    crashes: &mut VecDeque<Instant>,
    backoff: &mut Duration,
) -> bool {
    let sup = &ctx.supervision;
    let now = Instant::now();
    crashes.push_back(now);
    while crashes.front().is_some_and(|t| now.duration_since(*t) > sup.restart_window) {
        crashes.pop_front();
    }
    if crashes.len() as u32 > sup.restart_limit {
        instance.on(Event::GaveUp(format!(
            "crashed {} times within {}s; marked failed (limits: --stub-restart-limit, --stub-restart-window-secs). Last: {}",
            crashes.len(),
            sup.restart_window.as_secs(),
            instance.reason()
        )));
        return false;
    }
    let delay = *backoff;
    *backoff = (*backoff * 2).min(sup.backoff_max);
    let deadline = Instant::now() + delay;
    while Instant::now() < deadline {
        if ctx.queue.is_closed() {
            return false;
        }
        std::thread::sleep((deadline - Instant::now()).min(Duration::from_millis(20)));
    }
    instance.on(Event::BackoffOver);
    true
}

/// How often an idle worker handles what its stub sent unasked (logs and calls from model
/// threads).
const IDLE_POLL: Duration = Duration::from_millis(50);

fn serve(ctx: &VersionContext, instance: &Instance, stub: &Stub) -> Served {
    let interrupted = || instance.died.load(Ordering::Acquire) || instance.restart.load(Ordering::Acquire);
    loop {
        match ctx.queue.next_batch_unless(&interrupted, IDLE_POLL) {
            Next::Closed => return Served::Closed,
            Next::Idle => {
                if let Err(e) = stub.poll() {
                    let exit = stub.kill();
                    return Served::Died(e.to_string(), exit);
                }
            }
            Next::Interrupted => {
                if instance.died.load(Ordering::Acquire) {
                    let status = stub.kill();
                    return Served::Died(
                        format!("stub exited while idle ({status}); last stderr lines:\n{}", stub.stderr_tail()),
                        status,
                    );
                }
                return Served::Restart;
            }
            Next::Batch(batch) => {
                instance.inflight.store(batch.len() as u64, Ordering::Relaxed);
                instance.executions.fetch_add(1, Ordering::Relaxed);
                let result = run_batch(ctx, stub, batch);
                instance.inflight.store(0, Ordering::Relaxed);
                instance.status.lock().unwrap_or_else(|p| p.into_inner()).channel = Some(stub.channel().clone());
                if let Err(e) = result {
                    error!("{e}");
                    let exit = stub.kill();
                    return Served::Died(e.to_string(), exit);
                }
            }
        }
    }
}

/// Runs one batch; answers every request in it. Returns the stub's error if the stub is unusable.
fn run_batch(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Result<(), HostError> {
    let t0 = Instant::now();
    let mut waiting: HashMap<u64, Pending> = HashMap::with_capacity(batch.len());
    let mut requests = Vec::with_capacity(batch.len());
    let mut batch_size = 0;
    for p in batch {
        if p.tx.is_closed() {
            // The client went away while the request waited (a dropped HTTP connection, a
            // cancelled gRPC call): do not spend the model's time on it.
            finish(ctx, p, Err(InferError::new(ErrorKind::Cancelled, "the client cancelled the request")), None);
            continue;
        }
        let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
        let mut inputs = Vec::with_capacity(p.req.inputs.len());
        let mut failed = None;
        for t in &p.req.inputs {
            match stub.input(&t.data) {
                Ok(desc) => inputs.push(tritium_ipc::Tensor {
                    name: t.name.clone(),
                    dtype: t.datatype,
                    shape: t.shape.clone(),
                    data: TensorData::Shm { desc, writable: true },
                }),
                Err(e) => {
                    failed =
                        Some(InferError::internal(format!("cannot place input '{}' in shared memory: {e}", t.name)));
                    break;
                }
            }
        }
        if let Some(err) = failed {
            for t in &inputs {
                if let TensorData::Shm { desc, .. } = t.data {
                    let _ = stub.channel().free_own(desc);
                }
            }
            finish(ctx, p, Err(err), None);
            continue;
        }
        batch_size += p.batch_size.max(1);
        requests.push(Request {
            id,
            request_id: p.req.id.clone(),
            correlation_id: p.req.correlation_id.clone(),
            flags: p.req.flags,
            timeout_us: p.req.timeout_us,
            parameters: p.req.parameters.clone(),
            inputs,
            requested_outputs: p.outputs.clone(),
        });
        waiting.insert(id, p);
    }
    if requests.is_empty() {
        return Ok(());
    }
    let t1 = Instant::now();
    let executed = match stub.execute(requests, ctx.supervision.execute_timeout) {
        Ok(done) => done,
        Err(e) => {
            let message = match &e {
                HostError::Timeout { after, .. } => format!(
                    "model '{}' instance '{}' did not finish execute within {}s (parameters {{ key: \"execute_timeout_secs\" }}); the instance was killed and is restarting",
                    ctx.model,
                    stub.instance(),
                    after.as_secs_f64()
                ),
                other => other.to_string(),
            };
            for (_, p) in waiting.drain() {
                finish(ctx, p, Err(InferError::internal(message.clone())), None);
            }
            return Err(e);
        }
    };
    let t2 = Instant::now();
    let mut answers = Vec::with_capacity(executed.responses.len());
    for resp in &executed.responses {
        let Some(p) = waiting.remove(&resp.request) else { continue };
        let result = match &resp.error {
            Some(e) => Err(InferError::new(ErrorKind::from_triton_code(e.code), e.message.clone())),
            None => {
                let mut outputs = Vec::with_capacity(resp.outputs.len());
                let mut err = None;
                for t in &resp.outputs {
                    match stub.output(&t.data) {
                        Ok(view) => outputs.push(OutputTensor {
                            name: t.name.clone(),
                            datatype: t.dtype,
                            shape: t.shape.clone(),
                            data: view.to_vec(),
                        }),
                        Err(e) => {
                            err = Some(InferError::internal(e.to_string()));
                            break;
                        }
                    }
                }
                match err {
                    Some(e) => Err(e),
                    None => {
                        order_outputs(&mut outputs, &p.outputs);
                        Ok(InferResponse {
                            model: ctx.model.clone(),
                            version: ctx.version,
                            id: p.req.id.clone(),
                            outputs,
                            parameters: resp.parameters.clone(),
                        })
                    }
                }
            }
        };
        stub.release_outputs(resp);
        answers.push((p, result));
    }
    let fallback = executed
        .error
        .map(|e| e.to_string())
        .unwrap_or_else(|| "the model sent no response for this request".to_string());
    for (_, p) in waiting.drain() {
        answers.push((p, Err(InferError::internal(fallback.clone()))));
    }
    let t3 = Instant::now();
    let times = ExecTimes { compute_input: t1 - t0, compute_infer: t2 - t1, compute_output: t3 - t2 };
    ctx.stats.execution(batch_size, times);
    for (p, result) in answers {
        let queue = t0.saturating_duration_since(p.enqueued);
        finish(ctx, p, result, Some((queue, times)));
    }
    Ok(())
}

/// Puts outputs in the order the client asked for them.
fn order_outputs(outputs: &mut [OutputTensor], requested: &[String]) {
    outputs.sort_by_key(|o| requested.iter().position(|r| r == &o.name).unwrap_or(usize::MAX));
}

fn finish(
    ctx: &VersionContext,
    p: Pending,
    result: Result<InferResponse, InferError>,
    timing: Option<(Duration, ExecTimes)>,
) {
    let total = p.enqueued.elapsed();
    match (&result, timing) {
        (Ok(_), Some((queue, times))) => ctx.stats.success(p.batch_size, total, queue, times),
        (Err(e), timing) => ctx.stats.failure(total, e.kind, timing.is_some() || e.kind == ErrorKind::Internal),
        (Ok(_), None) => ctx.stats.failure(total, ErrorKind::Internal, true),
    }
    let _ = p.tx.send(result);
}
