"""A deterministic embedding model in the shape of Triton's vLLM backend for embeddings.

It takes `embedding_request`, the JSON `{"input": <string or token ids>, "pooling_params":
{"dimensions": [N]}}` Triton's OpenAI frontend sends, and answers the embedding as a JSON list
of floats in `text_output`: `embed(text, N)` below (N is 8 unless asked; at most 8 are allowed).
It counts words (or token ids) as `num_input_tokens`.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_DIMENSIONS = 8


def embed(text, n):
    """The test's embedding: each dimension a fixed function of the text's characters."""
    h = sum((k + 1) * ord(c) for k, c in enumerate(text))
    return [((h * (i + 3)) % 997) / 997.0 - 0.5 for i in range(n)]


def answer(request):
    body = json.loads(pb_utils.get_input_tensor_by_name(request, "embedding_request").as_numpy()[0])
    item = body["input"]
    dims = body.get("pooling_params", {}).get("dimensions")
    n = dims[0] if dims else MAX_DIMENSIONS
    if n > MAX_DIMENSIONS:
        raise ValueError(f"this model makes at most {MAX_DIMENSIONS} dimensions, not {n}")
    if isinstance(item, str):
        text, tokens = item, len(item.split())
    else:
        text, tokens = " ".join(str(t) for t in item), len(item)
    out = [
        pb_utils.Tensor("text_output", np.array([json.dumps(embed(text, n)).encode()], dtype=np.object_)),
        pb_utils.Tensor("num_input_tokens", np.array([tokens], dtype=np.uint32)),
        pb_utils.Tensor("num_output_tokens", np.array([0], dtype=np.uint32)),
    ]
    return pb_utils.InferenceResponse(output_tensors=out)


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            sender = request.get_response_sender()
            try:
                sender.send(answer(request), flags=final)
            except (ValueError, KeyError, TypeError) as e:
                err = pb_utils.TritonError(f"openai_embed: {e}", pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=err), flags=final)
        return None
