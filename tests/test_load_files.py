"""Loading a model from a config override and in-memory files (Triton's `file:<path>` load
parameters): tritonclient's `load_model(name, config=..., files=...)` over HTTP and gRPC, and
`pb_utils.load_model(name, config=..., files=...)` from model code. The files form the model's
directory (a private temporary one, removed once the model no longer uses it); the model need not
be in the repository; files need a config; paths stay inside the model directory."""

import json
import os
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model
from tritonclient.utils import InferenceServerException

CONFIG = """
name: "served"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "WHO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# The model says who wrote it (a constant in its own file), the note beside it if any, and where
# its directory is.
MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils

WHO = {who!r}


class TritonPythonModel:
    def initialize(self, args):
        self.where = args["model_repository"]
        note = os.path.join(self.where, "extra", "note.txt")
        self.note = open(note).read() if os.path.exists(note) else ""

    def execute(self, requests):
        text = f"{{WHO}}|{{self.note}}|{{self.where}}"
        out = np.array([text.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", out)]) for _ in requests]
"""

LOADER_CONFIG = """
name: "loader"
backend: "python"
max_batch_size: 0
input [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

LOADER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "NAME").as_numpy()[0].decode()
            args = json.loads(name)
            files = {k: v.encode() for k, v in args["files"].items()}
            try:
                pb_utils.load_model(args["name"], config=args["config"], files=files)
                result = "ok"
            except Exception as e:
                result = f"{type(e).__name__}: {e}"
            out = np.array([result.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("RESULT", out)]))
        return responses
"""


def model_source(who):
    return MODEL.format(who=who)


def config_json(name):
    return json.dumps(
        {
            "name": name,
            "backend": "python",
            "max_batch_size": 0,
            "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
            "output": [{"name": "WHO", "data_type": "TYPE_STRING", "dims": [1]}],
        }
    )


def who(client, module, name):
    x = module.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    return client.infer(name, [x]).as_numpy("WHO")[0].decode().split("|")


def wait_gone(path, seconds=60):
    deadline = time.time() + seconds
    while os.path.exists(path) and time.time() < deadline:
        time.sleep(0.1)
    return not os.path.exists(path)


@pytest.fixture
def srv(start):
    write_model(start.repo, "served", CONFIG, model_source("the repository"))
    write_model(start.repo, "loader", LOADER_CONFIG, LOADER)
    # A replaced version is kept for the update grace period (10 s by default) before its files go.
    return start(
        ["served", "loader"],
        ["--model-control-mode", "explicit", "--load-model", "*", "--model-update-grace-secs", "1"],
    )


def client_of(srv, module):
    return module.InferenceServerClient(srv.http_url if module is httpclient else srv.grpc_url)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_new_model_loads_from_files_and_its_directory_goes_with_it(srv, module):
    client = client_of(srv, module)
    # A leading "/" is inside the model directory too, as in Triton.
    files = {
        "file:/1/model.py": model_source("the client").encode(),
        "file:extra/note.txt": b"a note",
    }
    client.load_model("fresh", config=config_json("fresh"), files=files)
    assert client.is_model_ready("fresh")
    author, note, where = who(client, module, "fresh")
    assert (author, note) == ("the client", "a note")
    assert not where.startswith(srv.repository), where
    assert not os.path.exists(os.path.join(srv.repository, "fresh"))
    index = {m["name"]: m for m in httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()}
    assert index["fresh"]["state"] == "READY"
    client.unload_model("fresh")
    assert wait_gone(where), f"{where} is still there after the unload"


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_files_replace_a_repository_model_until_a_plain_load(srv, module):
    client = client_of(srv, module)
    assert who(client, module, "served")[0] == "the repository"
    client.load_model("served", config=config_json("served"), files={"file:1/model.py": model_source("v2").encode()})
    author, _, first = who(client, module, "served")
    assert author == "v2"
    client.load_model("served", config=config_json("served"), files={"file:1/model.py": model_source("v3").encode()})
    author, _, second = who(client, module, "served")
    assert author == "v3" and second != first
    assert wait_gone(first), "the replaced version's directory stays"
    client.load_model("served")
    author, _, where = who(client, module, "served")
    assert author == "the repository" and where.startswith(srv.repository)
    assert wait_gone(second)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bad_files_are_refused_with_tritons_texts(srv, module):
    client = client_of(srv, module)
    body = model_source("bad").encode()
    cases = [
        (None, {"file:1/model.py": body}, "failed to load 'served', failed to poll from model repository"),
        (config_json("served"), {"file:../escape.py": body}, "must stay within model directory"),
        (config_json("served"), {"file:1/../../escape.py": body}, "must stay within model directory"),
        (config_json("served"), {"file:1": b"", "file:1/model.py": body}, "directory has been created as a file"),
    ]
    for config, files, expected in cases:
        with pytest.raises(InferenceServerException) as info:
            client.load_model("served", config=config, files=files)
        assert expected in info.value.message(), info.value.message()
    assert not os.path.exists(os.path.join(os.path.dirname(srv.repository), "escape.py"))
    # The model keeps serving what it served.
    assert who(client, module, "served")[0] == "the repository"


def test_model_code_loads_a_model_from_files(srv):
    client = httpclient.InferenceServerClient(srv.http_url)

    def load_from_code(name, config, files):
        x = httpclient.InferInput("NAME", [1], "BYTES")
        args = {"name": name, "config": config, "files": files}
        x.set_data_from_numpy(np.array([json.dumps(args).encode()], dtype=np.object_))
        return client.infer("loader", [x]).as_numpy("RESULT")[0].decode()

    files = {"file:1/model.py": model_source("model code")}
    assert load_from_code("made", config_json("made"), files) == "ok"
    assert who(client, httpclient, "made")[0] == "model code"
    # As in Triton: files need a config.
    result = load_from_code("made", "", files)
    assert result.startswith("TritonModelException"), result
    assert "failed to poll from model repository" in result, result
    # A files key must be a load parameter name.
    result = load_from_code("made", config_json("made"), {"1/model.py": "x"})
    assert "Unrecognized load parameter '1/model.py'" in result, result
    assert who(client, httpclient, "made")[0] == "model code"


def test_stub_names_with_shell_metacharacters_are_refused_as_in_python_backend(srv):
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    files = {"file:1/model.py": model_source("x").encode()}
    for name in ["model;test", "model|test", "model$test", "model\\test"]:
        with pytest.raises(InferenceServerException) as info:
            client.load_model(name, config=config_json(name), files=files)
        assert "Invalid stub name: contains invalid characters" in info.value.message(), info.value.message()
    client.load_model("model-with_fine.chars", config=config_json("model-with_fine.chars"), files=files)
    assert client.is_model_ready("model-with_fine.chars")
