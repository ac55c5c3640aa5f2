"""Runs two interleaved sequences on the stateful example, one with an integer correlation id and
one with a string id, and prints each running sum."""

import numpy as np
from _common import client_and_module

args, client, tc = client_and_module(__doc__)

sequences = {1001: [1, 2, 3, 4], "session-b": [10, 20, 30, 40]}
sums = {key: 0 for key in sequences}
for step in range(4):
    for key, values in sequences.items():
        inp = tc.InferInput("INPUT", [1, 1], "INT32")
        inp.set_data_from_numpy(np.array([[values[step]]], dtype=np.int32))
        result = client.infer(
            "sequence_accumulate",
            [inp],
            sequence_id=key,
            sequence_start=step == 0,
            sequence_end=step == len(values) - 1,
        )
        total = int(result.as_numpy("OUTPUT")[0, 0])
        sums[key] += values[step]
        print(f"sequence {key!r}: + {values[step]} -> {total}")
        assert total == sums[key], (key, total, sums[key])
