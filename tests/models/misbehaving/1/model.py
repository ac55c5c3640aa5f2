"""An `execute` that fails in the ways model code does; MODE picks which: 0 raises, 1 returns too
few responses, 2 a non-response, 3 a non-list, 4 calls pb_utils wrongly, 5 returns an error
response."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        if mode == 0:
            raise ValueError("exploded")
        if mode == 1:
            return []
        if mode == 2:
            return ["not a response"]
        if mode == 3:
            return "not a list"
        if mode == 4:
            # A pb_utils call that raises: its frames inside pb_utils are not the model's.
            return [pb_utils.InferenceResponse([pb_utils.Tensor("", np.zeros(1, np.int32))])]
        error = pb_utils.TritonError("bad argument", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
