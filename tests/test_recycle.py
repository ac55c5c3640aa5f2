"""Recycling stubs (`stub_max_rss_bytes`, `stub_max_requests`, per model and as server flags):
under load from concurrent tritonclient requests, a model that leaks on purpose is replaced by a
fresh stub, started and ready before the old one drains, and no request fails. `tritium stubs`
shows private memory and growth, `/metrics` counts the recycled stubs by reason."""

import json
import os
import subprocess
import threading
import urllib.request

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import binary, write_model

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""

# Keeps 1 MiB (written, so resident) of every request it serves.
LEAK = """
import numpy as np
import triton_python_backend_utils as pb_utils

KEPT = []


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            KEPT.append(np.ones(1 << 20, dtype=np.uint8))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]))
        return out
"""


def stubs(srv, model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    proc = subprocess.run(
        [binary(), "stubs", model, "--json", "--url", srv.grpc_url], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def metrics(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def load(srv, model, clients=4, requests=150):
    """`clients` threads (half gRPC, half HTTP) send `requests` each; returns the failures."""
    failures = []

    def run(i):
        module = grpcclient if i % 2 == 0 else httpclient
        client = module.InferenceServerClient(srv.grpc_url if module is grpcclient else srv.http_url)
        for n in range(requests):
            inp = module.InferInput("IN", [1], "FP32")
            value = np.array([float(i * 1000 + n)], dtype=np.float32)
            inp.set_data_from_numpy(value)
            try:
                out = client.infer(model, [inp]).as_numpy("OUT")
                if out is None or out[0] != value[0]:
                    failures.append(f"client {i} request {n}: wrong answer {out}")
            except Exception as exc:  # noqa: BLE001 - every failure is counted
                failures.append(f"client {i} request {n}: {exc}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def test_a_leaking_stub_is_recycled_under_load_without_a_failed_request(start):
    # A stub starts at about 40 MiB resident; 100 MiB is passed after some 60 leaked requests.
    extra = 'parameters { key: "stub_max_rss_bytes" value: { string_value: "104857600" } }'
    write_model(start.repo, "leak", CONFIG.format(name="leak", count=1, extra=extra), LEAK)
    srv = start(["leak"])
    [before] = stubs(srv, "leak")
    assert before["pss_bytes"] > 0 and before["uss_bytes"] > 0, before
    assert before["recycled"] == {"rss": 0, "requests": 0}, before
    failures = load(srv, "leak")
    assert failures == [], failures[:5]
    [after] = stubs(srv, "leak")
    assert after["recycled"]["rss"] >= 1, after
    assert after["pid"] != before["pid"] and after["state"] == "ready", after
    # A recycled stub is a fresh one: it holds less than the limit and started from scratch.
    assert after["requests_taken"] < 4 * 150, after
    text = metrics(srv)
    recycled = [
        line for line in text.splitlines() if line.startswith('tritium_stub_recycled_total{model="leak",reason="rss"}')
    ]
    assert recycled and int(recycled[0].split()[-1]) >= 1, text
    log = srv.log_text()
    assert "stub recycled" in log
    # The one instance stayed ready throughout (ready to ready), so capacity never dropped.
    assert "draining" not in log and "crashed" not in log, log[-4000:]


def test_the_request_limit_flag_recycles_each_instance_without_a_failed_request(start):
    model = LEAK.replace("KEPT.append(np.ones(1 << 20, dtype=np.uint8))", "pass")
    write_model(start.repo, "counted", CONFIG.format(name="counted", count=2, extra=""), model)
    srv = start(["counted"], ["--stub-max-requests", "100"])
    before = stubs(srv, "counted")
    failures = load(srv, "counted", clients=4, requests=400)
    assert failures == [], failures[:5]
    after = stubs(srv, "counted")
    assert sum(s["recycled"]["requests"] for s in after) >= 2, after
    assert {s["pid"] for s in after} != {s["pid"] for s in before}, (before, after)
    assert all(s["state"] == "ready" for s in after), after
    # Capacity never dropped: no instance left the ready state (a recycled one goes from ready
    # to ready), and none crashed.
    log = srv.log_text()
    assert "draining" not in log and "crashed" not in log, log[-4000:]
    assert "stub recycled" in log


# A decoupled model whose every request streams three responses from a thread of its own, the
# last one well after `execute` returned: a stub recycled meanwhile must finish them.
STREAMER = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def stream(sender, value):
    for i in range(3):
        time.sleep(0.02)
        out = pb_utils.Tensor("OUT", np.array([value + i], dtype=np.float32))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == 2 else 0
        sender.send(pb_utils.InferenceResponse([out]), flags=flags)


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            value = float(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
            threading.Thread(target=stream, args=(r.get_response_sender(), value)).start()
        return None
"""


def test_a_decoupled_stub_finishes_its_streams_before_it_is_recycled(start):
    import queue

    extra = 'model_transaction_policy { decoupled: true }\nparameters { key: "stub_max_requests" value: { string_value: "15" } }'
    write_model(start.repo, "streamer", CONFIG.format(name="streamer", count=1, extra=extra), STREAMER)
    srv = start(["streamer"])
    failures = []

    def run(i):
        got = queue.Queue()
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        for n in range(30):
            inp = grpcclient.InferInput("IN", [1], "FP32")
            inp.set_data_from_numpy(np.array([float(i * 1000 + n * 10)], dtype=np.float32))
            client.async_stream_infer("streamer", [inp], request_id=f"{i}-{n}")
            values = []
            while len(values) < 3:
                result, error = got.get(timeout=60)
                if error is not None:
                    failures.append(f"stream {i} request {n}: {error}")
                    break
                values.append(float(result.as_numpy("OUT")[0]))
            if len(values) == 3 and values != [i * 1000 + n * 10 + k for k in range(3)]:
                failures.append(f"stream {i} request {n}: {values}")
        client.stop_stream()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [], failures[:5]
    [after] = stubs(srv, "streamer")
    assert after["recycled"]["requests"] >= 1, after
