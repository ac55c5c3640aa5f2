"""A model without config.pbtxt: auto_complete_config supplies everything."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [3]})
        config.add_output({"name": "SUM", "data_type": "TYPE_INT32", "dims": [1]})
        config.set_max_batch_size(0)
        return config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("SUM", np.array([r.inputs()[0].as_numpy().sum()], dtype=np.int32))]
            )
            for r in requests
        ]
