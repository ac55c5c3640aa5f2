"""A TensorRT-LLM-shaped test model that reports the LoRA inputs it gets: it answers
`task=<lora_task_id or none> weights=<lora_weights shape and sum, or none> config=<lora_config
shape, or none>`."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _describe(request, name, summed=False):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return "none"
    a = tensor.as_numpy()
    if name == "lora_task_id":
        return str(int(a.reshape(-1)[0]))
    shape = "x".join(str(d) for d in a.shape)
    return f"{shape}:{float(a.astype(np.float32).sum()):g}" if summed else shape


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = (
                f"task={_describe(r, 'lora_task_id')} weights={_describe(r, 'lora_weights', True)}"
                f" config={_describe(r, 'lora_config')}"
            )
            tensor = pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_))
            out.append(pb_utils.InferenceResponse([tensor]))
        return out
