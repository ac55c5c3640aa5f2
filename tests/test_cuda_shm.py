"""The CUDA shared memory extension and GPU placement end to end, with tritonclient over HTTP and
gRPC.

Without a usable CUDA driver (CI, this project's build machines) the tests check what a user of
such a machine sees: the extension is listed and answers status and unregister, registering
says why it cannot (no CUDA driver), names shared with system regions are refused, and
`KIND_GPU` is refused at load with Triton's text. With a GPU (`cargo xtask gpu-check`), the
rest run: regions made by `tritonclient.utils.cuda_shared_memory` carry a model's inputs and
outputs, their status, their unregistering while a request uses them, Triton's bounds errors,
and `KIND_GPU` instances on their device.
"""

import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as sysshm
from conftest import Server, cuda_device_count, needs_gpu
from test_shared_memory import error_of, identity_inputs, shm_outputs, write_model
from tritonclient.utils import InferenceServerException

GPUS = cuda_device_count()


def needs_no_gpu():
    if GPUS:
        pytest.skip("checks a machine without a GPU; this one has one")


IDENTITY_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [
  {{ name: "IN0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "IN1" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "SLEEP" data_type: TYPE_FP32 dims: [ 1 ] optional: true }}
]
output [
  {{ name: "OUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "OUT1" data_type: TYPE_FP32 dims: [ -1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

IDENTITY_MODEL = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "IN0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "IN1").as_numpy()
            sleep = pb_utils.get_input_tensor_by_name(request, "SLEEP")
            if sleep is not None:
                time.sleep(float(sleep.as_numpy()[0]))
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT0", a + b), pb_utils.Tensor("OUT1", a - b)])
            )
        return responses
"""

# Reports how it was placed: args' kind and device id.
PLACED_CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [
  {{ name: "KIND" data_type: TYPE_STRING dims: [ 1 ] }},
  {{ name: "DEVICE" data_type: TYPE_INT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_GPU {gpus} }} ]
"""

PLACED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.kind = args["model_instance_kind"]
        self.device = int(args["model_instance_device_id"])

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([
                pb_utils.Tensor("KIND", np.array([self.kind], dtype=np.object_)),
                pb_utils.Tensor("DEVICE", np.array([self.device], dtype=np.int32)),
            ])
            for _ in requests
        ]
"""


# FORCE_CPU_ONLY_INPUT_TENSORS "no": reports whether its input is on the GPU, and doubles it on
# the device it came on (torch, when the input is a GPU tensor).
GPU_INPUTS_CONFIG = """
name: "gpu_inputs"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "ON_GPU" data_type: TYPE_BOOL dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "FORCE_CPU_ONLY_INPUT_TENSORS" value: { string_value: "no" } }
"""

GPU_INPUTS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            t = pb_utils.get_input_tensor_by_name(request, "IN")
            if t.is_cpu():
                out = pb_utils.Tensor("OUT", t.as_numpy() * 2)
            else:
                import torch

                out = pb_utils.Tensor.from_dlpack("OUT", torch.from_dlpack(t.to_dlpack()) * 2)
            on_gpu = pb_utils.Tensor("ON_GPU", np.array([not t.is_cpu()]))
            responses.append(pb_utils.InferenceResponse([out, on_gpu]))
        return responses
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("cuda-shm-repo"))
    write_model(repo, "cuda_identity", IDENTITY_CONFIG.format(name="cuda_identity"), IDENTITY_MODEL)
    write_model(repo, "gpu_inputs", GPU_INPUTS_CONFIG, GPU_INPUTS_MODEL)
    models = ["cuda_identity", "gpu_inputs"]
    if GPUS:
        write_model(repo, "placed_gpu0", PLACED_CONFIG.format(name="placed_gpu0", gpus="gpus: [ 0 ]"), PLACED_MODEL)
        write_model(repo, "placed_all", PLACED_CONFIG.format(name="placed_all", gpus=""), PLACED_MODEL)
        models += ["placed_gpu0", "placed_all"]
    server = Server(repo, str(tmp_path_factory.mktemp("cuda-shm-log") / "tritium.log"))
    try:
        server.wait_models(models)
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{server.log_text()}"


@pytest.fixture(params=["http", "grpc"])
def api(srv, request):
    """(tritonclient module, client), with every region unregistered afterwards."""
    module = httpclient if request.param == "http" else grpcclient
    url = srv.http_url if request.param == "http" else srv.grpc_url
    client = module.InferenceServerClient(url)
    client.url = url
    yield module, client
    client.unregister_cuda_shared_memory()
    client.unregister_system_shared_memory()


def cuda_status(client):
    status = client.get_cuda_shared_memory_status()
    if isinstance(status, list):  # HTTP: a list of dicts
        return {r["name"]: (int(r["device_id"]), int(r["byte_size"])) for r in status}
    return {n: (r.device_id, r.byte_size) for n, r in status.regions.items()}


def raw_handle_for(module, handle_b64):
    """tritonclient's HTTP client puts the base64 text into JSON; its gRPC one decodes it."""
    if module is httpclient and isinstance(handle_b64, bytes):
        return handle_b64.decode()
    return handle_b64


FAKE_HANDLE = __import__("base64").b64encode(bytes(64))


def test_the_extension_is_listed_and_answers_status_and_unregister(api):
    module, client = api
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if isinstance(metadata, dict) else list(metadata.extensions)
    assert "cuda_shared_memory" in extensions
    assert cuda_status(client) == {}
    assert error_of(lambda: client.get_cuda_shared_memory_status("nope")) == (
        "Unable to find cuda shared memory region: 'nope'"
    )
    client.unregister_cuda_shared_memory("nope")  # not registered: no error, as in Triton
    client.unregister_cuda_shared_memory()


def test_without_cuda_registering_says_why(api):
    needs_no_gpu()
    module, client = api
    message = error_of(lambda: client.register_cuda_shared_memory("g", raw_handle_for(module, FAKE_HANDLE), 0, 64))
    assert message.startswith(
        "failed to register CUDA shared memory region: 'g', GPUs not supported (CUDA is not available:"
    )
    assert cuda_status(client) == {}


def test_a_name_is_registered_as_one_kind(api):
    module, client = api
    name = f"r{uuid.uuid4().hex[:10]}"
    handle = sysshm.create_shared_memory_region(name, f"/{name}", 64)
    try:
        client.register_system_shared_memory(name, f"/{name}", 64)
        assert error_of(
            lambda: client.register_cuda_shared_memory(name, raw_handle_for(module, FAKE_HANDLE), 0, 64)
        ) == (f"shared memory region '{name}' already in manager")
        assert error_of(lambda: client.get_cuda_shared_memory_status(name)) == (
            f"The region named '{name}' is registered as system shared memory, not CUDA shared memory"
        )
        # Unregistering it as CUDA memory leaves the system region alone, as in Triton.
        client.unregister_cuda_shared_memory(name)
        status = client.get_system_shared_memory_status(name)
        assert (status[0]["name"] if isinstance(status, list) else list(status.regions)[0]) == name
    finally:
        client.unregister_system_shared_memory()
        sysshm.destroy_shared_memory_region(handle)


def test_the_log_says_once_whether_cuda_is_there(srv):
    log = srv.log_text()
    if GPUS:
        assert log.count("CUDA device") == GPUS, log
    else:
        assert log.count("CUDA is not available") == 1, log
        assert "models run on the CPU only" in log


def test_a_model_asking_for_gpu_inputs_gets_cpu_tensors_for_inputs_on_the_cpu(api):
    module, client = api
    # From the request body and from system shared memory alike.
    a = np.arange(8, dtype=np.float32)
    inp = module.InferInput("IN", [8], "FP32")
    inp.set_data_from_numpy(a)
    result = client.infer("gpu_inputs", [inp])
    assert result.as_numpy("ON_GPU").tolist() == [False]
    np.testing.assert_array_equal(result.as_numpy("OUT"), a * 2)
    name = f"r{uuid.uuid4().hex[:10]}"
    handle = sysshm.create_shared_memory_region(name, f"/{name}", 32)
    try:
        sysshm.set_shared_memory_region(handle, [a])
        client.register_system_shared_memory(name, f"/{name}", 32)
        inp = module.InferInput("IN", [8], "FP32")
        inp.set_shared_memory(name, 32)
        result = client.infer("gpu_inputs", [inp])
        assert result.as_numpy("ON_GPU").tolist() == [False]
        np.testing.assert_array_equal(result.as_numpy("OUT"), a * 2)
    finally:
        client.unregister_system_shared_memory()
        sysshm.destroy_shared_memory_region(handle)


# ---- with a GPU ----


@pytest.fixture
def cudashm():
    needs_gpu()
    import tritonclient.utils.cuda_shared_memory as module

    handles = []

    def create(size, device=0):
        name = f"g{uuid.uuid4().hex[:10]}"
        handle = module.create_shared_memory_region(name, size, device)
        handles.append(handle)
        return name, handle

    module.create = create
    yield module
    for h in handles:
        module.destroy_shared_memory_region(h)


# The same tensors as the system shared memory tests: IN0 and IN1 from one region, OUT0 and OUT1
# into another (set_shared_memory is the same call for both kinds of region).
gpu_inputs = identity_inputs
gpu_outputs = shm_outputs


def test_inputs_and_outputs_in_cuda_regions(api, cudashm):
    module, client = api
    n = 1 << 18
    a = np.random.default_rng(1).random(n, dtype=np.float32)
    b = np.random.default_rng(2).random(n, dtype=np.float32)
    in_name, in_handle = cudashm.create(8 * n)
    out_name, out_handle = cudashm.create(8 * n)
    cudashm.set_shared_memory_region(in_handle, [a, b])
    client.register_cuda_shared_memory(in_name, raw_handle_for(module, cudashm.get_raw_handle(in_handle)), 0, 8 * n)
    client.register_cuda_shared_memory(out_name, raw_handle_for(module, cudashm.get_raw_handle(out_handle)), 0, 8 * n)
    assert cuda_status(client) == {in_name: (0, 8 * n), out_name: (0, 8 * n)}

    client.infer("cuda_identity", gpu_inputs(module, in_name, n), outputs=gpu_outputs(module, out_name, n))
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out_handle, np.float32, [n]), a + b)
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out_handle, np.float32, [n], offset=4 * n), a - b)
    # Inputs from the GPU, outputs in the response.
    result = client.infer("cuda_identity", gpu_inputs(module, in_name, n))
    np.testing.assert_array_equal(result.as_numpy("OUT1"), a - b)

    client.unregister_cuda_shared_memory(in_name)
    assert set(cuda_status(client)) == {out_name}
    assert error_of(lambda: client.infer("cuda_identity", gpu_inputs(module, in_name, n))) == (
        f"Unable to find shared memory region: '{in_name}'"
    )


def test_a_model_asking_for_gpu_inputs_gets_the_clients_device_memory(api, cudashm):
    pytest.importorskip("torch", reason="the model uses torch for its GPU input")
    module, client = api
    n = 4096
    a = np.random.default_rng(3).random(n, dtype=np.float32)
    in_name, in_handle = cudashm.create(4 * n)
    out_name, out_handle = cudashm.create(4 * n)
    cudashm.set_shared_memory_region(in_handle, [a])
    client.register_cuda_shared_memory(in_name, raw_handle_for(module, cudashm.get_raw_handle(in_handle)), 0, 4 * n)
    client.register_cuda_shared_memory(out_name, raw_handle_for(module, cudashm.get_raw_handle(out_handle)), 0, 4 * n)
    inp = module.InferInput("IN", [n], "FP32")
    inp.set_shared_memory(in_name, 4 * n)
    out = module.InferRequestedOutput("OUT")
    out.set_shared_memory(out_name, 4 * n)
    result = client.infer("gpu_inputs", [inp], outputs=[out, module.InferRequestedOutput("ON_GPU")])
    assert result.as_numpy("ON_GPU").tolist() == [True]
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out_handle, np.float32, [n]), a * 2)
    # Twice more: the stub's opened handle is reused or opened again, never twice at once.
    for _ in range(2):
        client.infer("gpu_inputs", [inp], outputs=[out])
    # The default model (FORCE_CPU_ONLY_INPUT_TENSORS "yes") gets the same input on the CPU.
    identity = gpu_inputs(module, in_name, n // 2)
    result = client.infer("cuda_identity", identity)
    np.testing.assert_array_equal(result.as_numpy("OUT0"), a[: n // 2] + a[n // 2 :])


def test_cuda_registration_and_bounds_errors_are_tritons(api, cudashm):
    module, client = api
    name, handle = cudashm.create(4096)
    raw = raw_handle_for(module, cudashm.get_raw_handle(handle))
    assert error_of(lambda: client.register_cuda_shared_memory(name, raw, 0, 1 << 30)).startswith(
        f"failed to register shared memory region '{name}': invalid args"
    )
    client.register_cuda_shared_memory(name, raw, 0, 4096)
    assert error_of(lambda: client.register_cuda_shared_memory(name, raw, 0, 64)) == (
        f"shared memory region '{name}' already in manager"
    )
    assert error_of(lambda: client.infer("cuda_identity", gpu_inputs(module, name, 16, offset=4096))) == (
        f"Invalid offset for shared memory region: '{name}'"
    )
    assert error_of(lambda: client.infer("cuda_identity", gpu_inputs(module, name, 1000))) == (
        f"Invalid offset + byte size for shared memory region: '{name}'"
    )
    outputs = gpu_outputs(module, name, 16)
    inputs = [module.InferInput("IN0", [64], "FP32"), module.InferInput("IN1", [64], "FP32")]
    for i in inputs:
        i.set_data_from_numpy(np.ones(64, dtype=np.float32))
    assert "should be at least" in error_of(lambda: client.infer("cuda_identity", inputs, outputs=outputs))


def test_unregistering_a_cuda_region_in_use_waits_for_the_request(api, cudashm):
    module, client = api
    n = 1024
    a = np.arange(n, dtype=np.float32)
    name, handle = cudashm.create(8 * n)
    out_name, out_handle = cudashm.create(8 * n)
    cudashm.set_shared_memory_region(handle, [a, a])
    client.register_cuda_shared_memory(name, raw_handle_for(module, cudashm.get_raw_handle(handle)), 0, 8 * n)
    client.register_cuda_shared_memory(out_name, raw_handle_for(module, cudashm.get_raw_handle(out_handle)), 0, 8 * n)
    inputs = gpu_inputs(module, name, n)
    sleep = module.InferInput("SLEEP", [1], "FP32")
    sleep.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    inputs.append(sleep)
    out = {}

    def run():
        try:
            other = module.InferenceServerClient(client.url)
            out["r"] = other.infer("cuda_identity", inputs, outputs=gpu_outputs(module, out_name, n))
        except InferenceServerException as e:
            out["e"] = e

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    client.unregister_cuda_shared_memory(out_name)
    client.unregister_cuda_shared_memory(name)
    t.join(30)
    assert "e" not in out, out.get("e")
    np.testing.assert_array_equal(cudashm.get_contents_as_numpy(out_handle, np.float32, [n]), a + a)


def test_kind_gpu_instances_are_placed_on_their_device(api):
    needs_gpu()
    module, client = api
    inp = module.InferInput("IN", [1], "FP32")
    inp.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    for model in ("placed_gpu0", "placed_all"):
        result = client.infer(model, [inp])
        kind = result.as_numpy("KIND")[0]
        assert (kind.decode() if isinstance(kind, bytes) else kind) == "GPU"
        assert int(result.as_numpy("DEVICE")[0]) in range(GPUS)
    config = client.get_model_config("placed_all")
    groups = config["instance_group"] if isinstance(config, dict) else config.config.instance_group
    gpus = groups[0]["gpus"] if isinstance(groups[0], dict) else list(groups[0].gpus)
    assert list(gpus) == list(range(GPUS))


def test_a_missing_gpu_id_is_refused_with_tritons_text(start):
    needs_gpu()
    write_model(start.repo, "placed_bad", PLACED_CONFIG.format(name="placed_bad", gpus="gpus: [ 99 ]"), PLACED_MODEL)
    srv = start([])
    client = httpclient.InferenceServerClient(srv.http_url)
    deadline = time.time() + 60
    while True:
        entry = {m["name"]: m for m in client.get_model_repository_index()}.get("placed_bad", {})
        if entry.get("state") == "UNAVAILABLE" or time.time() > deadline:
            break
        time.sleep(0.2)
    available = ", ".join(str(i) for i in range(GPUS))
    assert f"specifies invalid or unsupported gpu id 99. Available GPUs are: {available}" in entry.get("reason", ""), (
        entry
    )
