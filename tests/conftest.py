"""End-to-end fixtures: a real `tritium serve` on free ports over a repository made of the
examples and the test models, and tritonclient clients for HTTP and gRPC."""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD_MODELS = [
    "add_sub",
    "preprocess",
    "batched_scale",
    "caption",
    "echo",
    "whoami",
    "slow_batch",
    "no_config",
    "chatty",
    "pylog",
    "metered",
    "stream_words",
    "ensemble_pipeline",
    "image_pipeline",
    "bls_add_sub",
    "tiny_llm",
    "sequence_accumulate",
    "misbehaving",
]


def require(condition, why):
    """Skips the calling test when a prerequisite is missing, or fails it when
    `TRITIUM_REQUIRE_ALL` is set (as `.ci/run` does), so CI never counts a missing
    prerequisite as a pass."""
    if condition:
        return
    if os.environ.get("TRITIUM_REQUIRE_ALL"):
        pytest.fail(f"prerequisite missing: {why}")
    pytest.skip(why)


def cuda_device_count():
    """How many devices the CUDA driver sees (0 without a driver), asked as the server asks it."""
    if os.environ.get("TRITIUM_CUDA", "").lower() in ("off", "0"):
        return 0
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def needs_gpu():
    """Skips a test that needs a CUDA GPU; under `TRITIUM_REQUIRE_GPU` (`cargo xtask gpu-check`)
    a missing GPU fails it instead. (`TRITIUM_REQUIRE_ALL` does not: CI never has a GPU.)"""
    if cuda_device_count():
        return
    if os.environ.get("TRITIUM_REQUIRE_GPU"):
        pytest.fail("TRITIUM_REQUIRE_GPU is set but the CUDA driver sees no device")
    pytest.skip("needs a CUDA GPU (run `cargo xtask gpu-check` on a machine with one)")


def write_model(repo, name, config, model):
    """Writes model `name` into repository `repo`: its config.pbtxt and version 1's model.py
    (both dedented)."""
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(model))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binary():
    path = os.environ.get("TRITIUM_BIN", os.path.join(ROOT, "target", "release", "tritium"))
    if not os.path.exists(path):
        pytest.fail(f"{path} does not exist: run `cargo xtask build` (or `cargo xtask test`)")
    return path


class Server:
    """A running tritium process."""

    def __init__(self, repository, log_path, extra_args=()):
        self.repository = repository
        self.log_path = log_path
        self.extra_args = list(extra_args)
        self.launches = 0
        self.launch()

    def launch(self):
        """Starts the server on ports free a moment ago. Another process may take one of them
        before the server binds it (`free_port` closes its socket): `wait_models` then starts it
        again on new ports, which it says in the log."""
        self.launches += 1
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        self.openai_port = free_port()
        self.http_url = f"127.0.0.1:{self.http_port}"
        self.grpc_url = f"127.0.0.1:{self.grpc_port}"
        self.log = open(self.log_path, "a" if self.launches > 1 else "w")
        repository = self.repository
        args = [
            binary(),
            "serve",
            "--model-repository",
            repository,
            "--http-port",
            str(self.http_port),
            "--grpc-port",
            str(self.grpc_port),
            "--metrics-port",
            str(self.metrics_port),
            "--openai-port",
            str(self.openai_port),
            "--python",
            sys.executable,
        ] + self.extra_args
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://{self.http_url}{path}", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def wait_models(self, models, timeout=120):
        deadline = time.time() + timeout
        for m in models:
            while self.get(f"/v2/models/{m}/ready") != 200:
                if self.proc.poll() is not None and "Address already in use" in self.log_text() and self.launches < 3:
                    self.log.write("(conftest: a port was taken before the server bound it; starting it again)\n")
                    self.log.close()
                    self.launch()
                    continue
                if self.proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"model {m} not ready; server log:\n{self.log_text()}")
                time.sleep(0.1)

    def log_text(self):
        with open(self.log_path) as f:
            return f.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for base in ("examples/models", "tests/models"):
        for name in os.listdir(os.path.join(ROOT, base)):
            shutil.copytree(os.path.join(ROOT, base, name), str(repo / name))
    return str(repo)


@pytest.fixture(scope="session")
def server(repository, tmp_path_factory):
    # Default limits, as a user gets them; test_client_limits.py tests the limits on its own server.
    srv = Server(repository, str(tmp_path_factory.mktemp("log") / "tritium.log"))
    try:
        srv.wait_models(GOOD_MODELS)
        yield srv
    finally:
        code = srv.stop()
        assert code == 0, f"tritium exited with {code} on SIGTERM; log:\n{srv.log_text()}"


@pytest.fixture
def start(tmp_path):
    """Starts servers on a repository of the test's own (`start.repo`, empty until the test writes
    models into it) and stops them after the test."""
    servers = []

    def start_server(models, extra_args=()):
        srv = Server(str(tmp_path / "repo"), str(tmp_path / f"tritium-{len(servers)}.log"), extra_args)
        servers.append(srv)
        srv.wait_models(models)
        return srv

    os.makedirs(str(tmp_path / "repo"), exist_ok=True)
    start_server.repo = str(tmp_path / "repo")
    yield start_server
    for srv in servers:
        srv.stop()


@pytest.fixture(params=["http", "grpc"])
def protocol(request):
    return request.param


@pytest.fixture
def client(server, protocol):
    """(tritonclient module, client) for the protocol under test."""
    if protocol == "http":
        import tritonclient.http as module

        return module, module.InferenceServerClient(server.http_url)
    import tritonclient.grpc as module

    return module, module.InferenceServerClient(server.grpc_url)
