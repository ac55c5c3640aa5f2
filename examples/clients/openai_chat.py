"""Chats with the tiny_llm example through tritium's OpenAI-compatible frontend, with the
official `openai` package: once whole, once streamed (start the server with --openai-port)."""

import argparse

import openai

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--url", default="http://127.0.0.1:9000/v1", help="the frontend's base URL")
parser.add_argument("--model", default="tiny_llm")
args = parser.parse_args()

client = openai.OpenAI(base_url=args.url, api_key="unused")
print("models:", [m.id for m in client.models.list()])

messages = [
    {"role": "system", "content": "You are tiny."},
    {"role": "user", "content": "Hello there, how are you?"},
]
answer = client.chat.completions.create(model=args.model, messages=messages, max_tokens=32)
text = answer.choices[0].message.content
print("whole:", text, f"({answer.usage.completion_tokens} tokens, {answer.choices[0].finish_reason})")
assert text == "I heard: Hello there, how are you?", text

print("streamed: ", end="", flush=True)
pieces = []
stream = client.chat.completions.create(model=args.model, messages=messages, max_tokens=32, stream=True)
for chunk in stream:
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
            print(choice.delta.content, end="", flush=True)
print()
assert "".join(pieces) == text
