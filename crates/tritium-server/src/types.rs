//! The inference API the frontends use: requests, responses, errors, metadata and statistics,
//! free of any wire format (HTTP, gRPC and JSON are the frontends' business).

use bytes::Bytes;
pub use tritium_host::StubExit;
pub use tritium_ipc::{CorrelationId, DataType, Param as ParamValue};

pub use crate::error::{ErrorKind, InferError};

/// Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_START`, a bit of [`InferRequest::flags`].
pub const FLAG_SEQUENCE_START: u32 = 1;
/// Triton's `TRITONSERVER_REQUEST_FLAG_SEQUENCE_END`, a bit of [`InferRequest::flags`].
pub const FLAG_SEQUENCE_END: u32 = 2;
/// The most elements one classification ranks per batch entry (Triton's
/// `kMaxClassificationElements`).
pub const MAX_CLASSIFICATION_ELEMENTS: usize = 1_000_000;

/// An input tensor as the client sent it. `BYTES` data is in Triton's serialized form (a
/// little-endian `u32` length before each element).
#[derive(Debug, Clone)]
pub struct InputTensor {
    /// Name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Shape, batch dimension included for batching models.
    pub shape: Vec<i64>,
    /// The raw bytes, row-major.
    pub data: Bytes,
}

/// One inference request.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    /// Target model.
    pub model: String,
    /// Target version; `None` picks the model's newest ready version.
    pub version: Option<i64>,
    /// The client's request id, echoed in the response.
    pub id: String,
    /// Inputs.
    pub inputs: Vec<InputTensor>,
    /// Requested outputs, in the client's order; empty asks for every output.
    pub outputs: Vec<RequestedOutput>,
    /// Request parameters (the frontend has removed its own, such as `binary_data_output`).
    pub parameters: Vec<(String, ParamValue)>,
    /// Sequence correlation id.
    pub correlation_id: CorrelationId,
    /// Triton request flags (sequence start = 1, end = 2).
    pub flags: u32,
    /// Timeout in microseconds, 0 for none. Enforced in the queue only under a queue policy
    /// with a `default_timeout_microseconds` that allows overrides, as in Triton.
    pub timeout_us: u64,
    /// Priority (Triton's `priority` parameter): 0 for the model's default level; a model
    /// without `priority_levels` ignores it.
    pub priority: u64,
    /// The trace this request belongs to: the client's (a `traceparent` the frontend read) or,
    /// for a model's BLS call, the calling request's.
    pub trace: Option<tritium_trace::TraceParent>,
    /// For an ensemble's step: where the step adds its compute times, since an ensemble's own
    /// compute times are the sums of its steps' (as in Triton). `None` for other requests.
    pub compute_tally: Option<std::sync::Arc<ComputeTally>>,
}

/// The compute input, infer and output times that an ensemble request's steps add up, each
/// when it succeeds.
#[derive(Debug, Default)]
pub struct ComputeTally {
    input_ns: std::sync::atomic::AtomicU64,
    infer_ns: std::sync::atomic::AtomicU64,
    output_ns: std::sync::atomic::AtomicU64,
}

impl ComputeTally {
    /// Adds one step's compute input, infer and output times.
    pub(crate) fn add(&self, input: std::time::Duration, infer: std::time::Duration, output: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let ns = |d: std::time::Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.input_ns.fetch_add(ns(input), Relaxed);
        self.infer_ns.fetch_add(ns(infer), Relaxed);
        self.output_ns.fetch_add(ns(output), Relaxed);
    }

    /// The sums so far: compute input, infer and output.
    pub(crate) fn totals(&self) -> [std::time::Duration; 3] {
        use std::sync::atomic::Ordering::Relaxed;
        [&self.input_ns, &self.infer_ns, &self.output_ns].map(|n| std::time::Duration::from_nanos(n.load(Relaxed)))
    }
}

/// An output a request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Triton's classification extension: answer the top `k` classes of the tensor (as `BYTES`
    /// strings `"value:index[:label]"`) instead of the tensor itself.
    pub classification: Option<u32>,
    /// The system shared memory extension: write the output into this range of a registered
    /// region instead of returning its bytes.
    pub shm: Option<crate::shm::ShmTarget>,
}

impl RequestedOutput {
    /// The output `name`, returned as it is.
    pub fn named(name: impl Into<String>) -> Self {
        Self { name: name.into(), classification: None, shm: None }
    }
}

/// An output tensor. `BYTES` data is in Triton's serialized form.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTensor {
    /// Name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Shape.
    pub shape: Vec<i64>,
    /// The raw bytes, row-major.
    pub data: Vec<u8>,
}

/// The response to an [`InferRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct InferResponse {
    /// Model name.
    pub model: String,
    /// The version that served the request.
    pub version: i64,
    /// The request's id.
    pub id: String,
    /// Outputs, in the order the model produced them, filtered to those requested.
    pub outputs: Vec<OutputTensor>,
    /// Response parameters set by the model.
    pub parameters: Vec<(String, ParamValue)>,
}

/// One message on a decoupled request's response stream ([`crate::Server::infer_decoupled`]).
/// The stream ends after the message that is final.
#[derive(Debug, Clone, PartialEq)]
pub enum Streamed {
    /// A response, or the error the model (or the server) answered with; `last` when it carries
    /// the final flag. An error from the server (the stub died, a limit) is always last.
    Response {
        /// The response or the error.
        result: Result<InferResponse, InferError>,
        /// Whether it is the request's final response.
        last: bool,
    },
    /// The final flag without a response (`send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`).
    Final,
}

impl Streamed {
    /// Whether this message ends the stream.
    pub fn is_last(&self) -> bool {
        matches!(self, Streamed::Final | Streamed::Response { last: true, .. })
    }
}

/// The receiving end of a decoupled request's responses ([`crate::Server::infer_decoupled`]):
/// it counts the messages its consumer has taken, and the instance worker passes that count to
/// the stub as credit, so a model runs at most `--max-inflight-responses` ahead of its client.
/// Dropping it, or [`ResponseStream::cancel`], is how a consumer cancels the request.
#[derive(Debug)]
pub struct ResponseStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<Streamed>,
    taken: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The sending end of a [`ResponseStream`], held by the request while it is queued or open (a
/// frontend makes its own to serve a model that is not decoupled through the same path).
#[derive(Debug, Clone)]
pub struct StreamTx {
    tx: tokio::sync::mpsc::UnboundedSender<Streamed>,
    taken: std::sync::Arc<std::sync::atomic::AtomicU64>,
    cancelled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// A new response stream and its sending end.
pub fn response_stream() -> (StreamTx, ResponseStream) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let taken = std::sync::Arc::default();
    let cancelled = std::sync::Arc::default();
    (
        StreamTx { tx, taken: std::sync::Arc::clone(&taken), cancelled: std::sync::Arc::clone(&cancelled) },
        ResponseStream { rx, taken, cancelled },
    )
}

impl ResponseStream {
    /// Cancels the request while still taking what it sends: the model sees the cancellation
    /// (`is_cancelled()`), as when the consumer goes away, but a model that ignores it goes on
    /// answering, and its responses still come here until the final one (Triton's
    /// `ResponseIterator.cancel()` in BLS).
    pub fn cancel(&self) {
        self.cancelled.store(true, std::sync::atomic::Ordering::Release);
    }

    /// The next message, waiting for it; None once the stream ended (after the final message,
    /// or when the server dropped the request).
    pub async fn recv(&mut self) -> Option<Streamed> {
        let message = self.rx.recv().await;
        if message.is_some() {
            self.taken.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        message
    }

    /// Polls for the next message (as [`ResponseStream::recv`], for hand-written futures and bodies).
    pub fn poll_recv(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Streamed>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(Some(_)) = &polled {
            self.taken.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        polled
    }

    /// The next message if one is there, without waiting.
    pub fn try_recv(&mut self) -> Result<Streamed, tokio::sync::mpsc::error::TryRecvError> {
        let message = self.rx.try_recv();
        if message.is_ok() {
            self.taken.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
        message
    }

    /// How many messages the consumer has taken.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl StreamTx {
    /// Queues one message; false when the consumer went away.
    pub fn send(&self, message: Streamed) -> bool {
        self.tx.send(message).is_ok()
    }

    /// Whether the consumer dropped its [`ResponseStream`] or cancelled the request. Messages
    /// sent after a cancellation still reach a consumer that is there.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed() || self.cancelled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Completes when the consumer drops its [`ResponseStream`] (a cancellation that keeps
    /// the stream does not complete it).
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// How many messages the consumer has taken.
    pub fn taken(&self) -> u64 {
        self.taken.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits until the consumer has taken at least `count` messages, or went away.
    pub(crate) async fn wait_taken(&self, count: u64) {
        while self.taken() < count && !self.is_closed() {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

/// Name, dtype and shape of a model input or output, as metadata reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMetadata {
    /// Name.
    pub name: String,
    /// KServe dtype name (`"FP32"`, `"BYTES"`).
    pub datatype: String,
    /// Shape with `-1` for variable dimensions, batch dimension included for batching models.
    pub shape: Vec<i64>,
}

/// What `/v2/models/{m}` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelMetadata {
    /// Model name.
    pub name: String,
    /// Versions available (as strings, as KServe has them).
    pub versions: Vec<String>,
    /// Platform (`"python"`).
    pub platform: String,
    /// Inputs.
    pub inputs: Vec<TensorMetadata>,
    /// Outputs.
    pub outputs: Vec<TensorMetadata>,
}

/// What `/v2` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerMetadata {
    /// Server name.
    pub name: String,
    /// Server version.
    pub version: String,
    /// Supported protocol extensions.
    pub extensions: Vec<String>,
}

/// One row of the repository index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexEntry {
    /// Model name.
    pub name: String,
    /// Version, empty when the model has none loaded.
    pub version: String,
    /// `READY`, `LOADING`, `UNAVAILABLE`, `UNLOADING`.
    pub state: String,
    /// Why it is not ready, when it is not.
    pub reason: String,
    /// The interpreter its stubs run on (empty for an ensemble, or a model not loaded).
    pub python: String,
    /// The model's own Python environment (`EXECUTION_ENV_PATH`, `requirements.txt`): its
    /// directory; empty when the model runs on the server's `--python`.
    pub environment: String,
}

/// A count and the total time of some step, as Triton's statistics report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatDuration {
    /// How many times.
    pub count: u64,
    /// Total nanoseconds.
    pub ns: u64,
}

/// Per-model-version statistics in Triton's shape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Model name.
    pub name: String,
    /// Version, as a string.
    pub version: String,
    /// Milliseconds since the epoch of the last inference, 0 if none.
    pub last_inference: u64,
    /// Inferences performed (each request's batch size counted).
    pub inference_count: u64,
    /// Model executions (calls of `execute`).
    pub execution_count: u64,
    /// Successful requests.
    pub success: StatDuration,
    /// Failed requests.
    pub fail: StatDuration,
    /// Failed requests by Triton's reasons: rejected before reaching the model (validation,
    /// unavailable), cancelled, failed in the model (backend), other.
    pub fail_reasons: FailReasons,
    /// Time in the queue.
    pub queue: StatDuration,
    /// Time preparing inputs.
    pub compute_input: StatDuration,
    /// Time in the model's `execute`.
    pub compute_infer: StatDuration,
    /// Time producing outputs.
    pub compute_output: StatDuration,
    /// Response-cache hits.
    pub cache_hit: StatDuration,
    /// Response-cache misses.
    pub cache_miss: StatDuration,
    /// Per batch size: (batch size, compute input, compute infer, compute output).
    pub batch_stats: Vec<BatchStats>,
}

/// Failure counts by Triton's `reason` label of `nv_inference_request_failure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailReasons {
    /// Refused before reaching the model.
    pub rejected: u64,
    /// Cancelled.
    pub canceled: u64,
    /// Failed in the model or its stub.
    pub backend: u64,
    /// Anything else.
    pub other: u64,
}

/// Statistics of executions of one batch size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// The batch size.
    pub batch_size: u64,
    /// Input preparation.
    pub compute_input: StatDuration,
    /// `execute`.
    pub compute_infer: StatDuration,
    /// Output handling.
    pub compute_output: StatDuration,
}

/// A model instance's supervisor state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InstanceState {
    /// The stub process is being started.
    Starting,
    /// `initialize` is running.
    Initializing,
    /// Serving requests.
    Ready,
    /// Finishing its batch before a requested restart.
    Draining,
    /// The stub died; a restart follows after the backoff.
    Crashed,
    /// Waiting out the restart delay.
    BackingOff,
    /// Given up: `initialize` failed, or too many crashes.
    Failed,
    /// Finalizing for unload or shutdown.
    Stopping,
    /// Gone for good.
    Stopped,
}

impl InstanceState {
    /// Every state, in lifecycle order.
    pub const ALL: [InstanceState; 9] = [
        InstanceState::Starting,
        InstanceState::Initializing,
        InstanceState::Ready,
        InstanceState::Draining,
        InstanceState::Crashed,
        InstanceState::BackingOff,
        InstanceState::Failed,
        InstanceState::Stopping,
        InstanceState::Stopped,
    ];

    /// Lower-case name, as the CLI and metrics print it.
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Starting => "starting",
            InstanceState::Initializing => "initializing",
            InstanceState::Ready => "ready",
            InstanceState::Draining => "draining",
            InstanceState::Crashed => "crashed",
            InstanceState::BackingOff => "backing_off",
            InstanceState::Failed => "failed",
            InstanceState::Stopping => "stopping",
            InstanceState::Stopped => "stopped",
        }
    }
}

/// What the CLI and the metrics see of one model instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceInfo {
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: i64,
    /// Instance name (`add_sub_0_0`).
    pub instance: String,
    /// The stub's pid while it runs.
    pub pid: Option<u32>,
    /// Supervisor state.
    pub state: InstanceState,
    /// Time since the current stub started.
    pub uptime: Option<std::time::Duration>,
    /// Restarts so far (crashes and requested restarts).
    pub restarts: u64,
    /// How the last stub ended, and when.
    pub last_exit: Option<(StubExit, std::time::SystemTime)>,
    /// Why the instance is failed or crashed.
    pub reason: String,
    /// The stub's resident memory.
    pub rss_bytes: u64,
    /// Shared memory mapped for the stub's channel.
    pub shm_bytes: u64,
    /// Requests executing now.
    pub inflight: u64,
    /// `execute` calls so far.
    pub executions: u64,
    /// How many times each state was entered.
    pub transitions: Vec<(String, u64)>,
    /// Events the supervisor refused as impossible in the state they came in (a bug if not 0).
    pub impossible_transitions: u64,
    /// The stub's proportional set size (`/proc/PID/smaps_rollup`): its private memory plus its
    /// share of pages it shares.
    pub pss_bytes: u64,
    /// The stub's unique set size: memory no other process maps.
    pub uss_bytes: u64,
    /// How much the stub's resident memory grew since it became ready (negative if it shrank).
    pub rss_growth_bytes: i64,
    /// Requests the running stub has taken since it started.
    pub requests_taken: u64,
    /// Stubs of this instance recycled so far, by reason (`rss`, `requests`).
    pub recycled: Vec<(&'static str, u64)>,
}

/// The Python stacks of one stub ([`crate::Server::stacks`]).
#[derive(Debug, Clone)]
pub struct InstanceStacks {
    /// Model name.
    pub model: String,
    /// Model version.
    pub version: i64,
    /// Instance name.
    pub instance: String,
    /// The stub's pid, when one runs.
    pub pid: Option<u32>,
    /// Every thread's stack (and the asyncio tasks'), as the stub wrote them; or why there are
    /// none.
    pub stacks: Result<String, String>,
}

/// The server's log settings, as Triton's logging extension names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    /// File the log goes to; empty for stderr.
    pub log_file: String,
    /// Whether INFO lines are written.
    pub log_info: bool,
    /// Whether WARNING lines are written.
    pub log_warning: bool,
    /// Whether ERROR lines are written.
    pub log_error: bool,
    /// Verbose level: 0 off, 1 and up for debug detail.
    pub log_verbose_level: u32,
    /// `default`, `ISO8601` or `json`.
    pub log_format: String,
}

/// A change of some log settings; `None` keeps the current value. The log file is not among
/// them: it is set at start (`--log-file`) only, so no client can make the server write where it
/// chooses (CVE-2024-0087 in Triton); a request that names it gets [`log_file_refused`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSettingsUpdate {
    /// See [`LogSettings::log_info`].
    pub log_info: Option<bool>,
    /// See [`LogSettings::log_warning`].
    pub log_warning: Option<bool>,
    /// See [`LogSettings::log_error`].
    pub log_error: Option<bool>,
    /// See [`LogSettings::log_verbose_level`].
    pub log_verbose_level: Option<u32>,
    /// See [`LogSettings::log_format`].
    pub log_format: Option<String>,
}

/// Triton's answer to a logging request that names `log_file`, on both protocols.
pub fn log_file_refused() -> InferError {
    InferError::new(ErrorKind::Unsupported, "log file location can not be updated through network protocol")
}

/// The process's logging, which the binary owns and the frontends change through [`crate::Server`].
pub trait LogControl: Send + Sync {
    /// The current settings.
    fn get(&self) -> LogSettings;
    /// Applies `update` and returns the new settings.
    fn update(&self, update: LogSettingsUpdate) -> Result<LogSettings, InferError>;
}

/// Parses a version as URLs and protos carry it: empty means "the default version".
pub fn parse_version(s: &str) -> Result<Option<i64>, InferError> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse::<i64>().map(Some).map_err(|_| {
        InferError::invalid(format!(
            "failed to get model version from specified version string '{s}': version should be an integral \
                 value > 0"
        ))
    })
}

/// The prefix of a file's load parameter name.
pub const FILE_PREFIX: &str = "file:";
/// One file of a load request: its path inside the model directory (without the `file:`
/// prefix, such as `1/model.py`) and its contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFile {
    /// The path inside the model directory.
    pub path: String,
    /// The file's bytes.
    pub contents: Vec<u8>,
}

impl ModelFile {
    /// A file from its load parameter name (`file:1/model.py`), when the name has the prefix.
    pub fn from_parameter(key: &str, contents: Vec<u8>) -> Option<Self> {
        key.strip_prefix(FILE_PREFIX).map(|path| Self { path: path.to_string(), contents })
    }
}

#[cfg(test)]
mod stream_tests {
    use super::*;

    fn final_message() -> Streamed {
        Streamed::Final
    }

    #[tokio::test]
    async fn the_stream_counts_what_its_consumer_took() {
        let (tx, mut rx) = response_stream();
        for _ in 0..3 {
            assert!(tx.send(final_message()));
        }
        // Queued is not taken.
        assert_eq!(tx.taken(), 0);
        assert!(rx.recv().await.is_some());
        assert_eq!((tx.taken(), rx.taken()), (1, 1));
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_ok());
        assert!(rx.try_recv().is_err());
        assert_eq!(tx.taken(), 3);
        assert!(!tx.is_closed());
        // A cancelled stream is closed to the model, but what it still sends arrives.
        rx.cancel();
        assert!(tx.is_closed());
        assert!(tx.send(final_message()));
        assert!(rx.try_recv().is_ok());
        drop(rx);
        assert!(tx.is_closed());
        assert!(!tx.send(final_message()));
    }
}
