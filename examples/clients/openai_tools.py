"""A tool-calling client for tritium's OpenAI-compatible frontend, with the official `openai`
package: it offers the model a `get_weather` tool, runs the call the model asks for, sends the
result back as a `tool` message and prints the model's answer; then it asks again streamed and
assembles the tool call from its deltas.

Start the server with a tool-call parser, e.g. over the scripted test model (whose user turn
`say TEXT` makes it answer TEXT):

    tritium serve --model-repository tests/models --openai-port 9000 --tool-call-parser llama3
    python examples/clients/openai_tools.py --model openai_tools_llama

With a real model, pass your own question with --prompt.
"""

import argparse
import json

import openai

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--url", default="http://127.0.0.1:9000/v1", help="the frontend's base URL")
parser.add_argument("--model", default="openai_tools_llama")
parser.add_argument(
    "--prompt",
    default='say <|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}',
    help="the user's message",
)
args = parser.parse_args()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


def get_weather(city):
    """The tool: a stand-in for a real weather service."""
    return f"sunny and 21 C in {city}"


client = openai.OpenAI(base_url=args.url, api_key="unused")
messages = [{"role": "user", "content": args.prompt}]

answer = client.chat.completions.create(model=args.model, messages=messages, tools=TOOLS)
choice = answer.choices[0]
print("finish_reason:", choice.finish_reason)
if not choice.message.tool_calls:
    print("the model answered without a tool:", choice.message.content)
    raise SystemExit(0)

messages.append(choice.message.model_dump(exclude_none=True))
for call in choice.message.tool_calls:
    arguments = json.loads(call.function.arguments)
    print(f"tool call {call.id}: {call.function.name}({arguments})")
    result = get_weather(**arguments) if call.function.name == "get_weather" else "unknown tool"
    messages.append({"role": "tool", "tool_call_id": call.id, "content": result})

final = client.chat.completions.create(model=args.model, messages=messages, tools=TOOLS)
print("answer:", final.choices[0].message.content)

# The same question streamed: the first delta of a call carries its id and name, the next ones
# pieces of its arguments.
calls = {}
stream = client.chat.completions.create(model=args.model, messages=messages[:1], tools=TOOLS, stream=True)
for chunk in stream:
    for c in chunk.choices:
        for delta in c.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        if c.finish_reason:
            print("streamed finish_reason:", c.finish_reason)
for index, call in sorted(calls.items()):
    print(f"streamed call {index}: {call['name']}({json.loads(call['arguments'])})")
