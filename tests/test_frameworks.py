"""ONNX Runtime and PyTorch models served in stubs by tritium's built-in backends, end to end: ONNX
models made here with onnx.helper and PyTorch models with torch.jit.script / torch.export, a real
server, real stubs and tritonclient over HTTP and gRPC.

Covers: answers against numpy over both protocols; auto-complete of a config-less ONNX model
(inputs, outputs, max_batch_size 4 and the dynamic batcher) and `--backend-config=onnxruntime,
default-max-batch-size=N`; configs that contradict the model; batching proved by the statistics
with every request getting its own answer; a missing onnxruntime; a request the runtime rejects
at run time failing alone; other platforms refused with a list of what tritium serves; and an
ensemble of Python, ONNX and PyTorch steps.
"""

import concurrent.futures
import json
import os
import re
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import Server, require
from test_envs import make_venv

try:
    import onnx
    from onnx import TensorProto, helper
except ImportError:
    onnx = None
try:
    import onnxruntime
except ImportError:
    onnxruntime = None
try:
    import torch
except ImportError:
    torch = None

OPSET = 17


def needs_onnx():
    require(onnx is not None and onnxruntime is not None, "the onnx and onnxruntime packages (cargo xtask setup)")


def needs_torch():
    require(torch is not None, "the torch package (cargo xtask setup)")


def save_onnx(path, nodes, inputs, outputs, initializers=()):
    """An ONNX model of `nodes` saved at `path` (opset 17, an IR version onnxruntime reads)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    onnx.save(model, path)


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def write(repo, name, config=None, files=None):
    """Model `name`: its config.pbtxt (when given, dedented) and version 1's files (callables
    that write a path)."""
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    if config is not None:
        with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
            f.write(textwrap.dedent(config))
    for filename, make in (files or {}).items():
        make(os.path.join(repo, name, "1", filename))


def add_sub_onnx(path):
    """SUM = X + Y, DIFF = X - Y over FP32 [batch, 4]."""
    save_onnx(
        path,
        [helper.make_node("Add", ["X", "Y"], ["SUM"]), helper.make_node("Sub", ["X", "Y"], ["DIFF"])],
        [vi("X", TensorProto.FLOAT, ["batch", 4]), vi("Y", TensorProto.FLOAT, ["batch", 4])],
        [vi("SUM", TensorProto.FLOAT, ["batch", 4]), vi("DIFF", TensorProto.FLOAT, ["batch", 4])],
    )


W = np.arange(6, dtype=np.float32).reshape(3, 2) / 10 - 0.2


def matmul_onnx(path, batch="n"):
    """Y = Relu(X @ W) over FP32 [batch, 3] -> [batch, 2]."""
    save_onnx(
        path,
        [helper.make_node("MatMul", ["X", "W"], ["XW"]), helper.make_node("Relu", ["XW"], ["Y"])],
        [vi("X", TensorProto.FLOAT, [batch, 3])],
        [vi("Y", TensorProto.FLOAT, [batch, 2])],
        [helper.make_tensor("W", TensorProto.FLOAT, [3, 2], W.flatten().tolist())],
    )


TABLE = np.arange(10, dtype=np.float32) * 1.5


def gather_onnx(path):
    """OUT = TABLE[IDX]: an index past the table is refused by onnxruntime when the model runs."""
    save_onnx(
        path,
        [helper.make_node("Gather", ["T", "IDX"], ["OUT"], axis=0)],
        [vi("IDX", TensorProto.INT64, ["batch", 1])],
        [vi("OUT", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor("T", TensorProto.FLOAT, [10], TABLE.tolist())],
    )


def torch_script(module):
    def make(path):
        torch.jit.script(module).save(path)

    return make


if torch is not None:

    class AddSub(torch.nn.Module):
        def forward(self, x, y):
            return x + y, x - y

    class Scale(torch.nn.Module):
        def forward(self, values, factor):
            return values * factor

    class Double(torch.nn.Module):
        def forward(self, x):
            return x * 2.0


def torch_export(path):
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Double(), (torch.ones(2, 4),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, path)


ONNX_ADD_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
"""

BATCHING_CONFIG = """
backend: "onnxruntime"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 500000 preferred_batch_size: [ 16 ] }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

GATHER_CONFIG = """
backend: "onnxruntime"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 500000 preferred_batch_size: [ 16 ] }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

TORCH_ADD_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 8
dynamic_batching { }
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT__1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "INFERENCE_MODE" value: { string_value: "true" } }
parameters { key: "DISABLE_CUDNN" value: { string_value: "true" } }
"""

TORCH_NAMED_CONFIG = """
backend: "pytorch"
max_batch_size: 0
input [ { name: "factor" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "values" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "scaled" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""

TORCH_EXPORT_CONFIG = """
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

# Contradictions of add_sub_onnx: a name, a data type, a rank.
CONTRADICTIONS = {
    "wrong_name": ("Z", "TYPE_FP32", "[ 4 ]", "'Z'"),
    "wrong_type": ("X", "TYPE_INT32", "[ 4 ]", "unexpected datatype TYPE_INT32 for input 'X'"),
    "wrong_rank": ("X", "TYPE_FP32", "[ 2, 2 ]", "input 'X': the ONNX model has 2 dimensions"),
}

ENSEMBLE_PRE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "RAW").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("P", (x * 2).astype(np.float32))]))
        return out
"""

ENSEMBLE_CONFIG = """
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "ens_pre" model_version: -1
    input_map { key: "RAW" value: "RAW" } output_map { key: "P" value: "p" } },
  { model_name: "onnx_add" model_version: -1
    input_map [ { key: "X" value: "p" }, { key: "Y" value: "p" } ]
    output_map [ { key: "SUM" value: "s" }, { key: "DIFF" value: "d" } ] },
  { model_name: "torch_add" model_version: -1
    input_map [ { key: "INPUT__0" value: "s" }, { key: "INPUT__1" value: "d" } ]
    output_map [ { key: "OUTPUT__0" value: "A" }, { key: "OUTPUT__1" value: "B" } ] }
] }
"""

ENS_PRE_CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "P" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

SERVED = ["onnx_add", "onnx_auto", "onnx_fixed", "onnx_batching", "onnx_gather", "onnx_external"]
TORCH_SERVED = ["torch_add", "torch_named", "torch_export", "ens_pre", "ensemble_mixed"]
BROKEN = ["no_onnxruntime", "tensorrt_model", *CONTRADICTIONS]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    needs_onnx()
    tmp = tmp_path_factory.mktemp("frameworks")
    repo = str(tmp / "repo")
    write(repo, "onnx_add", ONNX_ADD_CONFIG, {"model.onnx": add_sub_onnx})
    write(repo, "onnx_auto", None, {"model.onnx": matmul_onnx})
    write(repo, "onnx_fixed", None, {"model.onnx": lambda p: matmul_onnx(p, batch=2)})
    write(repo, "onnx_batching", BATCHING_CONFIG, {"model.onnx": matmul_onnx})
    write(repo, "onnx_gather", GATHER_CONFIG, {"model.onnx": gather_onnx})
    # External data: model.onnx is a directory holding model.onnx and its weights' file.
    write(repo, "onnx_external", 'platform: "onnxruntime_onnx"\n', {"model.onnx": external_matmul_onnx})
    for name, (tensor, dtype, dims, _) in CONTRADICTIONS.items():
        config = ONNX_ADD_CONFIG.replace(
            'name: "X" data_type: TYPE_FP32 dims: [ 4 ]', f'name: "{tensor}" data_type: {dtype} dims: {dims}'
        )
        write(repo, name, config, {"model.onnx": add_sub_onnx})
    write(repo, "tensorrt_model", 'platform: "tensorrt_plan"\nmax_batch_size: 1\n')
    # An environment without onnxruntime (numpy only), inside the model's directory.
    write(repo, "no_onnxruntime", None, {"model.onnx": add_sub_onnx})
    make_venv(os.path.join(repo, "no_onnxruntime", "env"), with_numpy=True)
    with open(os.path.join(repo, "no_onnxruntime", "config.pbtxt"), "w") as f:
        f.write(
            'platform: "onnxruntime_onnx"\n'
            'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env" } }\n'
        )
    models = list(SERVED)
    if torch is not None:
        write(repo, "torch_add", TORCH_ADD_CONFIG, {"model.pt": torch_script(AddSub())})
        write(repo, "torch_named", TORCH_NAMED_CONFIG, {"model.pt": torch_script(Scale())})
        write(repo, "torch_export", TORCH_EXPORT_CONFIG, {"model.pt2": torch_export})
        write(repo, "ens_pre", ENS_PRE_CONFIG)
        with open(os.path.join(repo, "ens_pre", "1", "model.py"), "w") as f:
            f.write(ENSEMBLE_PRE)
        write(repo, "ensemble_mixed", ENSEMBLE_CONFIG)
        models += TORCH_SERVED
    server = Server(repo, str(tmp / "tritium.log"), ["--model-load-thread-count", "4"])
    try:
        server.wait_models(models, timeout=300)
        yield server
    finally:
        server.stop()


def external_matmul_onnx(directory):
    """matmul_onnx with its weights in a file beside it (ONNX external data)."""
    os.makedirs(directory)
    path = os.path.join(directory, "model.onnx")
    matmul_onnx(path)
    model = onnx.load(path)
    onnx.save_model(
        model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0
    )


def clients(server):
    return [
        (httpclient, httpclient.InferenceServerClient(server.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    ]


def infer(module, client, model, inputs, outputs=None):
    """Runs `model` on `inputs` (name -> array) and returns (name -> array) for `outputs`."""
    tensors = []
    for name, array in inputs.items():
        dtype = {np.float32: "FP32", np.int64: "INT64"}[array.dtype.type]
        t = module.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    result = client.infer(model, tensors)
    return {name: result.as_numpy(name) for name in outputs or []}


def get_json(server, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=data, method="GET" if body is None else "POST"
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def reasons(server):
    return {m["name"]: m.get("reason", "") for m in get_json(server, "/v2/repository/index", {})}


def test_onnx_answers_match_numpy_over_http_and_grpc(served):
    rng = np.random.default_rng(1)
    for module, client in clients(served):
        for rows in (1, 3):
            x, y = rng.random((rows, 4), dtype=np.float32), rng.random((rows, 4), dtype=np.float32)
            out = infer(module, client, "onnx_add", {"X": x, "Y": y}, ["SUM", "DIFF"])
            np.testing.assert_allclose(out["SUM"], x + y, rtol=1e-6)
            np.testing.assert_allclose(out["DIFF"], x - y, rtol=1e-6)
        x = rng.random((2, 3), dtype=np.float32)
        out = infer(module, client, "onnx_external", {"X": x}, ["Y"])
        np.testing.assert_allclose(out["Y"], np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)


def test_a_config_less_onnx_model_is_completed_from_the_model(served):
    config = get_json(served, "/v2/models/onnx_auto/config")
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime", config
    assert config["max_batch_size"] == 4, config
    assert "dynamic_batching" in config, config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [("X", "TYPE_FP32", [3])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [("Y", "TYPE_FP32", [2])]
    x = np.array([[1, 2, 3], [-1, -2, -3]], dtype=np.float32)
    for module, client in clients(served):
        np.testing.assert_allclose(infer(module, client, "onnx_auto", {"X": x}, ["Y"])["Y"], np.maximum(x @ W, 0))
    # A fixed first dimension does not batch: max_batch_size stays 0 and dims are the full shape.
    fixed = get_json(served, "/v2/models/onnx_fixed/config")
    assert fixed["max_batch_size"] == 0 and "dynamic_batching" not in fixed, fixed
    assert fixed["input"][0]["dims"] == [2, 3], fixed


def test_default_max_batch_size_comes_from_the_backend_config(tmp_path):
    needs_onnx()
    repo = str(tmp_path / "repo")
    write(repo, "onnx_auto", None, {"model.onnx": matmul_onnx})
    server = Server(repo, str(tmp_path / "tritium.log"), ["--backend-config=onnxruntime,default-max-batch-size=8"])
    try:
        server.wait_models(["onnx_auto"])
        config = get_json(server, "/v2/models/onnx_auto/config")
        assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [8], config
        assert "--backend-config=onnxruntime,default-max-batch-size=8 has no effect" not in server.log_text()
    finally:
        server.stop()


def test_a_config_contradicting_the_model_fails_its_load_naming_the_tensor(served):
    found = reasons(served)
    for name, (_, _, _, expected) in CONTRADICTIONS.items():
        assert expected in found[name], (name, found[name])


def test_other_platforms_fail_naming_the_platform_and_what_tritium_serves(served):
    reason = reasons(served)["tensorrt_model"]
    assert "platform 'tensorrt_plan'" in reason and "onnxruntime_onnx" in reason and "pytorch_libtorch" in reason, (
        reason
    )


def test_a_missing_onnxruntime_fails_the_load_naming_package_and_environment(served):
    reason = reasons(served)["no_onnxruntime"]
    assert "'onnxruntime'" in reason and os.path.join("no_onnxruntime", "env") in reason, reason


def test_batching_joins_requests_and_each_gets_its_own_answer(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    before = client.get_inference_statistics("onnx_batching", as_json=True)["model_stats"][0]
    xs = [np.full((1, 3), i, dtype=np.float32) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda x: infer(grpcclient, client, "onnx_batching", {"X": x}, ["Y"])["Y"], xs))
    for x, y in zip(xs, answers):
        # A batch runs other kernels than one row: float32 sums may differ in the last bits.
        np.testing.assert_allclose(y, np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)
    after = client.get_inference_statistics("onnx_batching", as_json=True)["model_stats"][0]
    inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    assert inferences == 12 and executions < inferences, (inferences, executions)


def test_a_request_the_runtime_rejects_fails_alone(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    indices = [3, 99, 0, 7, 42, 9, 1, 5]

    def one(i):
        try:
            return infer(grpcclient, client, "onnx_gather", {"IDX": np.array([[i]], dtype=np.int64)}, ["OUT"])["OUT"]
        except Exception as exc:  # noqa: BLE001 - the bad ones
            return exc

    with concurrent.futures.ThreadPoolExecutor(len(indices)) as pool:
        results = list(pool.map(one, indices))
    for i, result in zip(indices, results):
        if i < len(TABLE):
            np.testing.assert_allclose(result, [[TABLE[i]]])
        else:
            assert isinstance(result, Exception) and "out of data bounds" in str(result), (i, result)
    stats = client.get_inference_statistics("onnx_gather", as_json=True)["model_stats"][0]
    assert int(stats["execution_count"]) < len(indices), stats
    np.testing.assert_allclose(
        infer(grpcclient, client, "onnx_gather", {"IDX": np.array([[2]], dtype=np.int64)}, ["OUT"])["OUT"], [[3.0]]
    )


def test_torchscript_and_torch_export_models_match_numpy(served):
    needs_torch()
    rng = np.random.default_rng(2)
    for module, client in clients(served):
        x, y = rng.random((2, 4), dtype=np.float32), rng.random((2, 4), dtype=np.float32)
        out = infer(module, client, "torch_add", {"INPUT__0": x, "INPUT__1": y}, ["OUTPUT__0", "OUTPUT__1"])
        np.testing.assert_allclose(out["OUTPUT__0"], x + y, rtol=1e-6)
        np.testing.assert_allclose(out["OUTPUT__1"], x - y, rtol=1e-6)
        values, factor = rng.random(3, dtype=np.float32), np.array([3], dtype=np.float32)
        out = infer(module, client, "torch_named", {"values": values, "factor": factor}, ["scaled"])
        np.testing.assert_allclose(out["scaled"], values * 3, rtol=1e-6)
        out = infer(module, client, "torch_export", {"INPUT__0": x}, ["OUTPUT__0"])
        np.testing.assert_allclose(out["OUTPUT__0"], x * 2, rtol=1e-6)
    assert "parameter DISABLE_CUDNN is accepted" in served.log_text()


def test_an_ensemble_joins_python_onnx_and_pytorch_steps(served):
    needs_torch()
    raw = np.arange(8, dtype=np.float32).reshape(2, 4)
    for module, client in clients(served):
        out = infer(module, client, "ensemble_mixed", {"RAW": raw}, ["A", "B"])
        # ens_pre doubles; onnx_add gives (2r + 2r, 0); torch_add gives (4r + 0, 4r - 0).
        np.testing.assert_allclose(out["A"], raw * 4)
        np.testing.assert_allclose(out["B"], raw * 4)


def test_thread_counts_are_chosen_and_logged(served):
    log = served.log_text()
    assert "intra_op_num_threads=" in log and "shared by 2 instance(s)" in log, log[-4000:]


JOINED_CONFIG = """
backend: "onnxruntime"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 500000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def test_a_batch_is_joined_without_a_copy_and_each_request_gets_its_rows(tmp_path):
    """The server places the inputs of a batch's requests back to back in the stub's shared
    memory, and the backend runs the session on one array over them (no copy); an input that
    is not in the stub's arena (here: in the client's registered shared memory) is joined by a
    copy. Every request gets its own rows back, in both cases."""
    needs_onnx()
    import tritonclient.utils.shared_memory as shm

    repo = str(tmp_path / "repo")
    write(repo, "onnx_joined", JOINED_CONFIG, {"model.onnx": add_sub_onnx})
    server = Server(repo, str(tmp_path / "tritium.log"))
    key, out_key = f"joined{os.getpid()}", f"joinedout{os.getpid()}"
    region = out_region = None
    rng = np.random.default_rng(5)

    def run_batch(client, rows, shm_first=False, out_first=False):
        """Sends one request per entry of `rows` at once (the first with X in the client's
        region when `shm_first`, and its SUM into the client's output region when `out_first`)
        and checks every answer against numpy; returns the executions."""
        before = client.get_inference_statistics("onnx_joined", as_json=True)["model_stats"][0]
        xs = [rng.random((n, 4), dtype=np.float32) for n in rows]
        ys = [rng.random((n, 4), dtype=np.float32) for n in rows]
        if shm_first:
            shm.set_shared_memory_region(region, [xs[0]])

        def one(i):
            x = grpcclient.InferInput("X", list(xs[i].shape), "FP32")
            if shm_first and i == 0:
                x.set_shared_memory(key, xs[0].nbytes)
            else:
                x.set_data_from_numpy(xs[i])
            y = grpcclient.InferInput("Y", list(ys[i].shape), "FP32")
            y.set_data_from_numpy(ys[i])
            # Every third request asks for SUM alone, and gets nothing else.
            outputs = [grpcclient.InferRequestedOutput("SUM")] if i % 3 == 1 else None
            if out_first and i == 0:
                total = grpcclient.InferRequestedOutput("SUM")
                total.set_shared_memory(out_key, xs[0].nbytes)
                outputs = [total, grpcclient.InferRequestedOutput("DIFF")]
            result = client.infer("onnx_joined", [x, y], outputs=outputs)
            if out_first and i == 0:
                assert result.get_output("SUM") is not None, "SUM is in the response, its data in the region"
                total = shm.get_contents_as_numpy(out_region, np.float32, list(xs[0].shape))
                return total.copy(), result.as_numpy("DIFF")
            return result.as_numpy("SUM"), result.as_numpy("DIFF")

        with concurrent.futures.ThreadPoolExecutor(len(rows)) as pool:
            answers = list(pool.map(one, range(len(rows))))
        for i, (x, y, (total, difference)) in enumerate(zip(xs, ys, answers)):
            np.testing.assert_allclose(total, x + y, rtol=1e-6)
            if i % 3 == 1:
                assert difference is None, i
            else:
                np.testing.assert_allclose(difference, x - y, rtol=1e-6)
        after = client.get_inference_statistics("onnx_joined", as_json=True)["model_stats"][0]
        inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
        executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
        assert inferences == sum(rows) and executions < len(rows), (inferences, executions)

    try:
        server.wait_models(["onnx_joined"], timeout=120)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        # Requests of 1 to 3 rows, 16 rows in all: one batch (or a few) of max_batch_size.
        run_batch(client, [1, 2, 3, 1, 2, 3, 1, 3])
        log = server.log_text()
        assert "requests was joined without a copy" in log, log[-4000:]
        assert "joined by copying" not in log, log[-4000:]
        region = shm.create_shared_memory_region(key, f"/{key}", 3 * 4 * 4)
        client.register_system_shared_memory(key, f"/{key}", 3 * 4 * 4)
        run_batch(client, [3, 1, 2, 2], shm_first=True)
        log = server.log_text()
        assert "joined by copying inputs ['X']" in log, log[-4000:]
        client.unregister_system_shared_memory(key)
        # One request of a joined batch has its SUM written into its own output region.
        out_region = shm.create_shared_memory_region(out_key, f"/{out_key}", 3 * 4 * 4)
        client.register_system_shared_memory(out_key, f"/{out_key}", 3 * 4 * 4)
        run_batch(client, [3, 2, 1, 2], out_first=True)
        client.unregister_system_shared_memory(out_key)
    finally:
        code = server.stop()
        for r in (region, out_region):
            if r is not None:
                shm.destroy_shared_memory_region(r)
    assert code == 0, server.log_text()[-4000:]
    # The backend's count, logged at finalize: every batch of the first round was a view.
    counts = re.search(
        r"of model 'onnx_joined': (\d+) batches joined without a copy, (\d+) by copying", server.log_text()
    )
    assert counts and int(counts[1]) >= 1 and int(counts[2]) >= 1, server.log_text()[-4000:]
