"""systemd's notification protocol, with a Python unix datagram socket as NOTIFY_SOCKET: READY=1 comes
after the startup load (once a slow model's initialize has returned), WATCHDOG=1 pings come when
WATCHDOG_USEC is set, SIGHUP re-scans the repository (a model added to it loads) except in explicit
mode, and SIGTERM sends STOPPING=1. Also checks that deploy/systemd/tritium.service names flags and
variables tritium accepts."""

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request

from conftest import ROOT, binary, free_port

SLOW = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(1.5)
        with open(os.path.join(os.path.dirname(__file__), "..", "initialized"), "w") as f:
            f.write(repr(time.time()))

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", r.inputs()[0].as_numpy())]) for r in requests]
"""

CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
"""


def write_model(repo, name):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(CONFIG.format(name=name))
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(SLOW)


class Receiver:
    """A NOTIFY_SOCKET: records every datagram with the time it arrived."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages = []
        self.lock = threading.Lock()
        self.running = True
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while self.running:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                self.messages.append((time.time(), data.decode()))

    def received(self):
        with self.lock:
            return list(self.messages)

    def wait_for(self, needle, after=0.0, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for at, msg in self.received():
                if at >= after and needle in msg:
                    return at, msg
            time.sleep(0.05)
        raise AssertionError(f"no {needle!r} after {after}: {self.received()}")

    def close(self):
        self.running = False
        self.thread.join(5)
        self.sock.close()


def test_ready_watchdog_sighup_rescan_and_stopping(start, tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    receiver = Receiver(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    monkeypatch.setenv("WATCHDOG_USEC", "200000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    try:
        write_model(start.repo, "slow")
        srv = start(["slow"])
        ready_at, msg = receiver.wait_for("READY=1")
        with open(os.path.join(start.repo, "slow", "initialized")) as f:
            initialized_at = float(f.read())
        assert ready_at >= initialized_at, "READY=1 came before the model's initialize returned"
        assert "STATUS=serving 1 model(s)" in msg, msg
        assert any("STATUS=loading 1 model(s)" in m for _, m in receiver.received())

        # WATCHDOG=1 every WATCHDOG_USEC/2 (100 ms).
        t0 = time.time()
        time.sleep(1.0)
        pings = [at for at, m in receiver.received() if m == "WATCHDOG=1" and at >= t0]
        assert 5 <= len(pings) <= 15, pings

        # SIGHUP: a model added to the repository loads (model-control-mode none: no polling).
        write_model(start.repo, "added")
        assert srv.get("/v2/models/added/ready") != 200
        hup_at = time.time()
        srv.proc.send_signal(signal.SIGHUP)
        srv.wait_models(["added"], timeout=60)
        assert srv.proc.poll() is None, "SIGHUP did not stop the server"
        receiver.wait_for("STATUS=re-scanning the model repository (SIGHUP)", after=hup_at)
        receiver.wait_for("STATUS=serving 2 model(s)", after=hup_at)
        assert "SIGHUP: re-scanning the model repository" in srv.log_text()

        stop_at = time.time()
        assert srv.stop() == 0
        receiver.wait_for("STOPPING=1", after=stop_at)
    finally:
        receiver.close()


def test_sighup_is_ignored_in_explicit_mode_and_no_socket_sends_nothing(start, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    write_model(start.repo, "slow")
    srv = start([], ["--model-control-mode", "explicit"])
    # The SIGHUP handler is in place before the startup load is logged.
    deadline = time.time() + 30
    while "loading 0 model(s)" not in srv.log_text():
        assert time.time() < deadline and srv.proc.poll() is None, srv.log_text()
        time.sleep(0.05)
    srv.proc.send_signal(signal.SIGHUP)
    deadline = time.time() + 10
    while "SIGHUP ignored" not in srv.log_text():
        assert time.time() < deadline, srv.log_text()
        time.sleep(0.05)
    assert srv.proc.poll() is None
    assert srv.get("/v2/models/slow/ready") != 200, "explicit mode loads nothing on SIGHUP"


def test_the_unit_file_uses_flags_and_variables_tritium_accepts(tmp_path):
    unit = open(os.path.join(ROOT, "deploy", "systemd", "tritium.service")).read()
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.lstrip().startswith("#"))
    assert lines["Type"] == "notify" and lines["NotifyAccess"] == "main"
    assert lines["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert "WatchdogSec" in lines
    env = {}
    for line in unit.splitlines():
        if line.startswith("Environment="):
            key, value = line[len("Environment=") :].split("=", 1)
            env[key] = value
    assert set(env) <= {"TRITIUM_MODEL_REPOSITORY", "TRITIUM_HOST", "TRITIUM_ENV_CACHE_DIR"}, env
    # The ExecStart line, with the unit's environment, serves (on 127.0.0.1 and free ports here).
    args = lines["ExecStart"].split()[1:]
    run_env = dict(os.environ, **env)
    run_env.update(
        TRITIUM_MODEL_REPOSITORY=str(tmp_path / "models"),
        TRITIUM_HOST="127.0.0.1",
        TRITIUM_ENV_CACHE_DIR=str(tmp_path / "envs"),
        TRITIUM_HTTP_PORT=str(free_port()),
        TRITIUM_GRPC_PORT=str(free_port()),
        TRITIUM_METRICS_PORT=str(free_port()),
    )
    run_env.pop("NOTIFY_SOCKET", None)
    os.makedirs(tmp_path / "models")
    proc = subprocess.Popen([binary(), *args], env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{run_env['TRITIUM_HTTP_PORT']}/v2/health/ready"
        deadline = time.time() + 30
        while True:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.time() < deadline, "the unit's command line does not serve"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
