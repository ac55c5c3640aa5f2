"""auto_complete_config as Triton's python_backend example uses it: inputs and outputs added,
max_batch_size and dynamic batching set; the completed config is what /config shows."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [
            {"name": "IN", "data_type": "TYPE_FP32", "dims": [4]},
            {"name": "FLAG", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
        ]
        outputs = [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        have_inputs = {i["name"] for i in config["input"]}
        have_outputs = {o["name"] for o in config["output"]}
        for i in inputs:
            if i["name"] not in have_inputs:
                auto_complete_model_config.add_input(i)
        for o in outputs:
            if o["name"] not in have_outputs:
                auto_complete_model_config.add_output(o)
        auto_complete_model_config.set_max_batch_size(8)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2)]
            )
            for r in requests
        ]
