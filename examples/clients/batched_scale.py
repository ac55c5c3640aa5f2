"""Sends concurrent requests to the dynamically batched example and shows the batches formed."""

import numpy as np

from _common import client_and_module

args, client, tc = client_and_module(__doc__)
if args.protocol == "http":
    import tritonclient.http as http

    client = http.InferenceServerClient(url=args.url or "127.0.0.1:8000", concurrency=8)


def request(i):
    inp = tc.InferInput("INPUT", [1, 3], "FP32")
    inp.set_data_from_numpy(np.full((1, 3), i, dtype=np.float32))
    return inp


if args.protocol == "http":
    pending = [client.async_infer("batched_scale", [request(i)]) for i in range(16)]
    results = [p.get_result() for p in pending]
else:
    import queue

    done = queue.Queue()
    for i in range(16):
        client.async_infer("batched_scale", [request(i)], callback=lambda result, error: done.put((result, error)))
    results = []
    for _ in range(16):
        result, error = done.get(timeout=30)
        if error:
            raise error
        results.append(result)
sizes = sorted(int(r.as_numpy("BATCH")[0, 0]) for r in results)
print("requests per execute() call, as each request saw it:", sizes)
for r in results:
    out = r.as_numpy("OUTPUT")
    assert out.shape == (1, 3) and out[0, 0] == out[0, 1] == out[0, 2]
