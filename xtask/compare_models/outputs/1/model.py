"""Outputs as clients see them; MODE picks: 0 every dtype (strings from str objects, numpy
unicode and bytes arrays; a transposed, non-contiguous FP64), 1-8 an error response with each
TritonError code, 9 response parameters, 10 FP32 missing from the response, 11 FP32 sent as
int32, 12 an output the config does not name, 13 an empty FP32, 14 a zero-dimensional FP32,
15 strings from a numpy unicode array (Triton 2.51 refuses those: "NumPy dtype is not supported")."""

import numpy as np
import triton_python_backend_utils as pb_utils

CODES = ["UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED"]


def every_dtype():
    return [
        pb_utils.Tensor("BOOL", np.array([True, False, True])),
        pb_utils.Tensor("FP16", np.array([0.5, -1.25, 65504], dtype=np.float16)),
        pb_utils.Tensor("INT8", np.array([-128, 0, 127], dtype=np.int8)),
        pb_utils.Tensor("UINT64", np.array([0, 2**64 - 1], dtype=np.uint64)),
        pb_utils.Tensor("FP64", np.arange(6, dtype=np.float64).reshape(2, 3).T),
        pb_utils.Tensor("STR_OBJECT", np.array(["héllo", "", "x"], dtype=np.object_)),
        pb_utils.Tensor("STR_BYTES", np.array([b"\x00\xff", b"z"])),
        pb_utils.Tensor("FP32", np.array([1.5], dtype=np.float32)),
    ]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            fp32 = pb_utils.Tensor("FP32", np.array([1.5], dtype=np.float32))
            if mode == 0:
                response = pb_utils.InferenceResponse(every_dtype())
            elif 1 <= mode <= 8:
                code = getattr(pb_utils.TritonError, CODES[mode - 1])
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"code {CODES[mode - 1]}", code))
            elif mode == 9:
                response = pb_utils.InferenceResponse([fp32], parameters={"p": "x", "n": 3, "b": True})
            elif mode == 10:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("INT8", np.zeros(1, np.int8))])
            elif mode == 11:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("FP32", np.array([7], dtype=np.int32))])
            elif mode == 12:
                response = pb_utils.InferenceResponse([fp32, pb_utils.Tensor("EXTRA", np.zeros(2, np.int8))])
            elif mode == 13:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("FP32", np.zeros(0, np.float32))])
            elif mode == 14:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("FP32", np.array(2.5, dtype=np.float32))])
            else:
                response = pb_utils.InferenceResponse([pb_utils.Tensor("STR_UNICODE", np.array(["ab", "c"]))])
            responses.append(response)
        return responses
