"""BLS (Business Logic Scripting): `InferenceRequest.exec` and `async_exec`, and the response iterator.

A call copies the request's inputs into the stub's shared memory and sends a `BlsRequest`
through the native channel (`Channel.bls_send`); the server routes it like a client's request to
the target model and answers with one `BlsResponse` (a model that is not decoupled) or several,
the last one final (`exec(decoupled=True)`). Each response's outputs are numpy arrays over the
server's shared memory (no copy), released when model code lets go of them, or GPU tensors when
the request asks for GPU memory and CUDA is usable (`PreferredMemory`). As in Triton
(python_backend's `src/infer_request.cc`, `src/pb_response_iterator.cc`), failures come back as
responses whose `has_error()` is true, not as exceptions; only calling outside `execute` raises.
Waits release the GIL.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, NamedTuple

from . import _runtime, dlpack
from .args import as_bool, as_int, as_str
from .errors import TRITONSERVER_MEMORY_GPU, ErrorCode, TritonError, TritonModelException

__all__ = ["PreferredMemory", "ResponseIterator", "is_model_ready", "load_model", "unload_model"]

# How long one wait for a response lasts before the caller looks at its timeout again.
_SLICE_MS = 1000


class PreferredMemory:
    """`pb_utils.PreferredMemory(preferred_memory_type, preferred_device_id=0)`: where a BLS call would
    like its outputs (`InferenceRequest(..., preferred_memory=...)`).

    With `TRITONSERVER_MEMORY_GPU`, when CUDA is usable in the stub, each output of the response
    (except BYTES, which DLPack cannot carry) is a GPU tensor on `preferred_device_id`: its bytes
    are copied from the server's shared memory into a device buffer of the stub's own, and the
    shared memory is given back at once. When CUDA is not usable (no driver, no device), the
    outputs stay CPU tensors over the server's shared memory, as with `TRITONSERVER_MEMORY_CPU`:
    check `is_cpu()` before `as_numpy()`."""

    __slots__ = ("preferred_memory_type", "preferred_device_id")

    def __init__(self, preferred_memory_type, preferred_device_id=0):
        from .errors import MemoryType

        kind = as_int(preferred_memory_type, "PreferredMemory preferred_memory_type")
        try:
            self.preferred_memory_type = MemoryType(kind)
        except ValueError:
            raise TypeError(
                "PreferredMemory preferred_memory_type must be pb_utils.TRITONSERVER_MEMORY_GPU or "
                f"TRITONSERVER_MEMORY_CPU, found {kind}"
            ) from None
        self.preferred_device_id = as_int(preferred_device_id, "PreferredMemory preferred_device_id")


def channel() -> Any:
    """The stub's channel, where BLS is allowed now (inside `execute`); raises Triton's error otherwise."""
    chan = _runtime.channel
    if chan is None or not chan.bls_allowed:
        raise TritonModelException("BLS is only supported during the 'execute' function.")
    return chan


class Outgoing(NamedTuple):
    """What a BLS request sends, as `InferenceRequest` hands it over (`Channel.bls_send`'s arguments)."""

    model: str
    version: int
    request_id: str
    correlation_id: int | str
    flags: int
    timeout_us: int
    parameters: list[tuple[str, Any]]
    # (name, KServe dtype, shape, data) per input.
    inputs: list[tuple[str, str, list[int], Any]]
    requested: list[str]
    # The request's own trace context, or None.
    trace: str | None
    preferred: PreferredMemory | None


def _send(chan: Any, request: Outgoing, decoupled: bool) -> int:
    """Sends `request` on `chan` and returns the call id."""
    return chan.bls_send(
        request.model,
        request.version,
        decoupled,
        request.request_id,
        request.correlation_id,
        request.flags,
        request.timeout_us,
        request.parameters,
        request.inputs,
        request.requested,
        # The BLS request's parent trace: the one it was given (`trace=`), else the trace of the
        # batch being executed, else none ("").
        request.trace or _runtime.current_trace or "",
    )


def _gpu_device(preferred):
    """The device a call's outputs go to: its preferred GPU when CUDA is usable, else None."""
    if preferred is None or preferred.preferred_memory_type != TRITONSERVER_MEMORY_GPU:
        return None
    if dlpack.cuda_unavailable_reason() is not None:
        return None
    return int(preferred.preferred_device_id)


def _to_gpu(outputs, device):
    """GPU tensors on `device` from native output messages over the server's shared memory (a
    BYTES output stays on the CPU): each copied into a `CudaBuffer`, the device synchronized once."""
    from . import _native
    from .tensor import gpu_tensor, tensor_from_wire

    tensors = []
    for o in outputs:
        if o.dtype == "BYTES":
            tensors.append(tensor_from_wire(o))
            continue
        host = o.array
        buf = _native.CudaBuffer(device, host.nbytes)
        buf.copy_from_host(host)
        tensors.append(gpu_tensor(o.name, o.dtype, dlpack.GpuData(buf.memory(), o.shape)))
    return tensors


def _response(msg: Any, preferred: PreferredMemory | None = None) -> Any:
    """A pb_utils.InferenceResponse from a native `BlsResponseMsg`; its outputs are placed as
    `preferred` (a PreferredMemory, or None for host memory) asks, where they can be."""
    from .tensor import received_response, tensor_from_wire

    outputs, error = [], None
    if msg.error is not None:
        message, code = msg.error
        try:
            code = ErrorCode(code)
        except ValueError:
            code = ErrorCode.INTERNAL
        error = TritonError(message, code)
    else:
        device = _gpu_device(preferred)
        if device is None:
            outputs = [tensor_from_wire(o) for o in msg.outputs]
        else:
            try:
                outputs = _to_gpu(msg.outputs, device)
            except Exception as e:  # noqa: BLE001 - a CudaError, or a bad device id: as a response
                error = TritonError(
                    f"Failed to place the BLS response's outputs in the memory of CUDA device {device}: {e}",
                    ErrorCode.INTERNAL,
                )
    # The callee's parameters as they are (they may include floats, which a model cannot set).
    return received_response(outputs, error, dict(msg.parameters))


def _timeout_response():
    return _error_response("Request timeout expired", ErrorCode.UNAVAILABLE)


def _error_response(message, code=ErrorCode.INTERNAL):
    from .tensor import InferenceResponse

    return InferenceResponse(error=TritonError(message, code))


class _Call:
    """One call in flight: waits for its responses, within the request's timeout if it has one."""

    __slots__ = ("channel", "call", "timeout_us", "done", "preferred")

    def __init__(self, channel, call, timeout_us, preferred=None):
        self.channel = channel
        self.call = call
        self.timeout_us = timeout_us
        self.done = False
        self.preferred = preferred

    def next(self):
        """(pb_utils.InferenceResponse, final) for the next response."""
        timeout_ms = None
        if self.timeout_us:
            timeout_ms = max(1, self.timeout_us // 1000)
        msg = self.channel.bls_next(self.call, timeout_ms)
        if msg is None:
            # The request's timeout passed: it is cancelled and its late responses are dropped.
            self.abandon(cancel=True)
            return _timeout_response(), True
        if msg.final_response:
            self.done = True
        return _response(msg, self.preferred), msg.final_response

    def abandon(self, cancel=False):
        if self.done:
            return
        self.done = True
        try:
            if cancel:
                self.channel.bls_cancel(self.call)
            self.channel.bls_forget(self.call)
        except Exception:  # noqa: BLE001 - the stub is shutting down
            pass

    def __del__(self):
        self.abandon()


def execute(chan: Any, request: Outgoing, decoupled: bool) -> Any:
    """`InferenceRequest.exec(decoupled)` on the stub's channel: the call's InferenceResponse, or
    with `decoupled` a ResponseIterator over its responses."""
    pending = _Call(chan, _send(chan, request, decoupled), request.timeout_us, request.preferred)
    if decoupled:
        return ResponseIterator(pending)
    response, final = pending.next()
    while not final:
        # A model that is not decoupled sends one response; anything else is not for this call.
        response, final = pending.next()
    return response


def async_execute(chan: Any, request: Outgoing, decoupled: bool) -> asyncio.Future[Any]:
    """`InferenceRequest.async_exec(decoupled)`: `execute` in the running event loop's executor;
    an awaitable future of its result."""
    loop = asyncio.get_running_loop()
    return loop.run_in_executor(None, functools.partial(execute, chan, request, decoupled))


class ResponseIterator:
    """The responses of `exec(decoupled=True)`, in order, the last one final (a final flag sent
    alone comes as a last response without outputs, as in Triton). Each `next` waits without the
    GIL. Once finished, iterating again starts over from the first response."""

    def __init__(self, call):
        self._call = call
        self._responses = []
        self._idx = 0
        self._finished = False

    def __iter__(self):
        if self._finished and self._idx >= len(self._responses):
            self._idx = 0
        return self

    def __next__(self):
        if self._finished:
            if self._idx < len(self._responses):
                self._idx += 1
                return self._responses[self._idx - 1]
            raise StopIteration("Iteration is done for the responses.")
        response, final = self._call.next()
        self._responses.append(response)
        if final:
            self._finished = True
            self._idx = len(self._responses)
        return response

    def cancel(self):
        """Asks the server to cancel the request; its remaining responses still end the iteration."""
        if not self._finished:
            self._call.channel.bls_cancel(self._call.call)


def _control_channel():
    channel = _runtime.channel
    if channel is None:
        raise TritonModelException("Model control is only available inside a model run by the server.")
    return channel


def is_model_ready(model_name, model_version=""):
    """`pb_utils.is_model_ready(model_name, model_version="")`: whether the model (version) is ready."""
    model_name = as_str(model_name, "is_model_ready model_name")
    model_version = as_str(model_version, "is_model_ready model_version")
    try:
        return _control_channel().model_ready(model_name, model_version)
    except ValueError as e:
        raise TritonModelException(str(e)) from None


def load_model(model_name, config="", files=None):
    """`pb_utils.load_model(model_name, config="", files=None)`: loads (or reloads) a model and waits
    until it is loaded; explicit model-control mode only."""
    model_name = as_str(model_name, "load_model model_name")
    config = as_str(config, "load_model config")
    if files is not None and not isinstance(files, dict):
        # Triton's text (python_backend src/model_loader.cc).
        raise TritonModelException(
            f"failed to load model '{model_name}', files should be a dictionary of file paths and file contents"
        )
    contents = []
    for key, value in (files or {}).items():
        path = as_str(key, "load_model files key")
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"load_model files['{path}'] must be bytes, found type '{type(value).__qualname__}'")
        contents.append((path, bytes(value)))
    try:
        _control_channel().model_load(model_name, config, contents)
    except ValueError as e:
        raise TritonModelException(str(e)) from None


def unload_model(model_name, unload_dependents=False):
    """`pb_utils.unload_model(model_name, unload_dependents=False)`: starts unloading a model;
    explicit model-control mode only."""
    model_name = as_str(model_name, "unload_model model_name")
    unload_dependents = as_bool(unload_dependents, "unload_model unload_dependents")
    try:
        _control_channel().model_unload(model_name, unload_dependents)
    except ValueError as e:
        raise TritonModelException(str(e)) from None
