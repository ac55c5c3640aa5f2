"""`cargo xtask bench frameworks`: an ONNX MLP (512 -> 2048 -> 512, FP32) served by tritium's
onnxruntime backend over gRPC at concurrency 1 and at 16 with dynamic batching, against the floor:
the same session called in a loop in one Python process with the same thread settings.

Each run prints throughput, p50/p99 latency and CPU per request (tritium: its server and stub
processes); the whole measurement runs RUNS times (2 by default) and the medians and spreads are
printed last. The client (tritonclient, in this process) shares the machine's CPUs with the
server, and its own per-request cost is in the latency. Not measured: Triton 2.51's Python backend
running the same session (the issue's second reference).

Environment: TRITIUM_BIN (default target/release/tritium), DUR seconds per case (5), THREADS
intra-op threads (1), RUNS (2).
"""

import concurrent.futures
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
import onnx
import onnxruntime as ort
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TRITIUM_BIN", os.path.join(ROOT, "target", "release", "tritium"))
DUR = float(os.environ.get("DUR", "5"))
THREADS = int(os.environ.get("THREADS", "1"))
RUNS = int(os.environ.get("RUNS", "2"))


def make_repo(repo):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((512, 2048), dtype=np.float32) * 0.02
    w2 = rng.standard_normal((2048, 512), dtype=np.float32) * 0.02
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W1"], ["H"]),
            helper.make_node("Relu", ["H"], ["R"]),
            helper.make_node("MatMul", ["R", "W2"], ["Y"]),
        ],
        "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["b", 512])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["b", 512])],
        initializer=[numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    os.makedirs(os.path.join(repo, "mlp", "1"))
    onnx.save(model, os.path.join(repo, "mlp", "1", "model.onnx"))
    with open(os.path.join(repo, "mlp", "config.pbtxt"), "w") as f:
        f.write(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
            "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
            f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{THREADS}" }} }}\n'
        )


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu(pid):
    """CPU seconds of a process and its children (the stubs)."""
    total = 0
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    for p in [pid, *map(int, children)]:
        fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def floor(path, x):
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    latencies, end, cpu = [], time.time() + DUR, time.process_time()
    while time.time() < end:
        t = time.perf_counter()
        session.run(["Y"], {"X": x})
        latencies.append(time.perf_counter() - t)
    return latencies, (time.process_time() - cpu) / len(latencies), session.run(["Y"], {"X": x})[0]


def served(repo, x, expected):
    ports = [free_port() for _ in range(3)]
    log = open(os.path.join(repo, "tritium.log"), "w")
    args = [BIN, "serve", "--model-repository", repo, "--python", sys.executable]
    args += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
    server = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    results = {}
    try:
        for _ in range(1200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/models/mlp/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            time.sleep(0.1)
        for concurrency in (1, 16):
            clients = [grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}") for _ in range(concurrency)]

            def loop(client):
                tensor = grpcclient.InferInput("X", [1, 512], "FP32")
                tensor.set_data_from_numpy(x)
                latencies, end = [], time.time() + DUR
                while time.time() < end:
                    t = time.perf_counter()
                    result = client.infer("mlp", [tensor])
                    latencies.append(time.perf_counter() - t)
                np.testing.assert_allclose(result.as_numpy("Y"), expected, rtol=1e-4, atol=1e-5)
                return latencies

            loop(clients[0])
            cpu = tree_cpu(server.pid)
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                latencies = [t for ts in pool.map(loop, clients) for t in ts]
            results[concurrency] = (latencies, (tree_cpu(server.pid) - cpu) / len(latencies))
        with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/models/mlp/stats") as r:
            stats = json.loads(r.read())["model_stats"][0]
        results["batches"] = (stats["inference_count"], stats["execution_count"])
    finally:
        server.terminate()
        server.wait()
    return results


def line(name, latencies, cpu):
    rate = len(latencies) / DUR
    p50, p99 = pct(latencies, 50) * 1e6, pct(latencies, 99) * 1e6
    print(f"{name:24} {rate:8.0f} inf/s  p50 {p50:7.0f} us  p99 {p99:7.0f} us  cpu/req {cpu * 1e6:6.0f} us")
    return rate, p50


def main():
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; {DUR} s per case; {THREADS} thread(s)")
    summary = {}
    for run in range(RUNS):
        repo = tempfile.mkdtemp(prefix="tritium-bench-frameworks-")
        try:
            make_repo(repo)
            x = np.random.default_rng(1).standard_normal((1, 512), dtype=np.float32)
            latencies, cpu, expected = floor(os.path.join(repo, "mlp", "1", "model.onnx"), x)
            print(f"run {run + 1}")
            summary.setdefault("floor c1", []).append(line("floor (in-process) c1", latencies, cpu))
            results = served(repo, x, expected)
            for concurrency in (1, 16):
                name = f"tritium grpc c{concurrency}"
                summary.setdefault(name, []).append(line(name, *results[concurrency]))
            print("  inferences, executions:", results["batches"])
        finally:
            shutil.rmtree(repo, ignore_errors=True)
    print("medians (spread) over runs:")
    for name, values in summary.items():
        rates, p50s = [v[0] for v in values], [v[1] for v in values]
        print(
            f"{name:24} {statistics.median(rates):8.0f} inf/s ({min(rates):.0f}-{max(rates):.0f})  "
            f"p50 {statistics.median(p50s):7.0f} us ({min(p50s):.0f}-{max(p50s):.0f})"
        )
    floor_p50 = statistics.median(v[1] for v in summary["floor c1"])
    tritium_p50 = statistics.median(v[1] for v in summary["tritium grpc c1"])
    print(f"tritium's added p50 latency at c1 (client included): {tritium_p50 - floor_p50:.0f} us (target: 50 us)")


if __name__ == "__main__":
    main()
