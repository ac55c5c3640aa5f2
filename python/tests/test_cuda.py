"""GPU tensors in the stub: the native CUDA functions (`tritium._native.cuda_*`, `CudaBuffer`,
`CudaMemory`), `pb_utils.Tensor.from_dlpack` of `kDLCUDA` producers, GPU tensors' DLPack export,
BLS outputs with GPU preferred memory, and KIND_GPU instances' device binding.

Without CUDA (no driver, as on CI) the native functions say why and raise clear errors, and a
`kDLCUDA` capsule is refused with Triton's text. The Python logic of GPU tensors is tested there
too, with CUDA made to look usable (the driver calls replaced by fakes that never touch the fake
device pointers). The tests marked `gpu` need a usable CUDA device and skip, saying why, without
one; those that use torch or cupy also skip when it is not installed.
"""

import ctypes
import gc
import os
import sys
import threading
import weakref

import numpy as np
import pytest
from tritium import _native, _runtime, bls, dlpack, stub
from tritium.errors import TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_GPU, TritonModelException
from tritium.tensor import InferenceRequest, Tensor

REASON = _native.cuda_unavailable_reason()
# Under TRITIUM_REQUIRE_GPU (`cargo xtask gpu-check`) the GPU tests run even where CUDA is not
# usable, and fail: a GPU check must never pass by skipping.
REQUIRE_GPU = bool(os.environ.get("TRITIUM_REQUIRE_GPU"))
gpu = pytest.mark.skipif(REASON is not None and not REQUIRE_GPU, reason=f"needs a usable CUDA device; here: {REASON}")
no_gpu = pytest.mark.skipif(REASON is None, reason="tests the behaviour without CUDA, which is usable here")

GPU_TEXT = "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"
FAKE_PTR = 0x7F00_DEAD_0000  # never dereferenced: the fakes below stand in for the driver


def error_of(call, kind=TritonModelException):
    with pytest.raises(kind) as e:
        call()
    return str(e.value)


# --- A legacy DLPack capsule made with ctypes, as a foreign producer would make it. ---

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_keep = {}  # the ctypes structs of capsules made here, by address, until their deleter runs


@dlpack._DELETER
def _delete(address):
    _keep.pop(address, None)


def ctypes_capsule(device_type, device_id=0, shape=(2, 3), strides=None, code=2, bits=32, ptr=FAKE_PTR):
    """A `dltensor` capsule over `ptr` (never read), with a deleter that forgets the struct."""
    managed = dlpack._ManagedTensor()
    dims = (ctypes.c_int64 * len(shape))(*shape)
    steps = (ctypes.c_int64 * len(shape))(*strides) if strides else None
    t = managed.dl_tensor
    t.data = ptr
    t.device.device_type, t.device.device_id = device_type, device_id
    t.ndim = len(shape)
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(steps, ctypes.POINTER(ctypes.c_int64)) if steps else None
    managed.deleter = ctypes.cast(_delete, ctypes.c_void_p).value
    address = ctypes.addressof(managed)
    _keep[address] = (managed, dims, steps)
    return _capsule_new(address, b"dltensor", None)


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA made to look usable to the Python side: pointers are accepted, synchronizations are
    recorded, and `CudaBuffer` is host memory standing in for a device buffer."""
    seen = {"synchronized": [], "bound": []}
    monkeypatch.setattr(dlpack, "_cuda_reason", None)
    monkeypatch.setattr(_native, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(_native, "cuda_pointer_device", lambda ptr: 0)
    monkeypatch.setattr(_native, "cuda_synchronize", lambda device: seen["synchronized"].append(device))
    monkeypatch.setattr(_native, "cuda_bind", lambda device: seen["bound"].append((device, threading.current_thread())))

    class HostBuffer:
        """A CudaBuffer's interface over host memory."""

        def __init__(self, device, nbytes):
            self.device, self.nbytes = device, nbytes
            self.host = np.zeros(nbytes, dtype=np.uint8)
            self.ptr = self.host.ctypes.data

        def copy_from_host(self, src, offset=0):
            self.host[offset : offset + src.nbytes] = np.frombuffer(np.ascontiguousarray(src).tobytes(), np.uint8)

        def memory(self):
            return _native.CudaMemory(self.device, self.ptr, self.nbytes, self)

    monkeypatch.setattr(_native, "CudaBuffer", HostBuffer)
    return seen


# --- The native functions without CUDA. ---


@no_gpu
def test_without_cuda_the_native_functions_say_why_and_raise():
    assert isinstance(REASON, str) and REASON
    assert _native.cuda_unavailable_reason() == REASON, "the same answer every time"
    assert _native.cuda_device_count() == 0
    assert _native.cuda_current_device() is None
    calls = [
        lambda: _native.cuda_bind(0),
        lambda: _native.cuda_synchronize(0),
        lambda: _native.cuda_pointer_device(FAKE_PTR),
        lambda: _native.cuda_device_name(0),
        lambda: _native.cuda_copy_to_host(0, FAKE_PTR, np.zeros(4, np.uint8)),
        lambda: _native.cuda_copy_from_host(0, FAKE_PTR, b"abcd"),
        lambda: _native.cuda_copy_to_host(0, FAKE_PTR, bytearray()),  # even with nothing to copy
        lambda: _native.CudaBuffer(0, 16),
        lambda: _native.CudaBuffer.alloc(0, 16),
        lambda: _native.CudaMemory(0, FAKE_PTR, 4, None).copy_to_host(bytearray(4)),
    ]
    for call in calls:
        assert error_of(call, _native.CudaError) == f"CUDA is not available: {REASON}"
    assert issubclass(_native.CudaError, Exception)


def test_host_buffers_are_checked_before_anything_is_copied():
    text = error_of(lambda: _native.cuda_copy_to_host(0, FAKE_PTR, b"read-only"), ValueError)
    assert text == "the destination is read-only"
    text = error_of(lambda: _native.cuda_copy_to_host(0, FAKE_PTR, np.zeros((4, 4), np.float32)[:, ::2]), ValueError)
    assert text == "the destination must be C-contiguous"
    text = error_of(lambda: _native.cuda_copy_from_host(0, FAKE_PTR, 12345), ValueError)
    assert text.startswith("the source must be a numpy array or an object with the buffer protocol, got <class 'int'>")
    small = _native.CudaMemory(0, FAKE_PTR, 4, None)
    assert error_of(lambda: small.copy_to_host(bytearray(8)), ValueError) == (
        "the destination has 8 bytes, more than the 4 bytes of the CUDA memory"
    )


def test_cuda_memory_checks_its_arguments_and_keeps_its_owner():
    owner = object()
    m = _native.CudaMemory(1, FAKE_PTR, 24, owner)
    assert (m.device, m.ptr, m.nbytes) == (1, FAKE_PTR, 24) and m.owner is owner
    assert repr(m) == f"CudaMemory(device=1, ptr=0x{FAKE_PTR:x}, nbytes=24)"
    assert "not negative" in error_of(lambda: _native.CudaMemory(-1, FAKE_PTR, 1, None), ValueError)
    assert "overflows" in error_of(lambda: _native.CudaMemory(0, 2**64 - 1, 2, None), ValueError)
    text = error_of(lambda: m.to_dlpack(2, 32, [7]), ValueError)
    assert text == "shape [7] of 32-bit elements does not fit the 24 bytes of the CUDA memory"
    assert "does not fit" in error_of(lambda: m.to_dlpack(2, 32, [-1]), ValueError)


def test_a_cuda_memory_capsule_is_a_kdlcuda_dltensor_over_the_same_memory():
    class Owner:
        pass

    owner = Owner()
    gone = weakref.ref(owner)
    capsule = _native.CudaMemory(3, FAKE_PTR, 24, owner).to_dlpack(2, 32, [2, 3])
    del owner
    t = dlpack._dl_tensor(capsule)
    assert (t.device.device_type, t.device.device_id) == (dlpack.KDL_CUDA, 3)
    assert t.data == FAKE_PTR and t.byte_offset == 0 and not t.strides
    assert (t.ndim, [t.shape[i] for i in range(2)]) == (2, [2, 3])
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (2, 32, 1)
    gc.collect()
    assert gone() is not None, "the capsule keeps the memory's owner alive"
    del t, capsule
    gc.collect()
    assert gone() is None, "an unconsumed capsule deletes its tensor when collected"


# --- Tensor.from_dlpack of kDLCUDA producers without CUDA: Triton's refusal. ---


@no_gpu
def test_a_ctypes_kdlcuda_capsule_is_refused_with_tritons_text_and_left_unconsumed():
    capsule = ctypes_capsule(dlpack.KDL_CUDA)
    assert error_of(lambda: Tensor.from_dlpack("T", capsule)) == GPU_TEXT
    assert dlpack._capsule_is_valid(capsule, b"dltensor"), "not consumed: its producer still owns it"
    before = len(_keep)
    capsule = None
    gc.collect()
    assert len(_keep) == before, "a capsule without a destructor leaves its tensor to its producer"


@no_gpu
def test_kdlcuda_producers_are_refused_without_cuda():
    capsule = _native.CudaMemory(0, FAKE_PTR, 8, None).to_dlpack(2, 32, [2])
    assert error_of(lambda: Tensor.from_dlpack("T", capsule)) == GPU_TEXT

    class OnGpu:
        def __dlpack__(self, stream=None):
            raise AssertionError("never asked for: the device is checked first")

        def __dlpack_device__(self):
            return (dlpack.KDL_CUDA, 0)

    assert error_of(lambda: Tensor.from_dlpack("T", OnGpu())) == GPU_TEXT


def test_cpu_dlpack_is_unchanged():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = Tensor.from_dlpack("T", a)
    assert t.is_cpu() and t.__dlpack_device__() == (dlpack.KDL_CPU, 0)
    assert np.shares_memory(t.as_numpy(), a)
    wire, shape, data = t._wire_payload()
    assert (wire, shape) == ("FP32", [2, 3]) and data is t.as_numpy()
    assert repr(t) == "Tensor(name='T', dtype=FP32, shape=[2, 3])"
    assert Tensor("C", np.zeros(2))._gpu is None


# --- GPU tensors' Python logic, with CUDA made to look usable. ---


def test_a_gpu_tensor_from_a_capsule(fake_cuda):
    class Owner:
        pass

    owner = Owner()
    gone = weakref.ref(owner)
    t = Tensor.from_dlpack("G", _native.CudaMemory(0, FAKE_PTR, 24, owner).to_dlpack(2, 32, [2, 3]))
    del owner
    assert not t.is_cpu()
    assert (
        t.name() == "G"
        and t.shape() == [2, 3]
        and t.triton_dtype() == Tensor("X", np.zeros(1, np.float32)).triton_dtype()
    )
    assert t.__dlpack_device__() == (dlpack.KDL_CUDA, 0)
    assert error_of(t.as_numpy) == "Tensor is stored in GPU and cannot be converted to NumPy."
    assert repr(t) == "Tensor(name='G', dtype=FP32, shape=[2, 3], device=cuda:0)"
    wire, shape, memory = t._wire_payload()
    assert (wire, shape) == ("FP32", [2, 3])
    assert isinstance(memory, _native.CudaMemory) and (memory.device, memory.ptr, memory.nbytes) == (0, FAKE_PTR, 24)
    assert fake_cuda["synchronized"] == [], "a raw capsule is taken as it is (Triton synchronizes objects only)"

    # Exported again: a kDLCUDA capsule over the same memory, which keeps it alive.
    capsule = t.to_dlpack()
    exported = dlpack._dl_tensor(capsule)
    assert (exported.device.device_type, exported.data, exported.ndim) == (dlpack.KDL_CUDA, FAKE_PTR, 2)
    again = Tensor.from_dlpack("H", capsule)
    assert again._wire_payload()[2].ptr == FAKE_PTR
    del t, memory, capsule, exported
    gc.collect()
    assert gone() is not None, "the tensor made from the export still holds the producer's memory"
    del again
    gc.collect()
    assert gone() is None, "every deleter ran: the producer's memory is released"


def test_a_gpu_tensor_from_an_object_synchronizes_its_device(fake_cuda):
    class Producer:
        """A CUDA producer as torch and cupy are: `__dlpack_device__`, then `__dlpack__`."""

        def __init__(self):
            self.streams = []

        def __dlpack_device__(self):
            return (dlpack.KDL_CUDA, 2)

        def __dlpack__(self, stream=None):
            self.streams.append(stream)
            return _native.CudaMemory(2, FAKE_PTR, 8, self).to_dlpack(4, 16, [4])  # BF16

    producer = Producer()
    t = Tensor.from_dlpack("B", producer)
    assert producer.streams == [None] and fake_cuda["synchronized"] == [2]
    assert t.__dlpack_device__() == (dlpack.KDL_CUDA, 2) and t._wire_payload()[0] == "BF16"
    code = dlpack._dl_tensor(t.to_dlpack()).dtype
    assert (code.code, code.bits) == (4, 16), "BF16 stays BF16"
    # A GPU pb_utils.Tensor is itself a CUDA producer.
    u = Tensor.from_dlpack("U", t)
    assert u._wire_payload()[2].ptr == FAKE_PTR and fake_cuda["synchronized"] == [2, 2]


def test_gpu_capsules_get_the_cpu_checks_and_texts(fake_cuda):
    strided = ctypes_capsule(dlpack.KDL_CUDA, shape=(2, 3), strides=(1, 2))
    assert error_of(lambda: Tensor.from_dlpack("T", strided)).startswith("DLPack tensor is not contiguous.")
    lanes = ctypes_capsule(dlpack.KDL_CUDA)
    dlpack._dl_tensor(lanes).dtype.lanes = 4
    assert error_of(lambda: Tensor.from_dlpack("T", lanes)) == "DLPack tensors with 4 lanes are not supported."
    odd = ctypes_capsule(dlpack.KDL_CUDA, code=5, bits=64)
    assert "has no Triton data type" in error_of(lambda: Tensor.from_dlpack("T", odd))
    assert error_of(lambda: Tensor.from_dlpack("", ctypes_capsule(dlpack.KDL_CUDA))) == (
        "Tensor name cannot be an empty string."
    )
    consumed = ctypes_capsule(dlpack.KDL_CUDA)
    Tensor.from_dlpack("A", consumed)
    assert "consumed already" in error_of(lambda: Tensor.from_dlpack("B", consumed))
    # A size-1 dimension's stride does not matter.
    ok = ctypes_capsule(dlpack.KDL_CUDA, shape=(3, 1), strides=(1, 99))
    assert Tensor.from_dlpack("T", ok).shape() == [3, 1]


def test_a_pointer_the_driver_does_not_know_is_refused(fake_cuda, monkeypatch):
    def unknown(ptr):
        raise _native.CudaError("cuPointerGetAttribute failed: invalid argument (CUresult 1)")

    monkeypatch.setattr(_native, "cuda_pointer_device", unknown)
    capsule = ctypes_capsule(dlpack.KDL_CUDA)
    text = error_of(lambda: Tensor.from_dlpack("T", capsule))
    assert text.startswith(f"DLPack capsule passed pointer 0x{FAKE_PTR:x} that is not CUDA device memory")
    assert dlpack._capsule_is_valid(capsule, b"dltensor"), "refused before it was consumed"
    # An empty tensor's pointer is not looked at.
    assert Tensor.from_dlpack("E", ctypes_capsule(dlpack.KDL_CUDA, shape=(0, 3), ptr=0)).shape() == [0, 3]


def test_a_failed_synchronization_is_tritons_error(fake_cuda, monkeypatch):
    def broken(device):
        raise _native.CudaError("cuCtxSynchronize failed: an illegal memory access was encountered (CUresult 700)")

    monkeypatch.setattr(_native, "cuda_synchronize", broken)

    class Producer:
        def __dlpack_device__(self):
            return (dlpack.KDL_CUDA, 0)

        def __dlpack__(self, stream=None):
            return _native.CudaMemory(0, FAKE_PTR, 4, None).to_dlpack(2, 32, [1])

    assert error_of(lambda: Tensor.from_dlpack("T", Producer())).startswith(
        "Failed to synchronize CUDA device with id 0: cuCtxSynchronize failed"
    )


# --- BLS outputs with GPU preferred memory. ---


class Output:
    """What a native output message (`InputMsg`) of a BLS response carries."""

    def __init__(self, name, array, dtype="FP32"):
        self.name, self.dtype, self.array, self.shape = name, dtype, array, tuple(array.shape)


class Response:
    def __init__(self, outputs, error=None):
        self.outputs, self.error, self.parameters, self.final_response = outputs, error, {}, True


def test_preferred_memory_is_checked_and_kept():
    preferred = bls.PreferredMemory(TRITONSERVER_MEMORY_GPU, 1)
    assert InferenceRequest("m", preferred_memory=preferred)._preferred_memory is preferred
    assert InferenceRequest("m")._preferred_memory is None
    with pytest.raises(TypeError, match="preferred_memory must be a pb_utils.PreferredMemory"):
        InferenceRequest("m", preferred_memory="GPU")


@no_gpu
def test_without_cuda_gpu_preferred_outputs_stay_on_the_cpu():
    a = np.arange(4, dtype=np.float32)
    resp = bls._response(Response([Output("OUT", a)]), bls.PreferredMemory(TRITONSERVER_MEMORY_GPU, 0))
    (out,) = resp.output_tensors()
    assert not resp.has_error() and out.is_cpu() and out.as_numpy() is a


def test_gpu_preferred_outputs_are_copied_to_the_device(fake_cuda):
    a = np.arange(4, dtype=np.float32)
    words = np.array([1, 2], dtype=np.uint16)
    text = np.array([5, 0, 0, 0, 104, 101, 108, 108, 111], dtype=np.uint8)  # one serialized "hello"
    outputs = [Output("OUT", a), Output("HALF", words, "BF16"), Output("TEXT", text, "BYTES")]
    outputs[2].shape = (1,)
    resp = bls._response(Response(outputs), bls.PreferredMemory(TRITONSERVER_MEMORY_GPU, 0))
    assert not resp.has_error(), resp.error()
    out, half, word = resp.output_tensors()
    assert not out.is_cpu() and not half.is_cpu() and word.is_cpu(), "BYTES stays on the CPU"
    assert word.as_numpy().tolist() == [b"hello"]
    memory = out._wire_payload()[2]
    assert memory.owner.host.view(np.float32).tolist() == [0.0, 1.0, 2.0, 3.0]
    assert out.shape() == [4] and half._wire_payload()[0] == "BF16"
    # CPU preferred memory, or none: CPU tensors.
    for preferred in (None, bls.PreferredMemory(TRITONSERVER_MEMORY_CPU, 0)):
        assert bls._response(Response([Output("OUT", a)]), preferred).output_tensors()[0].is_cpu()


def test_a_failed_gpu_placement_is_an_error_response(fake_cuda, monkeypatch):
    def no_memory(device, nbytes):
        raise _native.CudaError("cuMemAlloc failed: out of memory (CUresult 2)")

    monkeypatch.setattr(_native, "CudaBuffer", no_memory)
    resp = bls._response(Response([Output("OUT", np.zeros(4, np.float32))]), bls.PreferredMemory(0, 1))
    assert resp.has_error() and resp.output_tensors() == []
    assert resp.error().message() == (
        "Failed to place the BLS response's outputs in the memory of CUDA device 1: "
        "cuMemAlloc failed: out of memory (CUresult 2)"
    )


# --- KIND_GPU instances. ---

MODEL = """
import threading
from tritium import _native

SEEN = []


class TritonPythonModel:
    async def initialize(self, args):
        SEEN.append(("initialize", threading.current_thread().name))
"""


class InitChannel:
    def __init__(self):
        self.initialized = []

    def send_initialize_done(self, error=None):
        self.initialized.append(error)


@pytest.fixture
def model_dir(tmp_path, monkeypatch):
    """A version directory for a model file; sys.path and sys.modules are put back afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("loop_thread", "decoupled", "model_dir"):
        monkeypatch.setattr(_runtime, name, getattr(_runtime, name))
    for name in ("1", "1.model"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield tmp_path / "1"
    for name in ("1", "1.model"):
        sys.modules.pop(name, None)


def gpu_args(tmp_path, kind="GPU", device="1"):
    return {
        "model_name": "m",
        "model_version": "1",
        "model_instance_name": "m_0",
        "model_instance_kind": kind,
        "model_instance_device_id": device,
        "model_repository": str(tmp_path),
        "model_config": "{}",
    }


@no_gpu
def test_a_kind_gpu_instance_without_cuda_says_so_once(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TRITIUM_CUDA_BIND", "1")
    monkeypatch.setattr(stub, "_said_no_cuda", False)
    assert stub._instance_device(gpu_args(tmp_path, kind="CPU")) is None
    assert capsys.readouterr().err == ""
    assert stub._instance_device(gpu_args(tmp_path)) is None
    assert stub._instance_device(gpu_args(tmp_path)) is None
    err = capsys.readouterr().err
    assert err == (
        f"tritium stub: instance 'm_0' is KIND_GPU (device 1) but CUDA is not usable in the stub: {REASON}; "
        "its model code runs without a CUDA device bound\n"
    )


def test_a_kind_gpu_instance_binds_the_threads_that_run_model_code(fake_cuda, model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITIUM_CUDA_BIND", "1")  # the server sets it for a model that asks for KIND_GPU
    model_dir.mkdir()
    (model_dir / "model.py").write_text(MODEL)
    s = stub.Stub(InitChannel())
    try:
        s.initialize(str(model_dir / "model.py"), gpu_args(tmp_path))
        assert s.channel.initialized == [None]
        assert s.cuda_device == 1
        bound = [(device, thread.name) for device, thread in fake_cuda["bound"]]
        assert bound == [(1, threading.current_thread().name), (1, "tritium-asyncio")]
        assert sys.modules["1.model"].SEEN == [("initialize", "tritium-asyncio")]
    finally:
        if s.loop is not None:
            s.loop.call_soon_threadsafe(s.loop.stop)


def test_a_gpu_instance_of_a_kind_auto_model_binds_nothing(fake_cuda, model_dir, tmp_path, monkeypatch):
    # KIND_AUTO placed on a GPU: the server does not set TRITIUM_CUDA_BIND, so no context is made.
    monkeypatch.delenv("TRITIUM_CUDA_BIND", raising=False)
    model_dir.mkdir()
    (model_dir / "model.py").write_text(MODEL.replace("async def", "def"))
    s = stub.Stub(InitChannel())
    s.initialize(str(model_dir / "model.py"), gpu_args(tmp_path))
    assert s.channel.initialized == [None] and s.cuda_device is None and fake_cuda["bound"] == []


def test_a_kind_cpu_instance_binds_nothing(fake_cuda, model_dir, tmp_path):
    model_dir.mkdir()
    (model_dir / "model.py").write_text(MODEL.replace("async def", "def"))
    s = stub.Stub(InitChannel())
    s.initialize(str(model_dir / "model.py"), gpu_args(tmp_path, kind="CPU"))
    assert s.channel.initialized == [None] and s.cuda_device is None and fake_cuda["bound"] == []


def test_a_bad_device_id_fails_initialize(fake_cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITIUM_CUDA_BIND", "1")
    s = stub.Stub(InitChannel())
    s.initialize(str(tmp_path / "model.py"), gpu_args(tmp_path, device="x"))
    (error,) = s.channel.initialized
    assert "model_instance_device_id must be an integer, got 'x'" in error[0]


# --- With a usable CUDA device (skipped without one). ---


@gpu
def test_cuda_buffers_round_trip_and_check_their_bounds():
    assert _native.cuda_device_count() >= 1 and _native.cuda_device_name(0)
    buf = _native.CudaBuffer(0, 64)
    assert (buf.device, buf.nbytes) == (0, 64) and buf.ptr
    assert _native.cuda_pointer_device(buf.ptr + 63) == 0
    buf.copy_from_host(np.arange(16, dtype=np.float32))
    back = np.zeros(16, dtype=np.float32)
    buf.copy_to_host(back)
    assert back.tolist() == list(range(16))
    part = bytearray(8)
    buf.copy_to_host(memoryview(part), offset=8)
    assert np.frombuffer(part, np.float32).tolist() == [2.0, 3.0]
    assert "outside the 64 bytes" in error_of(lambda: buf.copy_from_host(b"x" * 8, offset=60), _native.CudaError)
    _native.cuda_copy_from_host(0, buf.ptr, np.full(4, 7, np.uint8))
    raw = np.zeros(4, np.uint8)
    _native.cuda_copy_to_host(0, buf.ptr, raw)
    assert raw.tolist() == [7, 7, 7, 7]
    host = np.zeros(4, np.uint8)
    assert "not CUDA device memory" in error_of(
        lambda: _native.cuda_copy_to_host(0, host.ctypes.data, raw), _native.CudaError
    )
    assert "does not exist" in error_of(lambda: _native.CudaBuffer(_native.cuda_device_count(), 8), _native.CudaError)
    gone = weakref.ref(buf)
    buf = None
    gc.collect()
    assert gone() is None


@gpu
def test_binding_and_copies_leave_the_threads_context_alone():
    def run():
        assert _native.cuda_current_device() is None, "a new thread has no context"
        _native.CudaBuffer(0, 8).copy_from_host(b"12345678")
        assert _native.cuda_current_device() is None, "copies put back what was current"
        _native.cuda_bind(0)
        assert _native.cuda_current_device() == 0

    errors = []
    thread = threading.Thread(target=lambda: _catch(run, errors))
    thread.start()
    thread.join()
    assert errors == []


def _catch(run, errors):
    try:
        run()
    except BaseException as e:  # noqa: BLE001 - reported by the test
        errors.append(e)


@gpu
def test_a_gpu_tensor_over_a_cuda_buffer():
    buf = _native.CudaBuffer(0, 24)
    buf.copy_from_host(np.arange(6, dtype=np.float32))
    t = Tensor.from_dlpack("G", buf.memory().to_dlpack(2, 32, [2, 3]))
    assert not t.is_cpu() and t.shape() == [2, 3] and t.__dlpack_device__() == (dlpack.KDL_CUDA, 0)
    assert error_of(t.as_numpy) == "Tensor is stored in GPU and cannot be converted to NumPy."
    memory = t._wire_payload()[2]
    assert memory.ptr == buf.ptr
    out = np.zeros(6, dtype=np.float32)
    memory.copy_to_host(out)
    assert out.tolist() == [0, 1, 2, 3, 4, 5]
    u = Tensor.from_dlpack("U", t)
    assert u._wire_payload()[2].ptr == buf.ptr
    resp = bls._response(Response([Output("OUT", np.arange(4, dtype=np.float32))]), bls.PreferredMemory(0, 0))
    (g,) = resp.output_tensors()
    assert not g.is_cpu()
    back = np.zeros(4, np.float32)
    g._wire_payload()[2].copy_to_host(back)
    assert back.tolist() == [0, 1, 2, 3]


@gpu
def test_torch_cuda_tensors_alias_both_ways():
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    x = torch.arange(6, dtype=torch.float32, device="cuda:0").reshape(2, 3) * 2
    t = Tensor.from_dlpack("T", x)
    assert not t.is_cpu() and t.shape() == [2, 3]
    assert t._wire_payload()[2].ptr == x.data_ptr()
    y = torch.from_dlpack(t)
    assert y.data_ptr() == x.data_ptr() and y.device == x.device
    y[0, 0] = 42
    assert float(x[0, 0]) == 42.0
    assert not Tensor.from_dlpack("C", torch.utils.dlpack.to_dlpack(x)).is_cpu()
    bf = Tensor.from_dlpack("B", x.to(torch.bfloat16))
    assert torch.from_dlpack(bf).dtype == torch.bfloat16
    with pytest.raises(TritonModelException, match="not contiguous"):
        Tensor.from_dlpack("N", x.t())


@gpu
def test_cupy_arrays_alias_both_ways():
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    x = cupy.arange(4, dtype=cupy.int32)
    t = Tensor.from_dlpack("T", x)
    assert not t.is_cpu() and t._wire_payload()[2].ptr == x.data.ptr
    y = cupy.from_dlpack(t)
    assert y.data.ptr == x.data.ptr
