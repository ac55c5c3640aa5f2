import numpy as np
import triton_python_backend_utils as pb_utils
from tritium import _native


def current_device():
    device = _native.cuda_current_device()
    return -1 if device is None else device


class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]
        self.device = int(args["model_instance_device_id"])
        self.bound_at_initialize = current_device()

    def execute(self, requests):
        bound = np.array([self.bound_at_initialize, current_device()], dtype=np.int32)
        outputs = [
            pb_utils.Tensor("KIND", np.array([self.kind], dtype=np.object_)),
            pb_utils.Tensor("DEVICE", np.array([self.device], dtype=np.int32)),
            pb_utils.Tensor("BOUND", bound),
        ]
        return [pb_utils.InferenceResponse(outputs) for _ in requests]
