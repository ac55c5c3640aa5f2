//! One model instance: a supervisor task that owns a stub, serves it (batches from the version's
//! queue, stub responses turned into client responses), and restarts the stub when it dies or
//! hangs.
//!
//! The supervisor's legal transitions are one `match (state, event)` table, [`transition`];
//! its state changes in one place, [`Status::on`], which refuses (logs and counts) an impossible
//! event, logs every change inside the instance's span, counts it, and publishes it on a watch
//! channel for whoever waits for a state. The supervisor is a task on the server's runtime, so an
//! instance served to completion holds no thread; a sequence model's serve loop (and any model's
//! under `--run-to-completion false`) holds a thread of the runtime's blocking pool while its stub
//! serves.
//!
//! A batch runs in named steps: [`place_inputs`], execute, [`collect_responses`] (outputs read,
//! ordered and classified), and the times recorded. A decoupled model's batch
//! ([`run_decoupled_batch`] on a worker thread, `lane/stream.rs` on the runtime) leaves its
//! requests in an [`OpenRequests`] table, which forwards each response as it arrives, during
//! `execute` and while the instance is idle, until the final one.
//!
//! Here: the settings ([`InstanceSettings`]), the version context, and the [`Instance`] others see.
//! `state.rs` is the state machine, `supervise.rs` the supervisor, `serve.rs` the worker thread's serve loop
//! and the `OpenRequests` table, `batch.rs` one batch's steps, `pipeline.rs` the pipelining
//! rules (a pure state machine), `ring.rs` the batches in the stub's ring driven by them (on the
//! worker thread), `lane.rs` the run-to-completion lane on the runtime (which drives the same
//! ring), and `calls.rs` the seam to the rest of the server ([`ModelCalls`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;
use tracing::{error, info, warn};
use tritium_host::{CallHandler, ChannelLimits, HostError, StackProbe, Stub, StubCommand, StubExit};
use tritium_ipc::Response;
use tritium_ipc::{CallOp, CallResult, Descriptor, Initialize, IpcError, Request, TensorData, ToStub};
use tritium_metrics::{CustomMetrics, MetricKind, MetricOp, MetricsSession};
use tritium_sync::Locked;
use tritium_trace::Activity;

use crate::classify::{Classes, ClassifyError};
use crate::pending::{Next, Pending, Reply, CANCELLED};
use crate::scheduler::Queue;
use crate::stats::{ExecTimes, Stats};
use crate::types::{
    ErrorKind, InferError, InferResponse, InstanceInfo, InstanceState, OutputTensor, RequestedOutput, Streamed,
};
use crate::validate;

mod adjacent;
mod batch;
mod calls;
mod lane;
mod pipeline;
mod ring;
mod serve;
mod state;
mod supervise;
#[cfg(test)]
pub(crate) mod testing;

pub(crate) use calls::{BlsCall, BlsCalls, ModelCalls, NoModelCalls};
pub(crate) use state::StateView;
pub(crate) use supervise::{spawn, Worker};

// The steps of serving a stub, shared by the worker thread and the async lane.
use adjacent::*;
use batch::*;
use ring::*;
use serve::*;
use state::*;
use supervise::*;

pub use lane::park_spin;

/// An instance's settings: supervision limits, request and response limits, how it is served
/// and recycled. Server-wide flags, overridable per model in `parameters`.
#[derive(Debug, Clone)]
pub struct InstanceSettings {
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
    /// Instances of models that have no sequence batcher (decoupled or not) are served by a
    /// task on the async runtime rather than by their worker thread (`--run-to-completion`).
    pub run_to_completion: bool,
    /// After a reload switches traffic to new instances, how long the previous ones stay alive
    /// without traffic, to serve again if the new ones crash repeatedly
    /// (`--model-update-grace-secs`, per model `model_update_grace_secs`); zero retires them at
    /// once.
    pub update_grace: Duration,
    /// A stub whose resident memory passes this is recycled: a fresh stub is started and ready
    /// first, then the old one drains and stops (`stub_max_rss_bytes`, `--stub-max-rss-bytes`).
    pub max_rss_bytes: Option<u64>,
    /// A stub that has taken this many requests is recycled the same way (`stub_max_requests`,
    /// `--stub-max-requests`).
    pub max_requests: Option<u64>,
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

/// Default of `--model-update-grace-secs` ([`InstanceSettings::update_grace`]).
pub const DEFAULT_MODEL_UPDATE_GRACE_SECS: u64 = 10;

impl Default for InstanceSettings {
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
            update_grace: Duration::from_secs(DEFAULT_MODEL_UPDATE_GRACE_SECS),
            max_rss_bytes: None,
            max_requests: None,
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
    pub settings: InstanceSettings,
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
    /// The instances' places in the server's rate limiter (empty when it is off).
    pub rate_limits: crate::limiter::Members,
}

/// Which instance this is, as `initialize(args)` reports it.
#[derive(Debug, Clone)]
pub(crate) struct InstanceSpec {
    pub name: String,
    pub kind: &'static str,
    pub device_id: i32,
    /// Its group's `rate_limiter`: the resources and priority it runs with under
    /// `--rate-limit execution_count`.
    pub rate_limiter: Option<tritium_config::proto::ModelRateLimiter>,
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
    /// The restart asked for is a recycling: a replacement is ready, and the stub finishes its
    /// open streams before it stops.
    recycling: AtomicBool,
    inflight: AtomicU64,
    executions: AtomicU64,
    /// The BLS calls its stub has in flight.
    pub(crate) bls: BlsCalls,
    /// Asks the running stub for its `prometheus_client` metrics (replaced at each start).
    probe: Mutex<Option<Arc<crate::scrape::StubProbe>>>,
    /// Asks the running stub for its Python stacks (replaced at each start).
    stacks: Mutex<Option<StackProbe>>,
    /// Requests the running stub has taken (reset at each start), for `stub_max_requests`.
    taken: AtomicU64,
    /// The running stub's resident memory when it became ready, for its growth since.
    rss_at_ready: AtomicU64,
    /// Stubs recycled for passing `stub_max_rss_bytes` and `stub_max_requests`.
    recycled: [AtomicU64; 2],
}

impl Instance {
    fn new(spec: InstanceSpec, metrics: MetricsSession) -> Self {
        Self {
            spec,
            metrics: Arc::new(metrics),
            status: Mutex::new(Status::new()),
            died: AtomicBool::new(false),
            restart: AtomicBool::new(false),
            recycling: AtomicBool::new(false),
            inflight: AtomicU64::new(0),
            executions: AtomicU64::new(0),
            bls: BlsCalls::default(),
            probe: Mutex::new(None),
            stacks: Mutex::new(None),
            taken: AtomicU64::new(0),
            rss_at_ready: AtomicU64::new(0),
            recycled: [AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Releases the custom metrics the model code of this stopped instance held, so that their
    /// series leave /metrics when its version retires rather than when the last holder of the
    /// session lets go of it (a supervisor task or a stub's call handler, after the unload has
    /// answered). Releasing twice releases nothing more.
    pub(crate) fn release_metrics(&self) {
        self.metrics.release_all();
    }

    /// The running stub's metrics probe, when the instance is ready.
    pub(crate) fn metrics_probe(&self) -> Option<Arc<crate::scrape::StubProbe>> {
        if self.state() != InstanceState::Ready {
            return None;
        }
        self.probe.locked().clone()
    }

    /// The running stub's pid and its stack probe, while a stub runs.
    pub(crate) fn stack_probe(&self) -> Option<(u32, StackProbe)> {
        let pid = self.status().pid?;
        Some((pid, self.stacks.locked().clone()?))
    }

    /// Counts a batch of `requests` the worker took for the running stub.
    fn took(&self, requests: usize) {
        self.executions.fetch_add(1, Ordering::Relaxed);
        self.taken.fetch_add(requests as u64, Ordering::Relaxed);
    }

    /// Whether the worker is running a batch (inside `execute`).
    pub(crate) fn executing(&self) -> bool {
        self.inflight.load(Ordering::Relaxed) > 0
    }

    fn status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status.locked()
    }

    /// Feeds `event` to the state machine. An impossible transition is logged and counted by
    /// [`Status::on`] and otherwise ignored: the supervisor carries on in the state it was in.
    fn on(&self, event: Event) {
        let _ = self.status().on(event);
    }

    /// The current state, as the supervisor knows it.
    pub(crate) fn state(&self) -> InstanceState {
        self.status().state
    }

    /// Whether the instance serves: ready, with its stub process still running (see
    /// `Status::reported`). What readiness checks ask.
    pub(crate) fn serving(&self) -> bool {
        self.status().reported() == InstanceState::Ready
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
        let private = st.pid.and_then(private_memory_of).unwrap_or_default();
        let at_ready = self.rss_at_ready.load(Ordering::Relaxed);
        InstanceInfo {
            model: model.to_string(),
            version,
            instance: self.spec.name.clone(),
            pid: st.pid,
            state: st.reported(),
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
            pss_bytes: private.pss,
            uss_bytes: private.uss,
            rss_growth_bytes: if st.pid.is_some() && at_ready > 0 { rss_bytes as i64 - at_ready as i64 } else { 0 },
            requests_taken: self.taken.load(Ordering::Relaxed),
            recycled: RecycleReason::ALL
                .iter()
                .map(|r| (r.as_str(), self.recycled[*r as usize].load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

/// Why a stub was recycled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecycleReason {
    /// Its resident memory passed `stub_max_rss_bytes`.
    Rss = 0,
    /// It took `stub_max_requests` requests.
    Requests = 1,
}

impl RecycleReason {
    pub(crate) const ALL: [RecycleReason; 2] = [RecycleReason::Rss, RecycleReason::Requests];

    /// The `reason` label of `tritium_stub_recycled_total`.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RecycleReason::Rss => "rss",
            RecycleReason::Requests => "requests",
        }
    }
}

/// A process's private memory, from `/proc/PID/smaps_rollup`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PrivateMemory {
    /// Proportional set size: private pages, plus shared pages divided among their sharers.
    pss: u64,
    /// Unique set size: pages no other process maps (`Private_Clean` + `Private_Dirty`).
    uss: u64,
}

fn private_memory_of(pid: u32) -> Option<PrivateMemory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(parse_smaps_rollup(&text))
}

/// Reads `Pss`, `Private_Clean` and `Private_Dirty` (in kB) out of `smaps_rollup`'s text.
fn parse_smaps_rollup(text: &str) -> PrivateMemory {
    let mut m = PrivateMemory::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(key), Some(kb)) = (words.next(), words.next().and_then(|v| v.parse::<u64>().ok())) else {
            continue;
        };
        match key {
            "Pss:" => m.pss = kb * 1024,
            "Private_Clean:" | "Private_Dirty:" => m.uss += kb * 1024,
            _ => {}
        }
    }
    m
}

/// Resident set size of a process, from `/proc/PID/statm`.
fn rss_of(pid: u32) -> Option<u64> {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    Some(pages * page)
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
            Event::Recycled { pid: 43, channel: channel() },
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
            (S::Ready, "Recycled", S::Ready),
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
    fn a_dead_stub_is_not_reported_ready_before_the_supervisor_hears_of_it() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let mut st = Status::new();
        for event in [Event::Spawn, Event::Spawned { pid: child.id(), channel: channel() }, Event::Initialized] {
            st.on(event).expect("start");
        }
        assert_eq!((st.state, st.reported()), (S::Ready, S::Ready));
        child.kill().expect("SIGKILL");
        // Not reaped: the supervisor has not heard yet and still holds it ready; what clients and
        // operators see is crashed as soon as the kernel has ended the process.
        let deadline = Instant::now() + Duration::from_secs(10);
        while st.reported() == S::Ready {
            assert!(Instant::now() < deadline, "a dead stub stayed ready");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!((st.state, st.reported()), (S::Ready, S::Crashed));
        child.wait().expect("wait");
        st.on(Event::Died("killed".into(), StubExit::Signal { signal: 9, name: "SIGKILL" })).expect("died");
        assert!(st.process.is_none());
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
    fn private_memory_comes_from_smaps_rollup() {
        let text = "55d0c8a4e000-7ffd5c1f8000 ---p 00000000 00:00 0                  [rollup]\n\
                    Rss:               36712 kB\nPss:               19105 kB\nPss_Anon:          15004 kB\n\
                    Shared_Clean:      17820 kB\nPrivate_Clean:      1024 kB\nPrivate_Dirty:     15000 kB\n";
        assert_eq!(parse_smaps_rollup(text), PrivateMemory { pss: 19105 * 1024, uss: 16024 * 1024 });
        assert_eq!(parse_smaps_rollup("garbage\n"), PrivateMemory::default());
        let me = private_memory_of(std::process::id()).expect("this process's smaps_rollup");
        assert!(me.pss > 0 && me.uss > 0, "{me:?}");
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
        // Window 64 starts at INITIAL_WINDOW (8): credit after 4 taken, then each half of the
        // grown window, up to 32 once it reached 64.
        assert_eq!(credit_due(0, 3, 64), None);
        assert_eq!(credit_due(0, 4, 64), Some(4));
        assert_eq!(credit_due(4, 9, 64), None);
        assert_eq!(credit_due(4, 10, 64), Some(10));
        assert_eq!(credit_due(100, 131, 64), None);
        assert_eq!(credit_due(100, 132, 64), Some(132));
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
        // The stub never waits for a credit that is not coming: whatever it was told, the client
        // can take enough of what the stub may send for the next credit to fall due.
        for window in [1u32, 2, 8, 64, 1000] {
            let mut credited = 0u64;
            for taken in 0..5_000u64 {
                let allowed = credited + tritium_ipc::window_now(u64::from(window), credited);
                assert!(taken <= allowed, "window {window}: the client took more than was sent");
                if taken == allowed {
                    assert!(credit_due(credited, taken, window).is_some(), "window {window} stalls at {taken}");
                }
                if let Some(c) = credit_due(credited, taken, window) {
                    credited = c;
                }
            }
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
