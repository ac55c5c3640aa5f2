"""DLPack on CPU tensors: pb_utils.Tensor.to_dlpack / from_dlpack / __dlpack__ with numpy as the
other side, memory shared both ways, BF16 round trips, and Triton's error texts."""

import ctypes
import gc
import weakref

import numpy as np
import pytest
from tritium import dlpack
from tritium.errors import TritonModelException
from tritium.tensor import Tensor


def error_of(call):
    with pytest.raises(TritonModelException) as e:
        call()
    return str(e.value)


@pytest.mark.parametrize(
    "dtype",
    [np.bool_, np.uint8, np.uint16, np.uint32, np.uint64, np.int8, np.int16, np.int32, np.int64]
    + [np.float16, np.float32, np.float64],
)
def test_every_numeric_dtype_round_trips_sharing_memory(dtype):
    a = np.arange(12).reshape(3, 4).astype(dtype)
    t = Tensor.from_dlpack("T", a)
    assert t.name() == "T" and t.shape() == [3, 4]
    assert np.shares_memory(t.as_numpy(), a)
    assert t.triton_dtype() == Tensor("X", a).triton_dtype()
    back = np.from_dlpack(t)  # the __dlpack__ protocol
    assert np.shares_memory(back, a) and back.dtype == a.dtype
    again = Tensor.from_dlpack("U", t.to_dlpack())  # a raw capsule
    assert np.shares_memory(again.as_numpy(), a)


def test_writes_through_either_side_are_seen_by_the_other():
    a = np.zeros(4, dtype=np.float32)
    t = Tensor.from_dlpack("T", a)
    t.as_numpy()[1] = 5.0
    assert a[1] == 5.0
    view = np.from_dlpack(Tensor("V", a))
    a[2] = 7.0
    assert view[2] == 7.0


def test_the_memory_outlives_the_tensor_that_exported_it():
    capsule = Tensor("T", np.arange(1000, dtype=np.int64)).to_dlpack()
    t = Tensor.from_dlpack("U", capsule)
    assert t.as_numpy()[999] == 999


def _dl_dtype(capsule):
    return dlpack._dl_tensor(capsule).dtype


def test_bf16_round_trips_as_bf16():
    words = np.array([0x3F80, 0x4000, 0xC040], dtype=np.uint16)  # 1.0, 2.0, -3.0 in bfloat16
    t = Tensor("B", None, "BF16", words)
    capsule = t.to_dlpack()
    assert (_dl_dtype(capsule).code, _dl_dtype(capsule).bits) == (4, 16)
    back = Tensor.from_dlpack("C", capsule)
    assert back.triton_dtype() == 14 and back.shape() == [3]
    assert "Use to_dlpack() and from_dlpack() instead" in error_of(back.as_numpy)
    assert back._wire_payload()[0] == "BF16"
    assert np.shares_memory(back._raw, words)


def test_a_read_only_tensor_is_exported_as_a_copy():
    a = np.arange(4, dtype=np.int32)
    a.flags.writeable = False
    out = np.from_dlpack(Tensor("R", a))
    assert out.tolist() == [0, 1, 2, 3] and not np.shares_memory(out, a)


def test_non_contiguous_tensors_are_refused_and_size_one_dims_are_not():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert error_of(lambda: Tensor.from_dlpack("T", a[:, ::2])).startswith("DLPack tensor is not contiguous.")
    # A size-1 dimension's stride does not matter (Triton's rule).
    odd = np.lib.stride_tricks.as_strided(np.arange(3, dtype=np.float32), shape=(3, 1), strides=(4, 1000))
    assert Tensor.from_dlpack("T", odd).as_numpy().ravel().tolist() == [0.0, 1.0, 2.0]


def test_tritons_errors():
    assert error_of(lambda: Tensor("S", np.array([b"a"], dtype=np.object_)).to_dlpack()) == (
        "DLPack does not have support for string tensors."
    )
    assert error_of(lambda: Tensor.from_dlpack("T", [1, 2])).startswith("Provided tensor is not supported.")
    assert error_of(lambda: Tensor.from_dlpack("", np.zeros(1))) == "Tensor name cannot be an empty string."

    class OnGpu:
        def __dlpack__(self, stream=None):
            raise AssertionError("never asked for")

        def __dlpack_device__(self):
            return (2, 0)

    assert "allocated on GPU device, when GPU is not available" in error_of(lambda: Tensor.from_dlpack("T", OnGpu()))

    class OnVulkan(OnGpu):
        def __dlpack_device__(self):
            return (7, 0)

    assert error_of(lambda: Tensor.from_dlpack("T", OnVulkan())) == "DLDevice type 7 is not support by Python backend."


def test_a_capsule_can_be_consumed_once():
    capsule = Tensor("T", np.zeros(2)).to_dlpack()
    Tensor.from_dlpack("A", capsule)
    assert "consumed already" in error_of(lambda: Tensor.from_dlpack("B", capsule))


def test_pinned_host_memory_counts_as_cpu():
    capsule = Tensor("T", np.arange(3, dtype=np.int16)).to_dlpack()
    dlpack._dl_tensor(capsule).device.device_type = dlpack.KDL_CUDA_HOST
    assert Tensor.from_dlpack("P", capsule).as_numpy().tolist() == [0, 1, 2]
    assert Tensor("T", np.zeros(1)).__dlpack_device__() == (1, 0)
    assert Tensor("T", np.zeros(1)).is_cpu()
    assert ctypes.sizeof(dlpack._DLTensor) == 48  # the DLPack ABI's DLTensor on 64-bit


def test_the_producer_is_released_when_the_last_array_over_it_dies():
    a = np.arange(8, dtype=np.float64)
    gone = weakref.ref(a)
    t = Tensor.from_dlpack("T", a)
    view = t.as_numpy()[2:4]
    del a, t
    gc.collect()
    assert gone() is not None, "the view still holds the producer's memory"
    assert view.tolist() == [2.0, 3.0]
    del view
    gc.collect()
    assert gone() is None, "the capsule's deleter ran"
