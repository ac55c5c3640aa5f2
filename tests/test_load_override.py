"""Loading a model with a `config` override (Triton's load parameter, tritonclient's
`load_model(name, config=...)`) over HTTP, gRPC and from model code: the model runs with that
config until it is loaded again without one; bad overrides get clear errors and leave the model
as it was."""

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model
from tritonclient.utils import InferenceServerException

CONFIG = """
name: "tunable"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "mode" value: { string_value: "from the file" } }
"""

MODEL = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.mode = json.loads(args["model_config"])["parameters"]["mode"]["string_value"]

    def execute(self, requests):
        out = np.array([self.mode.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("MODE", out)]) for _ in requests]
"""

LOADER_CONFIG = """
name: "loader"
backend: "python"
max_batch_size: 0
input [ { name: "CONFIG" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

LOADER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            config = pb_utils.get_input_tensor_by_name(request, "CONFIG").as_numpy()[0].decode()
            try:
                pb_utils.load_model("tunable", config=config)
                result = "ok"
            except Exception as e:
                result = f"{type(e).__name__}: {e}"
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", np.array([result.encode()], dtype=np.object_))]))
        return responses
"""


def override(mode, count=1, name="tunable"):
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": 4,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "MODE", "data_type": "TYPE_STRING", "dims": [1]}],
            "instance_group": [{"kind": "KIND_CPU", "count": count}],
            "parameters": {"mode": {"string_value": mode}},
        }
    )


def mode_of(client, module, batched):
    x = module.InferInput("X", [1, 1] if batched else [1], "INT32")
    x.set_data_from_numpy(np.array([[1]] if batched else [1], dtype=np.int32))
    out = client.infer("tunable", [x]).as_numpy("MODE")
    return out.reshape(-1)[0].decode()


@pytest.fixture
def srv(start):
    write_model(start.repo, "tunable", CONFIG, MODEL)
    write_model(start.repo, "loader", LOADER_CONFIG, LOADER)
    return start(["tunable", "loader"], ["--model-control-mode", "explicit", "--load-model", "*"])


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_config_override_lasts_until_the_next_plain_load(srv, module):
    client = module.InferenceServerClient(srv.http_url if module is httpclient else srv.grpc_url)
    assert mode_of(client, module, batched=False) == "from the file"
    client.load_model("tunable", config=override("from the override", count=2))
    assert mode_of(client, module, batched=True) == "from the override"
    config = httpclient.InferenceServerClient(srv.http_url).get_model_config("tunable")
    assert config["max_batch_size"] == 4
    assert [g["count"] for g in config["instance_group"]] == [2]
    # A plain load goes back to the repository's config.
    client.load_model("tunable")
    assert mode_of(client, module, batched=False) == "from the file"


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bad_overrides_are_refused_and_the_model_keeps_serving(srv, module):
    client = module.InferenceServerClient(srv.http_url if module is httpclient else srv.grpc_url)
    for config, expected in [
        ("{not json", "the 'config' parameter is not a model configuration in JSON"),
        (override("x", name="someone_else"), "the 'config' parameter names model 'someone_else'"),
    ]:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("tunable", config=config)
        assert expected in info.value.message(), info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("tunable", config=override("y"), files={"file:../model.py": b"pass"})
    assert "must stay within model directory" in info.value.message(), info.value.message()
    assert mode_of(client, module, batched=False) == "from the file"


def test_model_code_loads_with_a_config_override(srv):
    client = httpclient.InferenceServerClient(srv.http_url)
    c = httpclient.InferInput("CONFIG", [1], "BYTES")
    c.set_data_from_numpy(np.array([override("from model code").encode()], dtype=np.object_))
    assert client.infer("loader", [c]).as_numpy("RESULT")[0] == b"ok"
    assert mode_of(client, httpclient, batched=True) == "from model code"
