//! A running stub: its process, its channel, and the protocol calls the server makes on it.
//!
//! Every wait is sliced: between slices the stub's process is checked, so a crashed stub turns
//! into [`HostError::Exited`] (with its exit status and the last lines of its stderr) at once
//! instead of a hang. Log records the stub sends are re-emitted through `tracing` inside the
//! stub's span on the way.
//!
//! - [`error`]: [`HostError`], everything that can go wrong with a stub.
//! - [`execute`]: a batch's `execute`, its inputs placed and its outputs read.
//! - [`unasked`]: what the stub sends unasked (logs, model code's calls and BLS requests).
//! - [`probe`]: [`MetricsProbe`], a stub's `prometheus_client` metrics.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Span;
use tritium_ipc::{
    ChannelConfig, ChannelLimits, Initialize, IpcError, Response, ServerChannel, ToServer, ToStub, WaitPolicy,
    PROTOCOL_VERSION,
};
use tritium_sync::Locked;

use crate::process::{self, ChildGuard, StderrTail, StubCommand, StubExit};
use crate::stacks::StackProbe;

mod error;
mod execute;
mod probe;
mod unasked;

use error::with_flag_hint;
pub use error::HostError;
pub use execute::{Executed, Submitted};
use probe::ProbeState;
pub use probe::{ClientMetrics, MetricsProbe};
pub use unasked::{BlsEvent, BlsHandler, CallHandler};

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

/// Takes one response of a decoupled model as it arrives, or refuses it (a response to no open
/// request) with why, after releasing its blocks.
pub type OnResponse<'a> = dyn FnMut(Response) -> Result<(), String> + 'a;

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
