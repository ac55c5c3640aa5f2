"""The client of `cargo xtask bench stream`: decoupled streams over one gRPC stream, timed.

Sends one request at a time on one tritonclient gRPC stream to a decoupled model that answers
each with N small responses and then the final flag alone, and records when each response
reaches the stream's callback. Prints one JSON object: per measured request, the time to the
first response, the gaps between consecutive responses, and the time to the final flag, in
microseconds.
"""

import argparse
import json
import queue
import time

import numpy as np
import tritonclient.grpc as grpcclient


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", default="bench_stream")
    parser.add_argument("--streams", type=int, default=10)
    parser.add_argument("--responses", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()

    arrivals = queue.Queue()
    client = grpcclient.InferenceServerClient(args.url)
    client.start_stream(callback=lambda result, error: arrivals.put((time.perf_counter_ns(), result, error)))
    n = grpcclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([args.responses], dtype=np.int32))
    measured = []
    for i in range(args.warmup + args.streams):
        start = time.perf_counter_ns()
        client.async_stream_infer(args.model, [n], request_id=str(i), enable_empty_final_response=True)
        times = []
        while True:
            at, result, error = arrivals.get(timeout=300)
            if error is not None:
                raise SystemExit(f"stream {i}: {error}")
            response = result.get_response()
            if response.outputs:
                times.append(at)
            if response.parameters["triton_final_response"].bool_param:
                end = at
                break
        if len(times) != args.responses:
            raise SystemExit(f"stream {i}: {len(times)} responses, expected {args.responses}")
        if i >= args.warmup:
            measured.append(
                {
                    "ttfr_us": (times[0] - start) / 1000,
                    "gaps_us": [(b - a) / 1000 for a, b in zip(times, times[1:])],
                    "total_us": (end - start) / 1000,
                }
            )
    client.stop_stream()
    client.close()
    print(json.dumps({"streams": measured}))


if __name__ == "__main__":
    main()
