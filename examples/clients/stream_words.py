"""Streams the words of a sentence from the decoupled stream_words example over gRPC streaming.

A decoupled model answers through a bidirectional gRPC stream (KServe's ModelStreamInfer): each
response arrives at the stream's callback as it is sent, and the last one carries the
`triton_final_response` parameter (asked for with `enable_empty_final_response`).
"""

import argparse
import queue

import numpy as np
import tritonclient.grpc as grpcclient

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--url", default="127.0.0.1:8001", help="gRPC host:port")
parser.add_argument("--protocol", choices=["grpc"], default="grpc", help="only grpc streams")
parser.add_argument("--text", default="the quick brown fox jumps over the lazy dog")
args = parser.parse_args()

answers = queue.Queue()
client = grpcclient.InferenceServerClient(url=args.url)
client.start_stream(callback=lambda result, error: answers.put((result, error)))
text = grpcclient.InferInput("TEXT", [1], "BYTES")
text.set_data_from_numpy(np.array([args.text.encode("utf-8")], dtype=np.object_))
client.async_stream_infer("stream_words", [text], request_id="words", enable_empty_final_response=True)

words = []
while True:
    result, error = answers.get(timeout=60)
    if error is not None:
        raise SystemExit(f"error: {error}")
    response = result.get_response()
    if response.outputs:
        index = int(result.as_numpy("INDEX")[0])
        word = result.as_numpy("WORD")[0].decode("utf-8")
        print(f"{index}: {word}")
        words.append(word)
    if response.parameters["triton_final_response"].bool_param:
        break
client.stop_stream()
client.close()
assert words == args.text.split(), words
print("WORDS:", len(words))
