"""The system shared memory extension end to end: a real server, real stubs, and
`tritonclient.utils.shared_memory` regions over HTTP and gRPC, as users drive them.

The aliasing tests prove that the model's numpy array *is* the client's memory: the array's
address lies in the stub's mapping of `/dev/shm/<key>` (from /proc/self/maps), it is read-only,
and bytes the client writes into the region while `execute` runs show up in the model's array.
"""

import os
import re
import subprocess
import textwrap
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from conftest import Server, require
from tritonclient.utils import InferenceServerException

IDENTITY_CONFIG = """
name: "shm_identity"
backend: "python"
max_batch_size: 0
input [
  { name: "IN0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "IN1" data_type: TYPE_FP32 dims: [ -1 ] }
]
output [
  { name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "OUT1" data_type: TYPE_FP32 dims: [ -1 ] }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

IDENTITY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT0", a + b), pb_utils.Tensor("OUT1", a - b)]
                )
            )
        return responses
"""

PROBE_CONFIG = """
name: "shm_probe"
backend: "python"
max_batch_size: 0
input [
  { name: "IN" data_type: TYPE_UINT8 dims: [ -1 ] },
  { name: "SLEEP" data_type: TYPE_FP32 dims: [ 1 ] }
]
output [
  { name: "WRITABLE" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "PATH" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "BEFORE" data_type: TYPE_UINT8 dims: [ -1 ] },
  { name: "AFTER" data_type: TYPE_UINT8 dims: [ -1 ] }
]
"""

# Reports where its input array lives (the file mapped at its address in /proc/self/maps),
# whether it may write to it, and its first bytes before and after sleeping SLEEP seconds.
PROBE_MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def mapping_of(address):
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            start, end = (int(x, 16) for x in parts[0].split("-"))
            if start <= address < end:
                return parts[5] if len(parts) > 5 else "[anonymous]"
    return "[unmapped]"


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            arr = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sleep = float(pb_utils.get_input_tensor_by_name(request, "SLEEP").as_numpy()[0])
            before = arr[:8].copy()
            time.sleep(sleep)
            after = arr[:8].copy()
            path = mapping_of(arr.ctypes.data)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("WRITABLE", np.array([arr.flags.writeable])),
                        pb_utils.Tensor("PATH", np.array([path.encode()], dtype=np.object_)),
                        pb_utils.Tensor("BEFORE", before),
                        pb_utils.Tensor("AFTER", after),
                    ]
                )
            )
        return responses
"""

DLPACK_CONFIG = """
name: "shm_dlpack"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "TWICE" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SAME" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "SHARED" data_type: TYPE_BOOL dims: [ 1 ] }
]
"""

# DLPack on a real stub's tensors: numpy reads an input through `__dlpack__`, outputs are made
# with `Tensor.from_dlpack` from an object and from a capsule; SHARED says whether the array
# numpy got is the input's own memory (an input in a client's region is exported as a copy).
DLPACK_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "IN")
            a = np.from_dlpack(t)
            twice = pb_utils.Tensor.from_dlpack("TWICE", a * 2)
            same = pb_utils.Tensor.from_dlpack("SAME", t.to_dlpack())
            shared = pb_utils.Tensor("SHARED", np.array([np.shares_memory(a, t.as_numpy())]))
            responses.append(pb_utils.InferenceResponse([twice, same, shared]))
        return responses
"""

# One instance, so the stub whose arena is measured is the one that ran every request.
COPY_CONFIG = """
name: "shm_copy"
backend: "python"
max_batch_size: 0
input [ { name: "IN0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

COPY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT0", pb_utils.get_input_tensor_by_name(r, "IN0").as_numpy())])
            for r in requests
        ]
"""


def write_model(repo, name, config, model):
    os.makedirs(os.path.join(repo, name, "1"))
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(config)
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(model))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("shm-repo"))
    write_model(repo, "shm_identity", IDENTITY_CONFIG, IDENTITY_MODEL)
    write_model(repo, "shm_probe", PROBE_CONFIG, PROBE_MODEL)
    write_model(repo, "shm_dlpack", DLPACK_CONFIG, DLPACK_MODEL)
    write_model(repo, "shm_copy", COPY_CONFIG, COPY_MODEL)
    server = Server(repo, str(tmp_path_factory.mktemp("shm-log") / "tritium.log"))
    try:
        server.wait_models(["shm_identity", "shm_probe", "shm_dlpack", "shm_copy"])
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{server.log_text()}"


@pytest.fixture(params=["http", "grpc"])
def api(srv, request):
    """(tritonclient module, client), with every region unregistered afterwards."""
    if request.param == "http":
        import tritonclient.http as module

        url = srv.http_url
    else:
        import tritonclient.grpc as module

        url = srv.grpc_url
    client = module.InferenceServerClient(url)
    client.url = url
    yield module, client
    client.unregister_system_shared_memory()


def in_thread(module, url, call):
    """Runs `call(client)` on a thread with a client of its own (the HTTP client is gevent's,
    which cannot cross threads); returns the thread and the dict its result or error lands in."""
    out = {}

    def run():
        try:
            out["r"] = call(module.InferenceServerClient(url))
        except InferenceServerException as e:
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


class Regions:
    """Client regions created for one test and destroyed after it."""

    def __init__(self):
        self.handles = []

    def create(self, size):
        name = f"r{uuid.uuid4().hex[:10]}"
        handle = shm.create_shared_memory_region(name, f"/{name}", size)
        self.handles.append(handle)
        return name, f"/{name}", handle

    def close(self):
        for h in self.handles:
            shm.destroy_shared_memory_region(h)


@pytest.fixture
def regions():
    r = Regions()
    yield r
    r.close()


def status_names(client):
    status = client.get_system_shared_memory_status()
    if isinstance(status, list):  # HTTP: a list of dicts
        return {r["name"]: (r["key"], int(r.get("offset", 0)), int(r["byte_size"])) for r in status}
    return {n: (r.key, r.offset, r.byte_size) for n, r in status.regions.items()}


def error_of(call):
    with pytest.raises(InferenceServerException) as e:
        call()
    return e.value.message()


def identity_inputs(module, name, n, offset=0):
    inputs = [module.InferInput("IN0", [n], "FP32"), module.InferInput("IN1", [n], "FP32")]
    inputs[0].set_shared_memory(name, 4 * n, offset=offset)
    inputs[1].set_shared_memory(name, 4 * n, offset=offset + 4 * n)
    return inputs


def shm_outputs(module, name, n):
    outputs = [module.InferRequestedOutput("OUT0"), module.InferRequestedOutput("OUT1")]
    outputs[0].set_shared_memory(name, 4 * n)
    outputs[1].set_shared_memory(name, 4 * n, offset=4 * n)
    return outputs


def test_register_infer_status_and_unregister(api, regions):
    module, client = api
    n = 1 << 20  # 4 MiB per tensor
    a = np.random.default_rng(1).random(n, dtype=np.float32)
    b = np.random.default_rng(2).random(n, dtype=np.float32)
    in_name, in_key, in_handle = regions.create(8 * n + 64)
    out_name, out_key, out_handle = regions.create(8 * n)
    shm.set_shared_memory_region(in_handle, [a, b], offset=64)
    client.register_system_shared_memory(in_name, in_key, 8 * n, offset=64)
    client.register_system_shared_memory(out_name, out_key, 8 * n)
    assert status_names(client) == {in_name: (in_key, 64, 8 * n), out_name: (out_key, 0, 8 * n)}

    result = client.infer("shm_identity", identity_inputs(module, in_name, n), outputs=shm_outputs(module, out_name, n))
    out0 = shm.get_contents_as_numpy(out_handle, np.float32, [n])
    out1 = shm.get_contents_as_numpy(out_handle, np.float32, [n], offset=4 * n)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    # As in Triton, the response names the outputs without data.
    output = result.get_output("OUT0")
    shape = output["shape"] if isinstance(output, dict) else list(output.shape)
    assert list(shape) == [n]
    if isinstance(output, dict):
        assert "data" not in output and "binary_data_size" not in output.get("parameters", {})

    # Mixed: inputs from shared memory, outputs in the response.
    result = client.infer("shm_identity", identity_inputs(module, in_name, n))
    np.testing.assert_array_equal(result.as_numpy("OUT0"), a + b)

    client.unregister_system_shared_memory(in_name)
    assert set(status_names(client)) == {out_name}
    message = error_of(lambda: client.infer("shm_identity", identity_inputs(module, in_name, n)))
    assert message == f"Unable to find shared memory region: '{in_name}'"
    client.unregister_system_shared_memory()
    assert status_names(client) == {}


def test_registration_errors_are_tritons(api, regions):
    _, client = api
    name, key, _ = regions.create(4096)
    assert error_of(lambda: client.register_system_shared_memory("x", "/no-such-tritium-region", 64)) == (
        "Unable to open shared memory region: '/no-such-tritium-region'"
    )
    assert error_of(lambda: client.register_system_shared_memory(name, key, 4000, offset=100)) == (
        f"failed to register shared memory region '{name}': invalid args"
    )
    client.register_system_shared_memory(name, key, 4096)
    assert error_of(lambda: client.register_system_shared_memory(name, key, 64)) == (
        f"shared memory region '{name}' already in manager"
    )
    assert error_of(lambda: client.get_system_shared_memory_status("nope")) == (
        "Unable to find system shared memory region: 'nope'"
    )
    # Unregistering a region that is not registered is no error (as in Triton).
    client.unregister_system_shared_memory("nope")


def test_bad_offsets_and_sizes_get_tritons_errors(api, regions):
    module, client = api
    name, key, handle = regions.create(4096)
    client.register_system_shared_memory(name, key, 1024)
    n = 64  # 256 bytes per tensor
    message = error_of(lambda: client.infer("shm_identity", identity_inputs(module, name, n, offset=1024)))
    assert message == f"Invalid offset for shared memory region: '{name}'"
    message = error_of(lambda: client.infer("shm_identity", identity_inputs(module, name, n, offset=600)))
    assert message == f"Invalid offset + byte size for shared memory region: '{name}'"
    message = error_of(lambda: client.infer("shm_identity", identity_inputs(module, "nope", n)))
    assert message == "Unable to find shared memory region: 'nope'"
    # An output larger than the range the request gives it.
    out = module.InferRequestedOutput("OUT0")
    out.set_shared_memory(name, 100)
    message = error_of(lambda: client.infer("shm_identity", identity_inputs(module, name, n), outputs=[out]))
    assert message == (
        "shared memory size specified with the request for output 'OUT0' (100 bytes) should be at least "
        "256 bytes to hold the results"
    )
    # The region still works after all that.
    shm.set_shared_memory_region(handle, [np.ones(2 * n, dtype=np.float32)])
    result = client.infer("shm_identity", identity_inputs(module, name, n))
    np.testing.assert_array_equal(result.as_numpy("OUT0"), np.full(n, 2, dtype=np.float32))


def probe_inputs(module, name, size, sleep):
    inp = module.InferInput("IN", [size], "UINT8")
    inp.set_shared_memory(name, size)
    delay = module.InferInput("SLEEP", [1], "FP32")
    delay.set_data_from_numpy(np.array([sleep], dtype=np.float32))
    return [inp, delay]


def test_the_models_array_is_the_clients_memory(api, regions):
    module, client = api
    name, key, handle = regions.create(4096)
    shm.set_shared_memory_region(handle, [np.arange(8, dtype=np.uint8)])
    client.register_system_shared_memory(name, key, 4096)
    t, results = in_thread(module, client.url, lambda c: c.infer("shm_probe", probe_inputs(module, name, 4096, 1.5)))
    time.sleep(0.5)  # the model has taken BEFORE and sleeps
    shm.set_shared_memory_region(handle, [np.full(8, 200, dtype=np.uint8)])
    t.join(30)
    assert "e" not in results, results.get("e")
    r = results["r"]
    # The array's address lies in the stub's mapping of the client's object...
    assert r.as_numpy("PATH")[0].decode() == f"/dev/shm/{key.lstrip('/')}"
    # ...the model may not write to it (the client owns it)...
    assert not bool(r.as_numpy("WRITABLE")[0])
    # ...and what the client wrote while execute ran is what the model's array holds.
    np.testing.assert_array_equal(r.as_numpy("BEFORE"), np.arange(8, dtype=np.uint8))
    np.testing.assert_array_equal(r.as_numpy("AFTER"), np.full(8, 200, dtype=np.uint8))


def test_unregistering_a_region_in_use_waits_for_the_request(api, regions):
    module, client = api
    n = 1024
    in_name, in_key, in_handle = regions.create(4096)
    out_name, out_key, out_handle = regions.create(4096)
    shm.set_shared_memory_region(in_handle, [np.full(8, 7, dtype=np.uint8)])
    client.register_system_shared_memory(in_name, in_key, 4096)
    client.register_system_shared_memory(out_name, out_key, 4096)
    out = module.InferRequestedOutput("AFTER")
    out.set_shared_memory(out_name, 64, offset=128)
    t, results = in_thread(
        module, client.url, lambda c: c.infer("shm_probe", probe_inputs(module, in_name, n, 1.5), outputs=[out])
    )
    time.sleep(0.5)
    # Both regions go while the request runs: the names at once (so they can be registered
    # again), the memory only when the request is done with it.
    client.unregister_system_shared_memory(in_name)
    client.unregister_system_shared_memory(out_name)
    assert status_names(client) == {}
    client.register_system_shared_memory(in_name, in_key, 64)
    t.join(30)
    assert "e" not in results, results.get("e")
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(out_handle, np.uint8, [8], offset=128), np.full(8, 7, dtype=np.uint8)
    )
    assert status_names(client) == {in_name: (in_key, 0, 64)}


def stub_shm_bytes(srv, model):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^tritium_stub_shm_bytes\{[^}]*model="' + model + r'"[^}]*\} (\d+)$', text, re.M)
    assert m, text
    return int(m.group(1))


def test_outputs_go_straight_into_the_region_never_through_the_arena(srv, api, regions):
    # The stub writes an output asked for in a region into that region, so its arena never holds
    # the 4 MiB outputs (a regression: they once went through the arena and were copied twice
    # more by the server, with the same bytes in the region at the end).
    module, client = api
    n = 1 << 20
    x = np.random.default_rng(3).random(n, dtype=np.float32)
    in_name, in_key, in_handle = regions.create(4 * n)
    out_name, out_key, out_handle = regions.create(4 * n)
    shm.set_shared_memory_region(in_handle, [x])
    client.register_system_shared_memory(in_name, in_key, 4 * n)
    client.register_system_shared_memory(out_name, out_key, 4 * n)
    for _ in range(3):
        inp = module.InferInput("IN0", [n], "FP32")
        inp.set_shared_memory(in_name, 4 * n)
        out = module.InferRequestedOutput("OUT0")
        out.set_shared_memory(out_name, 4 * n)
        client.infer("shm_copy", [inp], outputs=[out])
        np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [n]), x)
    assert stub_shm_bytes(srv, "shm_copy") < 4 * n


def test_dlpack_on_the_stubs_tensors(api, regions):
    module, client = api
    x = np.arange(16, dtype=np.float32)
    # An input in the request: DLPack shares the input's own (private, writable) memory.
    inp = module.InferInput("IN", [16], "FP32")
    inp.set_data_from_numpy(x)
    r = client.infer("shm_dlpack", [inp])
    np.testing.assert_array_equal(r.as_numpy("TWICE"), x * 2)
    np.testing.assert_array_equal(r.as_numpy("SAME"), x)
    assert bool(r.as_numpy("SHARED")[0])
    # An input in a client's region is read-only to the model: exported as a copy.
    name, key, handle = regions.create(64)
    shm.set_shared_memory_region(handle, [x])
    client.register_system_shared_memory(name, key, 64)
    inp = module.InferInput("IN", [16], "FP32")
    inp.set_shared_memory(name, 64)
    r = client.infer("shm_dlpack", [inp])
    np.testing.assert_array_equal(r.as_numpy("TWICE"), x * 2)
    np.testing.assert_array_equal(r.as_numpy("SAME"), x)
    assert not bool(r.as_numpy("SHARED")[0])


def test_perf_analyzer_with_system_shared_memory(srv, tmp_path):
    perf = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "bin", "perf_analyzer")
    require(os.path.exists(perf), "no perf_analyzer (run `cargo xtask setup`)")
    for protocol, url in (("http", srv.http_url), ("grpc", srv.grpc_url)):
        out = subprocess.run(
            [
                perf,
                "-m",
                "shm_identity",
                "-u",
                url,
                "-i",
                protocol,
                "--shape",
                "IN0:1024",
                "--shape",
                "IN1:1024",
                "--shared-memory",
                "system",
                "--output-shared-memory-size",
                "4096",
                "--measurement-interval",
                "500",
                "--concurrency-range",
                "2",
                # This machine is shared and noisy: any window is a measurement.
                "--stability-percentage",
                "1000",
                "--max-trials",
                "10",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, f"{protocol}:\n{out.stdout}\n{out.stderr}"
        m = re.search(r"Throughput: ([0-9.]+) infer/sec", out.stdout)
        assert m and float(m.group(1)) > 0, out.stdout


def live(client):
    try:
        return client.is_server_live()
    except InferenceServerException:
        return False


def test_allow_client_shm_false_refuses_registration_with_tritons_text(start, regions):
    srv = start([], ["--allow-client-shm=false"])
    deadline = time.time() + 60
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    while srv.get("/v2/health/live") != 200 or not live(grpc):
        assert srv.proc.poll() is None and time.time() < deadline, srv.log_text()
        time.sleep(0.05)
    name, key, _ = regions.create(4096)
    for client in (httpclient.InferenceServerClient(srv.http_url), grpc):
        assert error_of(lambda c=client: c.register_system_shared_memory(name, key, 4096)) == (
            "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
        )
        assert status_names(client) == {}
        client.unregister_system_shared_memory()
