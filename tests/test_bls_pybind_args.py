"""pb_utils takes its arguments as Triton's pybind11 bindings do, end to end: a BLS model reads the
target's name and its output names from BYTES input tensors and passes them as they come (bytes,
numpy arrays, numpy integers), as model code written for Triton does (issue 35, item 2)."""

import os
import shutil

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT

MODEL = '''
"""BLS with pybind11-style arguments: the model name and output names straight from BYTES tensors."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            outputs = pb_utils.get_input_tensor_by_name(request, "OUTPUT_NAMES").as_numpy()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            bls = pb_utils.InferenceRequest(
                model_name=name,
                inputs=(pb_utils.Tensor(b"INPUT0", x), pb_utils.Tensor(b"INPUT1", x)),
                requested_output_names=outputs,
                request_id=b"from-bls",
                flags=np.uint32(0),
                timeout=np.int64(0),
                model_version=np.int64(-1),
            )
            pb_utils.Logger.log(b"bls call to " + name, pb_utils.Logger.INFO)
            answer = bls.exec(decoupled=np.bool_(False))
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out = answer.output_tensors()
            responses.append(pb_utils.InferenceResponse(output_tensors=tuple(
                pb_utils.Tensor(t.name().replace("OUTPUT", "OUT"), t.as_numpy()) for t in out
            )))
        return responses
'''

CONFIG = """
name: "bls_bytes_args"
backend: "python"
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "OUTPUT_NAMES" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""


def test_bls_with_a_bytes_model_name_and_numpy_output_names(start):
    shutil.copytree(os.path.join(ROOT, "examples", "models", "add_sub"), os.path.join(start.repo, "add_sub"))
    os.makedirs(os.path.join(start.repo, "bls_bytes_args", "1"))
    with open(os.path.join(start.repo, "bls_bytes_args", "config.pbtxt"), "w") as f:
        f.write(CONFIG)
    with open(os.path.join(start.repo, "bls_bytes_args", "1", "model.py"), "w") as f:
        f.write(MODEL)
    srv = start(["add_sub", "bls_bytes_args"])
    x = np.arange(4, dtype=np.float32)
    for module, client in (
        (httpclient, httpclient.InferenceServerClient(srv.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)),
    ):
        for names, want in (([b"OUTPUT0", b"OUTPUT1"], {"OUT0", "OUT1"}), ([b"OUTPUT1"], {"OUT1"})):
            inputs = [
                module.InferInput("MODEL_NAME", [1], "BYTES"),
                module.InferInput("OUTPUT_NAMES", [len(names)], "BYTES"),
                module.InferInput("INPUT0", [4], "FP32"),
            ]
            inputs[0].set_data_from_numpy(np.array([b"add_sub"], dtype=np.object_))
            inputs[1].set_data_from_numpy(np.array(names, dtype=np.object_))
            inputs[2].set_data_from_numpy(x)
            result = client.infer("bls_bytes_args", inputs)
            got = (
                {o["name"] for o in result.get_response()["outputs"]}
                if module is httpclient
                else {o.name for o in result.get_response().outputs}
            )
            assert got == want
            if "OUT0" in want:
                assert np.array_equal(result.as_numpy("OUT0"), x + x)
            assert np.array_equal(result.as_numpy("OUT1"), x - x)
    assert "bls call to add_sub" in srv.log_text()
