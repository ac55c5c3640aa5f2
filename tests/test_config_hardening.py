"""A model config can be a client's (a load request's `config` override, `pb_utils.load_model`):
its sizes are checked against the server's limits before anything is allocated, every path it
names stays inside the model's directory, and no child process sees the server's secrets. Each
case sends the input an audit reproduced against an earlier build (which aborted the server or
answered with host files) and checks the clear error, a live server, and the other models'
stubs untouched."""

import json
import os

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model
from test_faults import children
from tritonclient.utils import InferenceServerException

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "Y" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""

MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        seen = [k for k in os.environ if k.startswith("TRITIUM_") and k != "TRITIUM_CUDA_BIND"]
        try:
            with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                parent = f.read()
        except OSError as e:
            parent = repr(e).encode()
        text = json.dumps({"env": seen, "parent_environ_has_token": b"s3cret-token" in parent})
        out = np.array([text.encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", out)]) for _ in requests]
""".replace("import os\n", "import json\nimport os\n", 1)

LOADER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            config = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0].decode()
            try:
                pb_utils.load_model("target", config=config)
                result = "ok"
            except Exception as e:
                result = f"{type(e).__name__}: {e}"
            out = np.array([result.encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", out)]))
        return responses
"""

LOADER_CONFIG = """
name: "loader"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def override(**extra):
    config = {
        "name": "target",
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_STRING", "dims": [1]}],
    }
    config.update(extra)
    return json.dumps(config)


def warmup(dims, **data):
    data = data or {"zero_data": True}
    inputs = {"X": {"data_type": "TYPE_INT32", "dims": dims, **data}}
    return [{"name": "sample", "batch_size": 1, "inputs": inputs}]


@pytest.fixture
def srv(start, tmp_path):
    for name in ("target", "bystander"):
        write_model(start.repo, name, CONFIG.format(name=name), MODEL)
    write_model(start.repo, "loader", LOADER_CONFIG, LOADER)
    with open(tmp_path / "secret.txt", "w") as f:
        f.write("root:x:0:0:the-secret-first-line\n")
    srv = start(["target", "bystander", "loader"], ["--model-control-mode", "explicit", "--load-model", "*"])
    srv.secret = str(tmp_path / "secret.txt")
    return srv


def ask(srv, model="bystander"):
    c = httpclient.InferenceServerClient(srv.http_url)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    return json.loads(c.infer(model, [x]).as_numpy("Y")[0])


def refused(srv, config, *needles, module=httpclient):
    """Loads `target` with `config`, expects a clear refusal, and checks nothing else moved."""
    stubs = sorted(children(srv.proc.pid))
    client = module.InferenceServerClient(srv.http_url if module is httpclient else srv.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("target", config=config)
    message = info.value.message()
    for needle in needles:
        assert needle in message, message
    assert "the-secret-first-line" not in message and "root:x" not in message, message
    index = httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()
    assert "the-secret-first-line" not in json.dumps(index), index
    assert srv.proc.poll() is None and srv.get("/v2/health/live") == 200
    assert ask(srv)["env"] == []
    # A refused load starts and stops nothing: every model keeps its stubs, target too.
    assert sorted(children(srv.proc.pid)) == stubs
    return message


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_sizes_from_a_config_override_cannot_abort_the_server(srv, module):
    # The audit's input: 2^45 zero bytes of warmup data aborted the process.
    refused(
        srv,
        override(model_warmup=warmup([35184372088832])),
        "warmup sample 'sample'",
        "--max-warmup-bytes",
        module=module,
    )
    refused(srv, override(model_warmup=warmup([4294967296, 4294967296])), "beyond 2^64", module=module)
    refused(
        srv,
        override(instance_group=[{"kind": "KIND_CPU", "count": 1000000}]),
        "instance count",
        "--max-model-instances",
        module=module,
    )
    refused(
        srv,
        override(max_batch_size=2147483647, sequence_batching={}),
        "--max-sequence-slots",
        module=module,
    )
    refused(
        srv,
        override(max_batch_size=4, sequence_batching={"oldest": {"max_candidate_sequences": 2147483647}}),
        "max_candidate_sequences",
        module=module,
    )


def test_paths_in_a_config_override_stay_inside_the_model_directory(srv):
    for data_file in (srv.secret, "../../../../../../etc/passwd", "/dev/zero", "/proc/self/environ"):
        refused(srv, override(model_warmup=warmup([4], input_data_file=data_file)), "outside the model's directory")
    for value in (srv.secret, "/proc/self/environ", "../../../../../../etc/passwd"):
        for key in ("requirements", "EXECUTION_ENV_PATH"):
            message = refused(srv, override(parameters={key: {"string_value": value}}), "outside the model's directory")
            assert f"parameter {key}" in message and "--allow-config-path" in message, message
    refused(
        srv,
        override(output=[{"name": "Y", "data_type": "TYPE_STRING", "dims": [1], "label_filename": srv.secret}]),
        "outside the model's directory",
    )
    refused(srv, override(default_model_filename="../../../../../../etc/passwd"), "is not a file name")
    # The model still loads with its own files afterwards.
    httpclient.InferenceServerClient(srv.http_url).load_model("target")
    assert ask(srv, "target")["env"] == []


def test_model_code_gets_the_same_checks_through_load_model(srv):
    c = httpclient.InferenceServerClient(srv.http_url)
    for config, needle in (
        (override(model_warmup=warmup([35184372088832])), "--max-warmup-bytes"),
        (override(parameters={"requirements": {"string_value": srv.secret}}), "outside the model's directory"),
    ):
        x = httpclient.InferInput("X", [1], "BYTES")
        x.set_data_from_numpy(np.array([config.encode()], dtype=np.object_))
        result = c.infer("loader", [x]).as_numpy("Y")[0].decode()
        assert result.startswith("TritonModelException: failed to load 'target'"), result
        assert needle in result and "the-secret-first-line" not in result, result
    assert srv.proc.poll() is None and ask(srv)["env"] == []


def test_no_child_sees_the_servers_secrets(start, monkeypatch):
    write_model(start.repo, "probe", CONFIG.format(name="probe"), MODEL)
    monkeypatch.setenv("TRITIUM_ADMIN_TOKEN", "s3cret-token")
    monkeypatch.setenv("TRITIUM_GRPC_SERVER_KEY", "/etc/tritium/tls.key")
    srv = start(["probe"])
    seen = ask(srv, "probe")
    assert seen["env"] == [], seen
    if os.geteuid() != 0:
        # Root's models have CAP_SYS_PTRACE and can read anything; others cannot read the server.
        assert seen["parent_environ_has_token"] is False, seen


def test_an_environment_cache_others_can_write_is_refused(start, tmp_path):
    """A cache anyone can write (the temp-dir fallback of old) could hold a "complete" environment
    that runs someone else's code in every model: tritium refuses to use it."""
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    packed = CONFIG.format(name="packed") + (
        'parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n'
    )
    write_model(start.repo, "packed", packed, MODEL)
    with open(os.path.join(start.repo, "packed", "env.tar.gz"), "wb") as f:
        f.write(b"not even gzip")
    write_model(start.repo, "plain", CONFIG.format(name="plain"), MODEL)
    srv = start(["plain"], ["--env-cache-dir", str(cache)])
    reason = httpclient.InferenceServerClient(srv.http_url).get_model_repository_index()
    reason = next(m for m in reason if m["name"] == "packed").get("reason", "")
    assert "others may write to it (mode 777)" in reason and "--env-cache-dir" in reason, reason
    assert os.listdir(cache) == []
    assert ask(srv, "plain")["env"] == []
