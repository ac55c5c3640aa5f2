//! One model instance: a supervised worker thread that owns a stub, takes batches from the
//! version's queue, turns stub responses into client responses, and restarts the stub when it
//! dies or hangs.
//!
//! The supervisor's legal transitions are one `match (state, event)` table, [`transition`];
//! its state changes in one place, [`Status::on`], which refuses (logs and counts) an impossible
//! event, logs every change inside the instance's span, counts it, and publishes it on a watch
//! channel for whoever waits for a state. The worker thread spawns its own stubs, so a stub's
//! `PR_SET_PDEATHSIG` is tied to a thread that lives as long as the instance.
//!
//! A batch runs in named steps: [`place_inputs`], execute, [`collect_responses`] (outputs read,
//! ordered and classified), and the times recorded. A decoupled model's batch
//! ([`run_decoupled_batch`]) leaves its requests in the worker's [`Open`] table, which forwards
//! each response as it arrives, during `execute` and while the worker is idle, until the final one.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tracing::{error, info, warn};
use tritium_host::{CallHandler, ChannelLimits, HostError, Stub, StubCommand, StubExit};
use tritium_ipc::Response;
use tritium_ipc::{CallOp, CallResult, Descriptor, Initialize, IpcError, Request, TensorData, ToStub};
use tritium_metrics::{CustomMetrics, MetricKind, MetricOp, MetricsSession};
use tritium_trace::Activity;

use crate::classify::{Classes, ClassifyError};
use crate::pending::{Next, Pending, Reply, CANCELLED};
use crate::scheduler::Queue;
use crate::stats::{ExecTimes, Stats};
use crate::types::{
    ErrorKind, InferError, InferResponse, InstanceInfo, InstanceState, OutputTensor, RequestedOutput, Streamed,
};
use crate::validate;

mod calls;
mod lane;
#[cfg(test)]
pub(crate) mod testing;

pub(crate) use calls::{BlsCall, BlsCalls, ModelCalls, NoModelCalls};

pub use lane::park_spin;

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
    /// Most bytes of a request's id and parameters (keys and string values), checked before it
    /// is queued (`--max-request-metadata-bytes`).
    pub max_request_metadata_bytes: usize,
    /// Most bytes of output tensors in one response, checked before any is copied
    /// (`--max-output-bytes`).
    pub max_output_bytes: u64,
    /// Most responses of one decoupled request sent by the model and not yet taken by its
    /// client; the model's next `send` waits for the client (`--max-inflight-responses`; 0: no
    /// limit).
    pub max_inflight_responses: u32,
    /// Requests of sequences waiting for a free sequence slot that one model version holds at
    /// most (`--max-sequence-backlog`); a request past it is refused.
    pub max_sequence_backlog: usize,
    /// What a stub may make the server map, and how much the server's arena for one stub may
    /// hold (`--max-stub-segments`, `--max-stub-shm-bytes`, `--max-server-shm-bytes-per-stub`).
    pub channel: ChannelLimits,
    /// Instances of models that are not decoupled and have no sequence batcher are served by a
    /// task on the async runtime rather than by their worker thread (`--run-to-completion`).
    pub run_to_completion: bool,
}

/// Default of `--max-request-metadata-bytes`: 64 KiB. Request ids are short tokens (UUIDs are
/// 36 bytes), and one request's metadata must leave room in the 252 KiB ring to the stub for the
/// rest of its batch.
pub const DEFAULT_MAX_REQUEST_METADATA_BYTES: usize = 64 << 10;

/// Default of `--max-output-bytes`: 2 GiB, the largest message Triton's gRPC endpoint sends
/// (its `max_send_message_length` is `INT32_MAX`); a larger response could not reach a gRPC
/// client anyway, and the server must hold a copy of it in memory.
pub const DEFAULT_MAX_OUTPUT_BYTES: u64 = 2 << 30;

/// Default of `--max-sequence-backlog`: Triton's backlog is unbounded; 4096 waiting requests
/// per model version leaves room for bursts while bounding what one client can make the server
/// hold.
pub const DEFAULT_MAX_SEQUENCE_BACKLOG: usize = 4096;

/// Default of `--max-inflight-responses`: a decoupled model runs at most 64 responses ahead of
/// a slow client (Triton has no such bound: its gRPC frontend queues every response).
pub const DEFAULT_MAX_INFLIGHT_RESPONSES: u32 = 64;

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
            max_request_metadata_bytes: DEFAULT_MAX_REQUEST_METADATA_BYTES,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            max_inflight_responses: DEFAULT_MAX_INFLIGHT_RESPONSES,
            max_sequence_backlog: DEFAULT_MAX_SEQUENCE_BACKLOG,
            channel: ChannelLimits::default(),
            run_to_completion: true,
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
    /// What answering classifications needs (batching, labels).
    pub classes: Classes,
    /// The config's `reshape`s: inputs reach the model, and outputs the client, reshaped.
    pub reshapes: crate::reshape::Reshapes,
    /// `FORCE_CPU_ONLY_INPUT_TENSORS: "no"`: inputs in a client's CUDA region reach the model as
    /// GPU tensors over that memory (the stub opens its IPC handle), as in Triton.
    pub gpu_inputs: bool,
    /// `model_transaction_policy { decoupled: true }`: responses are streamed as the model
    /// sends them, and a request stays open after `execute` until its final response.
    pub decoupled: bool,
    /// Where the model's BLS requests and model-control calls go.
    pub calls: Arc<dyn ModelCalls>,
    /// The runtime the server's tasks run on (none outside one, as in unit tests): where
    /// run-to-completion lanes run.
    pub runtime: Option<tokio::runtime::Handle>,
    /// `model_warmup`: run on each instance after `initialize`, before it is ready.
    pub warmup: Arc<Vec<crate::warmup::Sample>>,
}

/// Which instance this is, as `initialize(args)` reports it.
#[derive(Debug, Clone)]
pub(crate) struct InstanceSpec {
    pub name: String,
    pub kind: &'static str,
    pub device_id: i32,
}

/// What happens to an instance; fed to [`Status::on`].
enum Event {
    /// A stub process is being started.
    Spawn,
    /// The process started and said hello.
    Spawned {
        /// Its pid.
        pid: u32,
        /// Its channel, for reporting its shared memory.
        channel: Arc<tritium_ipc::ServerChannel>,
    },
    /// `initialize` returned.
    Initialized,
    /// `initialize` raised or timed out: a deterministic failure, not retried.
    InitFailed(String),
    /// The stub exited, was killed, hung, or broke the protocol: why, and how its process ended.
    Died(String, StubExit),
    /// The crash is counted and the restart delay begins.
    BackOff,
    /// An operator asked for a restart; the stub finishes its batch and is finalized.
    RestartRequested,
    /// Too many crashes in the window.
    GaveUp(String),
    /// The version is being unloaded or the server stops.
    Stop,
    /// The stub is gone for good.
    Stopped,
}

impl Event {
    /// The event's name, for logs and errors.
    fn name(&self) -> &'static str {
        match self {
            Event::Spawn => "Spawn",
            Event::Spawned { .. } => "Spawned",
            Event::Initialized => "Initialized",
            Event::InitFailed(_) => "InitFailed",
            Event::Died(..) => "Died",
            Event::BackOff => "BackOff",
            Event::RestartRequested => "RestartRequested",
            Event::GaveUp(_) => "GaveUp",
            Event::Stop => "Stop",
            Event::Stopped => "Stopped",
        }
    }
}

/// An event that cannot happen in the state the instance is in: a supervisor bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("impossible instance transition: {event} in state {}", from.as_str())]
pub(crate) struct ImpossibleTransition {
    /// The state the instance was in (and stays in).
    pub from: InstanceState,
    /// The event's name.
    pub event: &'static str,
}

/// The supervisor's state machine: the state `event` leads to from `from`, or why it cannot
/// happen. Every legal transition is a row of this table (ARCHITECTURE.md draws it).
fn transition(from: InstanceState, event: &Event) -> Result<InstanceState, ImpossibleTransition> {
    use Event as E;
    use InstanceState as S;
    Ok(match (from, event) {
        // The first start, a restart after the backoff, and a requested restart.
        (S::Starting | S::BackingOff | S::Draining, E::Spawn) => S::Starting,
        (S::Starting, E::Spawned { .. }) => S::Initializing,
        (S::Initializing, E::Initialized) => S::Ready,
        (S::Starting | S::Initializing, E::InitFailed(_)) => S::Failed,
        (S::Starting | S::Initializing | S::Ready, E::Died(..)) => S::Crashed,
        (S::Crashed, E::BackOff) => S::BackingOff,
        (S::Crashed, E::GaveUp(_)) => S::Failed,
        (S::Ready, E::RestartRequested) => S::Draining,
        (S::Ready | S::Crashed | S::BackingOff, E::Stop) => S::Stopping,
        (S::Stopping, E::Stopped) => S::Stopped,
        (from, event) => return Err(ImpossibleTransition { from, event: event.name() }),
    })
}

/// What waiters see of an instance through its watch channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateView {
    /// The current state.
    pub state: InstanceState,
    /// Restarts so far (crashes and requested restarts).
    pub restarts: u64,
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
    /// Events refused as impossible (supervisor bugs).
    impossible: u64,
    /// The running stub's channel, for reporting its shared memory when asked.
    channel: Option<Arc<tritium_ipc::ServerChannel>>,
    /// Publishes every state change.
    watch: watch::Sender<StateView>,
}

impl Status {
    fn new() -> Self {
        let state = InstanceState::Starting;
        Self {
            state,
            pid: None,
            started: None,
            restarts: 0,
            last_exit: None,
            reason: String::new(),
            transitions: BTreeMap::new(),
            impossible: 0,
            channel: None,
            watch: watch::Sender::new(StateView { state, restarts: 0 }),
        }
    }

    /// The one place where anything about the instance's state changes: the table decides the
    /// next state, then the event's data is recorded, the change logged, counted and published.
    fn on(&mut self, event: Event) -> Result<InstanceState, ImpossibleTransition> {
        let from = self.state;
        let to = match transition(from, &event) {
            Ok(to) => to,
            Err(e) => {
                self.impossible += 1;
                error!("{e}");
                return Err(e);
            }
        };
        match event {
            Event::Spawn => self.channel = None,
            Event::Spawned { pid, channel } => {
                self.pid = Some(pid);
                self.started = Some((Instant::now(), SystemTime::now()));
                self.channel = Some(channel);
            }
            Event::Initialized => self.reason.clear(),
            Event::InitFailed(why) | Event::GaveUp(why) => self.reason = why,
            Event::Died(why, exit) => {
                self.last_exit = Some((exit, SystemTime::now()));
                self.reason = why;
                self.forget_stub();
            }
            Event::BackOff | Event::RestartRequested => self.restarts += 1,
            Event::Stop => {}
            Event::Stopped => self.forget_stub(),
        }
        *self.transitions.entry(to.as_str()).or_default() += 1;
        self.state = to;
        match to {
            InstanceState::Failed | InstanceState::Crashed => {
                error!(from = from.as_str(), to = to.as_str(), reason = %self.reason, "instance state")
            }
            _ => info!(from = from.as_str(), to = to.as_str(), "instance state"),
        }
        self.watch.send_replace(StateView { state: to, restarts: self.restarts });
        Ok(to)
    }

    fn forget_stub(&mut self) {
        self.pid = None;
        self.channel = None;
        self.started = None;
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
    /// The BLS calls its stub has in flight.
    pub(crate) bls: BlsCalls,
    /// Asks the running stub for its `prometheus_client` metrics (replaced at each start).
    probe: Mutex<Option<Arc<crate::scrape::StubProbe>>>,
}

impl Instance {
    fn new(spec: InstanceSpec, metrics: MetricsSession) -> Self {
        Self {
            spec,
            metrics: Arc::new(metrics),
            status: Mutex::new(Status::new()),
            died: AtomicBool::new(false),
            restart: AtomicBool::new(false),
            inflight: AtomicU64::new(0),
            executions: AtomicU64::new(0),
            bls: BlsCalls::default(),
            probe: Mutex::new(None),
        }
    }

    /// The running stub's metrics probe, when the instance is ready.
    pub(crate) fn metrics_probe(&self) -> Option<Arc<crate::scrape::StubProbe>> {
        if self.state() != InstanceState::Ready {
            return None;
        }
        self.probe.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the worker is running a batch (inside `execute`).
    pub(crate) fn executing(&self) -> bool {
        self.inflight.load(Ordering::Relaxed) > 0
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Feeds `event` to the state machine. An impossible transition is logged and counted by
    /// [`Status::on`] and otherwise ignored: the supervisor carries on in the state it was in.
    fn on(&self, event: Event) {
        let _ = self.status().on(event);
    }

    /// The current state.
    pub(crate) fn state(&self) -> InstanceState {
        self.status().state
    }

    /// Why it is failed or crashed, if it is.
    pub(crate) fn reason(&self) -> String {
        self.status().reason.clone()
    }

    /// Restarts so far.
    pub(crate) fn restarts(&self) -> u64 {
        self.status().restarts
    }

    /// A receiver that sees every state change, starting from the current state.
    pub(crate) fn subscribe(&self) -> watch::Receiver<StateView> {
        self.status().watch.subscribe()
    }

    /// Asks the worker to drain and restart the stub.
    pub(crate) fn request_restart(&self, queue: &Queue) {
        self.restart.store(true, Ordering::Release);
        queue.wake_all();
    }

    /// A report for the CLI and metrics.
    pub(crate) fn info(&self, model: &str, version: i64) -> InstanceInfo {
        let st = self.status();
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
            impossible_transitions: st.impossible,
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

/// Answers model code's custom-metric calls from the instance's session, and its model-control
/// calls through the server.
fn call_handler(session: Arc<MetricsSession>, calls: Arc<dyn ModelCalls>, model: String) -> CallHandler {
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
enum Started {
    Ready(Arc<Stub>),
    /// Deterministic: `initialize` raised or took too long. Not retried.
    Failed(String),
    /// The process could not start or died on the way: worth a retry after a crash.
    Died(String, StubExit),
}

fn start(ctx: &Arc<VersionContext>, instance: &Arc<Instance>) -> Started {
    let spec = &instance.spec;
    let sup = &ctx.supervision;
    instance.on(Event::Spawn);
    let stub = match Stub::spawn_with_limits(&ctx.stub, &spec.name, sup.init_timeout, sup.channel) {
        Ok(stub) => stub,
        Err(e) => return Started::Died(e.to_string(), StubExit::Other(e.to_string())),
    };
    instance.on(Event::Spawned { pid: stub.pid(), channel: stub.channel().clone() });
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
        if let Err(why) = unwind_to_error(|| supervise(&ctx, &instance, ready)) {
            // The supervisor itself broke (serve's panics are caught inside it): the instance
            // cannot go on, so it is marked failed instead of staying "ready" without a worker.
            error!("instance supervisor panicked: {why}");
            instance.on(Event::Died(format!("the instance worker panicked: {why}"), StubExit::Other(why.clone())));
            instance.on(Event::GaveUp(format!("the instance worker panicked and stopped: {why}")));
        }
        ctx.queue.instance_gone(&instance.spec.name);
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
            p.tx.send(Err(InferError::unavailable(format!(
                "model '{}' version {} has no running instances",
                ctx.model, ctx.version
            ))));
        }
    }
}

/// Runs `f`, turning a panic into its message.
fn unwind_to_error<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|payload| panic_message(&*payload))
}

/// A panic's message, from its payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
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
    let mut crashes = Crashes::default();
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
                if !back_off(ctx, instance, &mut crashes, &mut backoff, true) {
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
        *instance.probe.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Arc::new(crate::scrape::StubProbe::new(stub.metrics_probe())));
        instance.on(Event::Initialized);
        if let Some(tx) = ready.take() {
            let _ = tx.send(Ok(()));
        }
        let ready_at = Instant::now();
        // A panic while serving (a bug in the worker) must not leave the instance "ready" with
        // nobody taking its queue: it ends this stub like a crash, and the supervisor restarts
        // (or gives up) as for any other. The batch in flight is answered as dropped.
        let served = unwind_to_error(|| {
            if lane::eligible(ctx) {
                lane::serve(ctx, instance, &stub)
            } else {
                serve(ctx, instance, &stub)
            }
        })
        .unwrap_or_else(|why| {
            error!("instance worker panicked: {why}");
            instance.inflight.store(0, Ordering::Relaxed);
            let exit = stub.kill();
            Served::Died(format!("the instance worker panicked: {why}"), exit)
        });
        match served {
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
                // A stub killed by SIGBUS while a client's region it had mapped is shorter than
                // registered died of the client's truncation, not of the model's code: the crash
                // is not counted against the restart limit.
                let client_fault = matches!(exit, StubExit::Signal { signal: libc::SIGBUS, .. })
                    .then(|| crate::shm::shrunk_region(&stub.channel().region_ids()))
                    .flatten();
                drop(stub);
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
                if !back_off(ctx, instance, &mut crashes, &mut backoff, client_fault.is_none()) {
                    return;
                }
            }
        }
    }
}

/// The crashes within the restart window.
#[derive(Debug, Default)]
struct Crashes(VecDeque<Instant>);

impl Crashes {
    /// Records a crash at `now` and returns how many fell within `window` of it.
    fn record(&mut self, now: Instant, window: Duration) -> usize {
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
fn back_off(
    ctx: &VersionContext,
    instance: &Instance,
    crashes: &mut Crashes,
    backoff: &mut Duration,
    counted: bool,
) -> bool {
    let sup = &ctx.supervision;
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
    if ctx.queue.wait_closed(delay) {
        instance.on(Event::Stop);
        instance.on(Event::Stopped);
        return false;
    }
    true
}

/// How often an idle worker handles what its stub sent unasked (logs and calls from model
/// threads).
const IDLE_POLL: Duration = Duration::from_millis(50);

/// How long an idle worker of a decoupled model with open requests waits for their responses
/// before it looks at its queue again.
const STREAM_POLL: Duration = Duration::from_millis(2);

fn serve(ctx: &VersionContext, instance: &Instance, stub: &Stub) -> Served {
    let mut open = Open::default();
    let served = serve_with(ctx, instance, stub, &mut open);
    // Requests of a decoupled model still waiting for their final response get the error every
    // other request of this stub gets; a clean stop answers them too, never leaving a stream open.
    let message = match &served {
        Served::Died(why, _) => why.clone(),
        Served::Closed | Served::Restart => {
            format!("model instance '{}' stopped before the model sent the final response", stub.instance())
        }
    };
    open.fail_all(ctx, &message);
    served
}

fn serve_with(ctx: &VersionContext, instance: &Instance, stub: &Stub, open: &mut Open) -> Served {
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
                        open.watch(stub, ctx.supervision.max_inflight_responses);
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
                return Served::Restart;
            }
            Next::Batch(batch) => {
                instance.inflight.store(batch.len() as u64, Ordering::Relaxed);
                instance.executions.fetch_add(1, Ordering::Relaxed);
                let result = if ctx.decoupled {
                    run_decoupled_batch(ctx, stub, batch, open)
                } else {
                    run_batches(ctx, instance, stub, batch)
                };
                instance.inflight.store(0, Ordering::Relaxed);
                if let Err(e) = result {
                    error!("{e}");
                    let exit = stub.kill();
                    return Served::Died(e.to_string(), exit);
                }
            }
        }
    }
}

/// The stub's watcher saw it exit while no batch ran.
fn died_idle(stub: &Stub) -> Served {
    let status = stub.kill();
    Served::Died(
        format!("stub {} exited while idle ({status}); last stderr lines:\n{}", stub.instance(), stub.stderr_tail()),
        status,
    )
}

/// A decoupled model's request between its `execute` and its final response.
struct OpenRequest {
    p: Pending,
    /// Its time in the queue.
    queue: Duration,
    /// When its batch was taken.
    started: Instant,
    /// The stub was told that the client went away.
    cancelled: bool,
    /// The count of responses taken by the client that the stub was last told (its `Credit`).
    credited: u64,
}

/// The open requests of a decoupled model's instance, by the id the stub knows them by.
#[derive(Default)]
struct Open(HashMap<u64, OpenRequest>);

impl Open {
    /// Forwards one response to its request's stream, reading its outputs out of shared memory
    /// and releasing them; the final one closes the request and counts it in the statistics
    /// once. A response to a request that is not open (unknown, or already final), or one whose
    /// descriptors do not match its tensors, is refused with why: the stub broke the protocol.
    fn route(&mut self, ctx: &VersionContext, stub: &Stub, resp: Response) -> Result<(), String> {
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
        let limit = ctx.supervision.max_output_bytes;
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
        open.watch(stub, resp.request, ctx.supervision.max_inflight_responses);
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
                _ => ctx.stats.success(open.p.batch_size, total, open.queue, open.times()),
            }
            open.p.tx.stream(message);
        }
        Ok(())
    }

    /// Tells the stub, for each open request, that its client went away (once) and how many
    /// responses its client has taken (when that advanced by half of `window`), even while the
    /// model sends nothing: called while the worker is idle and while `execute` runs.
    fn watch(&mut self, stub: &Stub, window: u32) {
        for (id, open) in self.0.iter_mut() {
            open.watch(stub, *id, window);
        }
    }

    /// Ends the open requests among `ids` with `error` as their final response.
    fn fail(&mut self, ctx: &VersionContext, ids: &[u64], error: &InferError) {
        for id in ids {
            if let Some(open) = self.0.remove(id) {
                finish(ctx, open.p, Err(error.clone()), None);
            }
        }
    }

    /// Ends every open request with `message` (an internal error) as its final response.
    fn fail_all(&mut self, ctx: &VersionContext, message: &str) {
        for (_, open) in self.0.drain() {
            finish(ctx, open.p, Err(InferError::internal(message.to_string())), None);
        }
    }
}

impl OpenRequest {
    /// [`Open::watch`] for one request, `id` to the stub. A stub that cannot take the message
    /// is noticed by the worker's next receive.
    fn watch(&mut self, stub: &Stub, id: u64, window: u32) {
        let Reply::Stream(tx) = &self.p.tx else { return };
        if tx.is_closed() {
            if !self.cancelled {
                // The model sees it in `is_cancelled()` and may stop early; a send waiting for
                // credit stops waiting.
                self.cancelled = true;
                let _ = stub.cancel(id);
            }
            return;
        }
        if let Some(consumed) = credit_due(self.credited, tx.taken(), window) {
            self.credited = consumed;
            let _ = stub.credit(id, consumed);
        }
    }

    /// The request's times for the statistics: all of it since its batch was taken is counted
    /// as inference, since a decoupled model computes while it sends.
    fn times(&self) -> ExecTimes {
        ExecTimes {
            compute_input: Duration::ZERO,
            compute_infer: self.started.elapsed(),
            compute_output: Duration::ZERO,
        }
    }
}

/// The count to pass to the stub when a client that was credited `credited` responses has taken
/// `taken`: when it advanced by at least half the window (at least one), so a model blocked on
/// a full window wakes before its client runs dry, with one message per half window.
fn credit_due(credited: u64, taken: u64, window: u32) -> Option<u64> {
    let step = u64::from(window / 2).max(1);
    (window > 0 && taken >= credited.saturating_add(step)).then_some(taken)
}

/// Runs one batch of a decoupled model: its requests become open, and each response is
/// forwarded as it arrives, during `execute` and after it (through the idle worker's poll). An
/// error raised by `execute` ends the batch's requests that are still open.
fn run_decoupled_batch(
    ctx: &VersionContext,
    stub: &Stub,
    batch: Vec<Pending>,
    open: &mut Open,
) -> Result<(), HostError> {
    let t0 = Instant::now();
    let mut placed = place_inputs(ctx, stub, batch);
    if placed.requests.is_empty() {
        return Ok(());
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
        open.0.insert(id, OpenRequest { p, queue, started: t0, cancelled: false, credited: 0 });
    }
    let requests = std::mem::take(&mut placed.requests);
    // Responses and the watch both need the open table; the stub calls one at a time.
    let open = std::cell::RefCell::new(open);
    let window = ctx.supervision.max_inflight_responses;
    let mut route = |r: Response| open.borrow_mut().route(ctx, stub, r);
    let mut watch = |stub: &Stub| open.borrow_mut().watch(stub, window);
    let executed = stub.execute_decoupled(requests, ctx.supervision.execute_timeout, &mut route, &mut watch);
    let open = open.into_inner();
    match executed {
        Ok(error) => {
            let times =
                ExecTimes { compute_input: t1 - t0, compute_infer: t1.elapsed(), compute_output: Duration::ZERO };
            ctx.stats.execution(placed.batch_size, times);
            if let Some(e) = error {
                open.fail(ctx, &ids, &InferError::internal(client_text(ctx, e)));
            }
            Ok(())
        }
        Err(HostError::Ipc { source: IpcError::TooLarge { len, capacity }, .. }) => {
            for desc in blocks {
                let _ = stub.channel().free_own(desc);
            }
            let message = too_large_batch(&ctx.model, len, capacity, ctx.supervision.max_request_metadata_bytes);
            for id in &ids {
                if let Some(o) = open.0.remove(id) {
                    finish(ctx, o.p, Err(InferError::invalid(message.clone())), None);
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

/// The input blocks the server placed for `requests`, to free if the `Execute` never left.
fn input_blocks(requests: &[Request]) -> Vec<Descriptor> {
    requests
        .iter()
        .flat_map(|r| &r.inputs)
        .filter_map(|t| match t.data {
            TensorData::Shm { desc, .. } => Some(desc),
            TensorData::Cuda { .. } => None,
        })
        .collect()
}

/// Why one request of a batch failed before or after `execute`.
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// Its input could not be copied into the stub's shared memory.
    #[error("cannot place input '{input}' in shared memory: {source}")]
    Placement {
        /// The input.
        input: String,
        /// Why.
        #[source]
        source: Box<HostError>,
    },
    /// An output's descriptor from the stub could not be read.
    #[error("{0}")]
    Output(#[source] Box<HostError>),
    /// A client's region the request uses is no longer valid (the client shrank its file).
    #[error("{0}")]
    Region(InferError),
    /// An output asked for as classes could not be classified.
    #[error(transparent)]
    Classify(#[from] ClassifyError),
    /// The response's outputs are larger than `--max-output-bytes`.
    #[error(
        "the model's response holds {bytes} bytes of outputs, more than the limit of {limit} bytes (server flag --max-output-bytes)"
    )]
    OutputTooLarge {
        /// The outputs' bytes.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

impl From<RequestError> for InferError {
    fn from(e: RequestError) -> Self {
        match e {
            RequestError::Classify(c) => c.into(),
            RequestError::Region(e) => e,
            other => InferError::internal(other.to_string()),
        }
    }
}

/// A batch's requests as sent to the stub, and those waiting for their answers by id.
#[derive(Default)]
struct Placed {
    requests: Vec<Request>,
    waiting: HashMap<u64, Pending>,
    /// The sum of the requests' batch sizes (1 each for non-batching models).
    batch_size: u64,
}

/// Runs `batch` and, while the stub executes it, the batches that are ready behind it: each is
/// placed and sent before the one ahead of it is answered, so the stub starts it the moment it
/// ends the other, without waiting for the worker (pipelining; the model still runs one batch
/// at a time, in queue order). The queue is looked at twice per batch: right after it is sent,
/// and when the stub has ended it, before its answers are read (for requests that came while it
/// ran). At most two batches are in the ring. A restart or a dead stub stops taking batches
/// ahead, so the worker gets back to its loop.
fn run_batches(ctx: &VersionContext, instance: &Instance, stub: &Stub, batch: Vec<Pending>) -> Result<(), HostError> {
    let interrupted = || instance.died.load(Ordering::Acquire) || instance.restart.load(Ordering::Acquire);
    // The next ready batch sent to the stub; `Err` when sending it found the stub unusable.
    let take_ahead = || -> Result<Option<Running>, HostError> {
        if interrupted() {
            return Ok(None);
        }
        let Some(batch) = ctx.queue.ready_batch() else { return Ok(None) };
        instance.executions.fetch_add(1, Ordering::Relaxed);
        start_batch(ctx, stub, batch)
    };
    let mut running = start_batch(ctx, stub, batch)?;
    while let Some(current) = running.take() {
        let mut next = match take_ahead() {
            Ok(next) => next,
            Err(e) => {
                fail_waiting(ctx, stub, current.placed.waiting, &e);
                return Err(e);
            }
        };
        let requests = current.placed.waiting.len() + next.as_ref().map_or(0, |n| n.placed.waiting.len());
        instance.inflight.store(requests as u64, Ordering::Relaxed);
        let mut late = None;
        let finished = finish_batch(ctx, stub, current, &mut || {
            if next.is_none() {
                late = Some(take_ahead());
            }
        });
        let late_error = match late {
            Some(Ok(taken)) => {
                next = taken;
                None
            }
            Some(Err(e)) => Some(e),
            None => None,
        };
        if let Err(failed) = finished {
            if let Some(next) = next {
                if failed.ended {
                    // The stub may have started the batch behind: it fails with the stub.
                    fail_waiting(ctx, stub, next.placed.waiting, &failed.error);
                } else {
                    // The stub never got to it (it runs batches in order): the batch goes back to
                    // the queue, for the restarted stub or another instance, so that one
                    // crashing request takes no other down with it.
                    requeue_unstarted(ctx, next.placed);
                }
            }
            return Err(failed.error);
        }
        if let Some(e) = late_error {
            return Err(e);
        }
        running = next;
    }
    Ok(())
}

/// Why a batch could not be finished: the stub is unusable.
struct Unfinished {
    error: HostError,
    /// The stub had ended the batch (sent `ExecuteDone`) before it failed.
    ended: bool,
}

/// A batch sent to the stub whose answers are still to be read.
struct Running {
    placed: Placed,
    submitted: tritium_host::Submitted,
    /// When it was taken, and when its inputs were placed.
    t0: Instant,
    t1: Instant,
}

/// Puts the requests of a batch the stub never started (it died running the one ahead) back at
/// the front of the queue, in their order, for the restarted stub or another instance.
fn requeue_unstarted(ctx: &VersionContext, placed: Placed) {
    let mut waiting: Vec<(u64, Pending)> = placed.waiting.into_iter().collect();
    waiting.sort_by_key(|(id, _)| *id);
    ctx.queue.requeue(waiting.into_iter().map(|(_, p)| p).collect());
}

/// A batch whose inputs are in the stub's memory, with its `Execute` ready to send.
struct Prepared {
    running: Running,
    msg: ToStub,
    /// Its input blocks, freed if the message is too large for the ring.
    blocks: Vec<Descriptor>,
}

impl Prepared {
    /// The batch once `sent` says how sending it went: running; `None` when it was too large for
    /// the ring (its requests are answered and the stub is fine); or the stub's error.
    fn sent(
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
fn prepare_batch(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Option<Prepared> {
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
fn start_batch(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Result<Option<Running>, HostError> {
    let Some(prepared) = prepare_batch(ctx, stub, batch) else { return Ok(None) };
    let sent = stub.send(&prepared.msg);
    prepared.sent(ctx, stub, sent)
}

/// Answers a placed batch that could not be sent with `e`. A batch too large for the ring
/// reached nothing of the stub (the message was refused before a byte of it was written), so
/// the stub is fine: only this batch fails, its inputs `blocks` are freed, and this returns
/// `Ok`. Any other error means the stub is unusable and is handed back.
fn not_submitted(
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
        let message = too_large_batch(&ctx.model, len, capacity, ctx.supervision.max_request_metadata_bytes);
        for (_, p) in placed.waiting.drain() {
            finish(ctx, p, Err(InferError::invalid(message.clone())), None);
        }
        return Ok(());
    }
    fail_waiting(ctx, stub, placed.waiting, &e);
    Err(e)
}

/// Answers every request waiting for a batch with the stub's failure `e` (the stub is unusable).
fn fail_waiting(ctx: &VersionContext, stub: &Stub, waiting: HashMap<u64, Pending>, e: &HostError) {
    let message = execute_failure(&ctx.model, stub.instance(), e);
    for (_, p) in waiting {
        finish(ctx, p, Err(InferError::internal(message.clone())), None);
    }
}

/// Waits for a sent batch to end, calls `ended`, then reads its responses, records its times and
/// answers every request in it. Returns the stub's error if the stub is unusable.
fn finish_batch(
    ctx: &VersionContext,
    stub: &Stub,
    running: Running,
    ended: &mut dyn FnMut(),
) -> Result<(), Unfinished> {
    let Running { mut placed, submitted, t0, t1 } = running;
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
    let executed = match stub.complete(submitted, ctx.supervision.execute_timeout, Some(&mut on_wait)) {
        Ok(done) => done,
        Err(error) => {
            fail_waiting(ctx, stub, std::mem::take(&mut placed.waiting), &error);
            return Err(Unfinished { error, ended: false });
        }
    };
    let stamps = Stamps { taken: t0, placed: t1, started, ended: Instant::now() };
    ended();
    answer_batch(ctx, stub, placed, executed, stamps).map_err(|error| Unfinished { error, ended: true })
}

/// When a batch was taken from the queue, had its inputs placed, started (the worker turned to
/// it), and ended (its `ExecuteDone` came).
struct Stamps {
    taken: Instant,
    placed: Instant,
    started: Instant,
    ended: Instant,
}

/// What the clients of a failed batch are told: the error's text, as Triton words it (an
/// exception's rendering ends with its "At:" frames). The Python traceback goes to the server
/// log, at verbose level: a failing model would otherwise fill the log.
fn client_text(ctx: &VersionContext, e: tritium_ipc::StubError) -> String {
    if e.traceback.is_some() {
        tracing::debug!(model = %ctx.model, version = ctx.version, "execute failed: {e:#}");
    }
    e.message
}

/// Reads an ended batch's responses, records its times and answers every request in it.
/// Returns the stub's error if the stub is unusable (a response broke the protocol).
fn answer_batch(
    ctx: &VersionContext,
    stub: &Stub,
    placed: Placed,
    executed: tritium_host::Executed,
    stamps: Stamps,
) -> Result<(), HostError> {
    let Stamps { taken: t0, placed: t1, started, ended: t2 } = stamps;
    // Reading the outputs starts after the next batch was sent, which is no part of this one.
    let output_start = Instant::now();
    let batch_error = executed.error.map(|e| client_text(ctx, e));
    let answers = collect_responses(ctx, stub, &executed.responses, batch_error, placed.waiting)?;
    let times =
        ExecTimes { compute_input: t1 - t0, compute_infer: t2 - started, compute_output: output_start.elapsed() };
    ctx.stats.execution(placed.batch_size, times);
    let t3 = Instant::now();
    for Answer { mut p, result, served } in answers {
        if p.tx.discards() {
            continue;
        }
        if let Some(trace) = p.trace.as_mut() {
            trace.stamp(Activity::ComputeStart, t0);
            trace.stamp(Activity::ComputeInputEnd, t1);
            trace.stamp(Activity::ComputeOutputStart, output_start);
            trace.stamp(Activity::ComputeEnd, t3);
        }
        let queue = t0.saturating_duration_since(p.enqueued);
        if served {
            ctx.stats.success(p.batch_size, p.enqueued.elapsed(), queue, times);
            p.tx.send(result);
        } else {
            finish(ctx, p, result, Some((queue, times)));
        }
    }
    Ok(())
}

/// One request's answer after `execute`.
struct Answer {
    p: Pending,
    result: Result<InferResponse, InferError>,
    /// The model answered it: statistics count it as a success even when its classification
    /// is refused, as Triton's do (its frontends classify after the core has counted).
    served: bool,
}

/// Step 1: copies each request's inputs into the stub's shared memory. Requests whose client
/// went away, or whose inputs do not fit, are answered at once and left out.
fn place_inputs(ctx: &VersionContext, stub: &Stub, batch: Vec<Pending>) -> Placed {
    let mut placed = Placed { requests: Vec::with_capacity(batch.len()), ..Default::default() };
    forget_dead_regions(stub);
    for p in batch {
        if p.tx.is_closed() {
            // The client went away while the request waited (a dropped HTTP connection, a
            // cancelled gRPC call): do not spend the model's time on it.
            finish(ctx, p, Err(InferError::new(ErrorKind::Cancelled, CANCELLED)), None);
            continue;
        }
        let inputs = match place_request(ctx, stub, &p) {
            Ok(inputs) => inputs,
            Err(e) => {
                finish(ctx, p, Err(e.into()), None);
                continue;
            }
        };
        if let Some(Err(e)) =
            p.outputs.iter().filter_map(|o| o.shm.as_ref()).map(|t| t.check_size()).find(Result::is_err)
        {
            free_inputs(stub, &inputs);
            finish(ctx, p, Err(e), None);
            continue;
        }
        let output_regions = match output_regions(stub, &p.outputs) {
            Ok(regions) => regions,
            Err(source) => {
                let e = RequestError::Placement { input: "(an output's shared memory region)".into(), source };
                free_inputs(stub, &inputs);
                finish(ctx, p, Err(e.into()), None);
                continue;
            }
        };
        let id = NEXT_REQUEST.fetch_add(1, Ordering::Relaxed);
        placed.batch_size += p.batch_size.max(1);
        placed.requests.push(Request {
            id,
            request_id: p.req.id.clone(),
            correlation_id: p.req.correlation_id.clone(),
            flags: p.req.flags,
            timeout_us: p.req.timeout_us,
            parameters: p.req.parameters.clone(),
            inputs,
            requested_outputs: p.outputs.iter().map(|o| o.name.clone()).collect(),
            trace: p.trace.as_ref().and_then(|t| t.model_context()).unwrap_or_default(),
            output_regions,
        });
        placed.waiting.insert(id, p);
    }
    placed
}

/// One request's inputs in shared memory; on failure the blocks already placed are freed.
fn place_request(ctx: &VersionContext, stub: &Stub, p: &Pending) -> Result<Vec<tritium_ipc::Tensor>, RequestError> {
    let mut inputs = Vec::with_capacity(p.req.inputs.len());
    for t in &p.req.inputs {
        // The client may have shrunk its region while the request was queued: the request fails
        // alone, and the stub never maps a file shorter than the registration.
        if let Err(e) = crate::shm::check_input_region(&t.data) {
            free_inputs(stub, &inputs);
            return Err(RequestError::Region(e));
        }
        match place_input(ctx, stub, &t.data) {
            Ok(data) => inputs.push(tritium_ipc::Tensor {
                name: t.name.clone(),
                dtype: t.datatype,
                shape: t.shape.clone(),
                data,
            }),
            Err(source) => {
                free_inputs(stub, &inputs);
                return Err(RequestError::Placement { input: t.name.clone(), source });
            }
        }
    }
    Ok(inputs)
}

/// Where one input's bytes reach the stub, and whether the model may write to them: bytes that
/// lie in a client's registered region are passed as they are (no copy, read-only); bytes from a
/// client's CUDA region, for a model that asks for GPU inputs, as the region's IPC handle (the
/// stub opens it; no copy on the way to the model); any others are copied into a block of the
/// stub's arena that belongs to this request alone.
fn place_input(ctx: &VersionContext, stub: &Stub, data: &[u8]) -> Result<TensorData, Box<HostError>> {
    if let Some((region, offset)) = crate::shm::lookup(data.as_ptr(), data.len()) {
        map_region(stub, &region, false)?;
        let desc = Descriptor { segment: region.id(), offset, len: data.len() as u64 };
        return Ok(TensorData::Shm { desc, writable: false });
    }
    if ctx.gpu_inputs && !data.is_empty() {
        if let Some(cuda) = crate::shm::lookup_cuda(data.as_ptr(), data.len()) {
            return Ok(cuda);
        }
    }
    Ok(TensorData::Shm { desc: stub.input(data)?, writable: true })
}

/// Frees the blocks of inputs placed for a request that is not sent (a client region's need
/// nothing: `free_own` leaves them alone).
fn free_inputs(stub: &Stub, inputs: &[tritium_ipc::Tensor]) {
    for t in inputs {
        if let TensorData::Shm { desc, .. } = t.data {
            let _ = stub.channel().free_own(desc);
        }
    }
}

/// Maps a client's region into the stub, once per stub and use (system shared memory): for
/// inputs read-only, under the region's id, from a read-only descriptor (model code can neither
/// write nor truncate the client's file); for outputs the stub writes there, read-write, under
/// the region's output id.
fn map_region(stub: &Stub, region: &crate::shm::Region, output: bool) -> Result<(), Box<HostError>> {
    let channel = stub.channel();
    let (id, fd) = if output { (region.output_id(), region.fd()) } else { (region.id(), region.read_only_fd()) };
    if channel.has_region(id) {
        return Ok(());
    }
    channel
        .add_region(id, fd, region.file_offset(), region.byte_size())
        .map_err(|source| Box::new(HostError::Ipc { instance: stub.instance().to_string(), source }))
}

/// The outputs a request wants written into client regions, as descriptors for the stub.
fn output_regions(stub: &Stub, outputs: &[RequestedOutput]) -> Result<Vec<(String, Descriptor)>, Box<HostError>> {
    let mut regions = Vec::new();
    // Outputs in CUDA regions come back through the arena: the server copies them to the device.
    for o in outputs {
        if let Some((region, desc)) = o.shm.as_ref().and_then(|target| target.system()) {
            map_region(stub, region, true)?;
            regions.push((o.name.clone(), desc));
        }
    }
    Ok(regions)
}

/// Unmaps from the stub the client regions that are gone from the server (unregistered, and
/// their last request ended): called before each batch.
fn forget_dead_regions(stub: &Stub) {
    let channel = stub.channel();
    for id in channel.region_ids() {
        if !crate::shm::is_live(id) {
            let _ = channel.remove_region(id);
        }
    }
}

/// A batch whose `Execute` message does not fit the ring, as its clients see it.
fn too_large_batch(model: &str, len: usize, capacity: usize, per_request: usize) -> String {
    format!(
        "the batch's request metadata for model '{model}' (request ids, parameters, tensor names) encodes to {len} bytes, \
         more than the {capacity} bytes the message ring to the model's stub holds; nothing was sent to the model. \
         Send less metadata per request (each request may carry at most {per_request} bytes of id and parameters: \
         server flag --max-request-metadata-bytes)"
    )
}

/// Step 2's failure as the batch's clients see it.
fn execute_failure(model: &str, instance: &str, e: &HostError) -> String {
    match e {
        HostError::Timeout { after, .. } => format!(
            "model '{model}' instance '{instance}' did not finish execute within {}s (parameters {{ key: \"execute_timeout_secs\" }}); the instance was killed and is restarting",
            after.as_secs_f64()
        ),
        other => other.to_string(),
    }
}

/// Step 3: turns the stub's responses into answers; a request without a response gets the
/// batch's error, or says that the model sent none. Every output descriptor is checked against
/// its tensor's shape and type first: a mismatch is the stub breaking the protocol (its own code
/// writes both from one array), so the whole batch fails and the error is returned for the
/// supervisor to restart the stub. Responses over `--max-output-bytes` fail alone.
fn collect_responses(
    ctx: &VersionContext,
    stub: &Stub,
    responses: &[tritium_ipc::Response],
    batch_error: Option<String>,
    mut waiting: HashMap<u64, Pending>,
) -> Result<Vec<Answer>, HostError> {
    let limit = ctx.supervision.max_output_bytes;
    let mut sizes = Vec::with_capacity(responses.len());
    for resp in responses {
        match output_bytes(resp) {
            Ok(bytes) => sizes.push(bytes),
            Err(why) => {
                for r in responses {
                    stub.release_outputs(r);
                }
                let e = HostError::Protocol { instance: stub.instance().to_string(), message: why };
                let message = e.to_string();
                for (_, p) in waiting.drain() {
                    finish(ctx, p, Err(InferError::internal(message.clone())), None);
                }
                return Err(e);
            }
        }
    }
    let mut answers = Vec::with_capacity(responses.len());
    for (resp, bytes) in responses.iter().zip(sizes) {
        let Some(p) = waiting.remove(&resp.request) else {
            stub.release_outputs(resp);
            continue;
        };
        let (result, served) = match &resp.error {
            Some(e) => (Err(InferError::new(ErrorKind::from_triton_code(e.code), e.message.clone())), false),
            None if bytes > limit => (Err(RequestError::OutputTooLarge { bytes, limit }.into()), false),
            None => match read_outputs(stub, resp, &p.outputs) {
                Err(e) => (Err(e.into()), false),
                Ok(outputs) => {
                    let response =
                        shape_outputs(outputs, &p.outputs, &ctx.reshapes, &ctx.classes).map(|outputs| InferResponse {
                            model: ctx.model.clone(),
                            version: ctx.version,
                            id: p.req.id.clone(),
                            outputs,
                            parameters: resp.parameters.clone(),
                        });
                    (response.map_err(InferError::from), true)
                }
            },
        };
        stub.release_outputs(resp);
        answers.push(Answer { p, result, served });
    }
    let fallback = batch_error.unwrap_or_else(|| "the model sent no response for this request".to_string());
    for (_, p) in waiting.drain() {
        answers.push(Answer { p, result: Err(InferError::internal(fallback.clone())), served: false });
    }
    Ok(answers)
}

/// The bytes of a response's outputs, after checking that each fixed-size output's descriptor
/// holds exactly shape × element size bytes (and every shape is a real one). The error is the
/// protocol violation, in words.
fn output_bytes(resp: &tritium_ipc::Response) -> Result<u64, String> {
    let mut total = 0u64;
    for t in &resp.outputs {
        let len = match &t.data {
            TensorData::Shm { desc, .. } => desc.len,
            TensorData::Cuda { .. } => 0,
        };
        let dims = validate::dims(&t.shape);
        let elements = t
            .shape
            .iter()
            .try_fold(1u64, |acc, &d| u64::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
            .ok_or_else(|| format!("output '{}' has shape {dims}, which no tensor has", t.name))?;
        if let Some(size) = t.dtype.element_size() {
            let expected = elements.checked_mul(size as u64);
            if expected != Some(len) {
                return Err(format!(
                    "output '{}' of type {} and shape {dims} needs {} bytes, but its descriptor holds {len}",
                    t.name,
                    t.dtype.wire_name(),
                    expected.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string()),
                ));
            }
        }
        total = total.saturating_add(len);
    }
    Ok(total)
}

/// A response's output tensors, copied out of the stub's shared memory. An output the stub
/// wrote into the client's region comes back without bytes, after checking that it lies in the
/// range the request gave for it.
fn read_outputs(
    stub: &Stub,
    resp: &tritium_ipc::Response,
    requested: &[RequestedOutput],
) -> Result<Vec<OutputTensor>, RequestError> {
    resp.outputs
        .iter()
        .map(|t| {
            if let TensorData::Shm { desc, .. } = &t.data {
                if desc.in_client_region() {
                    let target = requested.iter().find(|r| r.name == t.name).and_then(|r| r.shm.as_ref());
                    let fits = target.and_then(|target| target.system()).is_some_and(|(_, want)| {
                        want.segment == desc.segment && want.offset == desc.offset && desc.len <= want.len
                    });
                    if !fits {
                        return Err(RequestError::Output(Box::new(HostError::Protocol {
                            instance: stub.instance().to_string(),
                            message: format!(
                                "output '{}' names a client shared memory range the request did not give it",
                                t.name
                            ),
                        })));
                    }
                    return Ok(OutputTensor {
                        name: t.name.clone(),
                        datatype: t.dtype,
                        shape: t.shape.clone(),
                        data: Vec::new(),
                    });
                }
            }
            let view = stub.output(&t.data).map_err(|e| RequestError::Output(Box::new(e)))?;
            Ok(OutputTensor { name: t.name.clone(), datatype: t.dtype, shape: t.shape.clone(), data: view.to_vec() })
        })
        .collect()
}

/// The outputs in the order the client asked for them, in their `dims` shape where the config
/// reshapes them, those asked for as classes replaced by their top classes.
fn shape_outputs(
    mut outputs: Vec<OutputTensor>,
    requested: &[RequestedOutput],
    reshapes: &crate::reshape::Reshapes,
    classes: &Classes,
) -> Result<Vec<OutputTensor>, RequestError> {
    outputs.sort_by_key(|o| requested.iter().position(|r| r.name == o.name).unwrap_or(usize::MAX));
    for o in &mut outputs {
        reshapes.output(&o.name, &mut o.shape);
        if let Some(k) = requested.iter().find(|r| r.name == o.name).and_then(|r| r.classification) {
            *o = classes.classify(o, k)?;
        }
    }
    Ok(outputs)
}

fn finish(
    ctx: &VersionContext,
    p: Pending,
    result: Result<InferResponse, InferError>,
    timing: Option<(Duration, ExecTimes)>,
) {
    if p.tx.discards() {
        return;
    }
    let total = p.enqueued.elapsed();
    match (&result, timing) {
        (Ok(_), Some((queue, times))) => ctx.stats.success(p.batch_size, total, queue, times),
        (Err(e), timing) => ctx.stats.failure(total, e.kind, timing.is_some() || e.kind == ErrorKind::Internal),
        (Ok(_), None) => ctx.stats.failure(total, ErrorKind::Internal, true),
    }
    p.tx.send(result);
}

#[cfg(test)]
mod tests {
    use super::*;
    use InstanceState as S;

    fn channel() -> Arc<tritium_ipc::ServerChannel> {
        let (channel, _fds) =
            tritium_ipc::ServerChannel::create("state-test", tritium_ipc::ChannelConfig::default()).expect("channel");
        Arc::new(channel)
    }

    /// One event of each kind, for walking the table.
    fn events() -> Vec<Event> {
        vec![
            Event::Spawn,
            Event::Spawned { pid: 42, channel: channel() },
            Event::Initialized,
            Event::InitFailed("init".into()),
            Event::Died("died".into(), StubExit::Code(1)),
            Event::BackOff,
            Event::RestartRequested,
            Event::GaveUp("gave up".into()),
            Event::Stop,
            Event::Stopped,
        ]
    }

    #[test]
    fn the_table_has_exactly_the_legal_transitions() {
        let legal: &[(S, &str, S)] = &[
            (S::Starting, "Spawn", S::Starting),
            (S::BackingOff, "Spawn", S::Starting),
            (S::Draining, "Spawn", S::Starting),
            (S::Starting, "Spawned", S::Initializing),
            (S::Initializing, "Initialized", S::Ready),
            (S::Starting, "InitFailed", S::Failed),
            (S::Initializing, "InitFailed", S::Failed),
            (S::Starting, "Died", S::Crashed),
            (S::Initializing, "Died", S::Crashed),
            (S::Ready, "Died", S::Crashed),
            (S::Crashed, "BackOff", S::BackingOff),
            (S::Crashed, "GaveUp", S::Failed),
            (S::Ready, "RestartRequested", S::Draining),
            (S::Ready, "Stop", S::Stopping),
            (S::Crashed, "Stop", S::Stopping),
            (S::BackingOff, "Stop", S::Stopping),
            (S::Stopping, "Stopped", S::Stopped),
        ];
        let events = events();
        for from in InstanceState::ALL {
            for event in &events {
                let expected = legal.iter().find(|(f, e, _)| *f == from && *e == event.name()).map(|(_, _, to)| *to);
                let got = transition(from, event);
                match expected {
                    Some(to) => assert_eq!(got, Ok(to), "{} in {}", event.name(), from.as_str()),
                    None => assert_eq!(
                        got,
                        Err(ImpossibleTransition { from, event: event.name() }),
                        "{} in {} should be impossible",
                        event.name(),
                        from.as_str()
                    ),
                }
            }
        }
    }

    #[test]
    fn impossible_events_are_refused_counted_and_change_nothing() {
        let mut st = Status::new();
        for (event, from) in [
            (Event::Initialized, S::Starting),
            (Event::RestartRequested, S::Starting),
            (Event::BackOff, S::Starting),
            (Event::Stopped, S::Starting),
        ] {
            let e = st.on(event).expect_err("impossible");
            assert_eq!(e.from, from);
        }
        assert_eq!(st.impossible, 4);
        assert_eq!(st.state, S::Starting);
        assert!(st.transitions.is_empty());
        assert_eq!(
            ImpossibleTransition { from: S::Failed, event: "Spawn" }.to_string(),
            "impossible instance transition: Spawn in state failed"
        );
    }

    #[test]
    fn restart_then_ready_is_published_on_the_watch() {
        let mut st = Status::new();
        let mut rx = st.watch.subscribe();
        st.on(Event::Spawn).expect("spawn");
        st.on(Event::Spawned { pid: 7, channel: channel() }).expect("spawned");
        assert_eq!(st.pid, Some(7));
        assert!(st.channel.is_some());
        st.on(Event::Initialized).expect("ready");
        assert_eq!(*rx.borrow_and_update(), StateView { state: S::Ready, restarts: 0 });
        for (event, to) in [
            (Event::RestartRequested, S::Draining),
            (Event::Spawn, S::Starting),
            (Event::Spawned { pid: 8, channel: channel() }, S::Initializing),
            (Event::Initialized, S::Ready),
        ] {
            assert_eq!(st.on(event), Ok(to));
        }
        assert!(rx.has_changed().expect("sender alive"));
        assert_eq!(*rx.borrow_and_update(), StateView { state: S::Ready, restarts: 1 });
        assert_eq!((st.pid, st.restarts, st.transitions["ready"], st.transitions["draining"]), (Some(8), 1, 2, 1));
    }

    #[test]
    fn a_crash_backs_off_before_the_next_spawn_and_forgets_the_stub() {
        let mut st = Status::new();
        for event in [Event::Spawn, Event::Spawned { pid: 9, channel: channel() }, Event::Initialized] {
            st.on(event).expect("start");
        }
        assert_eq!(
            st.on(Event::Died("killed".into(), StubExit::Signal { signal: 9, name: "SIGKILL" })),
            Ok(S::Crashed)
        );
        assert_eq!((st.pid, st.channel.is_none(), st.reason.as_str()), (None, true, "killed"));
        assert_eq!(st.last_exit.as_ref().map(|(w, _)| w.to_string()).as_deref(), Some("killed by signal 9 (SIGKILL)"));
        assert_eq!(st.reason, "killed");
        // The restart delay is entered before it is slept, and counts as a restart.
        assert_eq!(st.on(Event::BackOff), Ok(S::BackingOff));
        assert_eq!(st.restarts, 1);
        assert_eq!(st.on(Event::Spawn), Ok(S::Starting));
        assert_eq!(st.on(Event::Died("again".into(), StubExit::Code(1))), Ok(S::Crashed));
        assert_eq!(st.on(Event::GaveUp("too many".into())), Ok(S::Failed));
        assert_eq!(st.reason, "too many");
        assert!(st.on(Event::Spawn).is_err());
    }

    #[test]
    fn crashes_outside_the_window_are_forgotten() {
        let mut c = Crashes::default();
        let t = Instant::now();
        let w = Duration::from_secs(10);
        assert_eq!(c.record(t, w), 1);
        assert_eq!(c.record(t + Duration::from_secs(5), w), 2);
        assert_eq!(c.record(t + Duration::from_secs(12), w), 2);
        assert_eq!(c.record(t + Duration::from_secs(30), w), 1);
    }

    fn out(name: &str, v: &[f32]) -> OutputTensor {
        OutputTensor {
            name: name.into(),
            datatype: tritium_ipc::DataType::Fp32,
            shape: vec![v.len() as i64],
            data: v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    #[test]
    fn outputs_come_in_the_requested_order_with_classes() {
        let requested =
            vec![RequestedOutput { name: "B".into(), classification: Some(1), shm: None }, RequestedOutput::named("A")];
        let shaped = shape_outputs(
            vec![out("A", &[1.0]), out("B", &[0.5, 2.0])],
            &requested,
            &Default::default(),
            &Classes::default(),
        )
        .expect("ok");
        assert_eq!(shaped.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(), ["B", "A"]);
        assert_eq!(shaped[0].datatype, tritium_ipc::DataType::Bytes);
        assert_eq!(shaped[0].data, [&10u32.to_le_bytes()[..], b"2.000000:1"].concat());
        assert_eq!(shaped[1], out("A", &[1.0]));
        let mut bytes = out("B", &[]);
        bytes.datatype = tritium_ipc::DataType::Bytes;
        let e = InferError::from(
            shape_outputs(vec![bytes], &requested, &Default::default(), &Classes::default()).expect_err("BYTES"),
        );
        assert_eq!(e.kind, ErrorKind::InvalidArg);
    }

    fn response(outputs: Vec<tritium_ipc::Tensor>) -> tritium_ipc::Response {
        tritium_ipc::Response {
            request: 1,
            outputs,
            error: None,
            parameters: Vec::new(),
            final_response: true,
            flag_only: false,
        }
    }

    fn shm(name: &str, dtype: tritium_ipc::DataType, shape: &[i64], len: u64) -> tritium_ipc::Tensor {
        tritium_ipc::Tensor {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            data: TensorData::Shm { desc: Descriptor { segment: 1 << 31, offset: 0, len }, writable: true },
        }
    }

    #[test]
    fn output_descriptors_must_match_shape_and_type() {
        use tritium_ipc::DataType as D;
        let ok = response(vec![shm("A", D::Fp32, &[2, 3], 24), shm("S", D::Bytes, &[2], 13)]);
        assert_eq!(output_bytes(&ok), Ok(37));
        // A length that is not shape × element size: the stub broke the protocol.
        let short = response(vec![shm("A", D::Fp32, &[2, 3], 20)]);
        assert_eq!(
            output_bytes(&short),
            Err("output 'A' of type FP32 and shape [2,3] needs 24 bytes, but its descriptor holds 20".into())
        );
        // A made-up batch dimension cannot claim bytes that are not there.
        let huge = response(vec![shm("A", D::Int64, &[i64::MAX, 2], 32)]);
        assert!(output_bytes(&huge).expect_err("overflow").contains("more than 2^64"));
        let negative = response(vec![shm("A", D::Uint8, &[-1], 0)]);
        assert_eq!(output_bytes(&negative), Err("output 'A' has shape [-1], which no tensor has".into()));
    }

    #[test]
    fn oversized_outputs_and_overlong_batches_name_their_flags() {
        let e = InferError::from(RequestError::OutputTooLarge { bytes: 10, limit: 8 });
        assert_eq!(
            e.message,
            "the model's response holds 10 bytes of outputs, more than the limit of 8 bytes (server flag --max-output-bytes)"
        );
        let m = too_large_batch("m", 300_000, 258_048, 65_536);
        assert!(
            m.contains("300000 bytes") && m.contains("258048 bytes") && m.contains("--max-request-metadata-bytes"),
            "{m}"
        );
    }

    #[test]
    fn credit_goes_to_the_stub_each_half_window_and_never_without_a_window() {
        // Window 64: nothing until the client took 32 more than the stub was told.
        assert_eq!(credit_due(0, 31, 64), None);
        assert_eq!(credit_due(0, 32, 64), Some(32));
        assert_eq!(credit_due(32, 63, 64), None);
        assert_eq!(credit_due(32, 70, 64), Some(70));
        // A window of 1 credits every response; 0 means no limit and no credit at all.
        assert_eq!(credit_due(5, 6, 1), Some(6));
        assert_eq!(credit_due(0, 1_000, 0), None);
        // Replaying the worker's loop: the stub's view never lags the client by a half window.
        let (window, mut credited) = (16u32, 0u64);
        for taken in 0..1_000u64 {
            if let Some(c) = credit_due(credited, taken, window) {
                credited = c;
            }
            assert!(taken - credited < u64::from(window / 2));
        }
    }

    #[test]
    fn a_panic_becomes_an_error_with_its_message() {
        assert_eq!(unwind_to_error(|| 7), Ok(7));
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let literal = unwind_to_error(|| -> u32 { panic!("boom") });
        let formatted = unwind_to_error(|| -> u32 { panic!("batch {}", 3) });
        std::panic::set_hook(prev);
        assert_eq!(literal, Err("boom".into()));
        assert_eq!(formatted, Err("batch 3".into()));
    }

    #[test]
    fn execute_failures_name_the_limit_on_timeouts() {
        let e = HostError::Timeout { instance: "m_0".into(), what: "execute", after: Duration::from_secs(2) };
        assert_eq!(
            execute_failure("m", "m_0", &e),
            "model 'm' instance 'm_0' did not finish execute within 2s (parameters { key: \"execute_timeout_secs\" }); the instance was killed and is restarting"
        );
    }
}
