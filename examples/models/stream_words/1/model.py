"""Streams the words of the input TEXT, one response each (a decoupled model).

Each request gets its own response sender: one response per word (WORD and its INDEX), then
the final flag alone. An empty text gets only the final flag.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            if isinstance(text, bytes):
                text = text.decode("utf-8")
            for i, word in enumerate(str(text).split()):
                if sender.is_cancelled():
                    break
                sender.send(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("WORD", np.array([word.encode("utf-8")], dtype=np.object_)),
                            pb_utils.Tensor("INDEX", np.array([i], dtype=np.int32)),
                        ]
                    )
                )
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        # A decoupled model's execute returns None: every response went through the senders.
        return None
