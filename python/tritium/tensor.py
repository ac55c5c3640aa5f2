"""pb_utils.Tensor, InferenceRequest, InferenceResponse and Logger, as the stub hands them to model code."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import _runtime, dlpack, errors
from .args import as_bool, as_int, as_list, as_str, as_str_list, as_str_opt
from .dtypes import WIRE_DTYPES, deserialize_bytes_tensor, serialize_byte_tensor
from .errors import LogLevel, TritonError, TritonModelException
from .sender import InferenceResponseSender, ResponseState

try:
    from ._native import CudaMemory

    _CUDA_MEMORY: tuple[type, ...] = (CudaMemory,)
except ImportError:  # pb_utils without the native module (its pure-Python tests): no GPU inputs
    _CUDA_MEMORY = ()

__all__ = ["Tensor", "InferenceRequest", "InferenceResponse", "InferenceTrace", "Logger"]

# This module owns the fields of Tensor, InferenceRequest and InferenceResponse. The rest of the
# runtime (the stub, BLS, the response sender) makes and reads these objects through the module
# functions at the end of the file (`requests_from_wire`, `tensor_from_wire`, `gpu_tensor`,
# `received_response`, `send_response`), never through their private attributes; ruff's SLF001
# holds every module of python/tritium to that.

_NUMPY_TO_WIRE = {w.numpy_dtype: name for name, w in WIRE_DTYPES.items() if w.numpy_dtype is not None}
_NUMPY_TO_WIRE[np.dtype(np.object_)] = "BYTES"
_WIRE_TO_TRITON = {name: w.triton_type for name, w in WIRE_DTYPES.items()}


def _wire_dtype(array):
    wire = _NUMPY_TO_WIRE.get(array.dtype)
    if wire is None:
        if array.dtype.kind in "SU":
            return "BYTES"
        raise TritonModelException("NumPy dtype is not supported.")
    return wire


def _check_parameters(parameters):
    """Parameters as a dict of str to bool/int/str, as Triton accepts them (a dict or a JSON object string)."""
    if parameters is None:
        return {}
    if isinstance(parameters, str):
        parameters = json.loads(parameters)
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect parameters to be a dict, found type {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(f"Expect parameters values to have type bool/int/str, found type {type(value)}")
    return dict(parameters)


_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1


def _correlation_id(value):
    """A BLS request's correlation id: an unsigned 64-bit int (a Python or numpy integer) or a
    str (or UTF-8 bytes), as Triton's binding takes it."""
    text = as_str_opt(value)
    if text is not None:
        return text
    if isinstance(value, (bytes, bytearray, float)) or not hasattr(value, "__index__"):
        raise TypeError(f"Correlation ID must be integer or string, found type '{type(value).__qualname__}'")
    return as_int(value, "InferenceRequest correlation_id", 0, _U64_MAX)


_GPU_AS_NUMPY = "Tensor is stored in GPU and cannot be converted to NumPy."


def _check_preferred_memory(preferred_memory):
    from .bls import PreferredMemory  # bls imports this module

    if not isinstance(preferred_memory, PreferredMemory):
        raise TypeError(f"preferred_memory must be a pb_utils.PreferredMemory, found type '{type(preferred_memory)}'.")


class Tensor:
    """A named tensor: `Tensor(name, numpy_array)` in host memory, or, from
    `Tensor.from_dlpack` of a CUDA tensor (or a BLS output with GPU preferred memory), in GPU
    memory (`is_cpu()` is False)."""

    __slots__ = ("_name", "_array", "_wire", "_raw", "_gpu")
    _name: str
    _array: Any
    # The KServe dtype name ("FP32", "BYTES", ...).
    _wire: str
    _raw: Any
    _gpu: Any

    def __init__(self, name: str | bytes, numpy_array: Any, _wire: str | None = None, _raw: Any = None) -> None:
        name = as_str(name, "Tensor name")
        if _raw is None and numpy_array is None:
            # pybind11 converts no None to the numpy array Triton's constructor takes.
            raise TypeError("Tensor numpy_array must be a numpy array, found type 'NoneType'")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        if _raw is None:
            if not isinstance(numpy_array, np.ndarray):
                numpy_array = np.asarray(numpy_array)
            _wire = _wire_dtype(numpy_array)
        elif _wire is None:
            raise TypeError("Tensor: raw data needs its KServe dtype")
        self._name = name
        self._array = numpy_array
        self._wire = _wire
        self._raw = _raw
        self._gpu = None

    def name(self) -> str:
        """The tensor's name."""
        return self._name

    def as_numpy(self) -> NDArray[Any]:
        """The tensor's data as a numpy array (a view of shared memory for inputs). A GPU
        tensor has none: use `to_dlpack()` (`torch.from_dlpack(t)`)."""
        if self._gpu is not None:
            raise TritonModelException(_GPU_AS_NUMPY)
        if self._wire == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
            )
        return self._array

    def shape(self) -> list[int]:
        """The shape as a list of ints."""
        if self._raw is not None:
            return list(self._raw.shape)
        if self._gpu is not None:
            return list(self._gpu.shape)
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        """Triton's data type enum value (TYPE_FP32 is 11)."""
        return _WIRE_TO_TRITON[self._wire]

    def is_cpu(self) -> bool:
        """Whether the tensor is in host memory (False for a GPU tensor)."""
        return self._gpu is None

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing the tensor's memory (`torch.from_dlpack(t.to_dlpack())`): a
        `kDLCUDA` one for a GPU tensor. A read-only tensor (an input in a client's shared memory
        region) is exported as a copy."""
        if self._gpu is not None:
            return dlpack.export_gpu_capsule(self._wire, self._gpu)
        return dlpack.export_capsule(self._wire, self._raw if self._raw is not None else self._array)

    @staticmethod
    def from_dlpack(name: str | bytes, dlpack_tensor: Any) -> Tensor:
        """A tensor named `name` over the memory of a DLPack capsule, or of any object with
        `__dlpack__` and `__dlpack_device__` (a torch or cupy tensor, a numpy array), without a
        copy; BF16 tensors come through as BF16. A CUDA tensor gives a GPU tensor, which keeps
        the producer's memory alive, when CUDA is usable in the stub; otherwise it is refused
        with Triton's error for a stub without GPUs."""
        name = as_str(name, "Tensor name")
        if not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        wire, array = dlpack.import_tensor(dlpack_tensor)
        if isinstance(array, dlpack.GpuData):
            return gpu_tensor(name, wire, array)
        if wire == "BF16":
            return Tensor(name, None, "BF16", array)
        return Tensor(name, array, wire, None)

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        """The DLPack protocol: `numpy.from_dlpack(t)` and `torch.from_dlpack(t)` share its memory.
        A GPU tensor has no pending work (it was synchronized when it was made), so `stream` is
        not waited on, as in Triton."""
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        """(kDLCPU, 0) for a tensor in host memory, (kDLCUDA, device id) for a GPU tensor."""
        if self._gpu is not None:
            return (dlpack.KDL_CUDA, self._gpu.device)
        return (dlpack.KDL_CPU, 0)

    def __repr__(self):
        where = "" if self._gpu is None else f", device=cuda:{self._gpu.device}"
        return f"Tensor(name={self._name!r}, dtype={self._wire}, shape={self.shape()}{where})"

    def _wire_payload(self):
        """(wire dtype, shape, data) for sending: bytes for BYTES, a native CudaMemory for a GPU
        tensor (the channel copies it to the host, after synchronizing its device, straight into
        the shared memory a CPU tensor's bytes would go to), else a C-contiguous array."""
        if self._raw is not None:
            arr = np.ascontiguousarray(self._raw)
            return self._wire, list(arr.shape), arr
        if self._gpu is not None:
            return self._wire, list(self._gpu.shape), self._gpu.memory
        arr = self._array
        if self._wire == "BYTES":
            if arr.dtype != np.object_:
                arr = arr.astype(np.object_)
            return "BYTES", list(arr.shape), bytes(serialize_byte_tensor(arr)) if arr.size else b""
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        return self._wire, list(arr.shape), arr


class InferenceTrace:
    """`request.trace()`: the request's trace. Its context is Triton's trace context text
    (`{"traceparent": "00-...-...-01"}`) when the request is traced in OpenTelemetry mode, and
    None otherwise, as in Triton. Passed as `InferenceRequest(..., trace=...)`, it makes a BLS
    call a child of the request's span."""

    __slots__ = ("_context",)

    def __init__(self, context: str | None = None) -> None:
        self._context = context

    def get_context(self) -> str | None:
        """The trace context (a str), or None when the request is not traced."""
        return self._context or None


# The trace of every untraced request handed to `execute` (it has no state to share).
_NO_TRACE = InferenceTrace()


class InferenceRequest:
    """One request of a batch handed to `execute`."""

    __slots__ = (
        "_id",
        "_request_id",
        "_correlation_id",
        "_flags",
        "_timeout",
        "_parameters",
        "_inputs",
        "_requested",
        "_model_name",
        "_model_version",
        "_state",
        "_sender",
        "_trace",
        "_preferred_memory",
    )
    _state: ResponseState | None
    _sender: InferenceResponseSender | None

    def __init__(
        self,
        model_name: str | bytes = "",
        inputs: Sequence[Tensor] = (),
        requested_output_names: Sequence[str | bytes] = (),
        request_id: str | bytes = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int = -1,
        parameters: dict[str, Any] | str | None = None,
        preferred_memory: Any = None,
        trace: InferenceTrace | None = None,
    ) -> None:
        # Every argument as Triton's pybind11 binding takes it (see args.py): bytes for a str,
        # a numpy integer for an int, any sequence for a list.
        if trace is not None and not isinstance(trace, InferenceTrace):
            raise TypeError(f"trace must be a pb_utils.InferenceTrace, found type '{type(trace).__qualname__}'")
        self._trace = trace if trace is not None else InferenceTrace()
        # A request made by model code (a BLS call) has no response state: nothing answers it
        # through a sender, and its release flags mean nothing.
        self._state = None
        self._sender = None
        self._model_name = as_str(model_name, "InferenceRequest model_name")
        self._model_version = as_int(model_version, "InferenceRequest model_version", -(1 << 63), (1 << 63) - 1)
        # Triton's pybind11 signature has `.none(false)` on both lists: an explicit None is a
        # TypeError (leaving them out, which Triton does not allow, still means none).
        for value, what in ((inputs, "inputs"), (requested_output_names, "requested_output_names")):
            if value is None:
                raise TypeError(f"InferenceRequest {what} must be a list (or another sequence), found type 'NoneType'")
        self._inputs = as_list(inputs, "InferenceRequest inputs")
        for i, t in enumerate(self._inputs):
            if t is None:
                # pybind11 takes None for the shared_ptr; Triton's C++ side then refuses it.
                raise TritonModelException(
                    f"InferenceRequest inputs must be pb_utils.Tensor objects, found None at index {i}"
                )
            if not isinstance(t, Tensor):
                raise TypeError(
                    f"InferenceRequest inputs must be pb_utils.Tensor objects, found type "
                    f"'{type(t).__qualname__}' at index {i}"
                )
        self._requested = set(as_str_list(requested_output_names, "InferenceRequest requested_output_names"))
        self._request_id = as_str(request_id, "InferenceRequest request_id")
        self._correlation_id = _correlation_id(correlation_id)
        self._flags = as_int(flags, "InferenceRequest flags", 0, _U32_MAX)
        self._timeout = as_int(timeout, "InferenceRequest timeout", 0, _U64_MAX)
        self._parameters = _check_parameters(parameters)
        if preferred_memory is not None:
            _check_preferred_memory(preferred_memory)
        # Where a BLS call's outputs go: with TRITONSERVER_MEMORY_GPU and CUDA usable in the stub,
        # on that device (see bls.PreferredMemory); otherwise in host memory.
        self._preferred_memory = preferred_memory

    def inputs(self) -> list[Tensor]:
        """The input tensors."""
        return self._inputs

    def requested_output_names(self) -> set[str]:
        """Names of the outputs the client asked for."""
        return self._requested

    def request_id(self) -> str:
        """The client's request id ("" when none was given)."""
        return self._request_id

    def correlation_id(self) -> int | str:
        """The sequence correlation id (an int, or a str when the client sent a string)."""
        return self._correlation_id

    def flags(self) -> int:
        """Request flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START/END)."""
        return self._flags

    def set_flags(self, flags: int) -> None:
        """Sets the request flags (TRITONSERVER_REQUEST_FLAG_SEQUENCE_START/END), as Triton's
        `set_flags`: a BLS request carries them to the model it calls."""
        self._flags = as_int(flags, "set_flags flags", 0, _U32_MAX)

    def parameters(self) -> str:
        """The request parameters as a compact JSON object string ("{}" when none)."""
        return json.dumps(self._parameters, separators=(",", ":"))

    def timeout(self) -> int:
        """The request timeout in microseconds (0 for none)."""
        return self._timeout

    def model_name(self) -> str:
        """The model this request is for."""
        return self._model_name

    def is_cancelled(self) -> bool:
        """Whether the client cancelled this request."""
        state = self._state
        return state is not None and state.id in _runtime.cancelled

    def get_response_sender(self) -> InferenceResponseSender:
        """The request's `InferenceResponseSender` (the same one on every call)."""
        if self._state is None:
            raise TritonModelException(
                "Unable to send response. Response sender has no reference to the decoupled state of the model."
            )
        if self._sender is None:
            self._sender = InferenceResponseSender(self._state)
        return self._sender

    def trace(self) -> InferenceTrace:
        """The request's `InferenceTrace` (its `get_context()` is None unless the request is traced)."""
        return self._trace

    def exec(self, decoupled: bool = False) -> Any:
        """Runs the request on its model (BLS) and returns its InferenceResponse, or with
        `decoupled=True` a ResponseIterator over its responses. Only inside `execute`."""
        from . import bls

        decoupled = as_bool(decoupled, "exec decoupled")
        chan = bls.channel()
        return bls.execute(chan, self._outgoing(), decoupled)

    def async_exec(self, decoupled: bool = False) -> Awaitable[Any]:
        """`exec` in the running event loop's executor: an awaitable of its result."""
        from . import bls

        decoupled = as_bool(decoupled, "exec decoupled")
        chan = bls.channel()
        return bls.async_execute(chan, self._outgoing(), decoupled)

    def _outgoing(self) -> Any:
        """The request as a BLS call sends it (`bls.Outgoing`), its inputs copied out as the wire takes them."""
        from . import bls

        inputs = []
        for t in self._inputs:
            wire, shape, data = t._wire_payload()  # noqa: SLF001 - this module owns Tensor
            inputs.append((t.name(), wire, shape, data))
        version = self._model_version
        return bls.Outgoing(
            model=self._model_name,
            version=int(version) if version is not None else -1,
            request_id=self._request_id,
            correlation_id=self._correlation_id,
            flags=int(self._flags),
            timeout_us=int(self._timeout),
            parameters=list(self._parameters.items()),
            inputs=inputs,
            requested=sorted(self._requested),
            trace=self._trace.get_context(),
            preferred=self._preferred_memory,
        )

    def set_release_flags(self, flags: int) -> None:
        """Triton's request release flags: TRITONSERVER_REQUEST_RELEASE_ALL (the default) or
        TRITONSERVER_REQUEST_RELEASE_RESCHEDULE. tritium has no iterative sequence batching, so a
        rescheduled request ends with Triton core's error for a model not configured for it."""
        flags = as_int(flags, "set_release_flags flags", 0, _U32_MAX)
        if self._state is not None:
            self._state.release_flags = flags

    def __repr__(self):
        return f"InferenceRequest(request_id={self._request_id!r}, inputs={self._inputs!r})"


class InferenceResponse:
    """`InferenceResponse(output_tensors=[], error=None, parameters=None)`."""

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(
        self,
        output_tensors: Sequence[Tensor] = (),
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        if output_tensors is None:
            # Triton's default is an empty list; an explicit None is refused by pybind11.
            raise TypeError(
                "InferenceResponse output_tensors must be a list (or another sequence), found type 'NoneType'"
            )
        outputs = as_list(output_tensors, "InferenceResponse output_tensors")
        for t in outputs:
            if not isinstance(t, Tensor):
                raise TritonModelException(
                    f"InferenceResponse output_tensors must be pb_utils.Tensor objects, got {type(t).__name__}"
                )
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse error must be a pb_utils.TritonError")
        self._outputs = outputs
        self._error = error
        self._parameters = _check_parameters(parameters)

    def output_tensors(self) -> list[Tensor]:
        """The output tensors."""
        return self._outputs

    def has_error(self) -> bool:
        """True if the response carries an error."""
        return self._error is not None

    def error(self) -> TritonError | None:
        """The TritonError, or None."""
        return self._error

    def parameters(self) -> str:
        """The response parameters as a compact JSON object string ("{}" when none)."""
        return json.dumps(self._parameters, separators=(",", ":"))


def received_response(
    outputs: list[Tensor], error: TritonError | None, parameters: dict[str, Any]
) -> InferenceResponse:
    """A response as a BLS call received it: its fields as they came, without the checks on what
    model code builds (the callee's parameters may hold floats, which a model cannot set)."""
    response = object.__new__(InferenceResponse)
    response._outputs = outputs
    response._error = error
    response._parameters = parameters
    return response


class Logger:
    """pb_utils.Logger: log records go to the server's log with this file and line.

    As in Triton, the levels are `Logger.LogLevel` and its members are also on Logger (Logger.INFO).
    """

    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE
    _LEVELS = {level.value: level for level in LogLevel}

    @staticmethod
    def _emit(level, message, depth):
        frame = sys._getframe(depth)
        if message is None:
            # Triton's message is a std::string: pybind11 refuses None.
            raise TypeError("Logger message must be a str (or UTF-8 bytes), found type 'NoneType'")
        # A str, or UTF-8 bytes as pybind11 takes them; anything else is logged as its str().
        text = as_str_opt(message)
        _runtime.log(level, frame.f_code.co_filename, frame.f_lineno, str(message) if text is None else text)

    @staticmethod
    def log(message: Any, level: errors.LogLevel = LogLevel.INFO) -> None:
        """Logs `message` at `level` (Logger.INFO by default)."""
        if not isinstance(level, LogLevel):
            # Triton's level is a pybind11 enum, which takes no plain number.
            raise TypeError(
                "Logger.log level must be pb_utils.Logger.INFO, WARNING, ERROR or VERBOSE (a Logger.LogLevel), "
                f"found type '{type(level).__name__}'"
            )
        Logger._emit(level, message, 2)

    @staticmethod
    def log_info(message: Any) -> None:
        """Logs at INFO."""
        Logger._emit(LogLevel.INFO, message, 2)

    @staticmethod
    def log_warn(message: Any) -> None:
        """Logs at WARNING."""
        Logger._emit(LogLevel.WARNING, message, 2)

    @staticmethod
    def log_error(message: Any) -> None:
        """Logs at ERROR."""
        Logger._emit(LogLevel.ERROR, message, 2)

    @staticmethod
    def log_verbose(message: Any) -> None:
        """Logs at VERBOSE."""
        Logger._emit(LogLevel.VERBOSE, message, 2)


def _bare_tensor(name, wire, array, raw, gpu):
    """A tensor from fields known to be good (the stub's inputs, GPU tensors), without
    `__init__`'s checks."""
    t = object.__new__(Tensor)
    t._name = name
    t._array = array
    t._wire = wire
    t._raw = raw
    t._gpu = gpu
    return t


def gpu_tensor(name: str, wire: str, gpu: dlpack.GpuData) -> Tensor:
    """A tensor over device memory (`wire` is its KServe dtype name)."""
    return _bare_tensor(name, wire, None, None, gpu)


def tensor_from_wire(msg: Any) -> Tensor:
    """An input tensor over shared memory from a native `InputMsg` (or a BLS output's
    `OutputMsg`): `msg.array` is the numpy view of its bytes (raw uint8 for BYTES, raw uint16 for
    BF16, which numpy cannot represent)."""
    wire = msg.dtype
    if isinstance(msg.array, _CUDA_MEMORY):
        # An input in the client's CUDA shared memory, for a model that asked for GPU inputs
        # (FORCE_CPU_ONLY_INPUT_TENSORS "no"): a GPU tensor over the client's memory.
        return gpu_tensor(msg.name, wire, dlpack.GpuData(msg.array, msg.shape))
    if wire == "BYTES":
        return Tensor(msg.name, deserialize_bytes_tensor(msg.array).reshape(msg.shape), wire, None)
    if wire == "BF16":
        return Tensor(msg.name, None, wire, msg.array)
    # The hot path (every input of every request): the wire dtype is known, so nothing in
    # __init__ needs checking.
    return _bare_tensor(msg.name, wire, msg.array, None, None)


def requests_from_wire(
    wire_requests: Sequence[Any], model_name: str, model_version: int, decoupled: bool
) -> tuple[list[InferenceRequest], list[ResponseState]]:
    """The requests handed to `execute`, from the native `RequestMsg`s of a batch, and the
    response state of each, which the stub keeps to end them (the request's sender shares it)."""
    requests, states = [], []
    for msg in wire_requests:
        state = ResponseState(msg.id, set(msg.requested_outputs), decoupled)
        req = object.__new__(InferenceRequest)
        req._request_id = msg.request_id
        req._correlation_id = msg.correlation_id
        req._flags = msg.flags
        req._timeout = msg.timeout_us
        req._parameters = msg.parameters
        req._inputs = [tensor_from_wire(i) for i in msg.inputs]
        req._requested = state.requested
        req._model_name = model_name
        req._model_version = model_version
        req._state = state
        req._sender = None
        trace = msg.trace
        req._trace = InferenceTrace(trace) if trace else _NO_TRACE
        req._preferred_memory = None
        requests.append(req)
        states.append(state)
    return requests, states


def send_response(channel: Any, state: ResponseState, response: InferenceResponse, final: bool, wake: bool = True):
    """Sends `response` for the request `state` belongs to, keeping only the outputs it asked
    for (all when it asked for none). `wake=False` leaves the server asleep until the next
    message that wakes it (the batch's `ExecuteDone`)."""
    # This module owns InferenceResponse and Tensor: it reads their fields here, once per response.
    error = None
    err = response._error  # noqa: SLF001
    if err is not None:
        error = (err.message(), int(err.code()), None)
    requested = state.requested
    outputs = []
    for t in response._outputs:  # noqa: SLF001
        name = t._name  # noqa: SLF001
        if requested and name not in requested:
            continue
        wire, shape, data = t._wire_payload()  # noqa: SLF001
        outputs.append((name, wire, shape, data))
    parameters = response._parameters  # noqa: SLF001
    channel.send_response(state.id, outputs, error, list(parameters.items()) if parameters else [], final, wake)
