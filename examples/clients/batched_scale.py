"""Sends 16 concurrent requests to the dynamically batched example and shows the batches formed."""

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)
url = args.url or ("127.0.0.1:8000" if args.protocol == "http" else "127.0.0.1:8001")


def infer(i):
    # One client per thread: the HTTP client is not meant to be shared between threads.
    c = tc.InferenceServerClient(url=url)
    inp = tc.InferInput("INPUT", [1, 3], "FP32")
    inp.set_data_from_numpy(np.full((1, 3), i, dtype=np.float32))
    return c.infer("batched_scale", [inp])


with ThreadPoolExecutor(16) as pool:
    results = list(pool.map(infer, range(16)))
sizes = sorted(int(r.as_numpy("BATCH")[0, 0]) for r in results)
print("requests per execute() call, as each request saw it:", sizes)
for i, r in enumerate(results):
    assert np.array_equal(r.as_numpy("OUTPUT"), np.full((1, 3), 2 * i, dtype=np.float32))
