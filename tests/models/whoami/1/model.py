import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        responses = []
        for request in requests:
            time.sleep(int(pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]) / 1000.0)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                        pb_utils.Tensor("INSTANCE", np.array([self.name.encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
