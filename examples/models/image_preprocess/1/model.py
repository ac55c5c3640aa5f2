"""Pre-processing for image_pipeline: each image becomes its 8x8 thumbnail (block means) scaled to [0, 1]."""

import numpy as np
import triton_python_backend_utils as pb_utils


def thumbnail(image):
    """The 8x8 block means of a [H, W] image (H and W at least 8; the edges past a multiple of 8 are dropped)."""
    h, w = (image.shape[0] // 8) * 8, (image.shape[1] // 8) * 8
    if h == 0 or w == 0:
        raise pb_utils.TritonModelException(f"an image must be at least 8x8 pixels, got {list(image.shape)}")
    blocks = image[:h, :w].reshape(8, h // 8, 8, w // 8).astype(np.float32)
    return blocks.mean(axis=(1, 3)) / 255.0


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            pixels = np.stack([thumbnail(image).reshape(64) for image in images])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", pixels)]))
        return responses
