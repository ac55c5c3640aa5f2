"""Calls the bls_add_sub example, which runs add_sub through BLS: python examples/clients/bls_add_sub.py [--protocol grpc]."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
a = np.array([1, 2, 3, 4], dtype=np.float32)
b = np.array([10, 20, 30, 40], dtype=np.float32)
inputs = [tc.InferInput("INPUT0", [4], "FP32"), tc.InferInput("INPUT1", [4], "FP32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
outputs = [tc.InferRequestedOutput("OUTPUT0"), tc.InferRequestedOutput("OUTPUT1")]
result = client.infer("bls_add_sub", inputs, outputs=outputs)
s, d = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
print("add_sub through BLS: INPUT0 + INPUT1 =", s)
print("add_sub through BLS: INPUT0 - INPUT1 =", d)
assert np.array_equal(s, a + b) and np.array_equal(d, a - b)
