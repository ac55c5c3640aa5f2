"""Response senders as clients see them; MODE picks: 0 two responses then the final flag alone,
1 a response sent with the final flag, 2 the final flag only, 3 an error response then the final
flag, 4 a send after the final flag (the model sees the error), 5 execute returns responses
(not allowed for a decoupled model), 6 execute raises after one response, 7 a response with an
output the config does not name, 8 the final flag with an error response, 9 an empty response with the final flag, 10 an empty
response, then the final flag alone."""

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def out(*values):
    return pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array(values, dtype=np.int32))])


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                sender.send(out(1))
                sender.send(out(2, 3))
                sender.send(flags=FINAL)
            elif mode == 1:
                sender.send(out(4), flags=FINAL)
            elif mode == 2:
                sender.send(flags=FINAL)
            elif mode == 3:
                sender.send(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("bad", pb_utils.TritonError.NOT_FOUND))
                )
                sender.send(flags=FINAL)
            elif mode == 4:
                sender.send(flags=FINAL)
                try:
                    sender.send(out(5))
                    note = 0
                except Exception as e:  # noqa: BLE001 - what the model sees is the answer
                    note = len(str(e))
                    pb_utils.Logger.log_info(f"send after final: {type(e).__name__}: {e}")
                _ = note
            elif mode == 5:
                return [out(6) for _ in requests]
            elif mode == 6:
                sender.send(out(7))
                raise ValueError("after one response")
            elif mode == 7:
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("EXTRA", np.zeros(1, np.int32))]), flags=FINAL)
            elif mode == 8:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("last")), flags=FINAL)
            elif mode == 9:
                sender.send(pb_utils.InferenceResponse([]), flags=FINAL)
            else:
                sender.send(pb_utils.InferenceResponse([]))
                sender.send(flags=FINAL)
        return None
