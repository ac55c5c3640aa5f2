"""Sums INPUT per sequence: the state is keyed by the correlation id and reset by the START
control; each response carries the running sum, the size of the batch the request came in, the
control values the request carried, and the instance that served it. A request whose READY
control is false is a null request (a direct batch's empty slot): it is answered with zeros."""

import numpy as np
import triton_python_backend_utils as pb_utils


def control(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


def text(value):
    return np.array([[str(value).encode()]], dtype=np.object_)


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            start, end, ready = control(request, "START"), control(request, "END"), control(request, "READY")
            corrid = control(request, "CORRID")
            if isinstance(corrid, bytes):
                corrid = corrid.decode()
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            key = request.correlation_id()
            if not ready:
                total = 0
            else:
                if start:
                    self.sums[key] = 0
                total = self.sums.get(key, 0) + value
                self.sums[key] = total
                if end:
                    del self.sums[key]
            outputs = [
                pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                pb_utils.Tensor("CONTROLS", np.array([[start, end, ready]], dtype=np.float32)),
                pb_utils.Tensor("CORRID_SEEN", text(corrid)),
                pb_utils.Tensor("ID_SEEN", text(key)),
                pb_utils.Tensor("INSTANCE", text(self.instance)),
            ]
            responses.append(pb_utils.InferenceResponse(outputs))
        return responses
