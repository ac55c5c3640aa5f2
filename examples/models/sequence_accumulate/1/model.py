"""The running sum of INPUT per sequence. The state lives in the model, keyed by the request's
correlation id; the START control resets it and the END control drops it. With the direct
strategy a batch's slot without a request of its own carries a null request (READY is 0),
which is answered with 0 and never reaches a client."""

import numpy as np
import triton_python_backend_utils as pb_utils


def flag(request, name):
    return bool(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            total = 0
            if flag(request, "READY"):
                key = request.correlation_id()
                if flag(request, "START"):
                    self.sums[key] = 0
                value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
                total = self.sums.get(key, 0) + value
                self.sums[key] = total
                if flag(request, "END"):
                    del self.sums[key]
            responses.append(
                # INT32 arithmetic, as a model in another framework would do it: the sum wraps
                # around instead of failing (numpy refuses a Python int out of INT32's range).
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int64).astype(np.int32))]
                )
            )
        return responses
