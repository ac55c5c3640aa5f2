"""DLPack for pb_utils.Tensor: `to_dlpack()`, `Tensor.from_dlpack()`, `__dlpack__` and
`__dlpack_device__`, so numpy, torch, cupy and any other DLPack consumer share a tensor's memory.

A DLPack capsule is read here with ctypes (the struct layout is the DLPack ABI, stable since
v0.2): its device, dtype and strides are checked with Triton's texts, then a writable numpy array
is made over its memory that owns the capsule's deleter (numpy's own `from_dlpack` makes arrays
from such capsules read-only), so the producer's memory lives exactly as long as the array over
it. BF16 has no numpy dtype: the tensor keeps its raw 16-bit words (wire dtype BF16) and is
labelled BF16 again when exported, so a `torch.bfloat16` tensor round-trips unchanged.

GPU tensors (`kDLCUDA`): where CUDA is usable in the stub (`tritium._native.cuda_unavailable_reason()`
is None), a capsule is consumed the same way, but its memory stays on the device: `import_tensor`
returns a `GpuData` (a native `CudaMemory` that owns the capsule's deleter, and the shape), and a
GPU tensor is exported again as a `kDLCUDA` capsule over the same memory (`CudaMemory.to_dlpack`).
Where CUDA is not usable, they are refused with Triton's text for a stub without GPU support.
"""

import ctypes

import numpy as np

from .dtypes import WIRE_DTYPES
from .errors import TritonModelException

__all__ = ["export_capsule", "export_gpu_capsule", "import_tensor", "GpuData", "KDL_CPU", "KDL_CUDA"]

# DLDeviceType and DLDataTypeCode values of the DLPack ABI.
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6

# (code, bits) -> KServe wire dtype, from the one dtype table: numpy's kind gives the code, and
# BF16 (no numpy dtype) is added by hand.
_NUMPY_KIND_TO_DL = {"b": _BOOL, "u": _UINT, "i": _INT, "f": _FLOAT}
_DL_TO_WIRE = {
    (_NUMPY_KIND_TO_DL[w.numpy_dtype.kind], 8 * w.itemsize): name
    for name, w in WIRE_DTYPES.items()
    if w.numpy_dtype is not None and w.numpy_dtype.kind in _NUMPY_KIND_TO_DL
}
_DL_TO_WIRE[(_BFLOAT, 16)] = "BF16"


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _ManagedTensor(ctypes.Structure):
    # The legacy (unversioned) DLManagedTensor: what `__dlpack__(stream=None)` returns.
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_LEGACY = b"dltensor"
# A capsule's name is not copied: these constants live as long as the module.
_USED = b"used_dltensor"
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_set_name = ctypes.pythonapi.PyCapsule_SetName
_capsule_set_name.restype = ctypes.c_int
_capsule_set_name.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _is_capsule(obj):
    return type(obj).__name__ == "PyCapsule"


def _dl_tensor(capsule):
    """The DLTensor inside an unconsumed legacy capsule (a ctypes view: writes change the capsule)."""
    if not _capsule_is_valid(capsule, _LEGACY):
        raise TritonModelException(
            "Provided DLPack capsule is not a 'dltensor' capsule: it was consumed already, or it is a "
            "versioned capsule (ask the producer for `__dlpack__(stream=None)`)."
        )
    return _ManagedTensor.from_address(_capsule_pointer(capsule, _LEGACY)).dl_tensor


def cuda_unavailable_reason():
    """Why CUDA cannot be used in this process, or None when it can (asked once: the answer
    never changes)."""
    global _cuda_reason
    if _cuda_reason is _UNKNOWN:
        from . import _native

        _cuda_reason = _native.cuda_unavailable_reason()
    return _cuda_reason


_UNKNOWN = object()
_cuda_reason = _UNKNOWN


def _check_device(device_type):
    if device_type == KDL_CUDA:
        if cuda_unavailable_reason() is not None:
            raise TritonModelException(
                "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"
            )
        return
    if device_type not in (KDL_CPU, KDL_CUDA_HOST):
        raise TritonModelException(f"DLDevice type {device_type} is not support by Python backend.")


def _check_c_order(t):
    """Triton's rule: strides (if given) must be those of a C-contiguous tensor, ignoring size-1 dims."""
    if not t.strides:
        return
    expected = 1
    for i in reversed(range(t.ndim)):
        dim = t.shape[i]
        if dim != 1:
            if t.strides[i] != expected:
                raise TritonModelException(
                    "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order "
                    "are supported."
                )
            expected *= dim


class _Owner:
    """Owns a consumed capsule's DLManagedTensor: calls its deleter when the last array over its
    memory is gone (the capsule was renamed `used_dltensor`, so it no longer does)."""

    __slots__ = ("_managed", "_deleter")
    # Kept on the class: at interpreter exit the module's globals may be gone before the last owner.
    _call = _DELETER

    def __init__(self, managed, deleter):
        self._managed = managed
        self._deleter = deleter

    def release(self):
        managed, deleter = self._managed, self._deleter
        self._managed = self._deleter = None
        if deleter:
            self._call(deleter)(managed)

    def __del__(self):
        self.release()


def _array_over(capsule, t, dtype):
    """A writable numpy array over the capsule's memory, which it now owns (Triton's
    `FromDLPackCapsule`: the capsule is marked used, the deleter runs when the array dies)."""
    managed = _capsule_pointer(capsule, _LEGACY)
    owner = _Owner(managed, _ManagedTensor.from_address(managed).deleter)
    _capsule_set_name(capsule, _USED)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    count = 1
    for dim in shape:
        count *= dim
    nbytes = count * dtype.itemsize
    if nbytes == 0:
        owner.release()
        return np.empty(shape, dtype)
    buffer = (ctypes.c_char * nbytes).from_address(t.data + t.byte_offset)
    buffer.owner = owner  # the array's base chain ends here: the memory lives while it does
    return np.frombuffer(buffer, dtype=np.uint8).view(dtype).reshape(shape)


class GpuData:
    """A GPU tensor's bytes: `memory`, a native `CudaMemory` (device, ptr, nbytes, and the object
    that keeps the memory alive), and `shape`, a tuple of ints."""

    __slots__ = ("memory", "shape")

    def __init__(self, memory, shape):
        self.memory = memory
        self.shape = tuple(shape)

    @property
    def device(self):
        """The CUDA device id."""
        return self.memory.device


def _synchronize(device):
    """Waits for the producer's pending work on `device` (Triton synchronizes its proxy stream)."""
    from . import _native

    try:
        _native.cuda_synchronize(int(device))
    except _native.CudaError as e:
        raise TritonModelException(f"Failed to synchronize CUDA device with id {device}: {e}") from None


def _gpu_over(capsule, t, itemsize):
    """The GpuData over a kDLCUDA capsule's memory, which it now owns (as `_array_over` does)."""
    from . import _native

    shape = tuple(t.shape[i] for i in range(t.ndim))
    count = 1
    for dim in shape:
        count *= dim
    nbytes = count * itemsize
    ptr = (t.data or 0) + t.byte_offset
    device = t.device.device_id
    if nbytes:
        # A pointer the driver does not know is refused now, not when its bytes are copied.
        try:
            _native.cuda_pointer_device(ptr)
        except _native.CudaError as e:
            raise TritonModelException(
                f"DLPack capsule passed pointer 0x{ptr:x} that is not CUDA device memory ({e})"
            ) from None
    managed = _capsule_pointer(capsule, _LEGACY)
    owner = _Owner(managed, _ManagedTensor.from_address(managed).deleter)
    _capsule_set_name(capsule, _USED)
    try:
        memory = _native.CudaMemory(device, ptr, nbytes, owner)
    except ValueError as e:
        raise TritonModelException(str(e)) from None
    return GpuData(memory, shape)


def import_tensor(obj):
    """(wire dtype, data) over the memory of `obj`: a DLPack capsule or an object with
    `__dlpack__` and `__dlpack_device__`. For a CPU producer `data` is a numpy array that shares
    its memory and is writable (BF16: its raw uint16 words); for a CUDA producer (when CUDA is
    usable) it is a GpuData over the device memory, after the producer's pending work."""
    sync_device = None
    if _is_capsule(obj):
        capsule = obj
    else:
        if not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")):
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have `__dlpack__` and "
                "`__dlpack_device__` attributes"
            )
        device = obj.__dlpack_device__()
        _check_device(int(device[0]))
        # For a CUDA producer stream=None means no stream ordering is asked for: the device is
        # synchronized below, which waits for every stream's work on it.
        capsule = obj.__dlpack__(stream=None)
        if int(device[0]) == KDL_CUDA:
            sync_device = int(device[1])
    t = _dl_tensor(capsule)
    _check_device(t.device.device_type)
    if t.dtype.lanes != 1:
        raise TritonModelException(f"DLPack tensors with {t.dtype.lanes} lanes are not supported.")
    wire = _DL_TO_WIRE.get((t.dtype.code, t.dtype.bits))
    if wire is None:
        raise TritonModelException(
            f"DLPack data type (code {t.dtype.code}, {t.dtype.bits} bits) has no Triton data type."
        )
    _check_c_order(t)
    dtype = np.dtype(np.uint16) if wire == "BF16" else WIRE_DTYPES[wire].numpy_dtype
    if t.device.device_type == KDL_CUDA:
        gpu = _gpu_over(capsule, t, dtype.itemsize)
        if sync_device is not None:
            _synchronize(sync_device)
        return wire, gpu
    return wire, _array_over(capsule, t, dtype)


def export_capsule(wire, array):
    """A legacy DLPack capsule over `array`'s memory, labelled with `wire`'s dtype. A read-only
    array (a client's shared memory region, a BLS output over the server's memory) is exported
    as a copy: a legacy capsule cannot say read-only, and the consumer could write through it."""
    if wire == "BYTES":
        raise TritonModelException("DLPack does not have support for string tensors.")
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if not array.flags.writeable:
        array = array.copy()
    capsule = array.__dlpack__(stream=None)
    if wire == "BF16":
        _dl_tensor(capsule).dtype.code = _BFLOAT
    return capsule


def export_gpu_capsule(wire, gpu):
    """A legacy `kDLCUDA` DLPack capsule over a GPU tensor's memory (`gpu`, a GpuData), labelled
    with `wire`'s dtype; the consumer keeps the memory alive until it deletes the capsule."""
    code, bits = _WIRE_TO_DL[wire]
    return gpu.memory.to_dlpack(code, bits, list(gpu.shape))


_WIRE_TO_DL = {wire: key for key, wire in _DL_TO_WIRE.items()}
