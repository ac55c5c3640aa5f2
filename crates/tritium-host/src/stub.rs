//! A running stub: its process, its channel, and the protocol calls the server makes on it.
//!
//! Every wait is sliced: between slices the stub's process is checked, so a crashed stub turns
//! into [`HostError::Exited`] (with its exit status and the last lines of its stderr) at once
//! instead of a hang. Log records the stub sends are re-emitted through `tracing` inside the
//! stub's span on the way.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Span;
use tritium_ipc::{
    CallOp, CallResult, ChannelConfig, ChannelLimits, ClientFamily, Descriptor, Initialize, IpcError, LogLevel,
    Request, Response, ServerChannel, StubError, TensorData, ToServer, ToStub, View, WaitPolicy, PROTOCOL_VERSION,
};
use tritium_sync::Locked;

use crate::process::{self, ChildGuard, StderrTail, StubCommand, StubExit};
use crate::stacks::StackProbe;

impl Drop for Stub {
    fn drop(&mut self) {
        self.unwatched.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// How often a wait stops to check that the stub process is alive.
pub const LIVENESS_SLICE: Duration = Duration::from_millis(50);
/// How often a watched wait ([`Stub::execute_watching`]) calls its watcher.
pub const WATCH_SLICE: Duration = Duration::from_millis(5);

/// Most unasked messages (log records, calls) one [`Stub::poll`] handles before it returns, so
/// that a model thread logging without pause cannot keep an idle worker from its queue.
pub const POLL_CHUNK: usize = 256;

/// Everything that can go wrong with a stub.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The interpreter could not be started.
    #[error("cannot start the Python stub with {python:?}: {source}")]
    Spawn {
        /// The interpreter path.
        python: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The stub process ended.
    #[error(
        "stub {instance} (pid {pid}) exited unexpectedly ({status}{}){}",
        killed_suffix(.killed),
        stderr_suffix(.stderr)
    )]
    Exited {
        /// Instance name.
        instance: String,
        /// Process id.
        pid: u32,
        /// How it ended.
        status: StubExit,
        /// Why the server killed it, when it did (a lost heartbeat).
        killed: Option<String>,
        /// Its last lines of stderr.
        stderr: String,
    },
    /// The stub's channel closed or its process ended, seen by a call that never waits
    /// ([`Stub::try_send`], [`Stub::try_message`], [`Stub::check_alive`]): how the process ended
    /// and its last stderr lines take waiting for, which [`Stub::settle`] does (off an event loop).
    #[error("stub {instance} is exiting (its channel closed)")]
    Exiting {
        /// Instance name.
        instance: String,
    },
    /// The stub did not answer in time.
    #[error("stub {instance} did not {what} within {after:?}")]
    Timeout {
        /// Instance name.
        instance: String,
        /// What it was asked to do.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// The shared-memory channel failed.
    #[error("stub {instance}: {source}")]
    Ipc {
        /// Instance name.
        instance: String,
        /// Why.
        #[source]
        source: IpcError,
    },
    /// The stub sent something the protocol does not allow here.
    #[error("stub {instance} broke the protocol: {message}")]
    Protocol {
        /// Instance name.
        instance: String,
        /// What it did.
        message: String,
    },
    /// Model code raised an error (in `auto_complete_config`, `initialize`, `execute` or `finalize`).
    #[error("{0}")]
    Model(StubError),
}

fn killed_suffix(killed: &Option<String>) -> String {
    killed.as_ref().map_or_else(String::new, |why| format!(", {why}"))
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; last stderr lines:\n{stderr}")
    }
}

/// What the stub said about itself in its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StubInfo {
    /// Process id.
    pub pid: u32,
    /// `sys.version`.
    pub python: String,
    /// `numpy.__version__`.
    pub numpy: String,
}

/// The outcome of one `execute` call.
#[derive(Debug)]
pub struct Executed {
    /// The responses, in the order the stub sent them.
    pub responses: Vec<Response>,
    /// Set when `execute` itself failed; requests without a final response share this error.
    pub error: Option<StubError>,
}

/// The responses of one `execute` of a model that is not decoupled: at most one per request of
/// the batch (Triton's python_backend likewise takes exactly one response per request, returned
/// from `execute` or sent once through the request's response sender). The stub's own code sends
/// at most one per request, so anything else means the stub's side of the protocol was
/// subverted. Decoupled models go through [`Stub::execute_decoupled`] instead.
struct Collected {
    waiting: HashSet<u64>,
    responses: Vec<Response>,
}

impl Collected {
    fn new(ids: impl Iterator<Item = u64>) -> Self {
        let waiting: HashSet<u64> = ids.collect();
        Self { responses: Vec::with_capacity(waiting.len()), waiting }
    }

    /// Keeps `r`, or hands it back with why the protocol does not allow it (its blocks are the
    /// caller's to release).
    fn accept(&mut self, r: Response) -> Result<(), Box<(Response, String)>> {
        if self.waiting.remove(&r.request) {
            self.responses.push(r);
            return Ok(());
        }
        let why = if self.responses.iter().any(|k| k.request == r.request) {
            format!(
                "sent a second response for request {}; a model that is not decoupled sends exactly one response per request",
                r.request
            )
        } else {
            format!("responded to unknown request {}", r.request)
        };
        Err(Box::new((r, why)))
    }
}

/// A batch sent to the stub ([`Stub::submit`]) whose answers are still to be read
/// ([`Stub::complete`]).
pub struct Submitted {
    batch: u64,
    collected: Collected,
    /// Set by its `ExecuteDone`: the error `execute` raised, if it did.
    ended: Option<Option<StubError>>,
}

/// Names the server flag behind a shared-memory limit the channel enforced.
fn with_flag_hint(e: IpcError) -> IpcError {
    match e {
        IpcError::Protocol(m) if m.contains("the limit is") => {
            IpcError::Protocol(format!("{m} (server flags --max-stub-segments and --max-stub-shm-bytes)"))
        }
        IpcError::OutOfMemory(len, m) if m.contains("limit") => {
            IpcError::OutOfMemory(len, format!("{m} (server flag --max-server-shm-bytes-per-stub)"))
        }
        other => other,
    }
}

/// Takes one response of a decoupled model as it arrives, or refuses it (a response to no open
/// request) with why, after releasing its blocks.
pub type OnResponse<'a> = dyn FnMut(Response) -> Result<(), String> + 'a;

/// Answers the calls model code makes on the server (custom metrics).
pub type CallHandler = Arc<dyn Fn(CallOp) -> Result<CallResult, String> + Send + Sync>;

/// What model code asks of other models (BLS), handed to the [`BlsHandler`].
// Each event is built once and moved once into the handler; boxing the request would buy
// nothing but an allocation per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum BlsEvent {
    /// `InferenceRequest.exec()`: run `request` on `model` and answer with `BlsResponse`s.
    Request {
        /// The stub's call id.
        call: u64,
        /// Target model.
        model: String,
        /// Target version (-1 for the policy's choice).
        version: i64,
        /// The caller takes a stream of responses.
        decoupled: bool,
        /// The request; its inputs are blocks of the stub's arena, the handler's to release.
        request: Request,
    },
    /// The call was cancelled by model code.
    Cancel {
        /// The stub's call id.
        call: u64,
    },
}

/// Takes model code's BLS calls. It must not block the worker: it dispatches and returns, and
/// answers later through the stub's channel.
pub type BlsHandler = Arc<dyn Fn(BlsEvent) + Send + Sync>;

/// What a stub answered to a metrics request: its `prometheus_client` families, or why not.
pub type ClientMetrics = Result<Vec<ClientFamily>, String>;

/// A metrics request not answered yet.
struct Asked {
    seq: u64,
    at: Instant,
    answer: std::sync::mpsc::SyncSender<ClientMetrics>,
}

/// The metrics request a stub has open (at most one).
#[derive(Default)]
struct ProbeState {
    next: std::sync::atomic::AtomicU64,
    asked: Mutex<Option<Asked>>,
}

impl ProbeState {
    /// Hands the answer to `seq` to whoever asked; an answer nobody waits for any more (late, or
    /// never asked for) is dropped.
    fn deliver(&self, seq: u64, families: ClientMetrics) {
        let mut asked = self.asked.locked();
        if asked.as_ref().is_some_and(|a| a.seq == seq) {
            if let Some(a) = asked.take() {
                let _ = a.answer.try_send(families);
            }
        }
    }
}

/// How long an unanswered metrics request keeps a stub from being asked again.
const PROBE_RETRY_AFTER: Duration = Duration::from_secs(30);

/// Asks a stub, from any thread, for the metrics its model code registered with
/// `prometheus_client` (the answer comes through whichever thread reads the stub's messages).
/// Asking never waits: a stub whose ring is full, or that has not answered the previous request
/// (for up to 30 s), is not asked.
#[derive(Clone)]
pub struct MetricsProbe {
    channel: Arc<ServerChannel>,
    state: Arc<ProbeState>,
}

impl MetricsProbe {
    /// Sends a request; the answer comes on the returned receiver. None when the stub was not
    /// asked (see above) or its channel failed.
    pub fn ask(&self) -> Option<std::sync::mpsc::Receiver<ClientMetrics>> {
        let mut asked = self.state.asked.locked();
        if asked.as_ref().is_some_and(|a| a.at.elapsed() < PROBE_RETRY_AFTER) {
            return None;
        }
        let seq = self.state.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let (answer, receiver) = std::sync::mpsc::sync_channel(1);
        match self.channel.try_send(&ToStub::CollectMetrics { seq }) {
            Ok(true) => {
                *asked = Some(Asked { seq, at: Instant::now(), answer });
                Some(receiver)
            }
            Ok(false) | Err(_) => None,
        }
    }
}

/// How long the server waits for a hung stub's stacks before it kills it.
pub const STACKS_BEFORE_KILL: Duration = Duration::from_secs(2);

/// Logs `probe`'s stacks in `span`, before the stub is killed for `why`.
fn log_stacks(probe: &StackProbe, why: &str, span: &Span) {
    let text = probe.for_log(STACKS_BEFORE_KILL);
    tracing::error!(parent: span, "Python stacks of the stub before it is killed ({why}):\n{text}");
}

/// A running stub process and its channel.
pub struct Stub {
    /// The open metrics request, answered through [`Stub::unasked`].
    probe: Arc<ProbeState>,
    /// Answers model code's calls; without one, calls get an error.
    calls: Mutex<Option<CallHandler>>,
    /// Takes model code's BLS calls; without one, they are answered with an error.
    bls: Mutex<Option<BlsHandler>>,
    /// Why the watcher killed the process, when it did (a lost heartbeat).
    kill_reason: Arc<Mutex<Option<String>>>,
    /// Tells the watcher thread to stop.
    unwatched: Arc<std::sync::atomic::AtomicBool>,
    instance: String,
    child: Mutex<ChildGuard>,
    channel: Arc<ServerChannel>,
    stderr: StderrTail,
    info: StubInfo,
    span: Span,
    next_batch: Mutex<u64>,
    /// Asks the stub for its Python stacks.
    stacks: StackProbe,
}

impl Stub {
    /// Starts a stub for `instance` and waits up to `hello_timeout` for its hello, with the
    /// default shared-memory limits.
    pub fn spawn(cmd: &StubCommand, instance: &str, hello_timeout: Duration) -> Result<Self, HostError> {
        Self::spawn_with_limits(cmd, instance, hello_timeout, ChannelLimits::default())
    }

    /// Starts a stub for `instance` whose channel has `limits` (`--max-stub-segments`,
    /// `--max-stub-shm-bytes`, `--max-server-shm-bytes-per-stub`), and waits up to
    /// `hello_timeout` for its hello.
    pub fn spawn_with_limits(
        cmd: &StubCommand,
        instance: &str,
        hello_timeout: Duration,
        limits: ChannelLimits,
    ) -> Result<Self, HostError> {
        let wait = WaitPolicy { spin: Duration::from_micros(cmd.spin.into()), ..WaitPolicy::default() };
        let config = ChannelConfig { wait, limits, ..ChannelConfig::default() };
        let ipc = |source| HostError::Ipc { instance: instance.to_string(), source };
        let (channel, fds) = ServerChannel::create(&format!("tritium-{instance}"), config).map_err(ipc)?;
        let span = tracing::info_span!("stub", instance = %instance, pid = tracing::field::Empty);
        let spawn_error = |source| HostError::Spawn { python: cmd.python.display().to_string(), source };
        let (stacks, stacks_fd) = crate::stacks::pair().map_err(spawn_error)?;
        let (child, stderr) =
            process::spawn(cmd, fds.control, fds.socket, stacks_fd, span.clone()).map_err(spawn_error)?;
        span.record("pid", child.pid());
        let mut stub = Self {
            probe: Arc::default(),
            calls: Mutex::new(None),
            bls: Mutex::new(None),
            kill_reason: Arc::new(Mutex::new(None)),
            unwatched: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            instance: instance.to_string(),
            child: Mutex::new(child),
            channel: Arc::new(channel),
            stderr,
            info: StubInfo { pid: 0, python: String::new(), numpy: String::new() },
            span,
            next_batch: Mutex::new(0),
            stacks,
        };
        match stub.recv(Some(hello_timeout), "start and say hello")? {
            ToServer::Hello { protocol, pid, python, numpy } => {
                if protocol != PROTOCOL_VERSION {
                    return Err(stub.protocol_error(format!(
                        "speaks protocol {protocol}, the server speaks {PROTOCOL_VERSION}; the python/ directory and the server binary come from different builds"
                    )));
                }
                stub.info = StubInfo { pid, python, numpy };
            }
            other => return Err(stub.protocol_error(format!("sent {other:?} before its hello"))),
        }
        tracing::debug!(parent: &stub.span, python = %stub.info.python, numpy = %stub.info.numpy, "stub ready");
        Ok(stub)
    }

    /// The instance name.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// What the stub reported in its hello.
    pub fn info(&self) -> &StubInfo {
        &self.info
    }

    /// The stub's process id.
    pub fn pid(&self) -> u32 {
        self.lock_child().pid()
    }

    /// The channel, for allocating input tensors and reading outputs.
    pub fn channel(&self) -> &Arc<ServerChannel> {
        &self.channel
    }

    /// Asks this stub for its `prometheus_client` metrics from other threads.
    pub fn metrics_probe(&self) -> MetricsProbe {
        MetricsProbe { channel: self.channel.clone(), state: self.probe.clone() }
    }

    /// Stops the watcher thread ([`Stub::watch`]) before the process is told to exit, so that
    /// its exit does not run `on_exit` (a recycled stub's exit is not its instance's death).
    pub fn unwatch(&self) {
        self.unwatched.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Asks this stub for its threads' Python stacks from other threads.
    pub fn stack_probe(&self) -> StackProbe {
        self.stacks.clone()
    }

    /// Logs the stub's Python stacks (at error level, waiting at most [`STACKS_BEFORE_KILL`]) before
    /// it is killed for `why`, so the log shows where it hung.
    pub fn log_stacks_before_kill(&self, why: &str) {
        log_stacks(&self.stacks, why, &self.span);
    }

    /// The last lines the stub wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        self.stderr.text()
    }

    fn lock_child(&self) -> std::sync::MutexGuard<'_, ChildGuard> {
        self.child.locked()
    }

    /// A protocol error of this stub: `message` says what it did.
    pub fn protocol_error(&self, message: String) -> HostError {
        HostError::Protocol { instance: self.instance.clone(), message }
    }

    fn exited(&self, status: StubExit) -> HostError {
        // Give the stderr reader a moment to collect the dying words.
        std::thread::sleep(Duration::from_millis(20));
        let killed = self.kill_reason.locked().clone();
        HostError::Exited {
            instance: self.instance.clone(),
            pid: self.pid(),
            status,
            killed,
            stderr: self.stderr.text(),
        }
    }

    /// Watches the process from the thread shared by every stub (`poller`): when it exits,
    /// both rings are closed (a waiting `recv`, and a `send` waiting for room, end at once) and
    /// `on_exit` runs there (it must not block); when its heartbeat stops advancing for
    /// `heartbeat_timeout` (a frozen process), its stacks are logged and it is killed through its
    /// pidfd, from a thread started for that. Ends when the stub is dropped or unwatched.
    pub fn watch(
        &self,
        heartbeat_timeout: Option<Duration>,
        on_exit: impl Fn() + Send + 'static,
    ) -> std::io::Result<()> {
        let pidfd = process::pidfd_open(self.pid())?;
        let interrupter = self.channel.interrupter();
        let channel = self.channel.clone();
        let reason = self.kill_reason.clone();
        let span = self.span.clone();
        let stacks = self.stacks.clone();
        let mut last_beat = (channel.heartbeat(), Instant::now());
        let tick = move |pidfd: &std::os::fd::OwnedFd| {
            let beat = channel.heartbeat();
            if beat != last_beat.0 {
                last_beat = (beat, Instant::now());
                return;
            }
            let Some(limit) = heartbeat_timeout else { return };
            if last_beat.1.elapsed() <= limit {
                return;
            }
            last_beat.1 = Instant::now();
            let msg = format!("heartbeat lost for {limit:?} (the process stopped running)");
            *reason.locked() = Some(msg.clone());
            let (span, stacks) = (span.clone(), stacks.clone());
            let pidfd = match pidfd.try_clone() {
                Ok(fd) => fd,
                Err(e) => {
                    tracing::error!(parent: &span, "cannot kill the hung stub: {e}");
                    return;
                }
            };
            // Its stacks take up to STACKS_BEFORE_KILL: not on the shared thread.
            let killer = std::thread::Builder::new().name("stub-kill".into()).spawn(move || {
                log_stacks(&stacks, &msg, &span);
                tracing::error!(parent: &span, "{msg}; killing it");
                // Through the pidfd: a pid number could by now name another process.
                if let Err(e) = process::pidfd_kill(std::os::fd::AsFd::as_fd(&pidfd)) {
                    tracing::error!(parent: &span, "cannot kill the hung stub: {e}");
                }
            });
            if let Err(e) = killer {
                tracing::error!("cannot start a thread to kill the hung stub: {e}");
            }
        };
        crate::poller::watch(crate::poller::Watch {
            pidfd,
            stop: self.unwatched.clone(),
            on_exit: Box::new(move || {
                interrupter.interrupt();
                on_exit();
            }),
            tick: Box::new(tick),
        })
    }

    fn ipc(&self, source: IpcError) -> HostError {
        match source {
            IpcError::Closed | IpcError::PeerGone => {
                let status = self.lock_child().wait_or_kill(Duration::from_millis(500));
                self.exited(status)
            }
            source => HostError::Ipc { instance: self.instance.clone(), source: with_flag_hint(source) },
        }
    }

    /// [`Stub::ipc`] for the calls that never wait: a closed channel is [`HostError::Exiting`].
    fn ipc_now(&self, source: IpcError) -> HostError {
        match source {
            IpcError::Closed | IpcError::PeerGone => HostError::Exiting { instance: self.instance.clone() },
            source => self.ipc(source),
        }
    }

    /// Turns [`HostError::Exiting`] into the stub's exit (its status and last stderr lines),
    /// waiting up to 500 ms for the process to end before it is killed; other errors are
    /// returned as they are. Blocks: an event loop calls it where blocking is allowed.
    pub fn settle(&self, e: HostError) -> HostError {
        match e {
            HostError::Exiting { .. } => self.ipc(IpcError::Closed),
            e => e,
        }
    }

    /// Sends `msg`, waiting for room in the ring up to the channel's send timeout.
    pub fn send(&self, msg: &ToStub) -> Result<(), HostError> {
        self.channel.send(msg).map_err(|e| self.ipc(e))
    }

    /// Receives the next message that is not a log record or a call, checking the process
    /// between slices.
    fn recv(&self, timeout: Option<Duration>, what: &'static str) -> Result<ToServer, HostError> {
        self.recv_watching(timeout, what, None)
    }

    /// [`Stub::recv`], calling `watch` (if any) at least every [`WATCH_SLICE`] while it waits.
    fn recv_watching(
        &self,
        timeout: Option<Duration>,
        what: &'static str,
        mut watch: Option<&mut dyn FnMut(&Stub)>,
    ) -> Result<ToServer, HostError> {
        let start = Instant::now();
        let most = if watch.is_some() { WATCH_SLICE } else { LIVENESS_SLICE };
        loop {
            let slice = match timeout {
                Some(t) => {
                    let left = t.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(HostError::Timeout { instance: self.instance.clone(), what, after: t });
                    }
                    left.min(most)
                }
                None => most,
            };
            match self.channel.recv(slice).map_err(|e| self.ipc(e))? {
                Some(msg) => {
                    if let Some(msg) = self.unasked(msg)? {
                        return Ok(msg);
                    }
                }
                None => {
                    if let Some(w) = watch.as_mut() {
                        w(self);
                    }
                    let exit = self.lock_child().try_exit();
                    if let Some(status) = exit {
                        // Take whatever it managed to send before dying.
                        if let Ok(Some(msg)) = self.channel.recv(Duration::ZERO) {
                            if let Ok(Some(msg)) = self.unasked(msg) {
                                return Ok(msg);
                            }
                        }
                        return Err(self.exited(status));
                    }
                }
            }
        }
    }

    /// Sets what answers model code's calls.
    pub fn set_call_handler(&self, handler: CallHandler) {
        *self.calls.locked() = Some(handler);
    }

    /// Sets what takes model code's BLS calls.
    pub fn set_bls_handler(&self, handler: BlsHandler) {
        *self.bls.locked() = Some(handler);
    }

    fn bls(&self, event: BlsEvent) -> Result<(), HostError> {
        let handler = self.bls.locked().clone();
        match (handler, event) {
            (Some(h), event) => h(event),
            (None, BlsEvent::Request { call, request, .. }) => {
                for t in &request.inputs {
                    if let TensorData::Shm { desc, .. } = t.data {
                        self.channel.release(desc);
                    }
                }
                let error = StubError {
                    message: "this server does not take BLS requests here".into(),
                    code: 1,
                    traceback: None,
                };
                let response = Response {
                    request: 0,
                    outputs: Vec::new(),
                    error: Some(error),
                    parameters: Vec::new(),
                    final_response: true,
                    flag_only: false,
                };
                self.send(&ToStub::BlsResponse { call, response })?;
            }
            (None, BlsEvent::Cancel { .. }) => {}
        }
        Ok(())
    }

    fn answer(&self, call: u64, op: CallOp) -> Result<(), HostError> {
        let handler = self.calls.locked().clone();
        let result = match handler {
            Some(h) => h(op),
            None => Err("this server does not take calls from model code here".to_string()),
        };
        if call != 0 {
            self.send(&ToStub::Reply { call, result })?;
        }
        Ok(())
    }

    /// Handles what the stub sent while nobody waited for it (log records, calls from model
    /// threads, and the responses of a decoupled model's open requests, which go to
    /// `on_response`), at most [`POLL_CHUNK`] messages at a time: true when it stopped at that
    /// bound (more may be waiting), so the caller gets to look at its queue between chunks. The
    /// first message is waited for up to `wait`, the rest are taken only if already there.
    /// `on_response` refuses a response it has no open request for (with why, after releasing
    /// its blocks): a protocol error, as is any other message.
    pub fn poll(&self, wait: Duration, on_response: &mut OnResponse<'_>) -> Result<bool, HostError> {
        let mut wait = wait;
        for _ in 0..POLL_CHUNK {
            let Some(msg) = self.channel.recv(wait).map_err(|e| self.ipc(e))? else {
                return Ok(false);
            };
            wait = Duration::ZERO;
            match self.unasked(msg)? {
                None => {}
                Some(ToServer::Response(r)) => on_response(r).map_err(|why| self.protocol_error(why))?,
                Some(other) => return Err(self.protocol_error(format!("sent {other:?} while idle"))),
            }
        }
        Ok(true)
    }

    /// Handles what the stub sends unasked (log records, calls and BLS requests from model code) and hands back
    /// anything else.
    fn unasked(&self, msg: ToServer) -> Result<Option<ToServer>, HostError> {
        match msg {
            ToServer::Log(record) => self.emit_log(&record),
            ToServer::Call { call, op } => self.answer(call, op)?,
            ToServer::BlsRequest { call, model, version, decoupled, request } => {
                self.bls(BlsEvent::Request { call, model, version, decoupled, request })?
            }
            ToServer::BlsCancel { call } => self.bls(BlsEvent::Cancel { call })?,
            ToServer::ClientMetrics { seq, families } => self.probe.deliver(seq, families),
            other => return Ok(Some(other)),
        }
        Ok(None)
    }

    fn emit_log(&self, r: &tritium_ipc::LogRecord) {
        let _enter = self.span.enter();
        let line = ModelLogLine(r);
        match r.level {
            LogLevel::Error => tracing::error!(target: "tritium::model", "{line}"),
            LogLevel::Warning => tracing::warn!(target: "tritium::model", "{line}"),
            LogLevel::Info => tracing::info!(target: "tritium::model", "{line}"),
            LogLevel::Verbose => tracing::debug!(target: "tritium::model", "{line}"),
        }
    }

    /// Runs the model's `auto_complete_config` on `config_json` and returns the completed config.
    pub fn auto_complete(&self, model_file: &str, config_json: &str, timeout: Duration) -> Result<String, HostError> {
        self.send(&ToStub::AutoComplete { model_file: model_file.to_string(), config_json: config_json.to_string() })?;
        match self.recv(Some(timeout), "finish auto_complete_config")? {
            ToServer::AutoCompleteDone(r) => r.map_err(HostError::Model),
            other => Err(self.protocol_error(format!("answered auto-complete with {other:?}"))),
        }
    }

    /// Imports the model and calls `initialize(args)`, waiting up to `timeout`.
    pub fn initialize(&self, init: Initialize, timeout: Duration) -> Result<(), HostError> {
        self.send(&ToStub::Initialize(init))?;
        match self.recv(Some(timeout), "finish initialize")? {
            ToServer::InitializeDone(r) => r.map_err(HostError::Model),
            other => Err(self.protocol_error(format!("answered initialize with {other:?}"))),
        }
    }

    /// Copies `bytes` into a new block of the server's arena, for use as an input tensor.
    pub fn input(&self, bytes: &[u8]) -> Result<Descriptor, HostError> {
        let view = self.channel.alloc(bytes.len() as u64).map_err(|e| self.ipc(e))?;
        view.copy_from(bytes);
        Ok(view.desc)
    }

    /// Copies each of `inputs` into its own block of the server's arena, the blocks back to back
    /// in this order ([`tritium_ipc::Channel::alloc_run`]), so that the stub can view them as one
    /// array; `None` when one is empty (place them one by one then).
    pub fn input_run(&self, inputs: &[&[u8]]) -> Result<Option<Vec<Descriptor>>, HostError> {
        let lens: Vec<u64> = inputs.iter().map(|b| b.len() as u64).collect();
        let Some(views) = self.channel.alloc_run(&lens).map_err(|e| self.ipc(e))? else {
            return Ok(None);
        };
        Ok(Some(
            views
                .into_iter()
                .zip(inputs)
                .map(|(view, bytes)| {
                    view.copy_from(bytes);
                    view.desc
                })
                .collect(),
        ))
    }

    /// Allocates an uninitialised input block of `len` bytes for the caller to fill.
    pub fn input_block(&self, len: u64) -> Result<View, HostError> {
        self.channel.alloc(len).map_err(|e| self.ipc(e))
    }

    /// Runs one `execute` on `requests` and collects the responses until the stub says it is
    /// done. Input blocks are freed as the stub releases them; output tensors must be read with
    /// [`Stub::output`] and then released with [`Stub::release_outputs`].
    pub fn execute(&self, requests: Vec<Request>, timeout: Option<Duration>) -> Result<Executed, HostError> {
        self.execute_watching(requests, timeout, None)
    }

    /// [`Stub::execute`], calling `watch` every few milliseconds while `execute` runs (the
    /// server looks there for requests whose client went away, and sends their `Cancel`).
    pub fn execute_watching(
        &self,
        requests: Vec<Request>,
        timeout: Option<Duration>,
        watch: Option<&mut dyn FnMut(&Stub)>,
    ) -> Result<Executed, HostError> {
        let submitted = self.submit(requests)?;
        self.complete(submitted, timeout, watch)
    }

    /// Sends one `execute` of a model that is not decoupled, without waiting for it: the stub
    /// runs its batches one after the other, so a batch submitted while another runs is in the
    /// ring when that one ends. Read its answers with [`Stub::complete`], in submission order.
    pub fn submit(&self, requests: Vec<Request>) -> Result<Submitted, HostError> {
        let (msg, submitted) = self.prepare_execute(requests);
        self.send(&msg)?;
        Ok(submitted)
    }

    /// The `Execute` message of a batch and its [`Submitted`], for a caller that sends it itself
    /// ([`Stub::try_send`], from an event loop that must not wait for room in the ring).
    pub fn prepare_execute(&self, requests: Vec<Request>) -> (ToStub, Submitted) {
        let batch = {
            let mut b = self.next_batch.locked();
            *b += 1;
            *b
        };
        let collected = Collected::new(requests.iter().map(|r| r.id));
        (ToStub::Execute { batch, requests }, Submitted { batch, collected, ended: None })
    }

    /// Sends `msg` only if the ring has room for it now: false when it has not (or another
    /// thread is sending), for an event loop that retries later instead of waiting.
    pub fn try_send(&self, msg: &ToStub) -> Result<bool, HostError> {
        self.channel.try_send(msg).map_err(|e| self.ipc_now(e))
    }

    /// The next message the stub sent, if one is there now, after handling what it sends
    /// unasked (logs, calls, BLS requests); never waits. For an event loop that waits on the
    /// channel's doorbell between calls. At most [`POLL_CHUNK`] unasked messages are handled in
    /// one call, so that a model thread that logs without pause cannot hold the loop: `None`
    /// then, with more to read.
    pub fn try_message(&self) -> Result<Option<ToServer>, HostError> {
        for _ in 0..POLL_CHUNK {
            let Some(msg) = self.channel.try_recv().map_err(|e| self.ipc_now(e))? else { break };
            if let Some(msg) = self.unasked(msg)? {
                return Ok(Some(msg));
            }
        }
        Ok(None)
    }

    /// Fails with [`HostError::Exiting`] if its process has ended (what it sent before is taken
    /// first by whoever reads the channel; [`Stub::settle`] then tells how it ended).
    pub fn check_alive(&self) -> Result<(), HostError> {
        match self.try_exit() {
            Some(_) => Err(HostError::Exiting { instance: self.instance.clone() }),
            None => Ok(()),
        }
    }

    /// Takes one message of a submitted batch's answer: true once it ended the batch. A message
    /// that cannot be part of it is a protocol error.
    pub fn batch_message(&self, submitted: &mut Submitted, msg: ToServer) -> Result<bool, HostError> {
        match msg {
            ToServer::Response(r) => match submitted.collected.accept(r) {
                Ok(()) => Ok(false),
                Err(refused) => {
                    let (dropped, why) = *refused;
                    self.release_outputs(&dropped);
                    Err(self.protocol_error(why))
                }
            },
            ToServer::ExecuteDone { batch, error } if batch == submitted.batch => {
                submitted.ended = Some(error);
                Ok(true)
            }
            other => Err(self.protocol_error(format!("sent {other:?} during execute"))),
        }
    }

    /// The answers of a batch that ended (its `ExecuteDone` came); a batch abandoned before it
    /// ended hands its gathered responses' blocks back and gives nothing.
    pub fn executed(&self, submitted: Submitted) -> Option<Executed> {
        match submitted.ended {
            Some(error) => Some(Executed { responses: submitted.collected.responses, error }),
            None => {
                for r in &submitted.collected.responses {
                    self.release_outputs(r);
                }
                None
            }
        }
    }

    /// Waits up to `timeout` for the responses and the end of a submitted batch (the oldest
    /// one not completed yet), calling `watch` every few milliseconds meanwhile.
    pub fn complete(
        &self,
        mut submitted: Submitted,
        timeout: Option<Duration>,
        mut watch: Option<&mut dyn FnMut(&Stub)>,
    ) -> Result<Executed, HostError> {
        let result = loop {
            let w = watch.as_mut().map(|w| &mut **w as &mut dyn FnMut(&Stub));
            match self.recv_watching(timeout, "finish execute", w) {
                Ok(msg) => match self.batch_message(&mut submitted, msg) {
                    Ok(true) => break Ok(()),
                    Ok(false) => {}
                    Err(e) => break Err(e),
                },
                Err(e) => break Err(e),
            }
        };
        // Nobody will read the responses gathered so far on an error: `executed` hands their
        // blocks back.
        match (result, self.executed(submitted)) {
            (Ok(()), Some(done)) => Ok(done),
            (Err(e), _) => Err(e),
            (Ok(()), None) => Err(self.protocol_error("ended a batch it never ended".into())),
        }
    }

    /// Runs one `execute` of a decoupled model on `requests`: each response goes to
    /// `on_response` as it arrives (it may also come after this returns, through
    /// [`Stub::poll`]), and `watch` is called every few milliseconds, whether responses come or
    /// not (the server sends cancellations and credit from there). Returns the error `execute`
    /// raised, if it did.
    pub fn execute_decoupled(
        &self,
        requests: Vec<Request>,
        timeout: Option<Duration>,
        on_response: &mut OnResponse<'_>,
        watch: &mut dyn FnMut(&Stub),
    ) -> Result<Option<StubError>, HostError> {
        let batch = {
            let mut b = self.next_batch.locked();
            *b += 1;
            *b
        };
        self.send(&ToStub::Execute { batch, requests })?;
        let mut watched = Instant::now();
        loop {
            match self.recv_watching(timeout, "finish execute", Some(&mut *watch))? {
                ToServer::Response(r) => {
                    on_response(r).map_err(|why| self.protocol_error(why))?;
                    // Responses that keep coming must not starve the watch.
                    if watched.elapsed() >= WATCH_SLICE {
                        watch(self);
                        watched = Instant::now();
                    }
                }
                ToServer::ExecuteDone { batch: done, error } if done == batch => return Ok(error),
                other => return Err(self.protocol_error(format!("sent {other:?} during execute"))),
            }
        }
    }

    /// Tells the stub that the client of `request` went away (`is_cancelled()` turns true).
    pub fn cancel(&self, request: u64) -> Result<(), HostError> {
        self.send(&ToStub::Cancel { request })
    }

    /// Tells the stub that the client of decoupled request `request` has taken `consumed` of
    /// its responses, so a model waiting for room in the request's window may send again.
    pub fn credit(&self, request: u64, consumed: u64) -> Result<(), HostError> {
        self.send(&ToStub::Credit { request, consumed })
    }

    /// Resolves an output tensor's bytes (bounds-checked against the stub's segments).
    pub fn output(&self, data: &TensorData) -> Result<View, HostError> {
        match data {
            TensorData::Shm { desc, .. } => self.channel.view(*desc).map_err(|e| self.ipc(e)),
            TensorData::Cuda { .. } => {
                Err(self.protocol_error("sent a GPU tensor, which this server does not take yet".into()))
            }
        }
    }

    /// Hands the output blocks of `response` back to the stub's arena.
    pub fn release_outputs(&self, response: &Response) {
        for t in &response.outputs {
            if let TensorData::Shm { desc, .. } = t.data {
                self.channel.release(desc);
            }
        }
    }

    /// Calls `finalize()` and waits for the stub to exit, killing it after `timeout`.
    pub fn finalize(&self, timeout: Duration) -> Result<(), HostError> {
        self.send(&ToStub::Finalize)?;
        let result = match self.recv(Some(timeout), "finish finalize") {
            Ok(ToServer::FinalizeDone(r)) => r.map_err(HostError::Model),
            Ok(other) => Err(self.protocol_error(format!("answered finalize with {other:?}"))),
            Err(e) => Err(e),
        };
        self.lock_child().wait_or_kill(timeout);
        result
    }

    /// Kills the stub process now (SIGKILL) and reaps it.
    pub fn kill(&self) -> StubExit {
        self.lock_child().kill()
    }

    /// How the process ended, if it has.
    pub fn try_exit(&self) -> Option<StubExit> {
        self.lock_child().try_exit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(request: u64) -> Response {
        Response {
            request,
            outputs: Vec::new(),
            error: None,
            parameters: Vec::new(),
            final_response: true,
            flag_only: false,
        }
    }

    #[test]
    fn one_response_per_request_and_no_strangers() {
        let mut c = Collected::new([1, 2].into_iter());
        assert!(c.accept(response(1)).is_ok());
        let (dropped, why) = *c.accept(response(1)).expect_err("a second response");
        assert_eq!(dropped.request, 1);
        assert!(why.contains("second response for request 1"), "{why}");
        let (_, why) = *c.accept(response(9)).expect_err("unknown");
        assert_eq!(why, "responded to unknown request 9");
        assert!(c.accept(response(2)).is_ok());
        assert_eq!(c.responses.iter().map(|r| r.request).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn limit_errors_name_their_flags() {
        let e = with_flag_hint(IpcError::Protocol("peer has 2 segments; the limit is 2".into()));
        assert!(e.to_string().contains("--max-stub-segments"), "{e}");
        let e = with_flag_hint(IpcError::OutOfMemory(5, "its limit is 4 bytes".into()));
        assert!(e.to_string().contains("--max-server-shm-bytes-per-stub"), "{e}");
        let e = with_flag_hint(IpcError::Protocol("bad descriptor".into()));
        assert_eq!(e.to_string(), "protocol violation: bad descriptor");
    }
}

/// A model's log record as the server prints it: `file:line] message`, or
/// `file:line] logger: message` for a record from Python's `logging` module. Formatted only when
/// the record's level is enabled.
struct ModelLogLine<'a>(&'a tritium_ipc::LogRecord);

impl std::fmt::Display for ModelLogLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.0;
        if r.logger.is_empty() {
            write!(f, "{}:{}] {}", r.file, r.line, r.message)
        } else {
            write!(f, "{}:{}] {}: {}", r.file, r.line, r.logger, r.message)
        }
    }
}

#[cfg(test)]
mod log_line_tests {
    use super::ModelLogLine;
    use tritium_ipc::{LogLevel, LogRecord};

    fn record(logger: &str) -> LogRecord {
        LogRecord {
            level: LogLevel::Info,
            logger: logger.into(),
            file: "/m/1/model.py".into(),
            line: 12,
            message: "hello".into(),
        }
    }

    #[test]
    fn logging_records_name_their_logger_and_pb_utils_records_do_not() {
        assert_eq!(ModelLogLine(&record("my.model")).to_string(), "/m/1/model.py:12] my.model: hello");
        assert_eq!(ModelLogLine(&record("")).to_string(), "/m/1/model.py:12] hello");
    }
}
