"""`cargo xtask bench frameworks`: an ONNX MLP (512 -> 2048 -> 512, FP32) served over gRPC at
concurrency 1 and at 16 with dynamic batching, by tritium's onnxruntime backend, against two
references:

1. the floor: the same session called in a loop in one Python process, with the same thread
   settings (target: tritium's added p50 latency at concurrency 1 at most 50 us);
2. Triton 2.51's Python backend running the same session from a `model.py` (what a Triton user
   without the ONNX Runtime backend does; target: tritium >= 1.5x its throughput at concurrency 1
   and >= 2x at 16). `cargo xtask bench frameworks` installs it into `.venv-triton` (with
   onnxruntime) and passes its command in TRITON_COMMAND; without it, this reference is skipped.

Each server serves two copies of the model: `mlp` (max_batch_size 16, no dynamic batching: each
request runs alone, as at concurrency 1 nothing would be batched anyway, and a batcher's queue
delay would only add to the latency) for concurrency 1, and `mlp_batching` (dynamic batching,
max_queue_delay 500 us) for 16. A third, `identity` (a Python model returning its input, tritium
only), measures at concurrency 1 what the client, gRPC and the server cost without the model: it
splits tritium's added latency into that round trip and the rest.

The client is perf_analyzer (C++, `.venv/bin/perf_analyzer` from `cargo xtask setup`), invoked as
`cargo xtask bench serve` does: `--concurrency-range N` over gRPC, requests of batch 1 (X: FP32
[1, 512], random data it makes itself), its stability rule switched off (`--stability-percentage
1000`) so that each case is the merge of its first 3 windows of DUR / 3 seconds each; throughput
and p50/p99 latency are its own. It is the default because tritonclient's Python gRPC client, which
this script used before (still there with CLIENT=python), spends about 225 us of CPU per request
on the same 2 CPUs as the servers: that capped both servers' throughput at concurrency 16 and
inflated both servers' concurrency-1 latency, hiding what the servers themselves do. Before each
case one request through tritonclient warms the model and checks its output against the floor's.

Each run prints throughput, p50/p99 latency, CPU per request of the server's processes (stubs
included: their CPU time from /proc over the whole perf_analyzer run, divided by the requests the
model's statistics count meanwhile), and the client's own CPU per request as a separate column
(perf_analyzer's: its CPU time as a reaped child, over the same requests; with CLIENT=python, this
process's). The client shares the machine's CPUs, so its cost is in the latency and throughput but
not in the server's column. The whole measurement runs RUNS times (2 by default; the two servers'
order alternates between runs), printing the load average before each; the medians and spreads
are printed last, with the ratios and whether each target is met.

Environment: TRITIUM_BIN (default target/release/tritium), TRITIUM_FLAGS (more `tritium serve`
flags, split at whitespace), DUR seconds per case (5), THREADS intra-op threads (1), RUNS (2),
CLIENT (`perf_analyzer`, the default, or `python`: tritonclient's gRPC client in this process, one
thread per concurrent request), PERF_ANALYZER (default .venv/bin/perf_analyzer), TRITON_COMMAND
(JSON: program, args, env; set by xtask).
"""

import concurrent.futures
import glob
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
FLAGS = os.environ.get("TRITIUM_FLAGS", "").split()
TRITON = json.loads(os.environ["TRITON_COMMAND"]) if os.environ.get("TRITON_COMMAND") else None
CLIENT = os.environ.get("CLIENT", "perf_analyzer")
PERF_ANALYZER = os.environ.get("PERF_ANALYZER", os.path.join(ROOT, ".venv", "bin", "perf_analyzer"))
# perf_analyzer's window, as `bench serve` runs it: its stability rule (3 windows within 10% of
# each other) rarely holds on a small, busy machine, and then it prints no result at all; so the
# rule is switched off and each case is the merge of its first 3 windows, DUR seconds in all.
WINDOWS = 3
STABILITY_PERCENT = 1000

# Targets (issue 33).
ADDED_LATENCY_TARGET_US = 50
TRITON_RATIO_TARGETS = {1: 1.5, 16: 2.0}

TENSORS = (
    'input [ { name: "X" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
    'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 512 ] } ]\n'
)
BATCHING = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"

# Triton's reference: the session in a model.py, batches joined and split as a user writes it.
TRITON_MODEL = f"""
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        options = ort.SessionOptions()
        options.intra_op_num_threads = {THREADS}
        options.inter_op_num_threads = 1
        path = os.path.join(os.path.dirname(__file__), "model.onnx")
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        y = self.session.run(["Y"], {{"X": np.concatenate(xs) if len(xs) > 1 else xs[0]}})[0]
        responses, start = [], 0
        for x in xs:
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y[start : start + len(x)])]))
            start += len(x)
        return responses
"""

IDENTITY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
            for r in requests
        ]
"""


def mlp_onnx(path):
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
    onnx.save(model, path)


def write_model(repo, name, config, files):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)
    for filename, make in files.items():
        make(os.path.join(repo, name, "1", filename))


def make_repo(repo, server, onnx_file):
    """The models `server` ("tritium" or "triton") serves, over the same ONNX file."""
    copy = {"model.onnx": lambda path: shutil.copyfile(onnx_file, path)}
    if server == "tritium":
        threads = f'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{THREADS}" }} }}\n'
        head = f'platform: "onnxruntime_onnx"\nmax_batch_size: 16\n{threads}'
        files = copy
        identity = {"model.py": lambda path: open(path, "w").write(IDENTITY_MODEL)}
        write_model(repo, "identity", f'backend: "python"\nmax_batch_size: 16\n{TENSORS}', identity)
    else:
        head = f'backend: "python"\nmax_batch_size: 16\n{TENSORS}'
        files = dict(copy, **{"model.py": lambda path: open(path, "w").write(TRITON_MODEL)})
    write_model(repo, "mlp", head, files)
    write_model(repo, "mlp_batching", head + BATCHING, files)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_cpu(pid):
    """CPU seconds of a process and of its descendants (the stubs, spawned from any thread)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
            for f in glob.glob(f"/proc/{p}/task/*/children"):
                todo.extend(int(c) for c in open(f).read().split())
        except OSError:
            pass
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


def start(server, repo, ports):
    """Starts `server` on `repo` at the HTTP, gRPC and metrics `ports`."""
    log = open(os.path.join(repo, f"{server}.log"), "w")
    if server == "tritium":
        args = [BIN, "serve", "--model-repository", repo, "--python", sys.executable]
        args += ["--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--metrics-port", str(ports[2])]
        args += FLAGS
        env = None
    else:
        args = [TRITON["program"], *TRITON["args"], f"--model-repository={repo}"]
        args += [f"--http-port={ports[0]}", f"--grpc-port={ports[1]}", f"--metrics-port={ports[2]}"]
        env = dict(os.environ, **TRITON["env"])
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)


def stats(port, model):
    """`model`'s statistics from the server at HTTP `port`, retried a few times (a busy server may
    drop the connection)."""
    for attempt in range(5):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats", timeout=10) as r:
                return json.loads(r.read())["model_stats"][0]
        except OSError:
            if attempt == 4:
                raise
            time.sleep(0.2)


def children_cpu():
    """CPU seconds of this process's children that have exited and been waited for: read before
    and after running perf_analyzer to completion, the difference is what it spent (the server, also
    a child, is only reaped after its cases)."""
    t = os.times()
    return t.children_user + t.children_system


def parse_perf(stdout):
    """Throughput and p50/p99 latency (us) from perf_analyzer's first `Client:` block, or None."""
    at = stdout.find("Client:")
    if at < 0:
        return None
    lines = [line.strip() for line in stdout[at:].splitlines()]

    def value(key):
        line = next((line for line in lines if line.startswith(key)), None)
        return float(line[len(key) :].split()[0]) if line else None

    found = [value("Throughput:"), value("p50 latency:"), value("p99 latency:")]
    return None if None in found else tuple(found)


def perf_analyzer(proc, ports, model, concurrency):
    """perf_analyzer on `model` at `concurrency` over gRPC: (throughput, p50 us, p99 us, server CPU
    per request, perf_analyzer's CPU per request), CPU over the whole run and the requests the
    model served meanwhile."""
    window_ms = max(1, round(DUR * 1000 / WINDOWS))
    args = [PERF_ANALYZER, "-m", model, "-i", "grpc", "-u", f"127.0.0.1:{ports[1]}"]
    args += ["--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms)]
    args += ["--stability-percentage", str(STABILITY_PERCENT)]
    served0, cpu0, client0 = int(stats(ports[0], model)["inference_count"]), tree_cpu(proc.pid), children_cpu()
    out = subprocess.run(args, capture_output=True, text=True, timeout=DUR * 10 + 120)
    client = children_cpu() - client0
    cpu, served = tree_cpu(proc.pid) - cpu0, int(stats(ports[0], model)["inference_count"]) - served0
    parsed = parse_perf(out.stdout)
    if out.returncode != 0 or parsed is None or served <= 0:
        tail = "\n".join((out.stdout + out.stderr).splitlines()[-40:])
        raise RuntimeError(f"{' '.join(args)} failed ({out.returncode}; {served} served):\n{tail}")
    return (*parsed, cpu / served, client / served)


def python_client(proc, port, model, concurrency, x, want):
    """tritonclient's gRPC client, one thread and connection per concurrent request, in this
    process: as perf_analyzer's tuple, the client's CPU being this process's."""
    clients = [grpcclient.InferenceServerClient(f"127.0.0.1:{port}") for _ in range(concurrency)]

    def loop(client):
        tensor = grpcclient.InferInput("X", [1, 512], "FP32")
        tensor.set_data_from_numpy(x)
        latencies, end = [], time.time() + DUR
        while time.time() < end:
            t = time.perf_counter()
            result = client.infer(model, [tensor])
            latencies.append(time.perf_counter() - t)
        np.testing.assert_allclose(result.as_numpy("Y"), want, rtol=1e-4, atol=1e-5)
        return latencies

    for client in clients:
        check(client, model, x, want)
    cpu, client_cpu = tree_cpu(proc.pid), time.process_time()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        latencies = [t for ts in pool.map(loop, clients) for t in ts]
    n = len(latencies)
    cpu, client_cpu = tree_cpu(proc.pid) - cpu, time.process_time() - client_cpu
    return n / DUR, pct(latencies, 50) * 1e6, pct(latencies, 99) * 1e6, cpu / n, client_cpu / n


def check(client, model, x, want):
    """One request: warms `model` up and checks its output."""
    tensor = grpcclient.InferInput("X", [1, 512], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer(model, [tensor]).as_numpy("Y"), want, rtol=1e-4, atol=1e-5)


def served(server, repo, x, expected):
    """{case: (throughput, p50 us, p99 us, server CPU per request, client CPU per request)} of
    `server` on `repo`, and (inferences, executions) of the batching model."""
    ports = [free_port() for _ in range(3)]
    proc = start(server, repo, ports)
    models = ["mlp", "mlp_batching"] + (["identity"] if server == "tritium" else [])
    results = {}
    try:
        for model in models:
            deadline = time.time() + 300
            while True:
                try:
                    url = f"http://127.0.0.1:{ports[0]}/v2/models/{model}/ready"
                    with urllib.request.urlopen(url, timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"{server} did not get {model} ready; see {repo}/{server}.log")
                time.sleep(0.1)
        cases = [("mlp", 1, expected), ("mlp_batching", 16, expected)]
        if server == "tritium":
            cases.append(("identity", 1, x))
        for model, concurrency, want in cases:
            if CLIENT == "python":
                results[(model, concurrency)] = python_client(proc, ports[1], model, concurrency, x, want)
            else:
                check(grpcclient.InferenceServerClient(f"127.0.0.1:{ports[1]}"), model, x, want)
                results[(model, concurrency)] = perf_analyzer(proc, ports, model, concurrency)
        batching = stats(ports[0], "mlp_batching")
        results["batches"] = (int(batching["inference_count"]), int(batching["execution_count"]))
    finally:
        proc.terminate()
        proc.wait()
    return results


def line(name, rate, p50, p99, cpu, client=None):
    client = "     -" if client is None else f"{client * 1e6:6.0f}"
    print(
        f"  {name:26} {rate:8.0f} inf/s  p50 {p50:7.0f} us  p99 {p99:7.0f} us  cpu/req {cpu * 1e6:6.0f} us"
        f"  client cpu/req {client} us"
    )
    return rate, p50


def spread(values):
    return f"{statistics.median(values):8.0f} ({min(values):.0f}-{max(values):.0f})"


def main():
    if CLIENT not in ("perf_analyzer", "python"):
        sys.exit(f"CLIENT={CLIENT!r}: expected perf_analyzer (the default) or python")
    if CLIENT == "perf_analyzer" and not os.access(PERF_ANALYZER, os.X_OK):
        sys.exit(
            f"{PERF_ANALYZER} is missing (perf_analyzer needs libb64-0d; run `cargo xtask setup`), "
            "or run with CLIENT=python for tritonclient's Python client"
        )
    print(f"{os.cpu_count()} CPUs; {DUR} s per case; {THREADS} intra-op thread(s); {RUNS} runs")
    if CLIENT == "python":
        print("client: tritonclient's Python gRPC client in this process (its CPU per request caps c16 and adds to c1)")
    else:
        print(f"client: {PERF_ANALYZER} (gRPC; {WINDOWS} windows of {DUR / WINDOWS:.2f} s per case)")
    if TRITON is None:
        print("TRITON_COMMAND is not set (run `cargo xtask bench frameworks`): Triton's reference is skipped")
    summary = {}
    for run in range(RUNS):
        repo = tempfile.mkdtemp(prefix="tritium-bench-frameworks-")
        try:
            onnx_file = os.path.join(repo, "mlp.onnx")
            mlp_onnx(onnx_file)
            x = np.random.default_rng(1).standard_normal((1, 512), dtype=np.float32)
            print(f"run {run + 1}: load average {open('/proc/loadavg').read().split()[0]}")
            latencies, cpu, expected = floor(onnx_file, x)
            name = "floor (in-process) c1"
            p50, p99 = pct(latencies, 50) * 1e6, pct(latencies, 99) * 1e6
            summary.setdefault(name, []).append(line(name, len(latencies) / DUR, p50, p99, cpu))
            servers = ["tritium"] + (["triton"] if TRITON else [])
            for server in servers if run % 2 == 0 else servers[::-1]:
                os.makedirs(os.path.join(repo, server))
                make_repo(os.path.join(repo, server), server, onnx_file)
                results = served(server, os.path.join(repo, server), x, expected)
                for key in [k for k in results if k != "batches"]:
                    model, concurrency = key
                    name = f"{server} {'identity ' if model == 'identity' else ''}grpc c{concurrency}"
                    summary.setdefault(name, []).append(line(name, *results[key]))
                print(f"  {server} c16: inferences, executions {results['batches']}")
        finally:
            shutil.rmtree(repo, ignore_errors=True)
    print(f"medians (min-max) over {RUNS} runs:")
    for name, values in summary.items():
        print(f"  {name:26} {spread([v[0] for v in values])} inf/s  p50 {spread([v[1] for v in values])} us")
    floor_p50 = statistics.median(v[1] for v in summary["floor (in-process) c1"])
    tritium_p50 = statistics.median(v[1] for v in summary["tritium grpc c1"])
    identity_p50 = statistics.median(v[1] for v in summary["tritium identity grpc c1"])
    added = tritium_p50 - floor_p50
    print(
        f"tritium's added p50 latency at c1: {added:.0f} us (target {ADDED_LATENCY_TARGET_US} us: "
        f"{'met' if added <= ADDED_LATENCY_TARGET_US else 'missed'}); of it, the client, gRPC and the server "
        f"without the model (the identity model's p50): {identity_p50:.0f} us; the rest: {added - identity_p50:.0f} us"
    )
    if TRITON:
        for concurrency, target in TRITON_RATIO_TARGETS.items():
            ours = statistics.median(v[0] for v in summary[f"tritium grpc c{concurrency}"])
            theirs = statistics.median(v[0] for v in summary[f"triton grpc c{concurrency}"])
            ratio = ours / theirs
            print(
                f"tritium / Triton (Python backend) throughput at c{concurrency}: {ratio:.2f}x "
                f"(target {target}x: {'met' if ratio >= target else 'missed'})"
            )


if __name__ == "__main__":
    main()
