"""Statistics and /metrics equal what was sent; custom metrics from model code appear on /metrics; a
loaded model reports its load duration and its series leave /metrics when it is unloaded."""

import os
import re
import shutil
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT, Server, write_model
from tritonclient.utils import InferenceServerException


def metrics(server):
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def value(text, name, **labels):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in /metrics:\n{text}")


def send(client, module, x, shape=(1,)):
    inp = module.InferInput("X", list(shape), "FP32")
    inp.set_data_from_numpy(np.full(shape, x, dtype=np.float32))
    return client.infer("metered", [inp])


def test_statistics_and_metrics_count_what_was_sent(server):
    h = httpclient.InferenceServerClient(server.http_url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    ok = 0
    for i in range(5):
        send(h, httpclient, float(i))
        send(g, grpcclient, float(i))
        ok += 2
    model_errors = 0
    for _ in range(2):
        with pytest.raises(InferenceServerException):
            send(h, httpclient, -1.0)
        model_errors += 1
    rejected = 0
    for _ in range(3):
        with pytest.raises(InferenceServerException):
            send(g, grpcclient, 1.0, shape=(2,))
        rejected += 1

    stats = h.get_inference_statistics("metered")["model_stats"][0]
    s = stats["inference_stats"]
    assert stats["version"] == "1"
    assert s["success"]["count"] == ok
    assert s["fail"]["count"] == model_errors + rejected
    assert stats["execution_count"] == ok + model_errors
    assert stats["inference_count"] == ok
    assert s["queue"]["count"] == ok and s["compute_infer"]["count"] == ok and s["compute_infer"]["ns"] > 0
    assert stats["last_inference"] > 0
    gstats = g.get_inference_statistics("metered", as_json=True)["model_stats"][0]
    assert int(gstats["inference_stats"]["success"]["count"]) == ok

    text = metrics(server)
    labels = {"model": "metered", "version": "1"}
    assert value(text, "nv_inference_request_success", **labels) == ok
    assert value(text, "nv_inference_request_failure", reason="BACKEND", **labels) == model_errors
    assert value(text, "nv_inference_request_failure", reason="REJECTED", **labels) == rejected
    assert value(text, "nv_inference_count", **labels) == ok
    assert value(text, "nv_inference_exec_count", **labels) == ok + model_errors
    assert value(text, "nv_inference_compute_infer_duration_us", **labels) > 0
    assert value(text, "nv_inference_queue_duration_us", **labels) >= 0
    assert value(text, "nv_inference_pending_request_count", **labels) == 0
    assert value(text, "tritium_stub_state", model="metered", state="ready") == 1
    assert value(text, "tritium_stub_restarts_total", model="metered") == 0
    assert value(text, "tritium_stub_impossible_transitions_total", model="metered") == 0
    assert value(text, "tritium_stub_rss_bytes", model="metered") > 1 << 20
    assert value(text, "tritium_stub_shm_bytes", model="metered") > 0


def test_custom_metrics_from_model_code(server):
    h = httpclient.InferenceServerClient(server.http_url)
    before = metrics(server)
    try:
        start = value(before, "metered_requests_total", model="metered")
    except AssertionError:
        start = 0.0
    result = send(h, httpclient, 5.0)
    count = result.as_numpy("COUNT")[0]
    assert count == start + 1, "value() reads the counter the model increments"
    text = metrics(server)
    assert "# TYPE metered_requests_total counter" in text
    assert "# HELP metered_requests_total Requests seen by the metered model" in text
    assert value(text, "metered_requests_total", model="metered", instance="metered_0") == count
    assert value(text, "metered_last_x", model="metered") == 5.0
    assert value(text, "metered_x_bucket", model="metered", le="10") >= 1
    assert value(text, "metered_x_count", model="metered") >= 1


def test_a_refused_metric_call_reads_as_tritons(start):
    """The texts Triton 2.51 gives model code, checked side by side: the operation, the instance,
    then the server's reason (whose first words are Triton's)."""
    write_model(
        start.repo,
        "metric_errors",
        """
        backend: "python"
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "E" data_type: TYPE_STRING dims: [ -1 ] } ]
        """,
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.family = pb_utils.MetricFamily(name="c_total", description="d", kind=pb_utils.MetricFamily.COUNTER)
                self.hist = pb_utils.MetricFamily(name="h", description="d", kind=pb_utils.MetricFamily.HISTOGRAM)

            def execute(self, requests):
                calls = [
                    lambda: self.family.Metric().set(1.0),
                    lambda: self.hist.Metric(labels={}, buckets=[2.0, 1.0]),
                    lambda: pb_utils.MetricFamily(name="bad name", description="", kind=pb_utils.MetricFamily.GAUGE),
                ]
                texts = []
                for call in calls:
                    try:
                        call()
                        texts.append("no error")
                    except pb_utils.TritonModelException as e:
                        texts.append(str(e))
                return [pb_utils.InferenceResponse([pb_utils.Tensor("E", np.array(texts, dtype=np.object_))])
                        for _ in requests]
        """,
    )
    srv = start(["metric_errors"])
    c = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], np.float32))
    texts = [t.decode() for t in c.infer("metric_errors", [x]).as_numpy("E")]
    via = "Failed to process the request for model 'metric_errors_0', message: "
    assert texts[0] == f"Failed to set metric value: {via}TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    assert texts[1].startswith(f"Error when creating Metric: {via}Bucket Boundaries must be strictly sorted")
    assert texts[2].startswith(f"Error when creating MetricFamily: {via}Invalid metric name")


def series_of(text, model):
    """The sample lines of /metrics that carry `model="<model>"`."""
    return [line for line in text.splitlines() if not line.startswith("#") and f'model="{model}"' in line]


def test_load_duration_and_series_vanish_after_unload(tmp_path):
    repo = tmp_path / "repo"
    for name in ("metered", "echo"):
        shutil.copytree(os.path.join(ROOT, "tests/models", name), str(repo / name))
    srv = Server(str(repo), str(tmp_path / "tritium.log"), ["--model-control-mode", "explicit", "--load-model", "echo"])
    try:
        srv.wait_models(["echo"])
        h = httpclient.InferenceServerClient(srv.http_url)
        assert series_of(metrics(srv), "metered") == []

        h.load_model("metered")
        send(h, httpclient, 3.0)
        text = metrics(srv)
        labels = {"model": "metered", "version": "1"}
        assert "# TYPE nv_model_load_duration_secs gauge" in text
        assert value(text, "nv_model_load_duration_secs", **labels) > 0
        assert value(text, "nv_model_load_duration_secs", model="echo", version="1") > 0
        assert value(text, "nv_inference_request_success", **labels) == 1
        assert value(text, "tritium_stub_state", model="metered", state="ready") == 1
        assert value(text, "metered_requests_total", model="metered") == 1

        h.unload_model("metered")
        text = metrics(srv)
        assert series_of(text, "metered") == [], text
        assert "metered_requests_total" not in text, text
        # The other model's series stay.
        assert value(text, "nv_inference_request_success", model="echo", version="1") == 0
        assert value(text, "tritium_stub_state", model="echo", state="ready") == 1

        # Loaded again: the series come back, counting from zero.
        h.load_model("metered")
        text = metrics(srv)
        assert value(text, "nv_inference_request_success", **labels) == 0
        assert value(text, "nv_model_load_duration_secs", **labels) > 0
    finally:
        assert srv.stop() == 0, srv.log_text()
    # Stubs of models that hold metric families exit by themselves once finalized: they once
    # asked the server to drop the families after FinalizeDone, waited for a reply that never
    # came, and were killed at the exit timeout (30 s each, at every unload and shutdown).
    log = srv.log_text()
    assert "exit timeout reached" not in log and "did not exit" not in log, log


def test_summary_latencies_give_quantiles_and_counter_latencies_can_be_turned_off(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "tests/models", "metered"), str(repo / "metered"))
    flags = [
        "--metrics-config=summary_latencies=true",
        "--metrics-config=counter_latencies=false",
        "--metrics-config=summary_quantiles=0.5:0.05,0.99:0.001",
    ]
    srv = Server(str(repo), str(tmp_path / "tritium.log"), flags)
    try:
        srv.wait_models(["metered"])
        labels = {"model": "metered", "version": "1"}
        text = metrics(srv)
        # Nothing observed yet: the count is 0 and the quantiles NaN, as prometheus-cpp reports.
        assert value(text, "nv_inference_request_summary_us_count", **labels) == 0
        assert np.isnan(value(text, "nv_inference_request_summary_us", quantile="0.5", **labels))
        h = httpclient.InferenceServerClient(srv.http_url)
        for i in range(7):
            send(h, httpclient, float(i))
        text = metrics(srv)
        assert "# TYPE nv_inference_request_summary_us summary" in text
        for family in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
            name = f"nv_inference_{family}_summary_us"
            assert value(text, name + "_count", **labels) == 7, family
            median = value(text, name, quantile="0.5", **labels)
            p99 = value(text, name, quantile="0.99", **labels)
            assert 0 <= median <= p99, (family, median, p99)
            assert value(text, name + "_sum", **labels) >= 7 * median / 2
        # Only the configured quantiles, and no cumulative duration counters.
        assert 'quantile="0.9"' not in text
        assert "nv_inference_request_duration_us" not in text
        assert "nv_inference_compute_infer_duration_us" not in text
        assert value(text, "nv_inference_request_success", **labels) == 7
        # A model without the response cache has no cache summaries.
        assert "nv_cache_hit_summary_per_model" not in text
    finally:
        srv.stop()


def test_host_gauges_are_tritons_and_go_with_allow_cpu_metrics_false(tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "tests/models", "metered"), str(repo / "metered"))
    srv = Server(str(repo), str(tmp_path / "on.log"), ["--metrics-interval-ms=100"])
    try:
        srv.wait_models(["metered"])
        metrics(srv)
        # Busy for more than half an interval, so that the next scrape takes a new sample.
        end = time.monotonic() + 0.2
        while time.monotonic() < end:
            pass
        text = metrics(srv)
        assert "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n" in text
        assert 0 < value(text, "nv_cpu_utilization") <= 1
        with open("/proc/meminfo") as f:
            total = int(f.readline().split()[1]) * 1024
        assert value(text, "nv_cpu_memory_total_bytes") == total
        assert 0 < value(text, "nv_cpu_memory_used_bytes") < total
    finally:
        srv.stop()
    srv = Server(str(repo), str(tmp_path / "off.log"), ["--allow-cpu-metrics=false"])
    try:
        srv.wait_models(["metered"])
        assert "nv_cpu_" not in metrics(srv)
    finally:
        srv.stop()
