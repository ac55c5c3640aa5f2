"""A config's `reshape`: inputs reach the model in their reshape shape (after the batch
dimension), outputs the model makes in their reshape shape reach the client in their dims
shape, warmup samples are reshaped like requests, and BLS requests like clients' ones."""

import json
import os
import textwrap

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model

CONFIG = """
name: "reshaped"
backend: "python"
max_batch_size: 4
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
  { name: "S" data_type: TYPE_INT32 dims: [ 1 ] reshape: { shape: [ ] } },
  { name: "V" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ -1, 3, 1 ] } }
]
output [
  { name: "SHAPES" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } },
  { name: "W" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape: { shape: [ -1, 3, 1 ] } }
]
model_warmup [ {
  name: "zeros"
  batch_size: 1
  inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  inputs { key: "S" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "V" value: { data_type: TYPE_FP32 dims: [ 2, 3 ] zero_data: true } }
} ]
"""

MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x, s, v = (pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in ("X", "S", "V"))
            # A warmup sample (and any request) must arrive reshaped, or the load fails.
            if x.ndim != 3 or s.ndim != 1 or v.ndim != 4 or v.shape[3] != 1:
                raise ValueError(f"not reshaped: {x.shape} {s.shape} {v.shape}")
            shapes = json.dumps([list(x.shape), list(s.shape), list(v.shape)])
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("SHAPES", np.array([[shapes]] * x.shape[0], dtype=np.object_)),
                        pb_utils.Tensor("Y", x * 2),
                        pb_utils.Tensor("W", v + 1),
                    ]
                )
            )
        return responses
"""

CALLER_CONFIG = """
name: "reshape_caller"
backend: "python"
max_batch_size: 0
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "REPORT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

CALLER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.Tensor("X", np.arange(4, dtype=np.float32).reshape(1, 4)),
                pb_utils.Tensor("S", np.array([[7]], dtype=np.int32)),
                pb_utils.Tensor("V", np.zeros((1, 5, 3), dtype=np.float32)),
            ]
            got = pb_utils.InferenceRequest(
                model_name="reshaped", inputs=inputs, requested_output_names=["SHAPES", "Y", "W"]
            ).exec()
            if got.has_error():
                report = {"error": got.error().message()}
            else:
                report = {t.name(): t.shape() for t in got.output_tensors()}
                report["seen"] = json.loads(pb_utils.get_output_tensor_by_name(got, "SHAPES").as_numpy()[0][0])
            responses.append(
                pb_utils.InferenceResponse([pb_utils.Tensor("REPORT", np.array([json.dumps(report)], dtype=np.object_))])
            )
        return responses
"""


@pytest.fixture
def srv(start):
    write_model(start.repo, "reshaped", CONFIG, MODEL)
    write_model(start.repo, "reshape_caller", CALLER_CONFIG, CALLER)
    return start(["reshaped", "reshape_caller"])


def inputs(module, batch, variable):
    x = np.arange(batch * 4, dtype=np.float32).reshape(batch, 4)
    s = np.arange(batch, dtype=np.int32).reshape(batch, 1)
    v = np.ones((batch, variable, 3), dtype=np.float32)
    out = []
    for name, arr, dtype in (("X", x, "FP32"), ("S", s, "INT32"), ("V", v, "FP32")):
        t = module.InferInput(name, list(arr.shape), dtype)
        t.set_data_from_numpy(arr)
        out.append(t)
    return x, v, out


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_inputs_reach_the_model_reshaped_and_outputs_the_client_in_their_dims(srv, protocol):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(srv.http_url if protocol == "http" else srv.grpc_url)
    x, v, ins = inputs(module, 3, 5)
    result = client.infer("reshaped", ins)
    seen = json.loads(result.as_numpy("SHAPES")[0][0])
    # X [3, 4] -> [3, 2, 2]; S [3, 1] -> [3] (Triton's scalar idiom); V [3, 5, 3] -> [3, 5, 3, 1].
    assert seen == [[3, 2, 2], [3], [3, 5, 3, 1]]
    y = result.as_numpy("Y")
    assert y.shape == (3, 4)
    np.testing.assert_array_equal(y, x * 2)
    w = result.as_numpy("W")
    assert w.shape == (3, 5, 3)
    np.testing.assert_array_equal(w, v + 1)
    # The client's metadata and config still describe the dims.
    meta = client.get_model_metadata("reshaped", as_json=True) if module is grpcclient else None
    meta = meta or client.get_model_metadata("reshaped")
    assert [list(map(int, i["shape"])) for i in meta["inputs"]] == [[-1, 4], [-1, 1], [-1, -1, 3]]


def test_bls_requests_are_reshaped_like_clients_ones(srv):
    client = httpclient.InferenceServerClient(srv.http_url)
    n = httpclient.InferInput("N", [1], "INT32")
    n.set_data_from_numpy(np.array([1], dtype=np.int32))
    report = json.loads(client.infer("reshape_caller", [n]).as_numpy("REPORT")[0])
    assert "error" not in report, report
    assert report["seen"] == [[1, 2, 2], [1], [1, 5, 3, 1]]
    assert report["Y"] == [1, 4] and report["W"] == [1, 5, 3]


STEP_CONFIG = """
name: "ident22"
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
"""

STEP = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + 1)]
            )
            for r in requests
        ]
"""

ENSEMBLE_CONFIG = """
name: "ens_reshape"
platform: "ensemble"
max_batch_size: 4
input [ { name: "E" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "F" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
ensemble_scheduling { step [ {
  model_name: "ident22" model_version: -1
  input_map { key: "IN" value: "E" }
  output_map { key: "OUT" value: "F" }
} ] }
"""


def test_an_ensembles_own_reshape_applies_to_its_inputs_and_outputs(start):
    write_model(start.repo, "ident22", STEP_CONFIG, STEP)
    os.makedirs(os.path.join(start.repo, "ens_reshape", "1"))
    with open(os.path.join(start.repo, "ens_reshape", "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(ENSEMBLE_CONFIG))
    srv = start(["ident22", "ens_reshape"])
    client = httpclient.InferenceServerClient(srv.http_url)
    e = httpclient.InferInput("E", [2, 4], "FP32")
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    e.set_data_from_numpy(data)
    f = client.infer("ens_reshape", [e]).as_numpy("F")
    assert f.shape == (2, 4)
    np.testing.assert_array_equal(f, data + 1)
