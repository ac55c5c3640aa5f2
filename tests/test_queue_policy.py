"""Triton's queue policies end to end, over HTTP and gRPC with tritonclient: a full queue
rejects the overflow with UNAVAILABLE, a queue timeout rejects a request still waiting, higher
priorities run first, and the failures show in the statistics and metrics."""

import os
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import Server
from test_faults import wait_for, write_model
from tritonclient.utils import InferenceServerException

# Sleeps MS milliseconds; ORDER says how many executions this instance started before it;
# a file per execution tells the test that an instance is busy.
MODEL = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

STARTED = {started!r}

class TritonPythonModel:
    def initialize(self, args):
        self.order = 0

    def execute(self, requests):
        out = []
        for r in requests:
            self.order += 1
            open(os.path.join(STARTED, str(os.getpid()) + "-" + str(self.order)), "w").close()
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0][0])
            time.sleep(ms / 1000.0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("ORDER", np.array([[self.order]], dtype=np.int64))]))
        return out
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 1
input [ {{ name: "MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "ORDER" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
dynamic_batching {{ {batching} }}
"""

MODELS = {
    "bounded": "default_queue_policy { max_queue_size: 2 }",
    "expiring": "default_queue_policy { default_timeout_microseconds: 100000 }",
    "overridable": "default_queue_policy { default_timeout_microseconds: 60000000 allow_timeout_override: true }",
    "prioritized": "priority_levels: 2 default_priority_level: 2",
}

BLOCK_MS = 2500


@pytest.fixture(scope="module")
def queued(tmp_path_factory):
    base = tmp_path_factory.mktemp("queue_policy")
    repo, started = str(base / "repo"), str(base / "started")
    os.makedirs(started)
    for name, batching in MODELS.items():
        write_model(repo, name, MODEL.format(started=started), CONFIG.format(name=name, batching=batching))
    srv = Server(repo, str(base / "tritium.log"))
    try:
        srv.wait_models(list(MODELS))
        srv.started = started
        yield srv
    finally:
        code = srv.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{srv.log_text()}"


def client_for(server, protocol):
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    return module, module.InferenceServerClient(url)


def infer(server, protocol, model, ms=0, **kwargs):
    module, c = client_for(server, protocol)
    inp = module.InferInput("MS", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[ms]], dtype=np.int32))
    return int(c.infer(model, [inp], **kwargs).as_numpy("ORDER")[0][0])


def unavailable(protocol):
    return "503" if protocol == "http" else "StatusCode.UNAVAILABLE"


class Blocked:
    """Keeps the model's one instance busy for BLOCK_MS from a thread, and waits until it is."""

    def __init__(self, server, protocol, model):
        before = len(os.listdir(server.started))
        self.thread = threading.Thread(target=infer, args=(server, protocol, model, BLOCK_MS))
        self.thread.start()
        wait_for(lambda: len(os.listdir(server.started)) > before, what="the blocking request to start")

    def join(self):
        self.thread.join(60)


def failures(server, model):
    h = httpclient.InferenceServerClient(server.http_url)
    return h.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["fail"]["count"]


def rejected_metric(server, model):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if (
            line.startswith("nv_inference_request_failure{")
            and f'model="{model}"' in line
            and 'reason="REJECTED"' in line
        ):
            return int(float(line.rsplit(" ", 1)[1]))
    return 0


def infer_concurrently(server, protocol, model, count):
    """Sends `count` requests at once from threads; each result is the answer or the exception."""
    results = [None] * count

    def one(i):
        try:
            results[i] = infer(server, protocol, model)
        except InferenceServerException as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_full_queue_rejects_the_overflow_with_unavailable(queued, protocol):
    failed_before = failures(queued, "bounded")
    metric_before = rejected_metric(queued, "bounded")
    blocked = Blocked(queued, protocol, "bounded")
    results = infer_concurrently(queued, protocol, "bounded", 5)
    blocked.join()
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 3, results
    for e in errors:
        assert e.status() == unavailable(protocol), e
        assert e.message().startswith("[request id: <id_unknown>] Exceeds maximum queue size"), e
        assert "max_queue_size" in e.message()
    assert sum(isinstance(r, int) for r in results) == 2
    assert failures(queued, "bounded") == failed_before + 3
    assert rejected_metric(queued, "bounded") == metric_before + 3


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_that_waits_past_its_timeout_is_rejected(queued, protocol):
    failed_before = failures(queued, "expiring")
    blocked = Blocked(queued, protocol, "expiring")
    start = time.time()
    with pytest.raises(InferenceServerException) as e:
        infer(queued, protocol, "expiring")
    # Rejected while the instance is still busy, not when it frees up.
    assert time.time() - start < BLOCK_MS / 1000.0
    blocked.join()
    assert e.value.status() == unavailable(protocol)
    assert e.value.message() == "Request timeout expired"
    assert failures(queued, "expiring") == failed_before + 1


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_request_timeout_shortens_an_allowed_default(queued, protocol):
    blocked = Blocked(queued, protocol, "overridable")
    with pytest.raises(InferenceServerException) as e:
        infer(queued, protocol, "overridable", timeout=100000)
    blocked.join()
    assert e.value.message() == "Request timeout expired"
    # Without its own timeout the request waits for the instance and runs.
    assert infer(queued, protocol, "overridable") > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_higher_priority_runs_before_an_earlier_lower_one(queued, protocol):
    blocked = Blocked(queued, protocol, "prioritized")
    orders = {}

    def one(name, priority):
        orders[name] = infer(queued, protocol, "prioritized", priority=priority)

    low = threading.Thread(target=one, args=("low", 2))
    low.start()
    time.sleep(0.3)
    high = threading.Thread(target=one, args=("high", 1))
    high.start()
    for t in (low, high):
        t.join(60)
    blocked.join()
    assert orders["high"] < orders["low"], orders


@pytest.fixture(scope="module")
def flag_bounded(tmp_path_factory):
    base = tmp_path_factory.mktemp("max_queue_size")
    repo, started = str(base / "repo"), str(base / "started")
    os.makedirs(started)
    plain = CONFIG.replace("dynamic_batching {{ {batching} }}", "")
    write_model(repo, "plain", MODEL.format(started=started), plain.format(name="plain"))
    srv = Server(repo, str(base / "tritium.log"), ["--max-queue-size", "1"])
    try:
        srv.wait_models(["plain"])
        srv.started = started
        yield srv
    finally:
        code = srv.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{srv.log_text()}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_server_flag_bounds_a_model_without_a_queue_policy(flag_bounded, protocol):
    blocked = Blocked(flag_bounded, protocol, "plain")
    results = infer_concurrently(flag_bounded, protocol, "plain", 3)
    blocked.join()
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) == 2, results
    for e in errors:
        assert e.status() == unavailable(protocol), e
        assert "Exceeds maximum queue size: 1 requests" in e.message(), e
        assert "--max-queue-size" in e.message(), e
