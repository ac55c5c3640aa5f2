"""MODE 0 raises, 1 returns too few responses, 2 a non-response, 3 a non-list, 4 an error response."""

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
        error = pb_utils.TritonError("bad argument", pb_utils.TritonError.INVALID_ARG)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
