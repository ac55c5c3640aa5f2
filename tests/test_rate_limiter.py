"""Triton's rate limiter (`--rate-limit execution_count`): instances wait for the resources their
`instance_group { rate_limiter }` names, across models; counts come from the configs or
`--rate-limit-resource`; a count that cannot run an instance fails its load with Triton's text.

Each model's `execute` writes `<dir>/<model>.started` and then holds on until the test writes
`<dir>/<model>.go`, so which execution holds a resource is decided by the test, not by timing."""

import concurrent.futures
import os
import re
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import binary, write_model
from tritonclient.utils import InferenceServerException

MODEL = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.dir = config["parameters"]["dir"]["string_value"]

    def execute(self, requests):
        start = time.monotonic()
        open(os.path.join(self.dir, self.name + ".started"), "a").close()
        go = os.path.join(self.dir, self.name + ".go")
        deadline = start + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        end = time.monotonic()
        span = np.array([start, end], dtype=np.float64)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("SPAN", span)]) for _ in requests]
"""


def config(name, directory, limiter=""):
    return f"""
        name: "{name}"
        backend: "python"
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU {limiter} }} ]
        parameters {{ key: "dir" value {{ string_value: "{directory}" }} }}
        """


def needs(resources, priority=1):
    items = ", ".join(f'{{ name: "{n}" count: {c}{" global: true" if g else ""} }}' for n, c, g in resources)
    return f"rate_limiter {{ resources [ {items} ] priority: {priority} }}"


def infer(srv, model):
    client = httpclient.InferenceServerClient(srv.http_url, network_timeout=120)
    x = httpclient.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    return client.infer(model, [x]).as_numpy("SPAN")


def wait_for(path, what):
    deadline = time.time() + 60
    while not os.path.exists(path):
        assert time.time() < deadline, f"{what} never started"
        time.sleep(0.01)


def metric(srv, name, model):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(rf'^{name}{{instance="{model}_0_0",model="{model}",version="1"}} (\d+)$', text, re.M)
    return None if m is None else int(m.group(1))


@pytest.fixture
def workdir(tmp_path):
    d = tmp_path / "signals"
    d.mkdir()
    return str(d)


@pytest.mark.parametrize("run_to_completion", ["true", "false"], ids=["async-lanes", "worker-threads"])
def test_instances_of_two_models_take_turns_with_one_resource(start, workdir, run_to_completion):
    for name in ("a", "b"):
        write_model(start.repo, name, config(name, workdir, needs([("R", 1, False)])), MODEL)
    write_model(start.repo, "free", config("free", workdir), MODEL)
    open(os.path.join(workdir, "free.go"), "w").close()
    flags = ["--rate-limit=execution_count", f"--run-to-completion={run_to_completion}"]
    srv = start(["a", "b", "free"], flags)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        a = pool.submit(infer, srv, "a")
        wait_for(os.path.join(workdir, "a.started"), "a's execute")
        # An instance that needs no resource runs while `a` holds R (nothing waits ahead of it).
        free = pool.submit(infer, srv, "free").result(timeout=60)
        assert free[1] >= free[0]
        b = pool.submit(infer, srv, "b")
        # `b` needs the R that `a` holds: it waits, however long `a` takes.
        time.sleep(0.5)
        assert not os.path.exists(os.path.join(workdir, "b.started")), "b ran while a held R"
        assert not b.done()
        open(os.path.join(workdir, "b.go"), "w").close()
        open(os.path.join(workdir, "a.go"), "w").close()
        a_span, b_span = a.result(timeout=60), b.result(timeout=60)
    assert b_span[0] >= a_span[1], f"b started at {b_span[0]} before a ended at {a_span[1]}"
    assert metric(srv, "tritium_rate_limiter_waits_total", "b") == 1
    assert metric(srv, "tritium_rate_limiter_waits_total", "a") == 0
    assert metric(srv, "tritium_rate_limiter_wait_duration_us", "b") > 0
    assert metric(srv, "tritium_rate_limiter_waits_total", "free") == 0


def test_a_resource_count_from_the_flag_lets_two_run_at_once(start, workdir):
    for name in ("a", "b"):
        write_model(start.repo, name, config(name, workdir, needs([("R", 1, True)])), MODEL)
    srv = start(["a", "b"], ["--rate-limit=execution_count", "--rate-limit-resource=R:2"])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(infer, srv, "a")
        wait_for(os.path.join(workdir, "a.started"), "a's execute")
        b = pool.submit(infer, srv, "b")
        # Two of R: `b` runs while `a` holds one.
        wait_for(os.path.join(workdir, "b.started"), "b's execute (two R exist)")
        open(os.path.join(workdir, "a.go"), "w").close()
        open(os.path.join(workdir, "b.go"), "w").close()
        a_span, b_span = a.result(timeout=60), b.result(timeout=60)
    assert b_span[0] < a_span[1]


def test_with_the_rate_limiter_off_resources_are_ignored(start, workdir):
    for name in ("a", "b"):
        write_model(start.repo, name, config(name, workdir, needs([("R", 1, False)])), MODEL)
    srv = start(["a", "b"])
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(infer, srv, "a")
        wait_for(os.path.join(workdir, "a.started"), "a's execute")
        open(os.path.join(workdir, "b.go"), "w").close()
        pool.submit(infer, srv, "b").result(timeout=60)
        open(os.path.join(workdir, "a.go"), "w").close()
        a.result(timeout=60)
    assert metric(srv, "tritium_rate_limiter_waits_total", "a") is None


def test_a_count_that_cannot_run_an_instance_fails_its_load_with_tritons_text(start, workdir):
    write_model(start.repo, "small", config("small", workdir, needs([("R", 1, False)])), MODEL)
    write_model(start.repo, "big", config("big", workdir, needs([("R", 3, False)])), MODEL)
    write_model(start.repo, "both", config("both", workdir, needs([("R", 1, True)])), MODEL)
    srv = start(
        ["small"],
        [
            "--rate-limit=execution_count",
            "--rate-limit-resource=R:2",
            "--model-control-mode=explicit",
            "--load-model=small",
        ],
    )
    client = httpclient.InferenceServerClient(srv.http_url)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("big")
    assert (
        'Resource count for "R" is limited to 2 which will prevent scheduling of one or more model '
        "instances, the minimum required count is 3"
    ) in str(e.value)
    with pytest.raises(InferenceServerException) as e:
        client.load_model("both")
    assert ('Resource "R" is present as both global and device-specific resource in the model configuration.') in str(
        e.value
    )
    # The refused loads changed nothing for the model that runs.
    open(os.path.join(workdir, "small.go"), "w").close()
    infer(srv, "small")
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert index["big"]["state"] == "UNAVAILABLE" and "limited to 2" in index["big"]["reason"]


def test_a_malformed_resource_flag_is_refused_at_start(tmp_path):
    out = subprocess.run(
        [
            binary(),
            "serve",
            "--model-repository",
            str(tmp_path),
            "--rate-limit=execution_count",
            "--rate-limit-resource=R1:lots",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    text = out.stdout + out.stderr
    assert "--rate-limit-resource" in text and "expected <name>:<count>" in text, text
