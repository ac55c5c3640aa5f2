"""Hostile models and clients: nothing a model writes into the shared memory it can reach, and
nothing a client sends, takes the server down, hangs it, or fails another model."""

import os
import textwrap
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import ROOT, Server
from tritonclient.utils import InferenceServerException

SCRIBBLER = '''
import mmap, os, random
import numpy as np
import triton_python_backend_utils as pb_utils


def memfds():
    """Every memfd this process can reach, as a broken native extension would find them."""
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/memfd:"):
            yield int(name)


class TritonPythonModel:
    def execute(self, requests):
        seed = int(requests[0].inputs()[0].as_numpy()[0])
        rng = random.Random(seed)
        for fd in memfds():
            size = os.fstat(fd).st_size
            try:
                m = mmap.mmap(fd, size)
            except (OSError, ValueError):
                continue
            # Random bytes at random places, and whole pages of garbage over the control segment
            # (ring headers and slots) and the start of every arena segment.
            for _ in range(2000):
                at = rng.randrange(size)
                m[at] = rng.randrange(256)
            page = min(size, 16384)
            m[:page] = bytes(rng.randrange(256) for _ in range(page))
            m.close()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([seed], np.int32))]) for _ in requests]
'''

SCRIBBLER_CONFIG = """
name: "scribbler"
backend: "python"
max_batch_size: 0
input [ { name: "SEED" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
parameters { key: "execute_timeout_secs" value: { string_value: "10" } }
"""


def add_model(repo, name, config, model):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(model))


def copy_example(repo, name):
    import shutil

    shutil.copytree(os.path.join(ROOT, "examples", "models", name), os.path.join(repo, name))


@pytest.fixture
def hostile(tmp_path):
    repo = str(tmp_path / "repo")
    os.makedirs(repo)
    add_model(repo, "scribbler", SCRIBBLER_CONFIG, SCRIBBLER)
    copy_example(repo, "add_sub")
    srv = Server(repo, str(tmp_path / "tritium.log"))
    try:
        srv.wait_models(["scribbler", "add_sub"])
        yield srv
    finally:
        srv.stop()


def add_sub(client):
    a = np.arange(4, dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    r = client.infer("add_sub", inputs)
    assert (r.as_numpy("OUTPUT0") == a + a).all()


def test_a_model_scribbling_over_its_shared_memory_never_hurts_the_server_or_others(hostile):
    client = grpcclient.InferenceServerClient(hostile.grpc_url)
    stop, failures, served = threading.Event(), [], [0]

    def other_model():
        c = grpcclient.InferenceServerClient(hostile.grpc_url)
        while not stop.is_set():
            try:
                add_sub(c)
                served[0] += 1
            except Exception as e:  # noqa: BLE001 - any failure of the other model is the finding
                failures.append(e.message() if isinstance(e, InferenceServerException) else repr(e))

    t = threading.Thread(target=other_model)
    t.start()
    outcomes = []
    try:
        for seed in range(4):
            inp = grpcclient.InferInput("SEED", [1], "INT32")
            inp.set_data_from_numpy(np.array([seed], np.int32))
            started = time.time()
            try:
                client.infer("scribbler", [inp], client_timeout=60)
                outcomes.append("ok")
            except InferenceServerException as e:
                outcomes.append(e.message())
            assert time.time() - started < 60, "the scribbled request got an answer, not a hang"
            # The instance comes back (restarted if it broke the protocol) and serves again.
            deadline = time.time() + 30
            while not client.is_model_ready("scribbler"):
                assert time.time() < deadline, hostile.log_text()[-3000:]
                time.sleep(0.1)
    finally:
        stop.set()
        t.join(60)
    assert hostile.proc.poll() is None, "the server is still running"
    assert failures == [], failures[:3]
    assert served[0] > 0
    assert client.is_server_live()
    add_sub(client)
    print("scribbler outcomes:", outcomes)


# A one-instance model that answers its stub's pid and N bytes of output.
SIZED = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                pb_utils.Tensor("BLOB", np.zeros([n], np.uint8)),
            ]))
        return out
"""

SIZED_CONFIG = """
name: "sized"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "BLOB" data_type: TYPE_UINT8 dims: [ -1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

# A model whose thread logs without pause from initialize on.
LOGSPAM = """
import os
import threading
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.stop = threading.Event()
        logger = pb_utils.Logger

        def spam():
            i, until = 0, time.time() + 60
            while not self.stop.is_set() and time.time() < until:
                logger.log_verbose(f"spam {i}")
                i += 1

        self.thread = threading.Thread(target=spam, daemon=True)
        self.thread.start()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]

    def finalize(self):
        self.stop.set()
"""

LOGSPAM_CONFIG = """
name: "logspam"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

MAX_OUTPUT = 1 << 20


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limited")
    repo = str(tmp / "repo")
    os.makedirs(repo)
    add_model(repo, "sized", SIZED_CONFIG, SIZED)
    srv = Server(repo, str(tmp / "tritium.log"), ["--max-output-bytes", str(MAX_OUTPUT)])
    try:
        srv.wait_models(["sized"])
        yield srv
    finally:
        srv.stop()


def sized(module, client, n, **kw):
    inp = module.InferInput("N", [1], "INT64")
    inp.set_data_from_numpy(np.array([n], np.int64))
    r = client.infer("sized", [inp], **kw)
    return int(r.as_numpy("PID")[0]), r


def clients(server):
    import tritonclient.http as httpclient

    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


@pytest.mark.parametrize("which", ["http", "grpc"])
def test_a_megabyte_request_id_fails_alone_and_the_stub_lives_on(limited, which):
    module, client = dict(zip(["http", "grpc"], clients(limited)))[which]
    pid, _ = sized(module, client, 4)
    for _ in range(8):
        with pytest.raises(InferenceServerException) as e:
            sized(module, client, 4, request_id="x" * (1 << 20))
        message = e.value.message()
        assert "--max-request-metadata-bytes" in message and "65536" in message, message[:500]
        assert len(message) < 1000, "the id is not echoed back"
        if which == "http":
            assert e.value.status() == "400", e.value.status()
        else:
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value.status()
    # Eight such requests (more than the restart limit) and the very same stub still serves.
    assert client.is_model_ready("sized")
    assert sized(module, client, 4)[0] == pid
    assert "crashed" not in limited.log_text()


def test_an_output_over_the_limit_fails_that_request_alone(limited):
    for module, client in clients(limited):
        pid, r = sized(module, client, MAX_OUTPUT - 8)
        assert r.as_numpy("BLOB").nbytes == MAX_OUTPUT - 8
        with pytest.raises(InferenceServerException) as e:
            sized(module, client, MAX_OUTPUT)
        message = e.value.message()
        assert "--max-output-bytes" in message and f"limit of {MAX_OUTPUT} bytes" in message, message
        assert client.is_model_ready("sized")
        assert sized(module, client, 1)[0] == pid, "the stub was not restarted"
    assert "crashed" not in limited.log_text()


@pytest.fixture
def logspam(tmp_path):
    repo = str(tmp_path / "repo")
    os.makedirs(repo)
    add_model(repo, "logspam", LOGSPAM_CONFIG, LOGSPAM)
    srv = Server(repo, str(tmp_path / "tritium.log"))
    try:
        srv.wait_models(["logspam"])
        yield srv
    finally:
        srv.stop()


def test_a_model_thread_logging_without_pause_does_not_starve_requests(logspam):
    client = grpcclient.InferenceServerClient(logspam.grpc_url)
    started = time.time()
    pids = set()
    for _ in range(20):
        inp = grpcclient.InferInput("N", [1], "INT64")
        inp.set_data_from_numpy(np.array([1], np.int64))
        pids.add(int(client.infer("logspam", [inp], client_timeout=20).as_numpy("PID")[0]))
    assert time.time() - started < 30
    assert len(pids) == 1, "served by one stub, never restarted"
    assert client.is_model_ready("logspam")


def test_a_batch_too_large_for_the_ring_fails_alone_without_a_restart(tmp_path):
    # With the per-request limit raised past the ring's size, a 1 MiB id reaches the send to the
    # stub: nothing is sent, the batch fails with a clear error, and the stub is not touched.
    repo = str(tmp_path / "repo")
    os.makedirs(repo)
    add_model(repo, "sized", SIZED_CONFIG, SIZED)
    srv = Server(repo, str(tmp_path / "tritium.log"), ["--max-request-metadata-bytes", str(4 << 20)])
    try:
        srv.wait_models(["sized"])
        for module, client in clients(srv):
            pid, _ = sized(module, client, 4)
            for _ in range(8):
                with pytest.raises(InferenceServerException) as e:
                    sized(module, client, 4, request_id="x" * (1 << 20))
                message = e.value.message()
                assert "nothing was sent to the model" in message, message[:500]
                assert "--max-request-metadata-bytes" in message, message[:500]
            assert client.is_model_ready("sized")
            assert sized(module, client, 4)[0] == pid
        assert "crashed" not in srv.log_text()
    finally:
        srv.stop()


# Model code that reaches past pb_utils to answer one request twice.
DOUBLE = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils
from tritium import _runtime


class TritonPythonModel:
    def execute(self, requests):
        n = int(pb_utils.get_input_tensor_by_name(requests[0], "N").as_numpy()[0])
        if n == 2:
            extra = [("PID", "INT64", [1], np.array([os.getpid()], np.int64))]
            _runtime.channel.send_response(requests[0]._state.id, extra, None, [], True)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("PID", np.array([os.getpid()], np.int64))])
                for _ in requests]
"""


def test_a_second_response_for_a_request_restarts_the_stub(tmp_path):
    repo = str(tmp_path / "repo")
    os.makedirs(repo)
    add_model(repo, "double", LOGSPAM_CONFIG.replace('"logspam"', '"double"'), DOUBLE)
    srv = Server(repo, str(tmp_path / "tritium.log"))
    try:
        srv.wait_models(["double"])
        client = grpcclient.InferenceServerClient(srv.grpc_url)

        def call(n):
            inp = grpcclient.InferInput("N", [1], "INT64")
            inp.set_data_from_numpy(np.array([n], np.int64))
            return int(client.infer("double", [inp], client_timeout=30).as_numpy("PID")[0])

        pid = call(1)
        with pytest.raises(InferenceServerException) as e:
            call(2)
        assert "second response for request" in e.value.message(), e.value.message()
        deadline = time.time() + 30
        while not client.is_model_ready("double"):
            assert time.time() < deadline, srv.log_text()[-3000:]
            time.sleep(0.1)
        assert call(1) != pid, "the stub that broke the protocol was replaced"
    finally:
        srv.stop()
