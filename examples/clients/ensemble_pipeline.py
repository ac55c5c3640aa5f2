"""Calls the ensemble_pipeline example (add_sub run twice by the server):
python examples/clients/ensemble_pipeline.py [--protocol grpc]."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.array([10, 20, 30, 40], dtype=np.float32)
inputs = [tc.InferInput("A", [4], "FP32"), tc.InferInput("B", [4], "FP32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
outputs = [tc.InferRequestedOutput("TWICE_A"), tc.InferRequestedOutput("TWICE_B")]
result = client.infer("ensemble_pipeline", inputs, outputs=outputs)
twice_a, twice_b = result.as_numpy("TWICE_A"), result.as_numpy("TWICE_B")
print("(A + B) + (A - B) =", twice_a)
print("(A + B) - (A - B) =", twice_b)
assert np.array_equal(twice_a, 2 * a) and np.array_equal(twice_b, 2 * b)
