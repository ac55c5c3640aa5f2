"""Metrics that model code registers with `prometheus_client` appear on /metrics: gathered from every
stub at scrape time, labelled with model, version and instance, one family per name; a stub killed
with SIGKILL comes back counting from zero (and tritium_stub_restarts_total says so); a stub busy in
`execute` still answers, and a stopped one never holds up the scrape beyond the timeout."""

import json
import os
import re
import signal
import threading
import time
import urllib.request

import numpy as np
import prometheus_client  # noqa: F401 - the models import it: missing, this file fails (never skips)
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model

CONFIG = """
name: "promc"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

MODEL = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils
from prometheus_client import Counter, Gauge, Histogram

REQUESTS_TOTAL = Counter("request_count", "Total requests", ["path"])
LAST_X = Gauge("last_x", "The last X seen")
X_SEEN = Histogram("x_seen", "X values", buckets=[1.0, 10.0])


class TritonPythonModel:
    def initialize(self, args):
        self.instance = args["model_instance_name"]

    def execute(self, requests):
        out = []
        for r in requests:
            x = float(pb_utils.get_input_tensor_by_name(r, "X").as_numpy()[0])
            REQUESTS_TOTAL.labels(path="infer").inc()
            LAST_X.set(x)
            X_SEEN.observe(x)
            if x == 999:
                time.sleep(5)
            out.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                        pb_utils.Tensor("INSTANCE", np.array([self.instance.encode()], dtype=np.object_)),
                    ]
                )
            )
        return out
"""

# A model that never imports prometheus_client: nothing is gathered from it and nothing fails.
PLAIN = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())]) for r in requests]
"""


def metrics(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=30) as r:
        return r.read().decode()


def samples(text, name):
    """{frozenset(labels): value} of every sample called `name`."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            out[labels] = float(line.rsplit(" ", 1)[1])
    return out


def value(text, name, **labels):
    want = set(labels.items())
    found = [v for ls, v in samples(text, name).items() if want <= ls]
    assert len(found) == 1, f"{name} {labels}: {found} in\n{text}"
    return found[0]


def infer(url, x):
    c = httpclient.InferenceServerClient(url, network_timeout=60)
    inp = httpclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([x], dtype=np.float32))
    r = c.infer("promc", [inp])
    return int(r.as_numpy("PID")[0]), r.as_numpy("INSTANCE")[0].decode()


@pytest.fixture
def srv(start):
    write_model(start.repo, "promc", CONFIG, MODEL)
    write_model(
        start.repo,
        "plain",
        """
        name: "plain"
        backend: "python"
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """,
        PLAIN,
    )
    # What some guides show, which is not Triton's configuration: a load error pointing the way.
    write_model(
        start.repo,
        "guide_metrics",
        """
        name: "guide_metrics"
        backend: "python"
        model_metrics {
          enable: true
          counters [ "requests" ]
        }
        """,
        PLAIN,
    )
    return start(["promc", "plain"])


def test_model_metrics_from_guides_fails_its_load_with_the_supported_ways(srv):
    req = urllib.request.Request(f"http://{srv.http_url}/v2/repository/index", data=b"{}", method="POST")
    deadline = time.time() + 30
    while True:
        with urllib.request.urlopen(req, timeout=10) as r:
            entry = {m["name"]: m for m in json.loads(r.read())}["guide_metrics"]
        if entry.get("state") == "UNAVAILABLE" or time.time() > deadline:
            break
        time.sleep(0.1)
    reason = entry.get("reason", "")
    assert entry.get("state") == "UNAVAILABLE", entry
    assert "config.pbtxt:5:" in reason and "field 'enable' not found for message 'inference.ModelMetrics'" in reason, (
        reason
    )
    assert "pb_utils.MetricFamily" in reason and "prometheus_client" in reason, reason


def test_counters_gauges_and_histograms_of_every_instance(srv):
    seen = {}
    for x in [0.5, 5.0, 50.0, 0.5, 5.0, 50.0, 2.0, 3.0]:
        pid, instance = infer(srv.http_url, x)
        seen.setdefault(instance, []).append(x)
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("X", [1], "FP32")
    inp.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    g.infer("plain", [inp])
    text = metrics(srv)
    assert sorted(seen) == ["promc_0_0", "promc_0_1"], f"both instances served: {seen}"

    # One HELP and one TYPE per family, however many instances export it.
    for family, kind in [("request_count_total", "counter"), ("last_x", "gauge"), ("x_seen", "histogram")]:
        assert text.count(f"# TYPE {family} {kind}\n") == 1, text
        assert text.count(f"# HELP {family} ") == 1, text
    # The process, platform and GC collectors and the _created samples are left out.
    assert "process_cpu_seconds_total" not in text and "python_gc_" not in text
    assert "_created" not in text
    for instance, xs in seen.items():
        labels = {"model": "promc", "version": "1", "instance": instance}
        assert value(text, "request_count_total", path="infer", **labels) == len(xs)
        assert value(text, "last_x", **labels) == xs[-1]
        assert value(text, "x_seen_count", **labels) == len(xs)
        assert value(text, "x_seen_sum", **labels) == pytest.approx(sum(xs))
        assert value(text, "x_seen_bucket", le="1", **labels) == sum(x <= 1 for x in xs)
        assert value(text, "x_seen_bucket", le="10", **labels) == sum(x <= 10 for x in xs)
        assert value(text, "x_seen_bucket", le="+Inf", **labels) == len(xs)
    # Every series carries exactly model, version, instance and the model's own labels.
    for labels in samples(text, "request_count_total"):
        assert {k for k, _ in labels} == {"model", "version", "instance", "path"}
    assert not any(("model", "plain") in ls for ls in samples(text, "last_x"))
    # The server's own metrics are still there, once.
    assert text.count("# TYPE nv_inference_count counter\n") == 1


def test_a_killed_stub_starts_from_zero_and_its_restart_is_counted(srv):
    victim = None
    for _ in range(6):
        pid, instance = infer(srv.http_url, 1.0)
        if instance == "promc_0_0":
            victim = pid
    assert victim, "promc_0_0 served a request"
    text = metrics(srv)
    before = value(text, "request_count_total", instance="promc_0_0")
    other = value(text, "request_count_total", instance="promc_0_1")
    assert before >= 1
    assert value(text, "tritium_stub_restarts_total", instance="promc_0_0") == 0

    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 60
    while True:
        text = metrics(srv)
        restarted = value(text, "tritium_stub_restarts_total", instance="promc_0_0") >= 1
        # The new stub's histogram (made at import) is on the page once it answers a scrape.
        answered = any(("instance", "promc_0_0") in ls for ls in samples(text, "x_seen_count"))
        if restarted and answered:
            break
        assert time.time() < deadline, f"promc_0_0 did not come back:\n{text}"
        time.sleep(0.1)
    # The new stub has served nothing yet: its counter is not on the page (a labelled child appears
    # at its first inc), its histogram is empty, and the other instance kept its counts.
    assert not any(("instance", "promc_0_0") in ls for ls in samples(text, "request_count_total")), text
    assert value(text, "x_seen_count", instance="promc_0_0") == 0
    assert value(text, "request_count_total", instance="promc_0_1") == other
    for _ in range(20):
        pid, instance = infer(srv.http_url, 1.0)
        if instance == "promc_0_0":
            assert pid != victim
            break
    text = metrics(srv)
    assert value(text, "request_count_total", instance="promc_0_0") == 1, "the restarted stub counts from zero"


def test_a_long_execute_does_not_delay_the_scrape(srv):
    infer(srv.http_url, 1.0)
    infer(srv.http_url, 1.0)
    done = []
    slow = threading.Thread(target=lambda: done.append(infer(srv.http_url, 999.0)))
    slow.start()
    time.sleep(1.0)  # the 5 s execute is running
    t0 = time.time()
    text = metrics(srv)
    took = time.time() - t0
    assert not done, "the scrape happened while execute slept"
    assert took < 1.0, f"the scrape took {took:.2f} s while one instance was in a 5 s execute"
    # The sleeping instance answered from its metrics thread: both instances are on the page, and
    # the sleeping one shows the request it is executing.
    assert value(text, "last_x", instance="promc_0_0") in (0.0, 1.0, 999.0)
    assert value(text, "last_x", instance="promc_0_1") in (0.0, 1.0, 999.0)
    assert 999.0 in (value(text, "last_x", instance="promc_0_0"), value(text, "last_x", instance="promc_0_1"))
    slow.join(30)
    assert done


def test_a_stopped_stub_never_holds_up_the_scrape(srv):
    pid, instance = infer(srv.http_url, 1.0)
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        text = metrics(srv)
        took = time.time() - t0
        assert took < 2.5, f"the scrape waited {took:.2f} s for a stopped stub"
        assert not any(("instance", instance) in ls for ls in samples(text, "last_x")), "a stopped stub has no series"
        other = "promc_0_1" if instance == "promc_0_0" else "promc_0_0"
        assert "# TYPE nv_inference_count counter" in text
        # Its unanswered request is not repeated: the next scrape does not wait at all.
        t0 = time.time()
        metrics(srv)
        assert time.time() - t0 < 0.5
    finally:
        os.kill(pid, signal.SIGCONT)
    assert other
    with open(srv.log_path) as f:
        log = f.read()
    assert log.count("did not answer within") == 1, log
