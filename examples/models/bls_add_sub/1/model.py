"""BLS: runs add_sub on this model's inputs with `InferenceRequest.exec` and answers with its outputs."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            bls_request = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                requested_output_names=["OUTPUT0", "OUTPUT1"],
            )
            bls_response = bls_request.exec()
            if bls_response.has_error():
                # As in Triton, a failed call is a response carrying the error, not an exception.
                responses.append(pb_utils.InferenceResponse(error=bls_response.error()))
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor(
                            "OUTPUT0", pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT0").as_numpy()
                        ),
                        pb_utils.Tensor(
                            "OUTPUT1", pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT1").as_numpy()
                        ),
                    ]
                )
            )
        return responses
