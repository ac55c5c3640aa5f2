"""`--metrics-config histogram_latencies=true`: Triton's `nv_inference_first_response_histogram_ms`
for decoupled models and decoupled ensembles, with Triton's buckets or a model's own, against a
real server with real stubs, streamed over gRPC with tritonclient."""

import os
import queue
import re
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import write_model

FAMILY = "nv_inference_first_response_histogram_ms"

SLOW_STREAM = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            sender = r.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            time.sleep(0.15)
            for i in range(2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x + i).astype(np.float32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

UNARY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def config(name, decoupled, extra=""):
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return f"""
    name: "{name}"
    backend: "python"
    input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
    instance_group [ {{ count: 1, kind: KIND_CPU }} ]
    {policy}
    {extra}
    """


ENSEMBLE = """
name: "pipeline"
platform: "ensemble"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "slow_stream" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "T" } },
  { model_name: "plain" model_version: -1 input_map { key: "IN" value: "T" } output_map { key: "OUT" value: "Y" } }
] }
"""

CUSTOM_BUCKETS = f"""
model_metrics {{ metric_control [ {{
  metric_identifier {{ family: "{FAMILY}" }}
  histogram_options {{ buckets: [ 10, 50, 100000 ] }}
}} ] }}
"""

MODELS = ["slow_stream", "plain", "custom_buckets", "pipeline"]


def write_repo(repo):
    write_model(repo, "slow_stream", config("slow_stream", True), SLOW_STREAM)
    write_model(repo, "custom_buckets", config("custom_buckets", True, CUSTOM_BUCKETS), SLOW_STREAM)
    write_model(repo, "plain", config("plain", False), UNARY)
    os.makedirs(os.path.join(repo, "pipeline", "1"))
    with open(os.path.join(repo, "pipeline", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE)


def scrape(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    series = {}
    for line in text.splitlines():
        if line.startswith(FAMILY):
            key, value = line.rsplit(" ", 1)
            # As Triton's own test reads them: whole numbers.
            series[key] = int(value)
    return text, series


def stream(srv, model, n):
    q = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        for _ in range(n):
            x = grpcclient.InferInput("X" if model == "pipeline" else "IN", [1], "FP32")
            x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
            client.async_stream_infer(model, [x])
            for _ in range(2):
                result, error = q.get(timeout=30)
                assert error is None, error
    finally:
        client.stop_stream()


def key(model, kind, le=None):
    labels = f'model="{model}",version="1"' + (f',le="{le}"' if le is not None else "")
    return f"{FAMILY}_{kind}{{{labels}}}"


def test_decoupled_models_and_ensembles_get_the_histogram(start):
    write_repo(start.repo)
    srv = start(MODELS, ["--metrics-config", "histogram_latencies=true"])
    _, before = scrape(srv)
    # Every decoupled model has its (empty) series from the start; a unary model has none.
    assert before[key("slow_stream", "count")] == 0
    assert not any('model="plain"' in k for k in before), before
    stream(srv, "slow_stream", 2)
    stream(srv, "pipeline", 1)
    stream(srv, "custom_buckets", 1)
    text, after = scrape(srv)
    assert f"# HELP {FAMILY} Duration from request to first response in milliseconds\n" in text
    assert f"# TYPE {FAMILY} histogram\n" in text
    # The model sleeps 150 ms before its first response: Triton's buckets 100, 500, 2000, 5000.
    assert after[key("slow_stream", "count")] >= 2
    assert after[key("slow_stream", "sum")] >= 2 * 150
    assert after[key("slow_stream", "bucket", 100)] == 0
    assert after[key("slow_stream", "bucket", "+Inf")] == after[key("slow_stream", "count")]
    for le in (500, 2000, 5000):
        assert key("slow_stream", "bucket", le) in after
    # The ensemble with the decoupled step is decoupled: its first response came after the step's.
    assert after[key("pipeline", "count")] == 1
    assert after[key("pipeline", "sum")] >= 150
    # The config's buckets replace Triton's.
    assert after[key("custom_buckets", "bucket", 50)] == 0
    assert after[key("custom_buckets", "bucket", 100000)] == 1
    assert key("custom_buckets", "bucket", 500) not in after


def test_off_by_default(start):
    write_repo(start.repo)
    srv = start(MODELS)
    stream(srv, "slow_stream", 1)
    text, _ = scrape(srv)
    assert FAMILY not in text


@pytest.mark.parametrize("value", ["maybe"])
def test_a_bad_value_stops_the_start(start, value):
    write_repo(start.repo)
    with pytest.raises(RuntimeError) as e:
        start(["plain"], ["--metrics-config", f"histogram_latencies={value}"])
    assert re.search("histogram_latencies", str(e.value)), str(e.value)
