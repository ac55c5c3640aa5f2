"""Tool calling on the OpenAI frontend end to end with the `openai` package: llama3- and
mistral-style tool calls parsed by `--tool-call-parser`, streamed and whole; `tools`,
`tool_calls` and `tool` messages through the chat template; named and `required` tool choice;
invalid tool JSON answered as content; and `--max-tool-call-parse-bytes` cutting a stream."""

import json
import os
import shutil
import subprocess
import sys
import time

import openai
import pytest
from conftest import ROOT, Server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
    },
]
PARSE_LIMIT = 4096


def say(text):
    return [{"role": "user", "content": "say " + text}]


def start_server(tmp_path_factory, parser, model, extra=()):
    repo = tmp_path_factory.mktemp(f"tools-{parser}")
    shutil.copytree(os.path.join(ROOT, "tests", "models", model), str(repo / model))
    log = str(tmp_path_factory.mktemp(f"tools-{parser}-log") / "tritium.log")
    srv = Server(str(repo), log, ["--tool-call-parser", parser, *extra])
    srv.model_dir = str(repo / model)
    srv.wait_models([model])
    return srv


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    srv = start_server(
        tmp_path_factory, "llama3", "openai_tools_llama", ["--max-tool-call-parse-bytes", str(PARSE_LIMIT)]
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    srv = start_server(tmp_path_factory, "mistral", "openai_tools_mistral")
    try:
        yield srv
    finally:
        srv.stop()


def client(srv):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{srv.openai_port}/v1", api_key="unused", max_retries=0, timeout=60)


def collect(stream):
    """Folds a chat stream into (content, calls by index, finish reasons, chunks)."""
    content, calls, finishes, chunks = "", {}, [], list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": "", "deltas": 0})
                call["deltas"] += 1
                if tc.id:
                    assert call["id"] is None, "the id comes once, in the first delta"
                    call["id"] = tc.id
                    assert tc.type == "function"
                if tc.function and tc.function.name:
                    assert call["name"] is None, "the name comes once, in the first delta"
                    call["name"] = tc.function.name
                if tc.function and tc.function.arguments:
                    call["arguments"] += tc.function.arguments
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
    return content, calls, finishes, chunks


LLAMA_CALLS = (
    '<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}; '
    '{"name": "get_time", "parameters": {"tz": "Europe/Paris"}}'
)


def test_llama3_tool_calls_whole(llama):
    r = client(llama).chat.completions.create(model="openai_tools_llama", messages=say(LLAMA_CALLS), tools=TOOLS)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    calls = choice.message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"tz": "Europe/Paris"}]
    assert all(c.type == "function" and c.id for c in calls)
    assert calls[0].id != calls[1].id


def test_llama3_tool_calls_streamed(llama):
    stream = client(llama).chat.completions.create(
        model="openai_tools_llama", messages=say(LLAMA_CALLS), tools=TOOLS, stream=True
    )
    content, calls, finishes, chunks = collect(stream)
    assert content == ""
    assert finishes == ["tool_calls"]
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}
    assert json.loads(calls[1]["arguments"]) == {"tz": "Europe/Paris"}
    # The arguments come in pieces as the model writes them (7 characters a response).
    assert calls[0]["deltas"] > 2 and calls[1]["deltas"] > 2
    assert all(calls[i]["id"] for i in (0, 1))


def test_mistral_tool_calls_whole_and_streamed(mistral):
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'
    oa = client(mistral)
    r = oa.chat.completions.create(model="openai_tools_mistral", messages=say(text), tools=TOOLS)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Oslo"})
    assert len(call.id) == 9 and call.id.isalnum(), "mistral ids are nine alphanumerics"
    content, calls, finishes, _ = collect(
        oa.chat.completions.create(model="openai_tools_mistral", messages=say(text), tools=TOOLS, stream=True)
    )
    assert (content, finishes) == ("", ["tool_calls"])
    assert calls[0]["name"] == "get_weather" and json.loads(calls[0]["arguments"]) == {"city": "Oslo"}


def test_plain_answers_stay_content(llama, mistral):
    for srv, model in ((llama, "openai_tools_llama"), (mistral, "openai_tools_mistral")):
        oa = client(srv)
        r = oa.chat.completions.create(model=model, messages=say("It is sunny."), tools=TOOLS)
        assert (r.choices[0].message.content, r.choices[0].finish_reason) == ("It is sunny.", "stop")
        assert r.choices[0].message.tool_calls is None
        content, calls, finishes, _ = collect(
            oa.chat.completions.create(model=model, messages=say("It is sunny."), tools=TOOLS, stream=True)
        )
        assert (content, calls, finishes) == ("It is sunny.", {}, ["stop"])


@pytest.mark.parametrize(
    "text",
    ['{"name": get_weather, "arguments": {}}', '{"name": "get_weather", "arguments": {"city": "Par', "{not json"],
)
def test_invalid_tool_json_is_content_not_an_error(llama, text):
    oa = client(llama)
    r = oa.chat.completions.create(model="openai_tools_llama", messages=say(text), tools=TOOLS)
    assert r.choices[0].message.content == text
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason == "stop"


def test_invalid_tool_json_streamed_is_content(llama):
    text = '{"name": get_weather, "arguments": {}}'
    content, calls, finishes, _ = collect(
        client(llama).chat.completions.create(model="openai_tools_llama", messages=say(text), tools=TOOLS, stream=True)
    )
    assert (content, calls, finishes) == (text, {}, ["stop"])


def test_named_tool_choice(llama):
    oa = client(llama)
    choice = {"type": "function", "function": {"name": "get_time"}}
    r = oa.chat.completions.create(
        model="openai_tools_llama", messages=say('{"tz": "UTC"}'), tools=TOOLS, tool_choice=choice
    )
    (call,) = r.choices[0].message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {"tz": "UTC"})
    # vLLM is asked to decode to the function's parameters, as Triton's frontend asks it.
    with open(os.path.join(llama.model_dir, "last_params.json")) as f:
        params = json.load(f)
    guided = json.loads(params["structured_outputs"])
    assert json.loads(guided["json"]) == TOOLS[1]["function"]["parameters"]
    assert "tools" not in params and "tool_choice" not in params
    content, calls, _, _ = collect(
        oa.chat.completions.create(
            model="openai_tools_llama", messages=say('{"tz": "UTC"}'), tools=TOOLS, tool_choice=choice, stream=True
        )
    )
    assert content == "" and calls[0]["name"] == "get_time"
    assert json.loads(calls[0]["arguments"]) == {"tz": "UTC"}
    r = oa.chat.completions.create(
        model="openai_tools_llama", messages=say('{"city": "Rome"}'), tools=TOOLS, tool_choice="required"
    )
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather", "required: the first tool"


def test_tool_choice_none_and_errors(llama):
    oa = client(llama)
    r = oa.chat.completions.create(
        model="openai_tools_llama", messages=say(LLAMA_CALLS), tools=TOOLS, tool_choice="none"
    )
    assert r.choices[0].message.content == LLAMA_CALLS and r.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(
            model="openai_tools_llama",
            messages=say("x"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert "nope" in e.value.message and e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError):
        oa.chat.completions.create(model="openai_tools_llama", messages=say("x"), tool_choice="required")


def test_tools_and_tool_messages_reach_the_template(llama, mistral):
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call1", "content": "sunny, 21 C"},
        {"role": "user", "content": "prompt"},
    ]
    r = client(llama).chat.completions.create(model="openai_tools_llama", messages=history, tools=TOOLS)
    prompt = r.choices[0].message.content
    assert prompt.startswith('<s><|tools|>get_weather: {"properties"') or prompt.startswith(
        "<s><|tools|>get_weather: {"
    )
    assert "get_time: " in prompt
    assert '<|assistant|><|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}<|end|>' in prompt
    assert "<|ipython|>sunny, 21 C<|end|>" in prompt
    r = client(mistral).chat.completions.create(model="openai_tools_mistral", messages=history, tools=TOOLS)
    prompt = r.choices[0].message.content
    tools = json.loads(prompt.split("[AVAILABLE_TOOLS]", 1)[1].split("[/AVAILABLE_TOOLS]", 1)[0])
    assert tools == TOOLS
    assert '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call1"}]</s>' in prompt
    assert '[TOOL_RESULTS]{"call_id": "call1", "content": "sunny, 21 C"}[/TOOL_RESULTS]' in prompt


def test_parse_limit_ends_the_stream_with_length_and_cancels(llama):
    marker = os.path.join(llama.model_dir, "cancelled")
    if os.path.exists(marker):
        os.remove(marker)
    content, calls, finishes, _ = collect(
        client(llama).chat.completions.create(
            model="openai_tools_llama", messages=[{"role": "user", "content": "flood"}], tools=TOOLS, stream=True
        )
    )
    assert finishes == ["length"]
    assert calls[0]["name"] == "get_weather"
    assert len(calls[0]["arguments"]) <= PARSE_LIMIT
    deadline = time.time() + 30
    while not os.path.exists(marker):
        assert time.time() < deadline, "the model never saw the request cancelled"
        time.sleep(0.05)


def test_tools_without_a_parser_are_refused(server):
    server.wait_models(["openai_tools_llama"])
    oa = openai.OpenAI(base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="openai_tools_llama", messages=say("x"), tools=TOOLS)
    assert "--tool-call-parser" in e.value.message
    # A named function needs no parser.
    r = oa.chat.completions.create(
        model="openai_tools_llama",
        messages=say('{"city": "Lima"}'),
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Lima"}


def test_example_tool_client(llama):
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "clients", "openai_tools.py"),
            "--url",
            f"http://127.0.0.1:{llama.openai_port}/v1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "get_weather({'city': 'Paris'})" in out.stdout
    assert "answer: The tool said: sunny and 21 C in Paris" in out.stdout
    assert "streamed finish_reason: tool_calls" in out.stdout
    assert "streamed call 0: get_weather({'city': 'Paris'})" in out.stdout
