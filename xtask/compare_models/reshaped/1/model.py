"""Reports the shapes its inputs arrive in; Y = X * 2 in X's shape."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            s = pb_utils.get_input_tensor_by_name(request, "S").as_numpy()
            shapes = json.dumps([list(x.shape), list(s.shape)])
            out = np.array([[shapes]] * x.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("SHAPES", out), pb_utils.Tensor("Y", x * 2)]))
        return responses
