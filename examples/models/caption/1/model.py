"""Describes an image in words, following a text prompt."""

import numpy as np
import triton_python_backend_utils as pb_utils

COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255), "black": (0, 0, 0)}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            image = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            prompt = pb_utils.get_input_tensor_by_name(request, "PROMPT").as_numpy()[0].decode("utf-8")
            mean = image.reshape(-1, 3).mean(axis=0).astype(np.float32)
            color = min(COLORS, key=lambda c: np.square(mean - np.array(COLORS[c])).sum())
            caption = f"{prompt} a {image.shape[1]}x{image.shape[0]} image, mostly {color}"
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("CAPTION", np.array([caption.encode("utf-8")], dtype=np.object_)),
                        pb_utils.Tensor("MEAN_COLOR", mean),
                    ]
                )
            )
        return responses
