import numpy as np
import triton_python_backend_utils as pb_utils


def add_one(tensor, preferred_memory=None):
    response = pb_utils.InferenceRequest(
        model_name="add_sub",
        inputs=[tensor, pb_utils.Tensor("INPUT1", np.ones(4, dtype=np.float32))],
        requested_output_names=["OUTPUT0"],
        preferred_memory=preferred_memory,
    ).exec()
    if response.has_error():
        raise pb_utils.TritonModelException(response.error().message())
    return pb_utils.get_output_tensor_by_name(response, "OUTPUT0")


class TritonPythonModel:
    def execute(self, requests):
        gpu = pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_GPU, 0)
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            out = add_one(pb_utils.Tensor("INPUT0", a), gpu)
            # The output (GPU or CPU) as the next call's input, renamed through DLPack.
            roundtrip = add_one(pb_utils.Tensor.from_dlpack("INPUT0", out))
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        out,
                        pb_utils.Tensor("IS_CPU", np.array([out.is_cpu()])),
                        pb_utils.Tensor("ROUNDTRIP", roundtrip.as_numpy()),
                    ]
                )
            )
        return responses
