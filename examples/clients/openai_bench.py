"""Benchmarks tritium's OpenAI frontend on the tiny_llm example (`cargo xtask bench openai`):
time to first token and tokens/s with 1, 8 and 32 concurrent streams, each stream a chat request
of 64 tokens, and `/v1/embeddings` requests per second at concurrency 1 and 16 on the test
embedding model (tests/models/openai_embed), through the official `openai` package.

It starts `target/release/tritium` on free ports over a temporary copy of
examples/models/tiny_llm and tests/models/openai_embed, or measures a running server with
--url."""

import argparse
import concurrent.futures
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENS = 64


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(workdir):
    repo = os.path.join(workdir, "repo")
    shutil.copytree(os.path.join(ROOT, "examples", "models", "tiny_llm"), os.path.join(repo, "tiny_llm"))
    shutil.copytree(os.path.join(ROOT, "tests", "models", "openai_embed"), os.path.join(repo, "openai_embed"))
    http, openai_port = free_port(), free_port()
    args = [
        os.environ.get("TRITIUM_BIN", os.path.join(ROOT, "target", "release", "tritium")),
        "serve",
        "--model-repository",
        repo,
        "--http-port",
        str(http),
        "--grpc-port",
        str(free_port()),
        "--metrics-port",
        str(free_port()),
        "--openai-port",
        str(openai_port),
        "--python",
        sys.executable,
    ]
    log = open(os.path.join(workdir, "tritium.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    for model in ("tiny_llm", "openai_embed"):
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{model}/ready", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("tritium did not become ready; see " + log.name)
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{openai_port}/v1"


def one_stream(client, i):
    """(seconds to the first token, seconds in all, tokens) of one streamed chat request."""
    words = " ".join(f"w{i}x{j}" for j in range(TOKENS))
    start = time.perf_counter()
    first = None
    tokens = 0
    stream = client.chat.completions.create(
        model="tiny_llm", messages=[{"role": "user", "content": words}], stream=True, max_tokens=TOKENS
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
            if first is None:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start, tokens


def measure(client, concurrency, rounds):
    """Runs `rounds` waves of `concurrency` streams; returns (median TTFT, p99 TTFT, tokens/s)."""
    ttfts = []
    tokens = 0
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for r in range(rounds):
            for first, _, n in pool.map(lambda i: one_stream(client, i), range(r * concurrency, (r + 1) * concurrency)):
                ttfts.append(first)
                tokens += n
    elapsed = time.perf_counter() - start
    ttfts.sort()
    return statistics.median(ttfts), ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))], tokens / elapsed


def measure_embeddings(client, concurrency, seconds):
    """Embeddings requests per second (one 16-word input each, floats) with `concurrency`
    clients for about `seconds`."""
    text = " ".join(f"word{j}" for j in range(16))
    stop = time.perf_counter() + seconds

    def worker(_):
        n = 0
        while time.perf_counter() < stop:
            client.embeddings.create(model="openai_embed", input=text, encoding_format="float")
            n += 1
        return n

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        done = sum(pool.map(worker, range(concurrency)))
    return done / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running frontend's base URL (default: start one)")
    parser.add_argument("--seconds", type=float, default=5.0, help="about how long each concurrency runs")
    args = parser.parse_args()
    proc = None
    workdir = tempfile.mkdtemp(prefix="tritium-bench-openai-")
    try:
        url = args.url
        if url is None:
            proc, url = start_server(workdir)
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        one_stream(client, 0)  # warm-up
        print(f"tiny_llm, {TOKENS} tokens per stream; load average {os.getloadavg()[0]:.2f}")
        print(f"{'streams':>8} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} {'tokens/s':>10}")
        for concurrency in (1, 8, 32):
            _, took, _ = one_stream(client, 1)
            rounds = max(2, int(args.seconds / max(took * max(1, concurrency / 8), 1e-3)))
            p50, p99, rate = measure(client, concurrency, rounds)
            print(f"{concurrency:>8} {p50 * 1000:>12.2f} {p99 * 1000:>12.2f} {rate:>10.0f}", flush=True)
        client.embeddings.create(model="openai_embed", input="warm up", encoding_format="float")
        print(f"\nopenai_embed, one 16-word input per request; load average {os.getloadavg()[0]:.2f}")
        print(f"{'clients':>8} {'requests/s':>12}")
        for concurrency in (1, 16):
            print(f"{concurrency:>8} {measure_embeddings(client, concurrency, args.seconds):>12.0f}", flush=True)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
