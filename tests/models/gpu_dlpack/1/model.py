import numpy as np
import triton_python_backend_utils as pb_utils
from tritium import _native, dlpack
from tritium.tensor import gpu_tensor

# Never read: a pointer the driver does not know.
NOT_DEVICE_MEMORY = 0x7F00DEAD0000
FP32 = (2, 32)  # DLPack's kDLFloat, 32 bits


def gpu_capsule(array):
    """A kDLCUDA capsule over a copy of `array` on device 0, in a CudaBuffer of the stub's own."""
    buf = _native.CudaBuffer(0, array.nbytes)
    buf.copy_from_host(array)
    return buf.memory().to_dlpack(*FP32, list(array.shape))


def torch_tensor(array):
    import torch

    return torch.from_numpy(array).to("cuda:0")


class TritonPythonModel:
    def execute(self, requests):
        usable = _native.cuda_unavailable_reason() is None
        responses = []
        for request in requests:
            x = np.ascontiguousarray(2 * pb_utils.get_input_tensor_by_name(request, "IN").as_numpy())
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:
                if usable:
                    capsule = gpu_capsule(x)
                else:
                    capsule = _native.CudaMemory(0, NOT_DEVICE_MEMORY, x.nbytes, None).to_dlpack(*FP32, list(x.shape))
                out = pb_utils.Tensor.from_dlpack("OUT", capsule)
            elif mode == 1:
                memory = _native.CudaMemory(0, NOT_DEVICE_MEMORY, x.nbytes, None)
                out = gpu_tensor("OUT", "FP32", dlpack.GpuData(memory, x.shape))
            else:
                out = pb_utils.Tensor.from_dlpack("OUT", torch_tensor(x))
            where = "cpu" if out.is_cpu() else f"cuda:{out.__dlpack_device__()[1]}"
            responses.append(
                pb_utils.InferenceResponse([out, pb_utils.Tensor("WHERE", np.array([where], dtype=np.object_))])
            )
        return responses
