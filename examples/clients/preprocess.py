"""Sends a generated PPM image to the preprocess example: python examples/clients/preprocess.py."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
height, width = 120, 160
pixels = np.zeros((height, width, 3), dtype=np.uint8)
pixels[..., 0] = np.linspace(0, 255, width, dtype=np.uint8)
ppm = b"P6\n%d %d\n255\n" % (width, height) + pixels.tobytes()
images = np.array([[ppm], [ppm]], dtype=np.object_)
inp = tc.InferInput("IMAGE", [2, 1], "BYTES")
inp.set_data_from_numpy(images)
result = client.infer("preprocess", [inp])
tensor = result.as_numpy("TENSOR")
print("TENSOR shape", tensor.shape, "dtype", tensor.dtype, "channel means", tensor.mean(axis=(0, 2, 3)))
assert tensor.shape == (2, 3, 224, 224)
