"""tritonserver's command line, as deployments written for Triton pass it: KServe's Triton runtime
arguments start tritium and it serves; `--allow-http=false` closes HTTP while gRPC serves; flags
that ask for nothing are logged and accepted; flags that ask for what tritium cannot do stop it
with an error naming the flag; `--exit-on-error=true` exits when a model fails to load."""

import os
import shutil
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT, binary, free_port


def add_sub_repo(tmp_path, broken=False):
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "examples/models/add_sub"), str(repo / "add_sub"))
    if broken:
        (repo / "broken").mkdir()
        (repo / "broken" / "config.pbtxt").write_text('backend: "python"\ninput [ { name: "X" ')
    return str(repo)


class Raw:
    """`tritium serve` started with exactly the given arguments (plus --python), as a deployment would."""

    def __init__(self, tmp_path, args):
        self.log_path = str(tmp_path / "tritium.log")
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [binary(), "serve", *args, "--python", sys.executable], stdout=self.log, stderr=subprocess.STDOUT
        )

    def text(self):
        with open(self.log_path) as f:
            return f.read()

    def wait_exit(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        finally:
            self.log.close()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def wait_grpc_ready(url, server, model="add_sub", timeout=120):
    client = grpcclient.InferenceServerClient(url)
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert server.proc.poll() is None, server.text()
        try:
            if client.is_model_ready(model):
                return client
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.1)
    raise AssertionError(f"{model} not ready; log:\n{server.text()}")


def infer_add_sub(module, client):
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_kserve_triton_runtime_arguments_start_and_serve(tmp_path):
    http, grpc, metrics = free_port(), free_port(), free_port()
    # KServe's Triton serving runtime, verbatim but for the ports (and tritium's loopback default).
    server = Raw(
        tmp_path,
        [
            f"--model-store={add_sub_repo(tmp_path)}",
            f"--grpc-port={grpc}",
            f"--http-port={http}",
            "--allow-grpc=true",
            "--allow-http=true",
            f"--metrics-port={metrics}",
            "--id=kserve-triton",
        ],
    )
    try:
        grpc_client = wait_grpc_ready(f"127.0.0.1:{grpc}", server)
        infer_add_sub(grpcclient, grpc_client)
        http_client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        infer_add_sub(httpclient, http_client)
        assert http_client.get_server_metadata()["name"] == "kserve-triton"
        assert grpc_client.get_server_metadata().name == "kserve-triton"
    finally:
        assert server.stop() == 0, server.text()


def test_allow_http_false_closes_http_while_grpc_serves(tmp_path):
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = Raw(
        tmp_path,
        [
            "--model-repository",
            add_sub_repo(tmp_path),
            "--allow-http",
            "off",
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--grpc-address=127.0.0.1",
            "--metrics-address=127.0.0.1",
        ],
    )
    try:
        client = wait_grpc_ready(f"127.0.0.1:{grpc}", server)
        infer_add_sub(grpcclient, client)
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/live", timeout=5)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as r:
            assert r.status == 200
        assert "HTTP service off (--allow-http=false)" in server.text()
    finally:
        assert server.stop() == 0, server.text()


def test_flags_without_meaning_here_are_accepted_and_logged(tmp_path):
    grpc = free_port()
    server = Raw(
        tmp_path,
        [
            "--model-repository",
            add_sub_repo(tmp_path),
            "--allow-http=false",
            "--allow-metrics=false",
            f"--grpc-port={grpc}",
            "--pinned-memory-pool-byte-size=268435456",
            "--backend-config=python,shm-default-byte-size=16777216",
            "--strict-model-config=false",
            "--log-verbose=false",
        ],
    )
    try:
        wait_grpc_ready(f"127.0.0.1:{grpc}", server)
        log = server.text()
        assert "--pinned-memory-pool-byte-size has no effect in tritium" in log
        assert "--backend-config=python,shm-default-byte-size=16777216 has no effect in tritium" in log
    finally:
        assert server.stop() == 0, server.text()


@pytest.mark.parametrize(
    "flag,named",
    [
        ("--grpc-use-ssl=true", "--grpc-server-cert"),
        ("--http-restricted-api=model-repository", "--http-restricted-api option format"),
        ("--rate-limit=sometimes", "--rate-limit=sometimes"),
        ("--cache-config=redis,host=localhost", "--cache-config=redis,host=localhost"),
    ],
)
def test_flags_asking_for_what_tritium_cannot_do_stop_it_with_the_flag_named(tmp_path, flag, named):
    server = Raw(tmp_path, ["--model-repository", add_sub_repo(tmp_path), flag])
    assert server.wait_exit() != 0
    log = server.text()
    assert named in log and "refusing to start" in log, log


def test_two_model_repositories_are_refused_with_a_reason(tmp_path):
    repo = add_sub_repo(tmp_path)
    server = Raw(tmp_path, ["--model-repository", repo, "--model-repository", repo])
    assert server.wait_exit() != 0
    assert "tritium serves one model repository" in server.text()


def test_exit_on_error_true_exits_when_a_model_fails_to_load(tmp_path):
    http, grpc, metrics = free_port(), free_port(), free_port()
    server = Raw(
        tmp_path,
        [
            "--model-repository",
            add_sub_repo(tmp_path, broken=True),
            f"--http-port={http}",
            f"--grpc-port={grpc}",
            f"--metrics-port={metrics}",
            "--exit-on-error=true",
        ],
    )
    code = server.wait_exit(120)
    log = server.text()
    assert code != 0, log
    assert "--exit-on-error=true" in log and "broken" in log, log
