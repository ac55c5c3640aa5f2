"""The stub's Python runtime end to end: `async def execute`, `sys.argv`, `finalize` errors,
Python-based backends and `get_model_dir`, request rescheduling, and the stream_words example.

The models are written here into a temporary repository (and a temporary backend directory),
served by a real tritium and called with tritonclient. Concurrency is shown by the order of
events the model records, never by timing.
"""

import json
import os
import queue
import subprocess
import sys
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ROOT, Server
from test_faults import write_model
from tritonclient.utils import InferenceServerException

TIMEOUT = 60

# An async decoupled model: each request's coroutine records its start, waits (bounded) until
# another request's coroutine has started too, records its end and answers with the events seen.
# On one instance this only finishes early if the first coroutine still runs while the second
# batch executes. MODE 1: one response, then the coroutine raises.
OVERLAP = """
import asyncio, json
import numpy as np
import triton_python_backend_utils as pb_utils

EVENTS = []


def text(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([value.encode()], dtype=np.object_))])


class TritonPythonModel:
    async def initialize(self, args):
        await asyncio.sleep(0)

    async def execute(self, requests):
        for r in requests:
            tag = pb_utils.get_input_tensor_by_name(r, "TAG").as_numpy()[0].decode()
            mode = int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0])
            sender = r.get_response_sender()
            if mode == 1:
                sender.send(text("before the error"))
                await asyncio.sleep(0.01)
                raise RuntimeError("boom in the background coroutine")
            EVENTS.append(("start", tag))
            for _ in range(3000):
                if len({t for e, t in EVENTS if e == "start"}) >= 2:
                    break
                await asyncio.sleep(0.01)
            EVENTS.append(("end", tag))
            sender.send(text(json.dumps(EVENTS)), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

OVERLAP_CONFIG = """
name: "overlap"
backend: "python"
model_transaction_policy { decoupled: true }
input [
  { name: "TAG" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# A plain model reporting what its runtime looks like; MODE 1 reschedules the request.
RUNTIME = """
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            mode = int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0])
            if mode == 1:
                r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                out.append(None)
                continue
            report = {
                "argv": sys.argv,
                "model_dir": pb_utils.get_model_dir(),
                "trace_context": r.trace().get_context(),
                "response_parameters": pb_utils.InferenceResponse(parameters={"k": 1}).parameters(),
            }
            text = np.array([json.dumps(report).encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]))
        return out
"""

RUNTIME_CONFIG = """
name: "{name}"
backend: "{backend}"
input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

# A Python-based backend's model.py: it reads model.json from the model's version directory.
BACKEND = """
import json, os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        with open(os.path.join(pb_utils.get_model_dir(), "model.json")) as f:
            self.settings = json.load(f)

    def execute(self, requests):
        report = {"settings": self.settings, "model_dir": pb_utils.get_model_dir(), "module": __name__}
        text = np.array([json.dumps(report).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", text)]) for _ in requests]
"""

FINALIZER = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return []

    def finalize(self):
        raise ValueError("boom in finalize")
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("runtime-repo"))
    backends = str(tmp_path_factory.mktemp("backends"))
    write_model(repo, "overlap", OVERLAP, OVERLAP_CONFIG)
    write_model(repo, "runtime", RUNTIME, RUNTIME_CONFIG.format(name="runtime", backend="python"))
    # The backend model's own version directory holds no model.py, only its settings.
    os.makedirs(os.path.join(repo, "wordy_model", "1"))
    with open(os.path.join(repo, "wordy_model", "config.pbtxt"), "w") as f:
        f.write(RUNTIME_CONFIG.format(name="wordy_model", backend="wordy"))
    with open(os.path.join(repo, "wordy_model", "1", "model.json"), "w") as f:
        json.dump({"words": 3}, f)
    os.makedirs(os.path.join(backends, "wordy"))
    with open(os.path.join(backends, "wordy", "model.py"), "w") as f:
        f.write(textwrap.dedent(BACKEND))
    write_model(repo, "nobackend", RUNTIME, RUNTIME_CONFIG.format(name="nobackend", backend="absent"))
    server = Server(
        repo,
        str(tmp_path_factory.mktemp("runtime-log") / "tritium.log"),
        ["--backend-directory", backends],
    )
    server.backends = backends
    try:
        server.wait_models(["overlap", "runtime", "wordy_model"])
        yield server
    finally:
        server.stop()


def strings(name, value):
    t = grpcclient.InferInput(name, [1], "BYTES")
    t.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
    return t


def ints(name, value):
    t = grpcclient.InferInput(name, [1], "INT32")
    t.set_data_from_numpy(np.array([value], dtype=np.int32))
    return t


class Stream:
    """One gRPC stream whose callbacks land in a queue."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.q = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))

    def send(self, model, inputs, request_id):
        self.client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)

    def next(self):
        return self.q.get(timeout=TIMEOUT)

    def close(self):
        self.client.stop_stream()
        self.client.close()


def report(srv, model, mode=0):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        return json.loads(c.infer(model, [ints("MODE", mode)]).as_numpy("TEXT")[0])
    finally:
        c.close()


def test_async_decoupled_coroutines_of_one_instance_overlap(srv):
    s = Stream(srv.grpc_url)
    try:
        s.send("overlap", [strings("TAG", "a"), ints("MODE", 0)], "a")
        s.send("overlap", [strings("TAG", "b"), ints("MODE", 0)], "b")
        finished = {}
        while len(finished) < 2:
            result, error = s.next()
            assert error is None, error
            r = result.get_response()
            events = [tuple(e) for e in json.loads(result.as_numpy("TEXT")[0])]
            finished[r.id] = [e for e in events if e[1] in ("a", "b")]
            assert r.parameters["triton_final_response"].bool_param
    finally:
        s.close()
    # Whichever finished first had already seen the other one start: both ran at once.
    first = min(finished.values(), key=len)
    assert first[:2] in ([("start", "a"), ("start", "b")], [("start", "b"), ("start", "a")]), finished
    assert first[2][0] == "end", finished


def test_an_exception_in_a_background_coroutine_ends_its_stream_with_an_error(srv):
    s = Stream(srv.grpc_url)
    try:
        s.send("overlap", [strings("TAG", "x"), ints("MODE", 1)], "bad")
        result, error = s.next()
        assert error is None and result.as_numpy("TEXT")[0] == b"before the error"
        result, error = s.next()
        assert result is None
        assert "Failed to process the request(s) for model 'overlap_0_0', message: " in str(error), error
        assert "RuntimeError: boom in the background coroutine" in str(error), error
        # The stream and the instance still serve.
        s.send("overlap", [strings("TAG", "y"), ints("MODE", 0)], "y")
        s.send("overlap", [strings("TAG", "z"), ints("MODE", 0)], "z")
        ids = set()
        while len(ids) < 2:
            result, error = s.next()
            assert error is None, error
            ids.add(result.get_response().id)
    finally:
        s.close()
    # The traceback is in the server log too, as Triton logs it.
    log = srv.log_text()
    assert "Traceback (most recent call last)" in log and "boom in the background coroutine" in log


def test_model_code_sees_tritons_argv_model_dir_and_request_api(srv):
    got = report(srv, "runtime")
    assert got["argv"] == [""]
    assert got["model_dir"] == os.path.join(srv.repository, "runtime", "1")
    assert got["trace_context"] is None
    assert got["response_parameters"] == '{"k":1}'


def test_a_rescheduled_request_gets_triton_cores_error(srv):
    with pytest.raises(InferenceServerException) as e:
        report(srv, "runtime", mode=1)
    assert "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not configured" in str(
        e.value
    )
    assert report(srv, "runtime")["argv"] == [""]


def test_a_python_based_backend_serves_from_the_backend_directory(srv):
    got = report(srv, "wordy_model")
    assert got["settings"] == {"words": 3}
    assert got["model_dir"] == os.path.join(srv.repository, "wordy_model", "1")
    assert got["module"] == "model"


def test_an_unknown_backend_fails_its_load_naming_the_place_looked_in(srv):
    req = urllib.request.Request(f"http://{srv.http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        index = {m["name"]: m for m in json.load(r)}
    reason = index["nobackend"]["reason"]
    assert "unable to find backend library for backend 'absent'" in reason, reason
    assert os.path.join(srv.backends, "absent", "model.py") in reason, reason


def test_a_finalize_exception_is_logged_with_its_traceback(tmp_path):
    repo = str(tmp_path / "repo")
    write_model(repo, "finalizer", FINALIZER, RUNTIME_CONFIG.format(name="finalizer", backend="python"))
    server = Server(repo, str(tmp_path / "tritium.log"))
    try:
        server.wait_models(["finalizer"])
    finally:
        code = server.stop()
    log = server.log_text()
    assert code == 0, log
    assert "ValueError: boom in finalize" in log, log
    assert "At:" in log and "model.py(" in log and "): finalize" in log, log


def test_the_stream_words_example_client(server):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "clients", "stream_words.py"), "--url", server.grpc_url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "WORDS: 9" in out.stdout, out.stdout


def test_stream_words_sends_one_response_per_word(server):
    s = Stream(server.grpc_url)
    try:
        s.send("stream_words", [strings("TEXT", "one  two three")], "w")
        words = []
        while True:
            result, error = s.next()
            assert error is None, error
            r = result.get_response()
            if r.outputs:
                words.append((int(result.as_numpy("INDEX")[0]), result.as_numpy("WORD")[0].decode()))
            if r.parameters["triton_final_response"].bool_param:
                break
        assert words == [(0, "one"), (1, "two"), (2, "three")]
    finally:
        s.close()
