"""Ensembles end to end (`platform: "ensemble"`): a real server, real stubs, tritonclient over
HTTP and gRPC.

The step models and the ensembles are written here into the test's own repository: a chain, a
diamond (two steps in parallel feeding a third), an ensemble with a decoupled step (streamed
over gRPC), one whose step fails, and one ensemble for each of Triton's load-time errors, which
must appear in the repository index with its reason while the good models stay ready.
"""

import json
import os
import queue
import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import Server
from test_faults import write_model
from tritonclient.utils import InferenceServerException

UNARY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", ({expr}).astype(np.float32))]))
        return out
"""

ONE_IN = """
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
"""

ADD = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "B").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("SUM", (a + b).astype(np.float32))]))
        return out
"""

ADD_CONFIG = """
name: "add"
backend: "python"
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

BOOM = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("boom from the step")) for _ in requests]
"""

# Decoupled: three responses OUT = IN + i, then the final flag alone.
COUNT = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


def stream(sender, x):
    for i in range(3):
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x + i).astype(np.float32))]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy().copy()
            threading.Thread(target=stream, args=(r.get_response_sender(), x)).start()
        return None
"""

BROKEN_INIT = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("initialize refuses")

    def execute(self, requests):
        return []
"""


def step(model, inputs, outputs):
    maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: -1{maps} }}'


def ensemble(name, steps, inputs=(("X", "TYPE_FP32", "4"),), outputs=(("Y", "TYPE_FP32", "4"),), mbs=0):
    def tensor(n, t, d):
        return f'{{ name: "{n}" data_type: {t} dims: [ {d} ] }}'

    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: {mbs}
input [ {", ".join(tensor(*i) for i in inputs)} ]
output [ {", ".join(tensor(*o) for o in outputs)} ]
ensemble_scheduling {{ step [ {", ".join(steps)} ] }}
"""


def write_ensemble(repo, name, config):
    # Triton's layout: a config and an (empty) version directory, no model file.
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))


GOOD = {
    "chain": ensemble(
        "chain",
        [step("add_one", {"IN": "X"}, {"OUT": "T"}), step("double", {"IN": "T"}, {"OUT": "Y"})],
    ),
    # add_one and double both read X and run in parallel; add joins them.
    "diamond": ensemble(
        "diamond",
        [
            step("add_one", {"IN": "X"}, {"OUT": "P"}),
            step("double", {"IN": "X"}, {"OUT": "Q"}),
            step("add", {"A": "P", "B": "Q"}, {"SUM": "Y"}),
        ],
        outputs=(("Y", "TYPE_FP32", "4"), ("P", "TYPE_FP32", "4")),
    ),
    "streamed": ensemble(
        "streamed",
        [step("count", {"IN": "X"}, {"OUT": "C"}), step("double", {"IN": "C"}, {"OUT": "Y"})],
    ),
    # An ensemble step that is an ensemble; named to load before "chain", which it loads first.
    "a_nested": ensemble(
        "a_nested",
        [step("chain", {"X": "X"}, {"Y": "T"}), step("double", {"IN": "T"}, {"OUT": "Y"})],
    ),
    "failing": ensemble(
        "failing",
        [step("add_one", {"IN": "X"}, {"OUT": "T"}), step("boom", {"IN": "T"}, {"OUT": "Y"})],
    ),
}

BAD = {
    "bad_unknown": (
        ensemble("bad_unknown", [step("nope", {"IN": "X"}, {"OUT": "Y"})]),
        "ensemble bad_unknown contains models that are not available or ambiguous: nope",
    ),
    "bad_output": (
        ensemble("bad_output", [step("add_one", {"IN": "X"}, {"OUT": "Z"})]),
        "ensemble output 'Y' for ensemble bad_output' is not used",
    ),
    "bad_input": (
        ensemble(
            "bad_input",
            [step("add_one", {"IN": "U"}, {"OUT": "Y"}), step("double", {"IN": "X"}, {"OUT": "Q"})],
        ),
        "output 'Y' for ensemble 'bad_input' is not written: at least one of its depending tensors, 'U', "
        "is not connected",
    ),
    "bad_twice": (
        ensemble(
            "bad_twice",
            [step("add_one", {"IN": "X"}, {"OUT": "Y"}), step("double", {"IN": "X"}, {"OUT": "Y"})],
        ),
        "ensemble tensor 'Y' can appear in an output map only once for ensemble 'bad_twice' step 1",
    ),
    "bad_unmapped": (
        ensemble("bad_unmapped", [step("add", {"A": "X"}, {"SUM": "Y"})]),
        "in ensemble bad_unmapped, input B in model add is not mapped to any ensemble tensors",
    ),
    "bad_dtype": (
        ensemble("bad_dtype", [step("add_one", {"IN": "X"}, {"OUT": "Y"})], inputs=(("X", "TYPE_INT32", "4"),)),
        "in ensemble bad_dtype, ensemble tensor X: inconsistent data type: TYPE_INT32 is inferred from model "
        "bad_dtype while TYPE_FP32 is inferred from model add_one",
    ),
    "bad_shape": (
        ensemble("bad_shape", [step("add_one", {"IN": "X"}, {"OUT": "Y"})], inputs=(("X", "TYPE_FP32", "5"),)),
        "in ensemble bad_shape, ensemble tensor X: inconsistent shape: [5] is inferred from model bad_shape "
        "while [4] is inferred from model add_one",
    ),
    # M needs N and N needs M: Y is never written.
    "bad_cycle": (
        ensemble(
            "bad_cycle",
            [
                step("add", {"A": "X", "B": "N"}, {"SUM": "M"}),
                step("double", {"IN": "M"}, {"OUT": "N"}),
                step("add_one", {"IN": "M"}, {"OUT": "Y"}),
            ],
        ),
        "output 'Y' for ensemble 'bad_cycle' is not written: at least one of its depending tensors, 'N', "
        "is not connected",
    ),
    "bad_batch": (
        ensemble(
            "bad_batch",
            [step("batched", {"IN": "X"}, {"OUT": "Y"})],
            mbs=8,
        ),
        "ensemble bad_batch allows maximum batch size 8, but it contains model batched which only allows "
        "maximum batch size to be 4",
    ),
    "bad_version": (
        ensemble("bad_version", [step("add_one", {"IN": "X"}, {"OUT": "Y"}).replace("model_version: -1", "")]),
        "ensemble 'bad_version' depends on 'add_one' whose required version 0 is not loaded.",
    ),
    # Two ensembles that use each other would each wait for the other.
    "bad_loop_a": (
        ensemble("bad_loop_a", [step("bad_loop_b", {"X": "X"}, {"Y": "Y"})]),
        "ensemble 'bad_loop_a' depends on itself through its steps: bad_loop_a -> bad_loop_b -> bad_loop_a",
    ),
    "bad_loop_b": (
        ensemble("bad_loop_b", [step("bad_loop_a", {"X": "X"}, {"Y": "Y"})]),
        "ensemble 'bad_loop_b' depends on itself through its steps: bad_loop_b -> bad_loop_a -> bad_loop_b",
    ),
    "bad_step_load": (
        ensemble("bad_step_load", [step("broken_init", {"IN": "X"}, {"OUT": "Y"})]),
        "ensemble 'bad_step_load' depends on 'broken_init' which has no loaded version. Model 'broken_init' "
        "loading failed with error: ",
    ),
}

STEPS = ["add_one", "double", "add", "boom", "count", "batched"]
TIMEOUT = 30


def write_steps(repo):
    write_model(repo, "add_one", UNARY.format(expr="x + 1"), ONE_IN.format(name="add_one", mbs=0))
    write_model(repo, "double", UNARY.format(expr="x * 2"), ONE_IN.format(name="double", mbs=0))
    write_model(repo, "batched", UNARY.format(expr="x"), ONE_IN.format(name="batched", mbs=4))
    write_model(repo, "add", ADD, ADD_CONFIG)
    write_model(repo, "boom", BOOM, ONE_IN.format(name="boom", mbs=0))
    count = ONE_IN.format(name="count", mbs=0) + "model_transaction_policy { decoupled: true }\n"
    write_model(repo, "count", COUNT, count)
    write_model(repo, "broken_init", BROKEN_INIT, ONE_IN.format(name="broken_init", mbs=0))


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = str(tmp_path_factory.mktemp("ensemble-repo"))
    write_steps(repo)
    for name, config in GOOD.items():
        write_ensemble(repo, name, config)
    for name, (config, _) in BAD.items():
        write_ensemble(repo, name, config)
    server = Server(repo, str(tmp_path_factory.mktemp("ensemble-log") / "tritium.log"))
    try:
        server.wait_models(STEPS + list(GOOD))
        yield server
    finally:
        server.stop()


def clients(srv):
    return [
        (httpclient, httpclient.InferenceServerClient(srv.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)),
    ]


def x_input(module, x):
    i = module.InferInput("X", [4], "FP32")
    i.set_data_from_numpy(x)
    return i


X = np.array([1, 2, 3, 4], dtype=np.float32)


def post(srv, path, body=b"{}"):
    req = urllib.request.Request(f"http://{srv.http_url}{path}", data=body, method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def get(srv, path):
    with urllib.request.urlopen(f"http://{srv.http_url}{path}", timeout=10) as r:
        return json.loads(r.read())


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_chain_runs_its_steps_in_order(srv, protocol):
    module, client = dict(http=clients(srv)[0], grpc=clients(srv)[1])[protocol]
    result = client.infer("chain", [x_input(module, X)])
    np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) * 2)


def test_an_ensemble_can_be_a_step(srv):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    result = client.infer("a_nested", [x_input(grpcclient, X)])
    np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) * 2 * 2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_diamond_joins_two_parallel_steps_and_honours_requested_outputs(srv, protocol):
    module, client = dict(http=clients(srv)[0], grpc=clients(srv)[1])[protocol]
    result = client.infer("diamond", [x_input(module, X)])
    np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) + X * 2)
    np.testing.assert_array_equal(result.as_numpy("P"), X + 1)
    only_y = client.infer("diamond", [x_input(module, X)], outputs=[module.InferRequestedOutput("Y")])
    np.testing.assert_array_equal(only_y.as_numpy("Y"), (X + 1) + X * 2)
    assert only_y.as_numpy("P") is None


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_only_the_steps_the_requested_outputs_need_run_and_outputs_come_as_made(srv, protocol):
    """Triton's answers, checked side by side with 2.51: a step nobody's output needs is not
    executed, the outputs come in the order they were made (not the config's: Y, P), and the
    response carries the request's sequence id and flags."""
    module, client = dict(http=clients(srv)[0], grpc=clients(srv)[1])[protocol]

    def executions():
        return {
            m: get(srv, f"/v2/models/{m}/stats")["model_stats"][0]["execution_count"]
            for m in ("add_one", "double", "add")
        }

    before = executions()
    only_p = client.infer("diamond", [x_input(module, X)], outputs=[module.InferRequestedOutput("P")])
    np.testing.assert_array_equal(only_p.as_numpy("P"), X + 1)
    assert executions() == dict(before, add_one=before["add_one"] + 1)

    both = client.infer("diamond", [x_input(module, X)], sequence_id=7, sequence_start=True).get_response()
    if protocol == "http":
        assert [o["name"] for o in both["outputs"]] == ["P", "Y"]
        assert both["parameters"] == {"sequence_id": 7, "sequence_start": True, "sequence_end": False}
    else:
        assert [o.name for o in both.outputs] == ["P", "Y"]
        assert both.parameters["sequence_id"].int64_param == 7 and both.parameters["sequence_start"].bool_param


def test_a_step_error_fails_the_request_with_the_ensemble_named(srv):
    for module, client in clients(srv):
        with pytest.raises(InferenceServerException) as e:
            client.infer("failing", [x_input(module, X)])
        assert "in ensemble 'failing', " in e.value.message(), e.value.message()
        assert "boom from the step" in e.value.message(), e.value.message()


def test_metadata_config_and_readiness(srv):
    meta = get(srv, "/v2/models/diamond")
    assert meta["platform"] == "ensemble"
    assert [i["name"] for i in meta["inputs"]] == ["X"]
    assert [o["name"] for o in meta["outputs"]] == ["Y", "P"]
    config = get(srv, "/v2/models/diamond/config")
    assert config["platform"] == "ensemble"
    assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["add_one", "double", "add"]
    assert config["model_transaction_policy"]["decoupled"] is False
    assert get(srv, "/v2/models/streamed/config")["model_transaction_policy"]["decoupled"] is True
    assert srv.get("/v2/models/chain/ready") == 200
    grpc = grpcclient.InferenceServerClient(srv.grpc_url)
    assert grpc.is_model_ready("diamond")
    assert grpc.get_model_metadata("diamond").platform == "ensemble"


def test_statistics_count_the_ensemble_and_its_steps(srv):
    def stats(model):
        return get(srv, f"/v2/models/{model}/stats")["model_stats"][0]

    before, step_before, one_before = stats("chain"), stats("double"), stats("add_one")
    client = httpclient.InferenceServerClient(srv.http_url)
    client.infer("chain", [x_input(httpclient, X)])
    after, step_after = stats("chain"), stats("double")
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert step_after["inference_stats"]["success"]["count"] >= step_before["inference_stats"]["success"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 1
    assert after["execution_count"] == before["execution_count"] + 1
    # The ensemble's compute times are the sums of its steps' for the request (Triton's), here
    # exactly: nothing else runs on these models meanwhile.
    for kind in ("compute_input", "compute_infer", "compute_output"):
        ns = after["inference_stats"][kind]["ns"] - before["inference_stats"][kind]["ns"]
        steps = sum(
            s_after["inference_stats"][kind]["ns"] - s_before["inference_stats"][kind]["ns"]
            for s_before, s_after in [(step_before, step_after), (one_before, stats("add_one"))]
        )
        assert ns == steps, (kind, ns, steps)
    assert after["inference_stats"]["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    # The batch statistics carry the same sums, as one execution.
    assert (
        sum(b["compute_infer"]["ns"] for b in after["batch_stats"]) == after["inference_stats"]["compute_infer"]["ns"]
    )
    # A nested ensemble's compute times include its inner ensemble's steps.
    nested_before, inner_before = stats("a_nested"), stats("chain")
    client.infer("a_nested", [x_input(httpclient, X)])
    nested_after, inner_after = stats("a_nested"), stats("chain")
    nested = (
        nested_after["inference_stats"]["compute_infer"]["ns"] - nested_before["inference_stats"]["compute_infer"]["ns"]
    )
    inner = (
        inner_after["inference_stats"]["compute_infer"]["ns"] - inner_before["inference_stats"]["compute_infer"]["ns"]
    )
    assert nested > inner > 0, (nested, inner)
    failed = stats("failing")["inference_stats"]["fail"]["count"]
    with pytest.raises(InferenceServerException):
        client.infer("failing", [x_input(httpclient, X)])
    assert stats("failing")["inference_stats"]["fail"]["count"] == failed + 1


def test_a_decoupled_step_makes_the_ensemble_stream(srv):
    # Unary frontends refuse it as any decoupled model.
    with pytest.raises(InferenceServerException) as e:
        httpclient.InferenceServerClient(srv.http_url).infer("streamed", [x_input(httpclient, X)])
    assert "decoupled" in e.value.message(), e.value.message()
    q = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    try:
        client.async_stream_infer("streamed", [x_input(grpcclient, X)], enable_empty_final_response=True)
        seen = []
        while True:
            result, error = q.get(timeout=TIMEOUT)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                seen.append(result.as_numpy("Y"))
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
    expected = sorted(((X + i) * 2).tolist() for i in range(3))
    assert sorted(y.tolist() for y in seen) == expected


def test_each_load_error_is_in_the_index_and_the_good_models_stay_ready(srv):
    index = {m["name"]: m for m in post(srv, "/v2/repository/index")}
    for name, (_, reason) in BAD.items():
        assert index[name]["state"] == "UNAVAILABLE", (name, index[name])
        assert index[name]["reason"].startswith(reason), (name, index[name]["reason"])
    for name in STEPS + list(GOOD):
        assert index[name]["state"] == "READY", (name, index[name])
        assert srv.get(f"/v2/models/{name}/ready") == 200


def test_explicit_control_loads_the_steps_of_a_loaded_ensemble(tmp_path):
    repo = str(tmp_path / "repo")
    write_steps(repo)
    write_ensemble(repo, "chain", GOOD["chain"])
    server = Server(repo, str(tmp_path / "tritium.log"), ["--model-control-mode", "explicit", "--load-model", "chain"])
    try:
        server.wait_models(["chain", "add_one", "double"])
        client = grpcclient.InferenceServerClient(server.grpc_url)
        result = client.infer("chain", [x_input(grpcclient, X)])
        np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) * 2)
        assert not client.is_model_ready("add")
        # Unloading a step makes the ensemble unavailable, with the reason; loading it again
        # reloads the ensemble (Triton's dependency graph).
        client.unload_model("double")
        assert not client.is_model_ready("chain")
        index = {m["name"]: m for m in post(server, "/v2/repository/index")}
        assert index["chain"]["state"] == "UNAVAILABLE"
        assert index["chain"]["reason"] == "ensemble 'chain' depends on 'double' which has no loaded version."
        with pytest.raises(InferenceServerException):
            client.infer("chain", [x_input(grpcclient, X)])
        client.load_model("double")
        assert client.is_model_ready("chain")
        result = client.infer("chain", [x_input(grpcclient, X)])
        np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) * 2)
    finally:
        server.stop()


def test_unload_dependents_takes_the_steps_no_other_ensemble_uses(tmp_path):
    repo = str(tmp_path / "repo")
    write_steps(repo)
    for name in ("chain", "a_nested", "diamond"):
        write_ensemble(repo, name, GOOD[name])
    flags = ["--model-control-mode", "explicit", "--load-model", "a_nested", "--load-model", "diamond"]
    server = Server(repo, str(tmp_path / "tritium.log"), flags)
    try:
        server.wait_models(["a_nested", "diamond", "chain", "add_one", "double", "add"])
        client = grpcclient.InferenceServerClient(server.grpc_url)
        # a_nested goes with chain (used by nothing else); add_one and double stay for diamond.
        client.unload_model("a_nested", unload_dependents=True)
        ready = {m: client.is_model_ready(m) for m in ("a_nested", "chain", "add_one", "double", "add", "diamond")}
        assert ready == {
            "a_nested": False,
            "chain": False,
            "add_one": True,
            "double": True,
            "add": True,
            "diamond": True,
        }
        result = client.infer("diamond", [x_input(grpcclient, X)])
        np.testing.assert_array_equal(result.as_numpy("Y"), (X + 1) + X * 2)
        # Over HTTP, the last user of the steps takes them all with it.
        body = json.dumps({"parameters": {"unload_dependents": True}}).encode()
        req = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/diamond/unload", data=body)
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200
        assert not any(client.is_model_ready(m) for m in ("diamond", "add_one", "double", "add"))
        # A plain unload leaves the steps loaded.
        client.load_model("chain")
        client.unload_model("chain")
        assert client.is_model_ready("add_one") and client.is_model_ready("double")
    finally:
        server.stop()
