//! The stub protocol: every message the server and a stub exchange, and the tensor dtype table.
//!
//! Messages are encoded with postcard into ring frames of class [`crate::ring::FRAME_APP`].
//! Tensor bytes never pass through the encoder: a [`Tensor`] carries a [`Descriptor`] into a
//! shared segment. The protocol already has room for what later work needs: several responses per
//! request (`final_response`), requests the stub sends during `execute` (BLS), cancellation, and
//! heartbeats.

use serde::{Deserialize, Serialize};

use crate::arena::Descriptor;

/// Version of this protocol; the stub's hello must carry the same number.
pub const PROTOCOL_VERSION: u32 = 9;

/// A tensor element type, named as KServe v2 names it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Fp32,
    Fp64,
    Bytes,
    Bf16,
}

impl DataType {
    /// Every data type, in Triton's enum order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
        DataType::Bf16,
    ];

    /// The KServe v2 wire name (`"FP32"`, `"BYTES"`, ...).
    pub fn wire_name(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
            DataType::Bf16 => "BF16",
        }
    }

    /// Parses a KServe v2 wire name.
    pub fn from_wire_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.wire_name() == name)
    }

    /// The model-config name (`"TYPE_FP32"`, `"TYPE_STRING"` for bytes).
    pub fn config_name(self) -> &'static str {
        match self {
            DataType::Bytes => "TYPE_STRING",
            DataType::Bool => "TYPE_BOOL",
            DataType::Uint8 => "TYPE_UINT8",
            DataType::Uint16 => "TYPE_UINT16",
            DataType::Uint32 => "TYPE_UINT32",
            DataType::Uint64 => "TYPE_UINT64",
            DataType::Int8 => "TYPE_INT8",
            DataType::Int16 => "TYPE_INT16",
            DataType::Int32 => "TYPE_INT32",
            DataType::Int64 => "TYPE_INT64",
            DataType::Fp16 => "TYPE_FP16",
            DataType::Fp32 => "TYPE_FP32",
            DataType::Fp64 => "TYPE_FP64",
            DataType::Bf16 => "TYPE_BF16",
        }
    }

    /// Bytes per element, or `None` for variable-length `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

/// Where a tensor's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TensorData {
    /// In a shared segment. `writable` is set when the bytes belong to this tensor alone, so the
    /// model may modify them in place (as it may modify Triton's private copies).
    Shm {
        /// The bytes.
        desc: Descriptor,
        /// Whether the receiver may write to them.
        writable: bool,
    },
    /// In GPU memory, exported as a CUDA IPC handle.
    Cuda {
        /// `cudaIpcMemHandle_t` bytes.
        handle: Vec<u8>,
        /// Device ordinal.
        device: i32,
        /// Byte offset from the start of the exported allocation.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
}

/// A named tensor: dtype, shape and where its bytes are. `BYTES` tensors hold Triton's
/// serialized form (a little-endian `u32` length before each element).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub dtype: DataType,
    /// Shape; a scalar has none.
    pub shape: Vec<i64>,
    /// The bytes.
    pub data: TensorData,
}

/// A request's correlation id: Triton allows an unsigned integer or a string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum CorrelationId {
    /// No correlation id (`0`).
    #[default]
    None,
    /// An integer id.
    U64(u64),
    /// A string id.
    Str(String),
}

/// A request or response parameter value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Param {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    Double(f64),
    /// A string.
    Str(String),
}

/// One inference request, as handed to `execute`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Request {
    /// Server-assigned id, unique per stub; responses and cancellation refer to it.
    pub id: u64,
    /// The client's request id (may be empty).
    pub request_id: String,
    /// Sequence correlation id.
    pub correlation_id: CorrelationId,
    /// Triton request flags (sequence start/end).
    pub flags: u32,
    /// Timeout in microseconds, 0 for none.
    pub timeout_us: u64,
    /// Request parameters, in the client's order.
    pub parameters: Vec<(String, Param)>,
    /// Input tensors.
    pub inputs: Vec<Tensor>,
    /// Names of the outputs the client asked for (all outputs when empty, per Triton).
    pub requested_outputs: Vec<String>,
    /// Triton's trace context text (`{"traceparent":"..."}`): to the stub, the traced
    /// request's (`request.trace().get_context()`); from the stub, a BLS request's parent.
    /// Empty when the request is not traced.
    pub trace: String,
    /// Outputs the client asked for in its registered shared memory (system shared memory
    /// extension): the stub writes each one straight into its [`Descriptor`] (a client region,
    /// [`REGION_BIT`]), never into its arena.
    pub output_regions: Vec<(String, Descriptor)>,
}

/// An error raised by model code or by the stub, with Triton's error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StubError {
    /// Human-readable message (for exceptions: the exception's text).
    pub message: String,
    /// A `pb_utils.TritonError` code.
    pub code: u32,
    /// The Python traceback, when the error came from an exception.
    pub traceback: Option<String>,
}

/// The message alone, as Triton words the error for clients and the repository index (an
/// exception's message already ends with its "At:" frames); the alternate form (`{:#}`), for the
/// server's log, adds the Python traceback.
impl std::fmt::Display for StubError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        match &self.traceback {
            Some(tb) if f.alternate() => write!(f, "\n{}", tb.trim_end()),
            _ => Ok(()),
        }
    }
}

/// One response to a request. A non-decoupled model sends exactly one, with `final_response`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The [`Request::id`] this answers.
    pub request: u64,
    /// Output tensors (in stub-owned segments; the server releases them when done).
    pub outputs: Vec<Tensor>,
    /// An error instead of (or besides) outputs.
    pub error: Option<StubError>,
    /// Response parameters set by the model.
    pub parameters: Vec<(String, Param)>,
    /// The last response for this request.
    pub final_response: bool,
    /// The final flag alone, with no response (`send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`),
    /// as opposed to a response that happens to be empty: Triton's gRPC stream writes nothing for
    /// the flag alone unless the client asked for an empty final response, and writes the empty
    /// response always.
    pub flag_only: bool,
}

impl Response {
    /// The final flag alone for `request` (`send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)`
    /// without a response): final, [`flag_only`](Self::flag_only), nothing in it.
    pub fn final_flag(request: u64) -> Self {
        Self {
            request,
            outputs: Vec::new(),
            error: None,
            parameters: Vec::new(),
            final_response: true,
            flag_only: true,
        }
    }
}

/// A log record from `pb_utils.Logger` or Python's `logging` module.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogRecord {
    /// Level.
    pub level: LogLevel,
    /// The `logging` logger's name (`my.model`); empty for `pb_utils.Logger`.
    pub logger: String,
    /// Source file of the call.
    pub file: String,
    /// Source line of the call.
    pub line: u32,
    /// The message.
    pub message: String,
}

/// `pb_utils.Logger` levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum LogLevel {
    Info,
    Warning,
    Error,
    Verbose,
}

impl LogLevel {
    /// The level for `pb_utils.LogLevel`'s number (0 info, 1 warning, 2 error, 3 verbose).
    pub fn from_index(value: i64) -> Option<Self> {
        match value {
            0 => Some(Self::Info),
            1 => Some(Self::Warning),
            2 => Some(Self::Error),
            3 => Some(Self::Verbose),
            _ => None,
        }
    }
}

/// What the model wants `initialize` to know, with Triton's exact `args` keys and values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Initialize {
    /// Path of the model file to import (`<repo>/<model>/<version>/model.py`).
    pub model_file: String,
    /// The `args` dict passed to `initialize`, in order.
    pub args: Vec<(String, String)>,
    /// A decoupled request's window: most responses sent and not yet taken by its client
    /// ([`ToStub::Credit`]) before the model's next `send` waits; 0 means no limit.
    pub max_inflight_responses: u32,
}

/// How many responses of a decoupled request may be in flight (sent and not yet taken by its
/// client) before its client has taken any: the window starts here and grows by one for each
/// response the client takes (doubling each round trip, as TCP's slow start does) up to
/// [`Initialize::max_inflight_responses`].
///
/// A stub that may run the whole window ahead at once fills it in a burst right after the
/// first response, and on a machine it shares with its client that burst (its sends, the
/// server forwarding them, the client parsing them) stands between the client and the first
/// response: `cargo xtask bench stream`'s client saw its first of 1,000 responses after 0.9-3.9
/// ms (median of 20) with a window of 64 from the start, and after 0.42-0.44 ms with 8.
pub const INITIAL_WINDOW: u64 = 8;

/// The window of a decoupled request whose client has taken `consumed` responses, for a
/// configured `window` (0: no limit, returned as is): the stub may send while its count of
/// sent responses is below `consumed` plus this, and the server credits the stub each half of
/// it. Both sides use this one rule.
pub fn window_now(window: u64, consumed: u64) -> u64 {
    if window == 0 {
        return 0;
    }
    window.min(INITIAL_WINDOW.saturating_add(consumed))
}

/// A custom metric family's kind, as `pb_utils.MetricFamily` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MetricKind {
    /// `MetricFamily.COUNTER` (Triton's 0): only goes up.
    Counter,
    /// `MetricFamily.GAUGE` (Triton's 1): goes up and down.
    Gauge,
    /// `MetricFamily.HISTOGRAM` (Triton's 2): observations counted in buckets.
    Histogram,
}

impl MetricKind {
    /// The kind for Triton's integer value (0 counter, 1 gauge, 2 histogram).
    pub fn from_triton(value: i64) -> Option<Self> {
        match value {
            0 => Some(Self::Counter),
            1 => Some(Self::Gauge),
            2 => Some(Self::Histogram),
            _ => None,
        }
    }
}

/// What a `pb_utils.Metric` method does to its metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MetricOp {
    /// `Metric.increment(value)`.
    Increment,
    /// `Metric.set(value)`.
    Set,
    /// `Metric.observe(value)`.
    Observe,
}

impl MetricOp {
    /// The operation for the stub's number (0 increment, 1 set, 2 observe; `tritium.metrics.MetricOp`).
    pub fn from_index(value: i64) -> Option<Self> {
        match value {
            0 => Some(Self::Increment),
            1 => Some(Self::Set),
            2 => Some(Self::Observe),
            _ => None,
        }
    }
}

/// A call model code makes on the server through the stub (custom metrics now; the same path
/// carries BLS later). A call with id 0 expects no reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CallOp {
    /// `pb_utils.MetricFamily(name, description, kind)`. Replies with the family id.
    MetricFamilyNew {
        /// Metric name.
        name: String,
        /// HELP text.
        description: String,
        /// Counter, gauge or histogram.
        kind: MetricKind,
    },
    /// The family object was garbage collected.
    MetricFamilyDrop {
        /// Family id.
        id: u64,
    },
    /// `family.Metric(labels, buckets)`. Replies with the metric id.
    MetricNew {
        /// Family id.
        family: u64,
        /// Label pairs.
        labels: Vec<(String, String)>,
        /// Histogram bucket bounds.
        buckets: Option<Vec<f64>>,
    },
    /// The metric object was garbage collected.
    MetricDrop {
        /// Metric id.
        id: u64,
    },
    /// `increment`, `set` or `observe`.
    MetricOp {
        /// Metric id.
        id: u64,
        /// What to do.
        op: MetricOp,
        /// The operand.
        value: f64,
    },
    /// `metric.value()`. Replies with the value.
    MetricValue {
        /// Metric id.
        id: u64,
    },
    /// `pb_utils.is_model_ready(model_name, model_version)`. Replies with [`CallResult::Ready`].
    ModelReady {
        /// Model name.
        name: String,
        /// Version ("" for the model's policy).
        version: String,
    },
    /// `pb_utils.load_model(model_name, config, files)` (explicit model control only).
    ModelLoad {
        /// Model name.
        name: String,
        /// A config override as JSON ("" for none).
        config: String,
        /// Override files, by path under the model directory.
        files: Vec<(String, Vec<u8>)>,
    },
    /// `pb_utils.unload_model(model_name, unload_dependents)` (explicit model control only).
    ModelUnload {
        /// Model name.
        name: String,
        /// Also unload the models that depend on it.
        unload_dependents: bool,
    },
}

/// The server's answer to a [`CallOp`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CallResult {
    /// Done, nothing to return.
    Done,
    /// A new object's id.
    Id(u64),
    /// A value.
    Value(f64),
    /// Whether a model is ready.
    Ready(bool),
}

/// A `prometheus_client` metric family's type, as the Prometheus text format names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub enum ClientMetricKind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One sample of a `prometheus_client` family: its full name (`x_total`, `x_bucket`), labels
/// and value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientSample {
    /// Sample name.
    pub name: String,
    /// Label pairs, as model code set them (`le` and `quantile` included).
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// One metric family from the `prometheus_client` default registry of a stub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientFamily {
    /// Family name, in the text format's terms (a counter's ends in `_total`).
    pub name: String,
    /// HELP text.
    pub help: String,
    /// Type.
    pub kind: ClientMetricKind,
    /// Samples.
    pub samples: Vec<ClientSample>,
}

/// Server -> stub messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToStub {
    /// Run the model class's static `auto_complete_config` on a config (JSON), then exit.
    AutoComplete {
        /// Path of the model file.
        model_file: String,
        /// The config so far, as Triton's JSON model config.
        config_json: String,
    },
    /// Import the model and call `initialize(args)`.
    Initialize(Initialize),
    /// Call `execute` with these requests (one batch).
    Execute {
        /// Batch id, echoed in `ExecuteDone`.
        batch: u64,
        /// The requests.
        requests: Vec<Request>,
    },
    /// The client gave up on a request (decoupled and long-running models may check it).
    Cancel {
        /// The [`Request::id`].
        request: u64,
    },
    /// The client of a decoupled request has taken `consumed` of its responses so far (the
    /// final included): the model may run [`window_now`] ahead of it.
    Credit {
        /// The [`Request::id`].
        request: u64,
        /// Responses taken, counted from the first; never decreases.
        consumed: u64,
    },
    /// The answer to a BLS request the stub made.
    BlsResponse {
        /// The stub's BLS call id.
        call: u64,
        /// One response (several for decoupled models).
        response: Response,
    },
    /// The answer to a [`ToServer::Call`].
    Reply {
        /// The call id.
        call: u64,
        /// The result, or the server's error message.
        result: Result<CallResult, String>,
    },
    /// Liveness probe; the stub answers with `Pong`.
    Ping {
        /// Echoed.
        seq: u64,
    },
    /// Call `finalize()` and exit.
    Finalize,
    /// Collect the `prometheus_client` default registry (answered with
    /// [`ToServer::ClientMetrics`] from a thread other than the one running `execute`).
    CollectMetrics {
        /// Echoed.
        seq: u64,
    },
}

/// Stub -> server messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToServer {
    /// First message of every stub.
    Hello {
        /// Must equal [`PROTOCOL_VERSION`].
        protocol: u32,
        /// The stub's pid.
        pid: u32,
        /// `sys.version` of the interpreter.
        python: String,
        /// `numpy.__version__`.
        numpy: String,
    },
    /// Result of `auto_complete_config`: the completed config as JSON.
    AutoCompleteDone(Result<String, StubError>),
    /// `initialize` returned (or raised).
    InitializeDone(Result<(), StubError>),
    /// A response to one request.
    Response(Response),
    /// `execute` returned for this batch. An error here fails every request of the batch that
    /// got no final response.
    ExecuteDone {
        /// The batch id.
        batch: u64,
        /// Set when `execute` raised or returned something invalid.
        error: Option<StubError>,
    },
    /// A BLS inference request made by model code.
    BlsRequest {
        /// The stub's call id.
        call: u64,
        /// Target model.
        model: String,
        /// Target version (-1 for the policy's choice).
        version: i64,
        /// `exec(decoupled=True)`: the caller takes a stream of responses (required for a
        /// decoupled target).
        decoupled: bool,
        /// The request.
        request: Request,
    },
    /// Model code cancelled a BLS call (`ResponseIterator.cancel()`), or stopped waiting for it.
    BlsCancel {
        /// The stub's call id.
        call: u64,
    },
    /// A `pb_utils.Logger` record.
    Log(LogRecord),
    /// A call on the server by model code; answered with [`ToStub::Reply`] unless `call` is 0.
    Call {
        /// Call id (0: no reply wanted).
        call: u64,
        /// What to do.
        op: CallOp,
    },
    /// Answer to `Ping`.
    Pong {
        /// Echoed.
        seq: u64,
    },
    /// `finalize` returned; the stub exits next.
    FinalizeDone(Result<(), StubError>),
    /// Answer to [`ToStub::CollectMetrics`]: the families (none when model code did not import
    /// `prometheus_client`), or why they could not be collected.
    ClientMetrics {
        /// Echoed.
        seq: u64,
        /// The families, or the error.
        families: Result<Vec<ClientFamily>, String>,
    },
}

/// Channel-level frames, handled inside [`crate::channel::Channel`] and never seen by its users.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// A new segment of the sender's; its memfd follows on the fd socket.
    SegmentAdded { id: u32, len: u64 },
    /// The sender retired one of its segments; unmap it.
    SegmentRemoved { id: u32 },
    /// The sender is done with these blocks of the receiver's.
    Release(Vec<Descriptor>),
    /// A client's registered system shared-memory region (server to stub only): its fd follows
    /// on the fd socket; map `len` bytes from `offset` of it as segment `id` (which has
    /// [`REGION_BIT`] set). `SegmentRemoved` unmaps it again.
    RegionAdded { id: u32, offset: u64, len: u64 },
}

/// Triton's text for an output larger than the range of a client's shared memory region the
/// request gave it; the stub (which writes such outputs) and the server (which copies an
/// ensemble's) both answer with it.
pub fn output_too_small(output: &str, available: u64, needed: u64) -> String {
    format!(
        "shared memory size specified with the request for output '{output}' ({available} bytes) should be at least {needed} bytes to hold the results"
    )
}

/// The bit that marks a segment id as a client's registered region (defined with the arena's
/// other segment-id bits).
pub use crate::arena::REGION_BIT;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_starts_small_and_grows_with_what_the_client_took() {
        assert_eq!(window_now(64, 0), INITIAL_WINDOW);
        assert_eq!(window_now(64, 10), INITIAL_WINDOW + 10);
        assert_eq!(window_now(64, 1_000), 64, "never beyond the configured window");
        assert_eq!(window_now(2, 0), 2, "a window under the initial one is the window");
        assert_eq!(window_now(0, 5), 0, "no limit stays no limit");
    }

    #[test]
    fn dtype_names_round_trip() {
        for d in DataType::ALL {
            assert_eq!(DataType::from_wire_name(d.wire_name()), Some(d));
            assert!(d.config_name().starts_with("TYPE_"));
        }
        assert_eq!(DataType::from_wire_name("STRING"), None);
        assert_eq!(DataType::Bytes.element_size(), None);
        assert_eq!(DataType::Bf16.element_size(), Some(2));
    }

    #[test]
    fn a_stub_error_shows_its_traceback_only_in_the_alternate_form() {
        let e = StubError { message: "ValueError: x".into(), code: 1, traceback: Some("Traceback ...\n".into()) };
        assert_eq!(e.to_string(), "ValueError: x");
        assert_eq!(format!("{e:#}"), "ValueError: x\nTraceback ...");
        let bare = StubError { traceback: None, ..e };
        assert_eq!(format!("{bare:#}"), "ValueError: x");
    }

    #[test]
    fn messages_round_trip_through_postcard() {
        let msg = ToStub::Execute {
            batch: 9,
            requests: vec![Request {
                id: 1,
                request_id: "r".into(),
                correlation_id: CorrelationId::Str("seq".into()),
                inputs: vec![Tensor {
                    name: "IN".into(),
                    dtype: DataType::Fp32,
                    shape: vec![2, -1],
                    data: TensorData::Shm { desc: Descriptor { segment: 1, offset: 64, len: 8 }, writable: true },
                }],
                ..Default::default()
            }],
        };
        let bytes = postcard::to_stdvec(&msg).expect("encode");
        assert_eq!(postcard::from_bytes::<ToStub>(&bytes).expect("decode"), msg);
    }

    #[test]
    fn typed_calls_and_logs_round_trip_through_postcard() {
        let mut msgs = vec![
            ToServer::Call {
                call: 3,
                op: CallOp::MetricFamilyNew { name: "n".into(), description: "d".into(), kind: MetricKind::Histogram },
            },
            ToServer::Call { call: 4, op: CallOp::ModelReady { name: "m".into(), version: "2".into() } },
            ToServer::Call {
                call: 5,
                op: CallOp::ModelLoad {
                    name: "m".into(),
                    config: "{}".into(),
                    files: vec![("1/model.py".into(), vec![1])],
                },
            },
            ToServer::Call { call: 6, op: CallOp::ModelUnload { name: "m".into(), unload_dependents: true } },
        ];
        for op in [MetricOp::Increment, MetricOp::Set, MetricOp::Observe] {
            msgs.push(ToServer::Call { call: 0, op: CallOp::MetricOp { id: 7, op, value: 1.5 } });
        }
        for level in [LogLevel::Info, LogLevel::Warning, LogLevel::Error, LogLevel::Verbose] {
            msgs.push(ToServer::Log(LogRecord {
                level,
                logger: "my.model".into(),
                file: "m.py".into(),
                line: 4,
                message: "hi".into(),
            }));
        }
        for msg in msgs {
            let bytes = postcard::to_stdvec(&msg).expect("encode");
            assert_eq!(postcard::from_bytes::<ToServer>(&bytes).expect("decode"), msg);
        }
    }

    #[test]
    fn bls_messages_round_trip_through_postcard() {
        let request = Request { id: 4, requested_outputs: vec!["OUT".into()], ..Default::default() };
        let response = Response::final_flag(0);
        let up = [
            ToServer::BlsRequest { call: 7, model: "m".into(), version: -1, decoupled: true, request },
            ToServer::BlsCancel { call: 7 },
        ];
        for msg in up {
            let bytes = postcard::to_stdvec(&msg).expect("encode");
            assert_eq!(postcard::from_bytes::<ToServer>(&bytes).expect("decode"), msg);
        }
        let down = ToStub::BlsResponse { call: 7, response };
        let bytes = postcard::to_stdvec(&down).expect("encode");
        assert_eq!(postcard::from_bytes::<ToStub>(&bytes).expect("decode"), down);
    }

    #[test]
    fn credits_and_the_window_round_trip_through_postcard() {
        let msgs = [
            ToStub::Credit { request: 9, consumed: u64::MAX },
            ToStub::Initialize(Initialize {
                model_file: "m.py".into(),
                args: vec![("k".into(), "v".into())],
                max_inflight_responses: 64,
            }),
        ];
        for msg in msgs {
            let bytes = postcard::to_stdvec(&msg).expect("encode");
            assert_eq!(postcard::from_bytes::<ToStub>(&bytes).expect("decode"), msg);
        }
    }

    #[test]
    fn client_metrics_round_trip_through_postcard() {
        let down = ToStub::CollectMetrics { seq: 3 };
        let bytes = postcard::to_stdvec(&down).expect("encode");
        assert_eq!(postcard::from_bytes::<ToStub>(&bytes).expect("decode"), down);
        let family = ClientFamily {
            name: "request_count_total".into(),
            help: "Total requests".into(),
            kind: ClientMetricKind::Counter,
            samples: vec![ClientSample {
                name: "request_count_total".into(),
                labels: vec![("p".into(), "a".into())],
                value: 2.0,
            }],
        };
        for families in [Ok(vec![family]), Err("no".to_string())] {
            let up = ToServer::ClientMetrics { seq: 3, families };
            let bytes = postcard::to_stdvec(&up).expect("encode");
            assert_eq!(postcard::from_bytes::<ToServer>(&bytes).expect("decode"), up);
        }
    }

    #[test]
    fn stub_numbers_map_to_enums() {
        let kinds: Vec<_> = (-1..4).map(MetricKind::from_triton).collect();
        assert_eq!(
            kinds,
            [None, Some(MetricKind::Counter), Some(MetricKind::Gauge), Some(MetricKind::Histogram), None]
        );
        let ops: Vec<_> = (-1..4).map(MetricOp::from_index).collect();
        assert_eq!(ops, [None, Some(MetricOp::Increment), Some(MetricOp::Set), Some(MetricOp::Observe), None]);
        let levels: Vec<_> = (-1..5).map(LogLevel::from_index).collect();
        assert_eq!(
            levels,
            [None, Some(LogLevel::Info), Some(LogLevel::Warning), Some(LogLevel::Error), Some(LogLevel::Verbose), None]
        );
    }
}
