"""OUTPUT = INPUT * 2, with BATCH = the number of requests in this execute() call."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        n = len(requests)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            batch = np.full((x.shape[0], 1), n, dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x * 2), pb_utils.Tensor("BATCH", batch)])
            )
        return responses
