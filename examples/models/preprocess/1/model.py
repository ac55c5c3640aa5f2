"""Decodes images and returns normalized CHW float32 tensors, one per batch element."""

import io
import json

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def decode_ppm(data):
    """Decodes a binary PPM (P6, 8-bit) into an HxWx3 uint8 array."""
    fields = []
    pos = 2
    while len(fields) < 3:
        while data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            pos = data.index(b"\n", pos) + 1
            continue
        end = pos
        while not data[end : end + 1].isspace():
            end += 1
        fields.append(int(data[pos:end]))
        pos = end
    width, height, maxval = fields
    if maxval != 255:
        raise ValueError("only 8-bit PPM images are supported")
    pixels = np.frombuffer(data, dtype=np.uint8, count=width * height * 3, offset=pos + 1)
    return pixels.reshape(height, width, 3)


def decode(data):
    if data[:2] == b"P6":
        return decode_ppm(data)
    try:
        from PIL import Image
    except ImportError as e:
        raise ValueError("only PPM (P6) images can be decoded without Pillow; pip install pillow for PNG/JPEG") from e
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.size = int(config["parameters"]["size"]["string_value"])

    def preprocess(self, data):
        img = decode(data)
        rows = np.linspace(0, img.shape[0] - 1, self.size).astype(np.int64)
        cols = np.linspace(0, img.shape[1] - 1, self.size).astype(np.int64)
        resized = img[rows][:, cols].astype(np.float32) / 255.0
        return (resized.transpose(2, 0, 1) - MEAN) / STD

    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            try:
                batch = np.stack([self.preprocess(row[0]) for row in images]).astype(np.float32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TENSOR", batch)]))
            except ValueError as e:
                error = pb_utils.TritonError(f"cannot decode image: {e}", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
