"""Calls the multi-input/multi-output caption example with an image and a text prompt."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
image = np.zeros((48, 64, 3), dtype=np.uint8)
image[..., 2] = 230
prompt = np.array(["Voilà:".encode()], dtype=np.object_)
inputs = [tc.InferInput("IMAGE", list(image.shape), "UINT8"), tc.InferInput("PROMPT", [1], "BYTES")]
inputs[0].set_data_from_numpy(image)
inputs[1].set_data_from_numpy(prompt)
result = client.infer("caption", inputs)
caption = result.as_numpy("CAPTION")[0].decode("utf-8")
print("CAPTION:", caption)
print("MEAN_COLOR:", result.as_numpy("MEAN_COLOR"))
assert caption == "Voilà: a 64x48 image, mostly blue", caption
