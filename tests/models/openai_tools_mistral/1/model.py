"""A scripted vLLM-shaped chat model for the OpenAI frontend's tool-calling tests.

It reads the last user turn of its chat prompt (llama3-style `<|user|>...<|end|>` or
mistral-style `[INST]...[/INST]`) as a command:

- `say TEXT`: answers TEXT as it is (a tool call, broken JSON, plain words, ...);
- `prompt`: answers the whole rendered prompt, so tests see what the template made of `tools`,
  `tool_calls` and `tool` messages;
- after a tool result (a `tool` message after the last user turn): answers
  `The tool said: RESULT`;
- `flood`: starts a tool call whose arguments never end, 1 KiB per response, until the request is
  cancelled; it then writes the file `cancelled` next to its config.

Streamed, the answer goes out in pieces of 7 characters; whole, in one response. It reports
`num_input_tokens` (words of the prompt) and `num_output_tokens` (words) when asked, and puts
the `sampling_parameters` it got in the file `last_params.json` next to its config.
"""

import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    value = tensor.as_numpy().reshape(-1)[0]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _tool_result(prompt):
    """The last tool result, when it comes after the last user turn."""
    for user, tool, end in (("<|user|>", "<|ipython|>", "<|end|>"), ("[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")):
        after = prompt.rsplit(user, 1)[-1]
        if user in prompt and tool in after:
            return after.rsplit(tool, 1)[-1].split(end, 1)[0]
    return None


def _turn(prompt):
    if "[INST]" in prompt:
        return prompt.rsplit("[INST]", 1)[-1].split("[/INST]", 1)[0]
    return prompt.rsplit("<|user|>", 1)[-1].split("<|end|>", 1)[0]


def _response(text, counts, input_tokens, output_tokens):
    tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_))]
    if counts[0]:
        tensors.append(pb_utils.Tensor("num_input_tokens", np.array([input_tokens], dtype=np.uint32)))
    if counts[1]:
        tensors.append(pb_utils.Tensor("num_output_tokens", np.array([output_tokens], dtype=np.uint32)))
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _generate(sender, prompt, stream, counts):
    turn = _turn(prompt).strip()
    n_in = len(prompt.split())
    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    if turn == "flood":
        sender.send(_response('{"name": "get_weather", "arguments": {"city": "', counts, n_in, 1))
        while not sender.is_cancelled():
            sender.send(_response("a" * 1024, counts, n_in, 1))
            time.sleep(0.01)
        with open(os.path.join(HERE, "cancelled"), "w") as f:
            f.write("cancelled")
        sender.send(flags=final)
        return
    result = _tool_result(prompt)
    if result is not None:
        text = f"The tool said: {result}"
    elif turn == "prompt":
        text = prompt
    elif turn.startswith("say "):
        text = turn[len("say ") :]
    else:
        text = "I only obey say/prompt/flood"
    if not stream:
        sender.send(_response(text, counts, n_in, len(text.split())), flags=final)
        return
    for i in range(0, len(text), 7):
        if sender.is_cancelled():
            break
        # The words count as tokens, all reported with the last piece.
        n_out = len(text.split()) if i + 7 >= len(text) else 0
        sender.send(_response(text[i : i + 7], counts, n_in, n_out))
    sender.send(flags=final)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            prompt = _input(request, "text_input", "")
            params = _input(request, "sampling_parameters", "{}")
            with open(os.path.join(HERE, "last_params.json"), "w") as f:
                f.write(params)
            stream = bool(_input(request, "stream", False))
            counts = (
                bool(_input(request, "return_num_input_tokens", False)),
                bool(_input(request, "return_num_output_tokens", False)),
            )
            args = (request.get_response_sender(), prompt, stream, counts)
            threading.Thread(target=_generate, args=args, daemon=True).start()
        return None
