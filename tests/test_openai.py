"""The OpenAI-compatible frontend (`--openai-port`) end to end with the official `openai`
package: discovery, chat and text completions whole and streamed, usage, stop, max_tokens,
OpenAI-shaped errors, cancellation by closing the stream, and concurrent streams."""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import openai
import pytest
from conftest import ROOT, Server
from test_faults import write_model

HELLO = [{"role": "user", "content": "Hello there"}]

# A vLLM-shaped model that streams "w0 w1 ..." every 20 ms until the client goes away, then
# writes the file `cancelled` next to its config; and one that fails after two words.
ENDLESS = """
import os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def text(s):
    return pb_utils.InferenceResponse([pb_utils.Tensor("text_output", np.array([s.encode()], dtype=np.object_))])


def run(sender, fail):
    i = 0
    while True:
        if sender.is_cancelled():
            with open(os.path.join(HERE, "cancelled"), "w") as f:
                f.write(str(i))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        if fail and i == 2:
            err = pb_utils.TritonError("the model broke mid-stream")
            sender.send(pb_utils.InferenceResponse(error=err), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return
        sender.send(text(f"w{i} "))
        i += 1
        time.sleep(0.02)


class TritonPythonModel:
    def initialize(self, args):
        self.fail = args["model_name"] == "failing"

    def execute(self, requests):
        for r in requests:
            threading.Thread(target=run, args=(r.get_response_sender(), self.fail), daemon=True).start()
        return None
"""

ENDLESS_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
model_transaction_policy {{ decoupled: true }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true }},
  {{ name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true }}
]
output [ {{ name: "text_output" data_type: TYPE_STRING dims: [ -1 ] }} ]
"""


# A vLLM-shaped model that is not decoupled: one response per request, served through unary
# inference.
COUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            prompt = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0].decode()
            text = np.array([("coupled: " + prompt).encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]))
        return out
"""


def metrics_text(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def client_for(server):
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="unused", max_retries=0, timeout=60
    )


@pytest.fixture(scope="module")
def oa(server):
    return client_for(server)


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A server whose LLM-shaped models have no chat template."""
    repo = tmp_path_factory.mktemp("openai-repo")
    for name in ("endless", "failing"):
        write_model(str(repo), name, ENDLESS, ENDLESS_CONFIG.format(name=name))
    coupled = ENDLESS_CONFIG.format(name="coupled").replace("model_transaction_policy { decoupled: true }", "")
    write_model(str(repo), "coupled", COUPLED, coupled)
    srv = Server(str(repo), str(tmp_path_factory.mktemp("openai-log") / "tritium.log"))
    try:
        srv.wait_models(["endless", "failing", "coupled"])
        yield srv
    finally:
        srv.stop()


def test_models_lists_llm_shaped_models_only(oa):
    ids = [m.id for m in oa.models.list()]
    assert "tiny_llm" in ids
    assert "add_sub" not in ids, "a model without LLM inputs is not listed"
    m = oa.models.retrieve("tiny_llm")
    assert m.id == "tiny_llm" and m.object == "model"
    with pytest.raises(openai.NotFoundError) as e:
        oa.models.retrieve("add_sub")
    assert e.value.status_code == 404


def test_chat_whole_with_usage(oa):
    r = oa.chat.completions.create(model="tiny_llm", messages=HELLO)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == "I heard: Hello there"
    assert r.choices[0].finish_reason == "stop"
    # The prompt is the rendered template "<s><|user|> Hello there<|assistant|>" (trim_blocks eats
    # the newline after a block tag, as in Hugging Face's rendering): 3 words.
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 4, 7)


def test_chat_streamed_with_usage(oa):
    stream = oa.chat.completions.create(
        model="tiny_llm", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "I heard: Hello there"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (3, 4)
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_completion_whole_and_streamed(oa):
    r = oa.completions.create(model="tiny_llm", prompt="one two three")
    assert r.object == "text_completion"
    assert r.choices[0].text == "I heard: one two three"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 5)
    pieces = [c.choices[0].text for c in oa.completions.create(model="tiny_llm", prompt="one two three", stream=True)]
    assert "".join(pieces) == "I heard: one two three"
    assert len([p for p in pieces if p]) == 5, "one word per chunk"


def test_max_tokens_and_stop(oa):
    r = oa.completions.create(model="tiny_llm", prompt="one two three four", max_tokens=3)
    assert r.choices[0].text == "I heard: one"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3
    r = oa.chat.completions.create(model="tiny_llm", messages=HELLO, max_completion_tokens=2)
    assert r.choices[0].message.content == "I heard:"
    assert r.choices[0].finish_reason == "length"
    r = oa.completions.create(model="tiny_llm", prompt="one two three four", stop=["three"])
    assert r.choices[0].text == "I heard: one two "
    assert r.choices[0].finish_reason == "stop"
    pieces = [
        c.choices[0].text for c in oa.completions.create(model="tiny_llm", prompt="a b c d", stop="c", stream=True)
    ]
    assert "".join(pieces) == "I heard: a b "


def test_sampling_fields_pass_through(oa):
    r = oa.chat.completions.create(model="tiny_llm", messages=HELLO, temperature=0.2, top_p=0.9, seed=5)
    assert r.choices[0].message.content == "I heard: Hello there"


def test_unknown_model_is_an_openai_404(oa):
    with pytest.raises(openai.NotFoundError) as e:
        oa.chat.completions.create(model="no_such_model", messages=HELLO)
    assert e.value.status_code == 404
    assert e.value.code == "model_not_found"
    assert e.value.type == "invalid_request_error"
    assert e.value.param == "model"
    assert "no_such_model" in e.value.message
    with pytest.raises(openai.NotFoundError):
        oa.completions.create(model="add_sub", prompt="x")


def test_bad_fields_are_400_naming_the_field(oa):
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="tiny_llm", messages=HELLO, n=2)
    assert e.value.param == "n" and "n=1" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        oa.completions.create(model="tiny_llm", prompt="x", max_tokens="lots")
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="tiny_llm", messages=[{"role": "tool", "content": "x"}])
    assert "tiny_llm knows the roles" in e.value.message, "raise_exception in the template"
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="tiny_llm", messages=[])
    assert e.value.param == "messages"


def test_raw_error_body_shape(server):
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.openai_port}/v1/completions",
        data=b'{"model": "tiny_llm", "prompt": 5}',
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400
    body = json.loads(e.value.read())
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["param"] == "prompt"


def test_raw_sse_framing(server):
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.openai_port}/v1/completions",
        data=json.dumps({"model": "tiny_llm", "prompt": "x y", "stream": True}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts) == "I heard: x y"


def test_chat_without_template_names_where_it_looked(bare):
    oa = client_for(bare)
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="endless", messages=HELLO)
    message = e.value.message
    assert os.path.join("endless", "tokenizer_config.json") in message
    assert os.path.join("endless", "1", "tokenizer_config.json") in message
    assert "--chat-template" in message


def test_model_error_mid_stream(bare):
    oa = client_for(bare)
    seen = []
    with pytest.raises(openai.APIError) as e:
        for chunk in oa.completions.create(model="failing", prompt="x", stream=True):
            seen.append(chunk.choices[0].text)
    assert "the model broke mid-stream" in str(e.value)
    assert seen[:2] == ["w0 ", "w1 "]


def test_a_model_that_is_not_decoupled_is_served_too(bare):
    oa = client_for(bare)
    r = oa.completions.create(model="coupled", prompt="x y")
    assert r.choices[0].text == "coupled: x y"
    assert r.usage is None, "no num-token outputs: usage is null"
    pieces = [c.choices[0].text for c in oa.completions.create(model="coupled", prompt="z", stream=True)]
    assert "".join(pieces) == "coupled: z"


def test_closing_the_stream_cancels_the_request_in_the_model(bare):
    marker = os.path.join(bare.repository, "endless", "cancelled")
    oa = client_for(bare)
    stream = oa.completions.create(model="endless", prompt="x", stream=True)
    it = iter(stream)
    assert next(it).choices[0].text == "w0 "
    assert next(it).choices[0].text == "w1 "
    stream.close()
    deadline = time.time() + 60
    while not os.path.exists(marker):
        assert time.time() < deadline, f"the model never saw is_cancelled(); log:\n{bare.log_text()}"
        time.sleep(0.05)
    # The frontend still answers afterwards, and counted the request as cancelled.
    assert [m.id for m in oa.models.list()] == ["coupled", "endless", "failing"]
    counter = 'tritium_openai_requests_total{endpoint="completions",model="endless",outcome="cancelled"} 1'
    while counter not in metrics_text(bare):
        assert time.time() < deadline, metrics_text(bare)
        time.sleep(0.05)


def test_a_client_that_gives_up_on_a_whole_answer_cancels_it(bare):
    marker = os.path.join(bare.repository, "endless", "cancelled")
    if os.path.exists(marker):
        os.remove(marker)
    oa = openai.OpenAI(base_url=f"http://127.0.0.1:{bare.openai_port}/v1", api_key="unused", max_retries=0, timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        oa.completions.create(model="endless", prompt="x")
    deadline = time.time() + 60
    while not os.path.exists(marker):
        assert time.time() < deadline, f"the model never saw is_cancelled(); log:\n{bare.log_text()}"
        time.sleep(0.05)


def test_chat_template_flag_overrides(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "examples", "models", "tiny_llm"), str(repo / "tiny_llm"))
    os.remove(repo / "tiny_llm" / "tokenizer_config.json")
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<|user|> {{ m.content | upper }} {% endfor %}")
    srv = Server(str(repo), str(tmp_path / "tritium.log"), extra_args=["--chat-template", str(template)])
    try:
        srv.wait_models(["tiny_llm"])
        r = client_for(srv).chat.completions.create(model="tiny_llm", messages=HELLO)
        assert r.choices[0].message.content == "I heard: HELLO THERE"
    finally:
        srv.stop()


def test_32_concurrent_streams(oa):
    def one(i):
        words = [f"s{i}w{j}" for j in range(6)]
        stream = oa.chat.completions.create(
            model="tiny_llm",
            messages=[{"role": "user", "content": " ".join(words)}],
            stream=True,
            max_tokens=64,
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    for i, text in enumerate(results):
        assert text == "I heard: " + " ".join(f"s{i}w{j}" for j in range(6))


def test_metrics_per_model(oa, server):
    oa.completions.create(model="tiny_llm", prompt="metrics please")
    text = metrics_text(server)
    assert 'tritium_openai_requests_total{endpoint="completions",model="tiny_llm",outcome="success"}' in text
    assert "# TYPE tritium_openai_time_to_first_token_seconds histogram" in text
    assert 'tritium_openai_inter_token_latency_seconds_count{model="tiny_llm"}' in text


def test_example_client(server):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "clients", "openai_chat.py"),
            "--url",
            f"http://127.0.0.1:{server.openai_port}/v1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "streamed: I heard: Hello there, how are you?" in out.stdout


def test_oversized_body_is_an_openai_413(server):
    req = urllib.request.Request(
        f"http://127.0.0.1:{server.openai_port}/v1/completions",
        data=json.dumps({"model": "tiny_llm", "prompt": "x" * (17 << 20)}).encode(),
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=60)
    assert e.value.code == 413
    assert "request body" in json.loads(e.value.read())["error"]["message"]
