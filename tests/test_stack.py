"""Live Python stacks of stubs (`tritium stack`, the `Stacks` admin RPC, `GET
/tritium/models/{model}/stacks`): a model hung in Python, one hung in C code that holds the GIL
(a `ctypes.PyDLL` call to libc's `sleep`), a model's own thread and an asyncio task; and a hung stub
killed by its execute timeout, whose stacks reach the log before it dies."""

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import binary, write_model

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}
"""

# Hangs in Python (a loop of short sleeps in a function with a telling name) until a file named
# `release` appears beside it; a model thread and the model's own event loop wait meanwhile.
PYTHON_HANG = """
import asyncio
import os
import threading
import time

import triton_python_backend_utils as pb_utils


def model_thread_waits_here(stop):
    while not stop.is_set():
        time.sleep(0.05)


async def asyncio_task_waits_here():
    while True:
        await asyncio.sleep(0.05)


class TritonPythonModel:
    def initialize(self, args):
        self.stop = threading.Event()
        self.thread = threading.Thread(target=model_thread_waits_here, args=(self.stop,), name="model-worker")
        self.thread.start()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="model-loop", daemon=True).start()
        asyncio.run_coroutine_threadsafe(asyncio_task_waits_here(), self.loop)

    def execute(self, requests):
        release = os.path.join(os.path.dirname(__file__), "release")
        while not os.path.exists(release):
            python_hang_waits_here()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]

    def finalize(self):
        self.stop.set()


def python_hang_waits_here():
    time.sleep(0.02)
"""

# Hangs in C code that holds the GIL: libc's sleep through ctypes.PyDLL, which does not release it.
C_HANG = """
import ctypes

import triton_python_backend_utils as pb_utils

LIBC = ctypes.PyDLL(None)


def c_hang_holds_the_gil(seconds):
    LIBC.sleep(seconds)


class TritonPythonModel:
    def execute(self, requests):
        c_hang_holds_the_gil(int(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0]))
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
"""


def tritium(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    return subprocess.run([binary(), *args], capture_output=True, text=True, env=env, timeout=timeout)


def infer_in_background(url, model, value):
    """Starts one request in a thread (it hangs); returns the thread and its outcome list."""
    outcome = []

    def run():
        client = grpcclient.InferenceServerClient(url)
        inp = grpcclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.array([value], dtype=np.float32))
        try:
            outcome.append(client.infer(model, [inp], client_timeout=120))
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, outcome


def wait_for_stack(srv, model, needle, timeout=60):
    """Runs `tritium stack` until its output contains `needle` (the request reaches execute a
    moment after it is sent); returns that output."""
    deadline = time.time() + timeout
    out = ""
    while time.time() < deadline:
        proc = tritium("stack", model, "--url", srv.grpc_url)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        if needle in out:
            return out
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared in the stacks:\n{out}")


def test_stacks_of_a_model_hung_in_python_show_every_thread_and_the_asyncio_task(start):
    write_model(start.repo, "hang_py", CONFIG.format(name="hang_py", extra=""), PYTHON_HANG)
    srv = start(["hang_py"])
    t, outcome = infer_in_background(srv.grpc_url, "hang_py", 1.0)
    try:
        out = wait_for_stack(srv, "hang_py", "python_hang_waits_here")
        assert "=== hang_py version 1 instance hang_py_0_0 (pid " in out, out
        # The main thread in execute, the model's thread, the asyncio task's stack, thread names.
        assert "in execute" in out, out
        assert "model_thread_waits_here" in out, out
        assert "model-worker" in out, out
        # Over HTTP: the same stacks as JSON, one instance chosen by its position.
        with urllib.request.urlopen(f"http://{srv.http_url}/tritium/models/hang_py/stacks?instance=0", timeout=30) as r:
            body = json.load(r)
        [one] = body["stacks"]
        assert one["instance"] == "hang_py_0_0" and one["pid"] > 0, body
        assert "python_hang_waits_here" in one["stacks"], body
        # An unknown instance or model is an error that says what there is.
        proc = tritium("stack", "hang_py", "--instance", "nope", "--url", srv.grpc_url)
        assert proc.returncode != 0 and "hang_py_0_0" in proc.stderr, proc.stderr
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://{srv.http_url}/tritium/models/missing/stacks", timeout=30)
        assert e.value.code == 404
    finally:
        open(os.path.join(start.repo, "hang_py", "1", "release"), "w").close()
        t.join(60)
    assert outcome and not isinstance(outcome[0], Exception), outcome


def test_stacks_of_an_asyncio_task_on_the_stubs_loop(start):
    model = """
    import asyncio
    import triton_python_backend_utils as pb_utils


    async def awaits_in_a_coroutine(seconds):
        await asyncio.sleep(seconds)


    class TritonPythonModel:
        async def execute(self, requests):
            await awaits_in_a_coroutine(float(pb_utils.get_input_tensor_by_name(requests[0], "IN").as_numpy()[0]))
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
    """
    write_model(start.repo, "hang_async", CONFIG.format(name="hang_async", extra=""), model)
    srv = start(["hang_async"])
    t, outcome = infer_in_background(srv.grpc_url, "hang_async", 8.0)
    out = wait_for_stack(srv, "hang_async", "awaits_in_a_coroutine")
    assert "asyncio tasks (" in out, out
    t.join(60)
    assert outcome and not isinstance(outcome[0], Exception), outcome


def test_stacks_of_a_stub_stuck_in_c_code_holding_the_gil(start):
    write_model(start.repo, "hang_c", CONFIG.format(name="hang_c", extra=""), C_HANG)
    srv = start(["hang_c"])
    t, outcome = infer_in_background(srv.grpc_url, "hang_c", 15.0)
    out = wait_for_stack(srv, "hang_c", "c_hang_holds_the_gil")
    # Read without the GIL: faulthandler's stacks are there, the parts that need the GIL are not.
    assert "in execute" in out, out
    assert "the GIL was not released within" in out, out
    t.join(60)
    assert outcome and not isinstance(outcome[0], Exception), outcome


def test_a_stub_killed_by_its_execute_timeout_logs_its_stacks_first(start):
    extra = 'parameters { key: "execute_timeout_secs" value: { string_value: "2" } }'
    write_model(start.repo, "hang_killed", CONFIG.format(name="hang_killed", extra=extra), C_HANG)
    srv = start(["hang_killed"])
    t, outcome = infer_in_background(srv.grpc_url, "hang_killed", 30.0)
    t.join(90)
    assert outcome and isinstance(outcome[0], Exception), outcome
    assert "did not finish execute within 2s" in str(outcome[0]), outcome
    # The requests are answered first; the stacks are logged before the kill, a moment later.
    marker = "Python stacks of the stub before it is killed"
    deadline = time.time() + 30
    while marker not in srv.log_text() and time.time() < deadline:
        time.sleep(0.1)
    log = srv.log_text()
    assert marker in log, log
    after = log[log.index(marker) :]
    assert "c_hang_holds_the_gil" in after, after[:4000]


def test_a_models_own_process_may_not_read_stacks_over_http(start):
    # Loopback trust is for the operator: a stub (or its children) asking gets 403.
    model = """
    import urllib.error
    import urllib.request

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                port = int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0])
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/tritium/models/asks/stacks", timeout=30)
                    code = 200
                except urllib.error.HTTPError as e:
                    code = e.code
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([code], dtype=np.float32))]))
            return out
    """
    write_model(start.repo, "asks", CONFIG.format(name="asks", extra=""), model)
    srv = start(["asks"])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.array([srv.http_port], dtype=np.float32))
    assert client.infer("asks", [inp]).as_numpy("OUT")[0] == 403
    # The operator on the host may.
    with urllib.request.urlopen(f"http://{srv.http_url}/tritium/models/asks/stacks", timeout=30) as r:
        assert r.status == 200
