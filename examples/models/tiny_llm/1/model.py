"""A tiny deterministic "LLM" with the inputs and outputs of Triton's vLLM backend.

Its "tokens" are words. It answers "I heard: " followed by the words of the last user turn (the
text after the last "<|user|>" of a chat prompt, else the whole prompt), one word per response
when streaming, from a thread after `execute` returns, as real LLM backends do. It honours the
`max_tokens` and `stop` of `sampling_parameters` (a JSON string), `exclude_input_in_output`
(echo), and reports `num_input_tokens` / `num_output_tokens` when asked. A request whose
client goes away (`is_cancelled()`) stops generating.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _reply_words(prompt):
    """The words of the answer: "I heard:" and the words of the last user turn."""
    turn = prompt.rsplit("<|user|>", 1)[-1].split("<|", 1)[0]
    return ["I", "heard:"] + turn.split()


def _response(text, input_tokens, output_tokens, counts):
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    if counts[0]:
        tensors.append(pb_utils.Tensor("num_input_tokens", np.array([input_tokens], dtype=np.uint32)))
    if counts[1]:
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([output_tokens], dtype=np.uint32)))
    return pb_utils.InferenceResponse(output_tensors=tensors)


class TritonPythonModel:
    """The tiny LLM."""

    def initialize(self, args):
        """Nothing to load."""
        self.threads = []

    def execute(self, requests):
        """Starts one generating thread per request and returns at once."""
        self.threads = [t for t in self.threads if t.is_alive()]
        for request in requests:
            try:
                job = self._job(request)
            except (ValueError, TypeError) as e:
                sender = request.get_response_sender()
                error = pb_utils.TritonError(f"tiny_llm: bad request: {e}", pb_utils.TritonError.INVALID_ARG)
                sender.send(
                    pb_utils.InferenceResponse(error=error), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                )
                continue
            thread = threading.Thread(target=self._generate, args=job, daemon=True)
            thread.start()
            self.threads.append(thread)
        return None

    def _job(self, request):
        prompt = _input(request, "text_input", "")
        params = json.loads(_input(request, "sampling_parameters", "{}") or "{}")
        if not isinstance(params, dict):
            raise ValueError("sampling_parameters must be a JSON object")
        max_tokens = int(params.get("max_tokens", 16))
        stop = params.get("stop") or []
        if isinstance(stop, str):
            stop = [stop]
        delay = float(params.get("tiny_llm_delay_ms", 0)) / 1000.0
        stream = bool(_input(request, "stream", False))
        echo = not bool(_input(request, "exclude_input_in_output", True))
        counts = (
            bool(_input(request, "return_num_input_tokens", False)),
            bool(_input(request, "return_num_output_tokens", False)),
        )
        return (request.get_response_sender(), prompt, max_tokens, stop, delay, stream, echo, counts)

    def _generate(self, sender, prompt, max_tokens, stop, delay, stream, echo, counts):
        input_tokens = len(prompt.split())
        words = _reply_words(prompt)[:max_tokens]
        text = prompt if echo else ""
        sent = 0
        for i, word in enumerate(words):
            if sender.is_cancelled():
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            piece = word if i == 0 else " " + word
            cut = [(text + piece).find(s, len(prompt) if echo else 0) for s in stop]
            cut = [c for c in cut if c >= 0]
            if cut:
                piece = (text + piece)[: min(cut)][len(text) :]
                words = words[: i + 1]
            if delay:
                time.sleep(delay)
            if stream:
                first = prompt if echo and i == 0 else ""
                sender.send(_response(first + piece, input_tokens, 1, counts))
            text += piece
            sent += 1
            if cut:
                break
        if not stream:
            sender.send(_response(text, input_tokens, sent, counts))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        """Lets the generating threads finish."""
        for thread in self.threads:
            thread.join(timeout=5)
