"""Hardening of client shared memory and sequences (issue 37, items 4, 5, 7, 8 and 9), end to
end: a real server, real stubs, and tritonclient's system shared memory utilities. Each test
sends the input the audit reproduced and checks the clear error, a live server, and that the
other models' stubs keep their pids (no stub died, no restart was counted)."""

import json
import os
import subprocess
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import ROOT, Server, binary
from tritonclient.utils import InferenceServerException

# Sums IN after sleeping SLEEP seconds; one instance, so a request can be held in the queue.
SLOW_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SLEEP" data_type: TYPE_FP32 dims: [ 1 ] }}
]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

SLOW_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            time.sleep(float(pb_utils.get_input_tensor_by_name(request, "SLEEP").as_numpy()[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return responses
"""

# A hostile model: it truncates every client region descriptor it can find in its process,
# and reports what happened (the errno's name, or "truncated").
TRUNCATOR_CONFIG = """
name: "truncator"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

TRUNCATOR_MODEL = """
import errno
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            results = []
            for fd in os.listdir("/proc/self/fd"):
                try:
                    target = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    continue
                if not target.startswith("/dev/shm/"):
                    continue
                try:
                    os.ftruncate(int(fd), 0)
                    results.append(b"truncated")
                except OSError as e:
                    results.append(errno.errorcode.get(e.errno, str(e.errno)).encode())
            out = np.array(results or [b"no region fd"], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", out)]))
        return responses
"""

SEQ_MODEL_DIR = os.path.join(ROOT, "tests", "models", "sequence_accumulator")

SEQ_OUTPUTS = """
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CONTROLS" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "CORRID_SEEN" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID_SEEN" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


def seq_config(name, corrid_type, max_batch_size, delay_us=0):
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{SEQ_OUTPUTS}
sequence_batching {{
  max_sequence_idle_microseconds: 60000000
  direct {{ max_queue_delay_microseconds: {delay_us} minimum_slot_utilization: 1.0 }}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]
}}
instance_group [ {{ kind: KIND_CPU, count: 1 }} ]
"""


# The same, but its `execute` first enables Python's faulthandler, which puts its own SIGBUS
# handler in front of the stub's guard (installed when the request's region was mapped).
FAULTHANDLER_MODEL = SLOW_MODEL.replace("import time", "import faulthandler\nimport time").replace(
    "        responses = []\n", "        faulthandler.enable()\n        responses = []\n", 1
)

MODELS = ["slow", "other", "victim", "victim_fh", "truncator", "seq_batch", "seq_one"]


def write_model(repo, name, config, model):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(model))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("shm-hardening-repo"))
    write_model(repo, "slow", SLOW_CONFIG.format(name="slow"), SLOW_MODEL)
    write_model(repo, "other", SLOW_CONFIG.format(name="other"), SLOW_MODEL)
    write_model(repo, "victim", SLOW_CONFIG.format(name="victim"), SLOW_MODEL)
    write_model(repo, "victim_fh", SLOW_CONFIG.format(name="victim_fh"), FAULTHANDLER_MODEL)
    write_model(repo, "truncator", TRUNCATOR_CONFIG, TRUNCATOR_MODEL)
    model_py = open(os.path.join(SEQ_MODEL_DIR, "1", "model.py")).read()
    # A batching sequence model that waits for both of its slots (so two clients share a batch),
    # and one with a single slot (so a second sequence waits in the backlog).
    write_model(repo, "seq_batch", seq_config("seq_batch", "TYPE_STRING", 2, delay_us=2_000_000), model_py)
    write_model(repo, "seq_one", seq_config("seq_one", "TYPE_UINT64", 1), model_py)
    server = Server(
        repo,
        str(tmp_path_factory.mktemp("shm-hardening-log") / "tritium.log"),
        # No crash of a model is forgiven here: one counted crash marks its instance failed.
        ["--max-shm-regions", "8", "--max-sequence-backlog", "2", "--stub-restart-limit", "0"],
    )
    try:
        server.wait_models(MODELS)
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{server.log_text()}"


class Regions:
    """Client regions created for one test and destroyed after it."""

    def __init__(self):
        self.handles = []

    def create(self, size):
        key = f"r{uuid.uuid4().hex[:10]}"
        handle = shm.create_shared_memory_region(key, f"/{key}", size)
        self.handles.append(handle)
        return key, handle

    def destroy(self):
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions(srv):
    r = Regions()
    yield r
    for url, module in ((srv.http_url, httpclient), (srv.grpc_url, grpcclient)):
        module.InferenceServerClient(url).unregister_system_shared_memory()
    r.destroy()


def stubs(srv):
    """{model: (pid, restarts)} from `tritium stubs --json`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    proc = subprocess.run(
        [binary(), "stubs", "--json", "--url", srv.grpc_url], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return {s["model"]: (s["pid"], s["restarts"]) for s in json.loads(proc.stdout)}


def live(srv):
    return srv.get("/v2/health/live") == 200 and srv.get("/v2/health/ready") == 200


def slow_inputs(module, x, sleep):
    a = module.InferInput("IN", list(x.shape), "FP32")
    a.set_data_from_numpy(x)
    s = module.InferInput("SLEEP", [1], "FP32")
    s.set_data_from_numpy(np.array([sleep], dtype=np.float32))
    return [a, s]


def in_thread(call):
    """Runs `call()` on a thread; returns the thread and the dict its result or error lands in."""
    out = {}

    def run():
        try:
            out["r"] = call()
        except InferenceServerException as e:
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def shm_fds_and_maps(pid, key):
    """Descriptors of the server open on /dev/shm/<key>, and its mappings of it."""
    fds = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == f"/dev/shm/{key}":
                fds += 1
        except OSError:
            pass
    with open(f"/proc/{pid}/maps") as f:
        maps = sum(1 for line in f if line.rstrip().endswith(f"/dev/shm/{key}"))
    return fds, maps


# Item 5: registrations are capped and one range of one file is mapped once.
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_registrations_are_capped_and_share_one_mapping(srv, regions, module):
    before = stubs(srv)
    url = srv.http_url if module is httpclient else srv.grpc_url
    client = module.InferenceServerClient(url)
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [np.arange(16, dtype=np.float32)])
    for i in range(8):
        client.register_system_shared_memory(f"same{i}", f"/{key}", 64)
    fds, maps = shm_fds_and_maps(srv.proc.pid, key)
    # One mapping, and its descriptor plus the read-only one stubs get (not 8 of each).
    assert (fds, maps) == (2, 1), (fds, maps)
    with pytest.raises(InferenceServerException) as e:
        client.register_system_shared_memory("same8", f"/{key}", 64)
    assert "8 regions are registered, the limit (server flag --max-shm-regions)" in e.value.message(), e.value
    # Every name still serves requests.
    inputs = slow_inputs(module, np.zeros(16, dtype=np.float32), 0.0)
    inputs[0].set_shared_memory("same7", 64)
    r = client.infer("slow", inputs)
    assert np.array_equal(r.as_numpy("OUT"), np.arange(16, dtype=np.float32) * 2)
    client.unregister_system_shared_memory("same0")
    client.register_system_shared_memory("same8", f"/{key}", 64)
    assert live(srv)
    after = stubs(srv)
    assert after == before, (before, after)


# Item 9: registrations come and go while requests use them; nothing hangs.
def test_regions_registered_used_and_dropped_concurrently_never_hang_the_server(srv, regions):
    before = stubs(srv)
    keys = [regions.create(64) for _ in range(4)]
    for _, handle in keys:
        shm.set_shared_memory_region(handle, [np.ones(16, dtype=np.float32)])
    errors = []

    def worker(n):
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        key = keys[n][0]
        for _ in range(25):
            name = f"churn{n}"
            try:
                client.register_system_shared_memory(name, f"/{key}", 64)
                inputs = slow_inputs(grpcclient, np.zeros(16, dtype=np.float32), 0.0)
                inputs[0].set_shared_memory(name, 64)
                model = "slow" if n % 2 else "other"
                r = client.infer(model, inputs, client_timeout=60)
                assert np.array_equal(r.as_numpy("OUT"), np.full(16, 2, dtype=np.float32))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            finally:
                client.unregister_system_shared_memory(name)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    assert not errors, errors
    assert live(srv)
    assert stubs(srv) == before


# Item 4: a client that shrinks its region while its request is queued.
def test_a_region_shrunk_while_its_request_is_queued_fails_that_request_alone(srv, regions):
    before = stubs(srv)
    key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [np.ones(16, dtype=np.float32)])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.register_system_shared_memory("shrinks", f"/{key}", 64)
    # The one instance is busy for a second; the request in the region waits in the queue.
    busy, busy_out = in_thread(
        lambda: grpcclient.InferenceServerClient(srv.grpc_url).infer(
            "slow", slow_inputs(grpcclient, np.ones(4, dtype=np.float32), 1.0)
        )
    )
    time.sleep(0.3)

    def queued():
        inputs = slow_inputs(grpcclient, np.zeros(16, dtype=np.float32), 0.0)
        inputs[0].set_shared_memory("shrinks", 64)
        return grpcclient.InferenceServerClient(srv.grpc_url).infer("slow", inputs)

    waiting, waiting_out = in_thread(queued)
    time.sleep(0.3)
    os.truncate(f"/dev/shm/{key}", 0)
    busy.join(60)
    waiting.join(60)
    assert "r" in busy_out, busy_out
    assert "e" in waiting_out, waiting_out
    message = waiting_out["e"].message()
    assert "is no longer valid: its file has 0 bytes" in message, message
    assert "unregister it and register it again" in message, message
    # The stub that would have read past the end of the file is the same process, unrestarted.
    assert stubs(srv) == before
    assert live(srv)
    r = client.infer("slow", slow_inputs(grpcclient, np.ones(2, dtype=np.float32), 0.0))
    assert np.array_equal(r.as_numpy("OUT"), [2, 2])


# Item 4: a client that shrinks its region while the model reads it fails that request alone:
# the stub's SIGBUS guard maps zeros over the lost pages and the response says what happened.
@pytest.mark.parametrize("model", ["victim", "victim_fh"])
def test_a_region_shrunk_while_the_model_reads_it_fails_that_request_alone(srv, regions, model):
    before = stubs(srv)
    key, handle = regions.create(1 << 20)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.register_system_shared_memory("shrinks_late", f"/{key}", 1 << 20)

    def call():
        inputs = slow_inputs(grpcclient, np.zeros(1 << 18, dtype=np.float32), 0.6)
        inputs[0].set_shared_memory("shrinks_late", 1 << 20)
        return grpcclient.InferenceServerClient(srv.grpc_url).infer(model, inputs)

    t, out = in_thread(call)
    time.sleep(0.3)
    os.truncate(f"/dev/shm/{key}", 0)
    t.join(60)
    assert "e" in out, out
    message = out["e"].message()
    assert "the client shrank a system shared memory region" in message, message
    assert "register the region again" in message, message
    # The stub lived through it: same pids everywhere, nothing restarted.
    assert stubs(srv) == before, srv.log_text()[-3000:]
    r = client.infer(model, slow_inputs(grpcclient, np.ones(2, dtype=np.float32), 0.0))
    assert np.array_equal(r.as_numpy("OUT"), [2, 2])
    assert live(srv)


# Item 4: an output region shrunk while the model runs fails that request alone.
def test_an_output_region_shrunk_while_the_model_runs_fails_that_request_alone(srv, regions):
    before = stubs(srv)
    key, handle = regions.create(1 << 20)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.register_system_shared_memory("out_late", f"/{key}", 1 << 20)

    def call():
        inputs = slow_inputs(grpcclient, np.ones(1 << 18, dtype=np.float32), 0.6)
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory("out_late", 1 << 20)
        return grpcclient.InferenceServerClient(srv.grpc_url).infer("victim", inputs, outputs=[out])

    t, out = in_thread(call)
    time.sleep(0.3)
    os.truncate(f"/dev/shm/{key}", 8)
    t.join(60)
    assert "e" in out, out
    assert stubs(srv) == before, srv.log_text()[-3000:]
    assert live(srv)


# Item 4: an output region shrunk while its request is queued fails that request alone.
def test_an_output_region_shrunk_while_queued_fails_that_request_alone(srv, regions):
    before = stubs(srv)
    key, handle = regions.create(64)
    client = httpclient.InferenceServerClient(srv.http_url)
    client.register_system_shared_memory("out_shrinks", f"/{key}", 64)
    busy, busy_out = in_thread(
        lambda: httpclient.InferenceServerClient(srv.http_url).infer(
            "slow", slow_inputs(httpclient, np.ones(4, dtype=np.float32), 1.0)
        )
    )
    time.sleep(0.3)

    def call():
        inputs = slow_inputs(httpclient, np.ones(16, dtype=np.float32), 0.0)
        out = httpclient.InferRequestedOutput("OUT", binary_data=True)
        out.set_shared_memory("out_shrinks", 64)
        return httpclient.InferenceServerClient(srv.http_url).infer("slow", inputs, outputs=[out])

    t, out = in_thread(call)
    time.sleep(0.3)
    os.truncate(f"/dev/shm/{key}", 8)
    busy.join(60)
    t.join(60)
    assert "r" in busy_out, busy_out
    assert "e" in out, out
    assert "is no longer valid: its file has 8 bytes" in out["e"].message(), out["e"]
    assert stubs(srv) == before
    assert live(srv)


# Item 4: a model that truncates the region descriptor it was given.
def test_a_model_cannot_truncate_a_clients_region_under_another_models_stub(srv, regions):
    key, handle = regions.create(64)
    x = np.arange(16, dtype=np.float32)
    shm.set_shared_memory_region(handle, [x])
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.register_system_shared_memory("victim", f"/{key}", 64)

    def infer(model):
        inp = grpcclient.InferInput("IN", [16], "FP32")
        inp.set_shared_memory("victim", 64)
        inputs = [inp] if model == "truncator" else [inp, slow_inputs(grpcclient, x, 0.0)[1]]
        return client.infer(model, inputs)

    # Another model's stub maps the region first.
    assert np.array_equal(infer("other").as_numpy("OUT"), x * 2)
    before = stubs(srv)
    results = [v.decode() for v in infer("truncator").as_numpy("RESULT")]
    # The stub holds only a read-only descriptor of the client's file.
    assert results and all(r in ("EINVAL", "EBADF") for r in results), results
    assert os.stat(f"/dev/shm/{key}").st_size == 64
    # The other model still reads the region, from the same stub.
    assert np.array_equal(infer("other").as_numpy("OUT"), x * 2)
    assert stubs(srv) == before
    assert live(srv)


def seq_infer(module, client, model, value, **sequence):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    r = client.infer(model, [inp], **sequence)
    return int(r.as_numpy("OUTPUT").reshape(-1)[0]), int(r.as_numpy("BATCH").reshape(-1)[0])


# Item 7: a huge string sequence id is refused before it is queued, not in another's batch.
@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_huge_string_sequence_id_counts_against_the_metadata_limit(srv, module):
    before = stubs(srv)
    url = srv.http_url if module is httpclient else srv.grpc_url
    kwargs = {"network_timeout": 60} if module is httpclient else {}
    huge = "s" * (300 * 1024)
    with pytest.raises(InferenceServerException) as e:
        seq_infer(
            module, module.InferenceServerClient(url, **kwargs), "seq_batch", 1, sequence_id=huge, sequence_start=True
        )
    message = e.value.message()
    assert "bytes of request id, sequence id and parameters" in message, message
    assert "(server flag --max-request-metadata-bytes)" in message, message
    assert huge[:100] not in message
    # Two clients' sequences share a batch (the model waits for both slots) and both succeed.
    tag = uuid.uuid4().hex[:8]
    results = {}

    def run(n):
        c = module.InferenceServerClient(url, **kwargs)
        results[n] = seq_infer(
            module, c, "seq_batch", n, sequence_id=f"{tag}-{n}", sequence_start=True, sequence_end=True
        )

    threads = [threading.Thread(target=run, args=(n,)) for n in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == {1: (1, 2), 2: (2, 2)}, results
    assert stubs(srv) == before
    assert live(srv)


# Item 8: the sequence backlog is bounded by default (here by the flag: 2 requests).
def test_the_sequence_backlog_is_bounded(srv):
    before = stubs(srv)
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    base = int(time.time()) % 100000 * 10 + 1_000_000
    # Sequence A holds the only slot.
    assert seq_infer(grpcclient, client, "seq_one", 1, sequence_id=base, sequence_start=True)[0] == 1
    waiting = []
    for n in (1, 2):
        t, out = in_thread(
            lambda n=n: seq_infer(
                grpcclient,
                grpcclient.InferenceServerClient(srv.grpc_url),
                "seq_one",
                10 * n,
                sequence_id=base + n,
                sequence_start=True,
                sequence_end=True,
            )
        )
        waiting.append((t, out))
    time.sleep(0.5)
    assert all(t.is_alive() for t, _ in waiting), "both wait in the backlog"
    with pytest.raises(InferenceServerException) as e:
        seq_infer(grpcclient, client, "seq_one", 5, sequence_id=base + 3, sequence_start=True)
    message = e.value.message()
    assert "the sequence backlog of model 'seq_one' is full: 2 requests" in message, message
    assert "(server flag --max-sequence-backlog)" in message, message
    # Sequence A ends: the backlogged sequences run in turn.
    assert seq_infer(grpcclient, client, "seq_one", 2, sequence_id=base, sequence_end=True)[0] == 3
    for t, _ in waiting:
        t.join(60)
    assert [out.get("r", out.get("e")) for _, out in waiting] == [(10, 1), (20, 1)]
    assert stubs(srv) == before
    assert live(srv)
