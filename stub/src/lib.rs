//! `tritium._native`: the stub's end of the shared-memory channel, exposed to the pure-Python stub.
//!
//! [`Channel::recv`] turns each server message into an immutable message object with named
//! attributes ([`ExecuteMsg`], [`InitializeMsg`], [`AutoCompleteMsg`], [`CancelMsg`], [`PingMsg`],
//! [`FinalizeMsg`], [`BlsResponseMsg`]); the Python loop dispatches on its type. An `ExecuteMsg`
//! holds one [`RequestMsg`] per request, and each input is an [`InputMsg`] whose `array` is a numpy
//! array made through numpy's C API directly over the shared memory, with the [`InBlock`] that owns
//! the bytes as its base (no copy). Dropping the last reference to an `InBlock` queues its release
//! to the server. Output tensors are read from the numpy array's data pointer and copied once into
//! the stub's arena, then sent as descriptors; a GPU tensor's output (a [`cuda::CudaMemory`]) is
//! copied from the device into the same place, after its device is synchronized, so the server
//! only ever sees host memory from a stub.
//!
//! CUDA ([`cuda`]): the driver found at run time through `tritium-cuda`, for GPU tensors and
//! `KIND_GPU` instances; where there is none, `cuda_unavailable_reason()` says why and every
//! CUDA call raises `CudaError`.
//!
//! Model code's calls on the server (custom metrics) and log records go out with typed protocol
//! values: Python passes the numbers of its `IntEnum`s (`MetricKind`, `MetricOp`, `LogLevel`),
//! which are mapped to the protocol's enums here, and anything else is a `ValueError`.
//!
//! BLS (`InferenceRequest.exec`): [`Channel::bls_send`] copies the request's inputs into the
//! stub's arena and sends a `BlsRequest`; each `BlsResponse` is routed by the [`Router`] to its
//! call's queue, and [`Channel::bls_next`] hands it to Python as a [`BlsResponseMsg`] whose
//! outputs are numpy arrays over the server's shared memory (no copy). `Cancel` and `Credit`
//! messages are recorded here too, per request from its `Execute` until it ends ([`router::Requests`]:
//! [`Channel::is_cancelled`], [`Channel::wait_for_room`]): the heartbeat thread pumps the ring
//! whenever nobody else does, so a cancellation is seen while `execute` still runs, and a
//! decoupled model's `send` that waits for its client (back-pressure) wakes on credit.

mod arrays;
mod cuda;
mod messages;
mod outputs;
mod router;
mod stacks;

use std::collections::VecDeque;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use tritium_ipc::{
    CallOp, CallResult, ClientFamily, ClientMetricKind, ClientSample, CorrelationId, DataType, IpcError, LogLevel,
    LogRecord, MetricKind, MetricOp, Request, Response, StubChannel, Tensor, TensorData, ToServer, ToStub, WaitPolicy,
    PROTOCOL_VERSION,
};
use tritium_sync::Locked;

use crate::arrays::{array_over, join_inputs};
use crate::messages::{
    params_from_py, params_to_py, stub_error, AutoCompleteMsg, BlsResponseMsg, CancelMsg, ExecuteMsg, FinalizeMsg,
    InBlock, InitializeMsg, InputMsg, PingMsg, PyStubError, RequestMsg,
};
use crate::outputs::Out;
use crate::router::Router;

create_exception!(_native, ChannelError, PyException, "The shared-memory channel to the server failed.");

fn ipc_err(e: IpcError) -> PyErr {
    ChannelError::new_err(e.to_string())
}

/// The stub's channel to the server.
/// The longest futex sleep of a wait on the ring. A wait needs no slices to notice the server:
/// its close wakes the futex, and its death kills the stub (`PR_SET_PDEATHSIG`). Every receive
/// has its own timeout, the Python side's parent check (1 s while idle); a shorter slice would
/// only wake an idle stub for nothing (the ring's default, 100 ms, woke it ten times a second).
const WAIT_SLICE: Duration = Duration::from_secs(1);

#[pyclass(frozen, module = "tritium._native")]
struct Channel {
    inner: Arc<StubChannel>,
    router: Arc<Router>,
    /// `initialize` returned and `finalize` has not begun: the only time BLS is allowed.
    executing: AtomicBool,
}

fn dtype(name: &str) -> PyResult<DataType> {
    DataType::from_wire_name(name).ok_or_else(|| PyValueError::new_err(format!("unknown tensor data type {name:?}")))
}

impl Channel {
    fn call(&self, py: Python<'_>, op: CallOp) -> PyResult<CallResult> {
        let (inner, router) = (self.inner.clone(), self.router.clone());
        py.detach(move || router.call(&inner, op)).map_err(PyValueError::new_err)
    }

    fn call_id(&self, py: Python<'_>, op: CallOp) -> PyResult<u64> {
        match self.call(py, op)? {
            CallResult::Id(id) => Ok(id),
            other => Err(ChannelError::new_err(format!("unexpected reply {other:?}"))),
        }
    }

    fn send(&self, py: Python<'_>, msg: ToServer) -> PyResult<()> {
        self.send_waking(py, msg, true)
    }

    /// [`Self::send`], leaving the server asleep when `wake` is false (`Channel::send_lazy`).
    /// Forgets `request`, which ended: a cancellation or credit for it still on its way is
    /// dropped when it comes. (A non-decoupled model's one response is final too.)
    fn ended(&self, request: u64) {
        self.router.requests.locked().end(request);
        self.router.client_regions.locked().remove(&request);
    }

    fn send_waking(&self, py: Python<'_>, msg: ToServer, wake: bool) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || if wake { inner.send(&msg) } else { inner.send_lazy(&msg) }).map_err(ipc_err)
    }

    /// [`InputMsg`]s over the server's blocks of `tensors`, each released when Python lets go
    /// of its array (those not reached after an error are released at once).
    fn tensors_to_py<'py>(&self, py: Python<'py>, tensors: Vec<Tensor>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        let mut rest = tensors.into_iter();
        while let Some(t) = rest.next() {
            let made = self.tensor_to_py(py, t).and_then(|m| list.append(m));
            if let Err(e) = made {
                for t in rest {
                    if let TensorData::Shm { desc, .. } = t.data {
                        self.inner.release(desc);
                    }
                }
                return Err(e);
            }
        }
        Ok(list)
    }

    fn tensor_to_py(&self, py: Python<'_>, t: Tensor) -> PyResult<InputMsg> {
        let (desc, writable) = match t.data {
            TensorData::Shm { desc, writable } => (desc, writable),
            TensorData::Cuda { handle, device, offset, len } => {
                // The client's device memory itself: `array` is a CudaMemory, and the tensor a
                // GPU tensor (`FORCE_CPU_ONLY_INPUT_TENSORS: "no"`).
                let memory = cuda::ipc_input(py, &handle, device, offset, len)
                    .map_err(|e| {
                        cuda::CudaError::new_err(format!(
                            "input '{}' is in the client's CUDA shared memory, which this stub cannot open: {}",
                            t.name,
                            e.value(py)
                        ))
                    })?
                    .into_any();
                let shape = PyTuple::new(py, t.shape)?.unbind();
                return Ok(InputMsg { name: t.name, dtype: t.dtype.wire_name(), shape, array: memory });
            }
        };
        let view = self.inner.view(desc).map_err(ipc_err)?;
        let block = Py::new(py, InBlock { view, writable, channel: self.inner.clone() })?;
        let array = array_over(py, block, t.dtype, &t.shape, &t.name)?.unbind();
        let shape = PyTuple::new(py, t.shape)?.unbind();
        Ok(InputMsg { name: t.name, dtype: t.dtype.wire_name(), shape, array })
    }

    fn request_to_py(&self, py: Python<'_>, r: Request) -> PyResult<Py<RequestMsg>> {
        let inputs = self.tensors_to_py(py, r.inputs)?;
        let corr: Py<PyAny> = match r.correlation_id {
            CorrelationId::None => 0u64.into_pyobject(py)?.into_any().unbind(),
            CorrelationId::U64(v) => v.into_pyobject(py)?.into_any().unbind(),
            CorrelationId::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        };
        let msg = RequestMsg {
            id: r.id,
            request_id: r.request_id,
            correlation_id: corr,
            flags: r.flags,
            timeout_us: r.timeout_us,
            parameters: params_to_py(py, r.parameters)?.unbind(),
            inputs: inputs.unbind(),
            requested_outputs: PyList::new(py, r.requested_outputs)?.unbind(),
            trace: r.trace,
        };
        Py::new(py, msg)
    }
}

#[pymethods]
impl Channel {
    /// Attaches to the control segment and fd socket inherited from the server.
    #[new]
    #[pyo3(signature = (control_fd, socket_fd, spin_us = 500, arena_segment = 256 << 20))]
    fn new(control_fd: i32, socket_fd: i32, spin_us: u64, arena_segment: u64) -> PyResult<Self> {
        if control_fd < 0 || socket_fd < 0 {
            return Err(PyValueError::new_err("file descriptors must be non-negative"));
        }
        // SAFETY: the server hands these fds to the stub at spawn for this channel's exclusive use.
        let (control, socket) = unsafe { (OwnedFd::from_raw_fd(control_fd), OwnedFd::from_raw_fd(socket_fd)) };
        let wait = WaitPolicy { spin: Duration::from_micros(spin_us), slice: WAIT_SLICE };
        let inner = Arc::new(StubChannel::connect(control, socket, wait, arena_segment).map_err(ipc_err)?);
        // The heartbeat the server watches: a native thread that never takes the GIL, so a model
        // busy in Python or C code still beats, and only a frozen process stops.
        // It also pumps the ring when nobody else does (the main thread inside `execute`), so
        // cancellations and BLS responses are taken while model code runs; it only tries the
        // receive lock and never waits for a message. While another thread receives (an idle
        // stub waiting for work) it only beats, at a slower pace.
        let weak = Arc::downgrade(&inner);
        let router: Arc<Router> = Arc::default();
        let pumped = router.clone();
        std::thread::Builder::new()
            .name("tritium-heartbeat".into())
            .spawn(move || {
                let mut seen = 0;
                while let Some(channel) = weak.upgrade() {
                    channel.beat();
                    // A failed ring is reported to whoever receives next.
                    let pumping = pumped.pump(&channel).unwrap_or(true);
                    drop(channel);
                    pumped.sleep_between_beats(pumping, &mut seen);
                }
            })
            .map_err(|e| ChannelError::new_err(format!("cannot start the heartbeat thread: {e}")))?;
        Ok(Self { inner, router, executing: AtomicBool::new(false) })
    }

    /// The pid of the server process that created the channel.
    #[getter]
    fn server_pid(&self) -> u32 {
        self.inner.server_pid()
    }

    /// Waits up to `timeout_ms` for the next message; returns None on timeout. The GIL is released
    /// while waiting. Each kind of message is its own class (`ExecuteMsg`, `InitializeMsg`, ...).
    fn recv<'py>(&self, py: Python<'py>, timeout_ms: u64) -> PyResult<Option<Bound<'py, PyAny>>> {
        let (inner, router) = (self.inner.clone(), self.router.clone());
        let msg = py.detach(move || router.next(&inner, Duration::from_millis(timeout_ms))).map_err(ipc_err)?;
        let Some(msg) = msg else { return Ok(None) };
        let obj = match msg {
            ToStub::Execute { batch, requests } => {
                let reqs = PyList::empty(py);
                let mut input_error = None;
                for r in requests {
                    match self.request_to_py(py, r) {
                        Ok(msg) => reqs.append(msg)?,
                        // Only GPU inputs fail this way; the batch fails, the stub lives on.
                        Err(e) if e.is_instance_of::<cuda::CudaError>(py) => {
                            input_error.get_or_insert_with(|| e.value(py).to_string());
                        }
                        Err(e) => return Err(e),
                    }
                }
                Bound::new(py, ExecuteMsg { batch, requests: reqs.unbind(), input_error })?.into_any()
            }
            ToStub::AutoComplete { model_file, config_json } => {
                Bound::new(py, AutoCompleteMsg { model_file, config_json })?.into_any()
            }
            ToStub::Initialize(init) => {
                let args = PyDict::new(py);
                for (k, v) in init.args {
                    args.set_item(k, v)?;
                }
                Bound::new(py, InitializeMsg { model_file: init.model_file, args: args.unbind() })?.into_any()
            }
            ToStub::Cancel { request } => Bound::new(py, CancelMsg { request })?.into_any(),
            ToStub::Credit { request, .. } => {
                return Err(ChannelError::new_err(format!("the credit of request {request} reached the main loop")));
            }
            ToStub::Ping { seq } => Bound::new(py, PingMsg { seq })?.into_any(),
            ToStub::Finalize => {
                self.executing.store(false, Ordering::Release);
                Bound::new(py, FinalizeMsg)?.into_any()
            }
            ToStub::Reply { call, .. } | ToStub::BlsResponse { call, .. } => {
                return Err(ChannelError::new_err(format!("the answer to call {call} reached the main loop")));
            }
            ToStub::CollectMetrics { seq } => {
                return Err(ChannelError::new_err(format!("metrics request {seq} reached the main loop")));
            }
        };
        Ok(Some(obj))
    }

    /// Announces this stub to the server.
    fn send_hello(&self, py: Python<'_>, python: String, numpy: String) -> PyResult<()> {
        self.send(py, ToServer::Hello { protocol: PROTOCOL_VERSION, pid: std::process::id(), python, numpy })
    }

    /// Reports the outcome of `auto_complete_config`.
    #[pyo3(signature = (config_json, error = None))]
    fn send_auto_complete_done(
        &self,
        py: Python<'_>,
        config_json: Option<String>,
        error: Option<PyStubError>,
    ) -> PyResult<()> {
        let result = match (stub_error(error), config_json) {
            (Some(e), _) => Err(e),
            (None, Some(c)) => Ok(c),
            (None, None) => return Err(PyValueError::new_err("either config_json or error is required")),
        };
        self.send(py, ToServer::AutoCompleteDone(result))
    }

    /// Reports the outcome of `initialize`.
    #[pyo3(signature = (error = None))]
    fn send_initialize_done(&self, py: Python<'_>, error: Option<PyStubError>) -> PyResult<()> {
        self.executing.store(error.is_none(), Ordering::Release);
        self.send(py, ToServer::InitializeDone(stub_error(error).map_or(Ok(()), Err)))
    }

    /// Whether the model is past `initialize` and before `finalize` (BLS is allowed).
    #[getter]
    fn bls_allowed(&self) -> bool {
        self.executing.load(Ordering::Acquire)
    }

    /// Reports the outcome of `finalize`.
    #[pyo3(signature = (error = None))]
    fn send_finalize_done(&self, py: Python<'_>, error: Option<PyStubError>) -> PyResult<()> {
        self.send(py, ToServer::FinalizeDone(stub_error(error).map_or(Ok(()), Err)))
    }

    /// Sends one response. `outputs` holds `(name, wire_dtype, shape, data)` where `data` is
    /// either `bytes` (serialized BYTES) or a C-contiguous numpy array. `wake=False` leaves the
    /// server asleep until the next message that wakes it: for the responses a non-decoupled
    /// model's `execute` returned, which the server has no use for before the batch's
    /// `ExecuteDone`.
    #[pyo3(signature = (request, outputs, error = None, parameters = Vec::new(), final_response = true, wake = true))]
    #[allow(clippy::too_many_arguments)]
    fn send_response(
        &self,
        py: Python<'_>,
        request: u64,
        outputs: Vec<(String, String, Vec<i64>, Bound<'_, PyAny>)>,
        error: Option<PyStubError>,
        parameters: Vec<(String, Bound<'_, PyAny>)>,
        final_response: bool,
        wake: bool,
    ) -> PyResult<()> {
        // `outputs` holds the objects the sources point into until the response is sent.
        let outs = outputs.iter().map(Out::from_py).collect::<PyResult<Vec<Out>>>()?;
        let parameters = params_from_py(parameters)?;
        self.respond(py, request, outs, stub_error(error), parameters, final_response, wake)
    }

    /// Sends the final response of each of a batch's `requests` (`(id, requested output names)`,
    /// every output when none are named) from `outputs` (`(name, wire dtype, C-contiguous numpy
    /// array)`) computed once for the whole batch: request i gets rows
    /// `[sum(rows[..i]), sum(rows[..=i]))` of each, or all of them when `rows` is None. One call
    /// for the batch instead of a `send_response` per request, each row range copied straight
    /// from the array. The server is not woken (the batch's `ExecuteDone` does). A request whose
    /// response cannot be made gets an error response instead ("Failed to send the response: ").
    #[pyo3(signature = (requests, outputs, rows = None))]
    fn send_rows(
        &self,
        py: Python<'_>,
        requests: Vec<(u64, Vec<String>)>,
        outputs: Vec<(String, String, Bound<'_, PyAny>)>,
        rows: Option<Vec<usize>>,
    ) -> PyResult<()> {
        self.respond_rows(py, requests, &outputs, rows)
    }

    /// Sends the final flag alone for `request`: a decoupled model's
    /// `send(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL)` without a response.
    fn send_final_flag(&self, py: Python<'_>, request: u64) -> PyResult<()> {
        self.send(py, ToServer::Response(Response::final_flag(request)))?;
        self.ended(request);
        Ok(())
    }

    /// Tells the server that `execute` returned for `batch`.
    #[pyo3(signature = (batch, error = None))]
    fn send_execute_done(&self, py: Python<'_>, batch: u64, error: Option<PyStubError>) -> PyResult<()> {
        self.send(py, ToServer::ExecuteDone { batch, error: stub_error(error) })
    }

    /// Sends a log record; `level` is a `pb_utils.LogLevel` (0 info, 1 warning, 2 error,
    /// 3 verbose), `logger` the `logging` logger's name (empty for `pb_utils.Logger`).
    #[pyo3(signature = (level, file, line, message, logger = String::new()))]
    fn send_log(
        &self,
        py: Python<'_>,
        level: i64,
        file: String,
        line: u32,
        message: String,
        logger: String,
    ) -> PyResult<()> {
        let level =
            LogLevel::from_index(level).ok_or_else(|| PyValueError::new_err(format!("unknown log level {level}")))?;
        self.send(py, ToServer::Log(LogRecord { level, logger, file, line, message }))
    }

    /// `pb_utils.MetricFamily(...)`: returns the family id. `kind` is a `pb_utils.MetricKind`
    /// (0 counter, 1 gauge, 2 histogram).
    fn metric_family_new(&self, py: Python<'_>, name: String, description: String, kind: i64) -> PyResult<u64> {
        let kind = MetricKind::from_triton(kind)
            .ok_or_else(|| PyValueError::new_err(format!("unknown metric kind {kind}")))?;
        self.call_id(py, CallOp::MetricFamilyNew { name, description, kind })
    }

    /// Releases a family.
    fn metric_family_drop(&self, py: Python<'_>, family_id: u64) -> PyResult<()> {
        self.call(py, CallOp::MetricFamilyDrop { id: family_id }).map(|_| ())
    }

    /// `family.Metric(labels, buckets)`: returns the metric id.
    #[pyo3(signature = (family_id, labels, buckets = None))]
    fn metric_new(
        &self,
        py: Python<'_>,
        family_id: u64,
        labels: Vec<(String, String)>,
        buckets: Option<Vec<f64>>,
    ) -> PyResult<u64> {
        self.call_id(py, CallOp::MetricNew { family: family_id, labels, buckets })
    }

    /// Releases a metric.
    fn metric_drop(&self, py: Python<'_>, metric_id: u64) -> PyResult<()> {
        self.call(py, CallOp::MetricDrop { id: metric_id }).map(|_| ())
    }

    /// `increment`, `set` or `observe`: `op` is a `tritium.metrics.MetricOp` (0, 1, 2).
    fn metric_op(&self, py: Python<'_>, metric_id: u64, op: i64, value: f64) -> PyResult<()> {
        let op =
            MetricOp::from_index(op).ok_or_else(|| PyValueError::new_err(format!("unknown metric operation {op}")))?;
        self.call(py, CallOp::MetricOp { id: metric_id, op, value }).map(|_| ())
    }

    /// `metric.value()`.
    fn metric_value(&self, py: Python<'_>, metric_id: u64) -> PyResult<f64> {
        match self.call(py, CallOp::MetricValue { id: metric_id })? {
            CallResult::Value(v) => Ok(v),
            other => Err(ChannelError::new_err(format!("unexpected reply {other:?}"))),
        }
    }

    /// Whether the server cancelled request `request` (its client went away).
    fn is_cancelled(&self, request: u64) -> bool {
        self.router.requests.locked().is_cancelled(request)
    }

    /// How many requests the stub is tracking (executed and not yet ended).
    fn tracked_requests(&self) -> usize {
        self.router.requests.locked().len()
    }

    /// Waits, without the GIL, until decoupled request `request`, which has sent `sent`
    /// responses, may send another: its client has taken enough of them (the server's
    /// `--max-inflight-responses` window) or went away. Pumps the ring itself when no other
    /// thread does, so a model sending from inside `execute` on the main thread cannot deadlock.
    fn wait_for_room(&self, py: Python<'_>, request: u64, sent: u64) -> PyResult<()> {
        let window = self.router.window.load(Ordering::Acquire);
        if self.router.requests.locked().has_room(request, sent, window) {
            return Ok(());
        }
        let (inner, router) = (self.inner.clone(), self.router.clone());
        py.detach(move || router.wait_until(&inner, None, || router.requests.locked().has_room(request, sent, window)))
            .map_err(ipc_err)?;
        Ok(())
    }

    /// Forgets requests that ended (their cancellations and credit).
    fn forget_cancelled(&self, requests: Vec<u64>) {
        let mut tracked = self.router.requests.locked();
        let mut regions = self.router.client_regions.locked();
        for r in requests {
            tracked.end(r);
            regions.remove(&r);
        }
    }

    /// Sends a BLS request and returns its call id; the responses come from `bls_next`.
    /// `inputs` holds `(name, wire_dtype, shape, data)` as for `send_response`; they are copied
    /// into the stub's arena, and the server releases them.
    /// `trace` is the parent's trace context text ("" for none).
    #[pyo3(signature = (model, version, decoupled, request_id, correlation_id, flags, timeout_us, parameters, inputs, requested_outputs, trace=String::new()))]
    #[allow(clippy::too_many_arguments)]
    fn bls_send(
        &self,
        py: Python<'_>,
        model: String,
        version: i64,
        decoupled: bool,
        request_id: String,
        correlation_id: Bound<'_, PyAny>,
        flags: u32,
        timeout_us: u64,
        parameters: Vec<(String, Bound<'_, PyAny>)>,
        inputs: Vec<(String, String, Vec<i64>, Bound<'_, PyAny>)>,
        requested_outputs: Vec<String>,
        trace: String,
    ) -> PyResult<u64> {
        let correlation_id = if let Ok(s) = correlation_id.extract::<String>() {
            CorrelationId::Str(s)
        } else {
            match correlation_id.extract::<u64>() {
                Ok(0) => CorrelationId::None,
                Ok(v) => CorrelationId::U64(v),
                Err(_) => return Err(PyValueError::new_err("Correlation ID must be integer or string")),
            }
        };
        let parameters = params_from_py(parameters)?;
        let mut tensors = Vec::with_capacity(inputs.len());
        for input in &inputs {
            match Out::from_py(input).and_then(|out| self.tensor_into_arena(py, out)) {
                Ok(t) => tensors.push(t),
                Err(e) => {
                    self.free_tensors(&tensors);
                    return Err(e);
                }
            }
        }
        let call = self.router.new_call();
        let request = Request {
            id: 0,
            request_id,
            correlation_id,
            flags,
            timeout_us,
            parameters,
            inputs: tensors,
            requested_outputs,
            trace,
            output_regions: Vec::new(),
        };
        self.router.bls.locked().insert(call, VecDeque::new());
        let blocks = request.inputs.clone();
        let msg = ToServer::BlsRequest { call, model, version, decoupled, request };
        let inner = self.inner.clone();
        if let Err(e) = py.detach(move || inner.send(&msg)) {
            self.router.bls.locked().remove(&call);
            self.free_tensors(&blocks);
            return Err(ipc_err(e));
        }
        Ok(call)
    }

    /// The next response of BLS call `call`, waiting at most `timeout_ms` (for ever when None)
    /// without the GIL; None on timeout. After the final response the call is forgotten.
    #[pyo3(signature = (call, timeout_ms = None))]
    fn bls_next<'py>(
        &self,
        py: Python<'py>,
        call: u64,
        timeout_ms: Option<u64>,
    ) -> PyResult<Option<Bound<'py, BlsResponseMsg>>> {
        let (inner, router) = (self.inner.clone(), self.router.clone());
        let deadline = timeout_ms.map(|t| Instant::now() + Duration::from_millis(t));
        let taken = py
            .detach(move || {
                let mut taken = None;
                let mut known = true;
                router
                    .wait_until(&inner, deadline, || {
                        let mut bls = router.bls.locked();
                        match bls.get_mut(&call) {
                            Some(queue) => taken = queue.pop_front(),
                            None => known = false,
                        }
                        if taken.as_ref().is_some_and(|r| r.final_response) {
                            bls.remove(&call);
                        }
                        taken.is_some() || !known
                    })
                    .map(|_| (taken, known))
            })
            .map_err(ipc_err)?;
        let response = match taken {
            (Some(r), _) => r,
            (None, true) => return Ok(None),
            (None, false) => return Err(PyValueError::new_err(format!("no BLS call {call} is in flight"))),
        };
        let error = response.error.map(|e| (e.message, e.code));
        let outputs = self.tensors_to_py(py, response.outputs)?.unbind();
        let parameters = params_to_py(py, response.parameters)?.unbind();
        let msg = BlsResponseMsg { call, outputs, error, parameters, final_response: response.final_response };
        Ok(Some(Bound::new(py, msg)?))
    }

    /// Asks the server to cancel BLS call `call` (its responses still come, the last one final).
    fn bls_cancel(&self, py: Python<'_>, call: u64) -> PyResult<()> {
        self.send(py, ToServer::BlsCancel { call })
    }

    /// Stops waiting for BLS call `call`: its responses are released as they come.
    fn bls_forget(&self, call: u64) {
        self.router.forget(&self.inner, call);
    }

    /// `pb_utils.is_model_ready(model_name, model_version)`.
    fn model_ready(&self, py: Python<'_>, name: String, version: String) -> PyResult<bool> {
        match self.call(py, CallOp::ModelReady { name, version })? {
            CallResult::Ready(ready) => Ok(ready),
            other => Err(ChannelError::new_err(format!("unexpected reply {other:?}"))),
        }
    }

    /// `pb_utils.load_model(model_name, config, files)`: waits until the model is loaded.
    fn model_load(&self, py: Python<'_>, name: String, config: String, files: Vec<(String, Vec<u8>)>) -> PyResult<()> {
        self.call(py, CallOp::ModelLoad { name, config, files }).map(|_| ())
    }

    /// `pb_utils.unload_model(model_name, unload_dependents)`: starts the unload.
    fn model_unload(&self, py: Python<'_>, name: String, unload_dependents: bool) -> PyResult<()> {
        self.call(py, CallOp::ModelUnload { name, unload_dependents }).map(|_| ())
    }

    /// Waits up to `timeout_ms`, without the GIL, for the server's next request for the
    /// `prometheus_client` metrics; returns its seq, or None. Requests come in through whichever
    /// thread pumps the ring (the heartbeat thread while `execute` runs), so a thread of its own
    /// answers them while the main thread is busy.
    fn next_metrics_request(&self, py: Python<'_>, timeout_ms: u64) -> Option<u64> {
        let router = self.router.clone();
        py.detach(move || {
            let queue = router.metrics.locked();
            let (mut queue, _) = router
                .metrics_asked
                .wait_timeout_while(queue, Duration::from_millis(timeout_ms), |q| q.is_empty())
                .unwrap_or_else(|p| p.into_inner());
            queue.pop_front()
        })
    }

    /// Answers metrics request `seq` with `families`, each `(name, help, type, samples)` with
    /// `type` one of "counter", "gauge", "histogram", "summary", "untyped" and samples
    /// `(name, labels, value)`; or with `error`. A message too large for the ring is answered
    /// with an error saying so.
    #[pyo3(signature = (seq, families, error = None))]
    #[allow(clippy::type_complexity)]
    fn send_client_metrics(
        &self,
        py: Python<'_>,
        seq: u64,
        families: Vec<(String, String, String, Vec<(String, Vec<(String, String)>, f64)>)>,
        error: Option<String>,
    ) -> PyResult<()> {
        let families = match error {
            Some(e) => Err(e),
            None => families
                .into_iter()
                .map(|(name, help, kind, samples)| {
                    let kind = match kind.as_str() {
                        "counter" => ClientMetricKind::Counter,
                        "gauge" => ClientMetricKind::Gauge,
                        "histogram" => ClientMetricKind::Histogram,
                        "summary" => ClientMetricKind::Summary,
                        "untyped" => ClientMetricKind::Untyped,
                        other => return Err(PyValueError::new_err(format!("unknown metric type {other:?}"))),
                    };
                    let samples =
                        samples.into_iter().map(|(name, labels, value)| ClientSample { name, labels, value }).collect();
                    Ok(ClientFamily { name, help, kind, samples })
                })
                .collect::<PyResult<Vec<_>>>()
                .map_err(|e| e.to_string()),
        };
        let inner = self.inner.clone();
        py.detach(move || match inner.send(&ToServer::ClientMetrics { seq, families }) {
            Err(IpcError::TooLarge { len, capacity }) => {
                let why = format!("the metrics take {len} bytes, more than the {capacity} bytes one message may hold");
                inner.send(&ToServer::ClientMetrics { seq, families: Err(why) })
            }
            other => other,
        })
        .map_err(ipc_err)
    }

    /// Answers a ping.
    fn send_pong(&self, py: Python<'_>, seq: u64) -> PyResult<()> {
        self.send(py, ToServer::Pong { seq })
    }

    /// Sends queued releases of input blocks now.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        py.detach(move || inner.flush_releases()).map_err(ipc_err)
    }

    /// Bytes of shared memory the stub's own arena holds.
    #[getter]
    fn shm_bytes(&self) -> u64 {
        self.inner.own_shm_bytes()
    }
}

/// The native half of the tritium stub.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Channel>()?;
    m.add_class::<InBlock>()?;
    m.add_class::<AutoCompleteMsg>()?;
    m.add_class::<InitializeMsg>()?;
    m.add_class::<ExecuteMsg>()?;
    m.add_class::<RequestMsg>()?;
    m.add_class::<InputMsg>()?;
    m.add_class::<CancelMsg>()?;
    m.add_class::<PingMsg>()?;
    m.add_class::<FinalizeMsg>()?;
    m.add_class::<BlsResponseMsg>()?;
    m.add_function(wrap_pyfunction!(join_inputs, m)?)?;
    m.add_function(wrap_pyfunction!(stacks::stack_signal, m)?)?;
    m.add_function(wrap_pyfunction!(stacks::serve_stacks, m)?)?;
    m.add("ChannelError", m.py().get_type::<ChannelError>())?;
    m.add("PROTOCOL_VERSION", PROTOCOL_VERSION)?;
    cuda::register(m)?;
    Ok(())
}
