"""Calls the image_pipeline example (Python pre-processing, an ONNX classifier, Python
post-processing, joined by an ensemble) with four 32x32 images, each lit on one side:
python examples/clients/image_pipeline.py [--protocol grpc]."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
expected = ["left", "right", "top", "bottom"]
images = np.full((4, 32, 32), 20, dtype=np.uint8)
images[0, :, :16] = images[1, :, 16:] = images[2, :16, :] = images[3, 16:, :] = 230
image = tc.InferInput("IMAGE", list(images.shape), "UINT8")
image.set_data_from_numpy(images)
result = client.infer("image_pipeline", [image])
labels = [label[0].decode() for label in result.as_numpy("LABEL")]
scores = result.as_numpy("SCORE")[:, 0]
for want, label, score in zip(expected, labels, scores):
    print(f"lit {want:6} -> {label:6} ({score:.2f})")
assert labels == expected, labels
