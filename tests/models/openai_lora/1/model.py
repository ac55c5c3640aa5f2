"""A vLLM-shaped test model with LoRA adapters and log probabilities.

It answers `adapter=<lora_name from the sampling parameters, or base> <prompt words>`, one word
per response when streaming. Asked for logprobs (`return_logprobs` and `logprobs: N` in the
sampling parameters), it sends vLLM's `logprobs` output with each response: for each word, N
entries `{"<id>": {"logprob": ..., "rank": r, "decoded_token": ...}}` whose rank-1 entry is
the word (logprob -0.25 * its position) and the others "alt<r>" (logprob -9 * r).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _logprobs(words, start, n):
    out = []
    for k, w in enumerate(words):
        entry = {"1000": {"logprob": -0.25 * (start + k), "rank": 1, "decoded_token": w}}
        for r in range(2, n + 1):
            entry[str(1000 + r)] = {"logprob": -9.0 * r, "rank": r, "decoded_token": f"alt{r}"}
        out.append(entry)
    return out


class TritonPythonModel:
    def execute(self, requests):
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        for request in requests:
            params = json.loads(_input(request, "sampling_parameters", "{}") or "{}")
            prompt = _input(request, "text_input", "")
            stream = bool(_input(request, "stream", False))
            want = bool(_input(request, "return_logprobs", False))
            n = int(params.get("logprobs", 0) or 0)
            words = ["adapter=" + params.get("lora_name", "base")] + prompt.split()[-2:]
            # Tokens are words, each after the first with its leading blank.
            tokens = [w if i == 0 else " " + w for i, w in enumerate(words)]
            pieces = [[t] for t in tokens] if stream else [tokens]
            sender = request.get_response_sender()
            start = 0
            for piece in pieces:
                text = "".join(piece)
                tensors = [
                    pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
                    pb_utils.Tensor("num_input_tokens", np.array([len(prompt.split())], dtype=np.uint32)),
                    pb_utils.Tensor("num_output_tokens", np.array([len(piece)], dtype=np.uint32)),
                ]
                if want and n:
                    lp = json.dumps(_logprobs(piece, start, n))
                    tensors.append(pb_utils.Tensor("logprobs", np.array([lp.encode()], dtype=np.object_)))
                start += len(piece)
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
            sender.send(flags=final)
        return None
