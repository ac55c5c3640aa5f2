"""The front door, end to end with tritonclient: restricted APIs over HTTP and gRPC (Triton's
`--http-restricted-api` / `--grpc-restricted-protocol`, and tritium's `admin` group that guards
`tritium stubs` / `tritium restart`), headers forwarded to the model as request parameters, and
gRPC over TLS and mutual TLS with certificates made by `openssl` at test time."""

import json
import os
import shutil
import subprocess
import textwrap
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import Server, binary, free_port, require
from tritonclient.utils import InferenceServerException

INFER = {"infer-key": "open-sesame"}
ADMIN = {"admin-key": "s3cret"}
GRPC_INFER = {"triton-grpc-protocol-infer-key": "open-sesame"}
GRPC_ADMIN = {"triton-grpc-protocol-admin-key": "s3cret"}

PARAMS_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            params = np.array([request.parameters().encode()], dtype=np.object_)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("PARAMS", params)]))
        return out
"""

PARAMS_CONFIG = """
name: "params"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def write_params_model(repo):
    os.makedirs(os.path.join(repo, "params", "1"), exist_ok=True)
    with open(os.path.join(repo, "params", "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(PARAMS_CONFIG))
    with open(os.path.join(repo, "params", "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(PARAMS_MODEL))


def start(tmp_path, args, name="front_door"):
    repo = tmp_path / f"{name}_repo"
    repo.mkdir(exist_ok=True)
    write_params_model(str(repo))
    srv = Server(str(repo), str(tmp_path / f"{name}.log"), args)
    try:
        srv.wait_models(["params"])
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    srv = start(
        tmp_path_factory.mktemp("door"),
        [
            "--http-restricted-api=inference,model-config:infer-key=open-sesame",
            "--http-restricted-api",
            "model-repository,statistics:admin-key=s3cret",
            "--grpc-restricted-protocol=inference,health:infer-key=open-sesame",
            "--grpc-restricted-protocol=admin,model-repository:admin-key=s3cret",
            "--http-header-forward-pattern=^x-team",
            "--grpc-header-forward-pattern=^x-team",
        ],
    )
    yield srv
    assert srv.stop() == 0, srv.log_text()


def http_inputs():
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    return [inp]


def grpc_inputs():
    inp = grpcclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    return [inp]


def params_of(result):
    return json.loads(result.as_numpy("PARAMS")[0])


def raw(srv, path, method="GET", headers=None, body=None):
    req = urllib.request.Request(f"http://{srv.http_url}{path}", data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


# ---- restricted APIs over HTTP ----


def test_http_restricted_groups_refuse_without_the_header_and_answer_with_it(door):
    c = httpclient.InferenceServerClient(door.http_url)
    with pytest.raises(InferenceServerException) as e:
        c.infer("params", http_inputs())
    assert e.value.status() == "403"
    assert e.value.message() == "This API is restricted, expecting header 'infer-key'"
    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        c.infer("params", http_inputs(), headers={"infer-key": "wrong"})
    assert params_of(c.infer("params", http_inputs(), headers=INFER)) == {}

    with pytest.raises(InferenceServerException, match="expecting header 'infer-key'"):
        c.get_model_config("params")
    assert c.get_model_config("params", headers=INFER)["name"] == "params"
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        c.get_inference_statistics("params", headers=INFER)
    assert c.get_inference_statistics("params", headers=ADMIN)["model_stats"]
    with pytest.raises(InferenceServerException, match="expecting header 'admin-key'"):
        c.get_model_repository_index()
    assert any(m["name"] == "params" for m in c.get_model_repository_index(headers=ADMIN))
    # Groups not restricted stay open.
    assert c.is_server_live() and c.get_model_metadata("params")["name"] == "params"


def test_http_refusal_is_tritons_403_before_the_method_check(door):
    status, body = raw(door, "/v2/models/params/infer")  # GET: would be 405
    assert status == 403
    assert json.loads(body) == {"error": "This API is restricted, expecting header 'infer-key'"}
    status, _ = raw(door, "/v2/models/params/versions/1/config", headers=INFER)
    assert status == 200
    # The header's name is case-insensitive; its value is compared exactly.
    status, _ = raw(door, "/v2/models/params/config", headers={"Infer-Key": "open-sesame"})
    assert status == 200
    status, _ = raw(door, "/v2/models/params/config", headers={"infer-key": "Open-Sesame"})
    assert status == 403


# ---- restricted APIs over gRPC ----


def test_grpc_restricted_groups_refuse_without_the_header_and_answer_with_it(door):
    c = grpcclient.InferenceServerClient(door.grpc_url)
    with pytest.raises(InferenceServerException) as e:
        c.infer("params", grpc_inputs())
    assert e.value.status() == "StatusCode.UNAVAILABLE"
    assert e.value.message() == "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'"
    assert params_of(c.infer("params", grpc_inputs(), headers=GRPC_INFER)) == {}

    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-infer-key"):
        c.is_server_live()
    assert c.is_server_live(headers=GRPC_INFER)
    assert c.is_model_ready("params", headers=GRPC_INFER)
    with pytest.raises(InferenceServerException, match="triton-grpc-protocol-admin-key"):
        c.get_model_repository_index(headers=GRPC_INFER)
    index = c.get_model_repository_index(headers=GRPC_ADMIN, as_json=True)
    assert any(m["name"] == "params" for m in index["models"])
    # Groups not restricted stay open.
    assert c.get_server_metadata().name == "tritium"
    assert c.get_model_config("params").config.name == "params"


def test_grpc_stream_is_refused_without_the_header_and_forwards_headers_with_it(door):
    results = []
    c = grpcclient.InferenceServerClient(door.grpc_url)
    c.start_stream(callback=lambda result, error: results.append((result, error)))
    try:
        c.async_stream_infer("params", grpc_inputs())
    except InferenceServerException as e:
        # The refusal may end the stream before the request is written.
        assert "no longer in valid state" in e.message()
    c.stop_stream()
    assert len(results) == 1 and results[0][1] is not None
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'" in str(results[0][1])

    results.clear()
    c = grpcclient.InferenceServerClient(door.grpc_url)
    headers = dict(GRPC_INFER, **{"x-team-name": "red"})
    c.start_stream(callback=lambda result, error: results.append((result, error)), headers=headers)
    c.async_stream_infer("params", grpc_inputs())
    c.stop_stream()
    assert len(results) == 1 and results[0][1] is None, results
    assert params_of(results[0][0]) == {"x-team-name": "red"}


def cli(*args, url):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    cmd = [binary()] + list(args) + ["--url", url]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)


def test_admin_group_guards_the_cli(door):
    refused = cli("stubs", "--json", url=door.grpc_url)
    assert refused.returncode != 0
    assert "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'" in refused.stderr
    header = "--header=triton-grpc-protocol-admin-key=s3cret"
    listed = cli("stubs", "--json", header, url=door.grpc_url)
    assert listed.returncode == 0, listed.stderr
    assert any(s["model"] == "params" for s in json.loads(listed.stdout))
    restarted = cli("restart", "params", header, url=door.grpc_url)
    assert restarted.returncode == 0, restarted.stderr


# ---- header forwarding ----


def test_http_headers_matching_the_pattern_reach_the_model(door):
    c = httpclient.InferenceServerClient(door.http_url)
    headers = dict(INFER, **{"X-Team-Name": "blue", "x-team-id": "7", "x-other": "no"})
    params = params_of(c.infer("params", http_inputs(), headers=headers))
    assert params == {"x-team-name": "blue", "x-team-id": "7"}


def test_grpc_metadata_matching_the_pattern_reaches_the_model(door):
    c = grpcclient.InferenceServerClient(door.grpc_url)
    headers = dict(GRPC_INFER, **{"x-team-name": "green", "x-other": "no"})
    params = params_of(c.infer("params", grpc_inputs(), headers=headers, parameters={"mine": 3}))
    assert params == {"mine": 3, "x-team-name": "green"}


# ---- flag errors ----


@pytest.mark.parametrize(
    "args,expected",
    [
        (
            ["--http-restricted-api=inferenc:k=v"],
            "--http-restricted-api=inferenc:k=v: unknown restricted api 'inferenc'",
        ),
        (
            ["--grpc-restricted-protocol=health:k=v", "--grpc-restricted-protocol=health,inference:j=w"],
            "restricted protocol 'health' can not be specified in multiple config groups",
        ),
        (
            ["--http-restricted-api=health"],
            "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got health",
        ),
        (["--grpc-header-forward-pattern=("], "--grpc-header-forward-pattern=(: not a valid regular expression"),
        (["--grpc-use-ssl=true", "--grpc-server-key=/nonexistent.key"], "--grpc-server-cert: is needed"),
        (
            ["--grpc-use-ssl=true", "--grpc-server-cert=/nonexistent.pem", "--grpc-server-key=/nonexistent.key"],
            "--grpc-server-cert=/nonexistent.pem: cannot read the file",
        ),
    ],
)
def test_bad_flag_values_stop_the_start_naming_the_flag(tmp_path, args, expected):
    cmd = [binary(), "serve", "--model-repository", str(tmp_path), "--http-port", str(free_port())] + args
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert expected in proc.stderr, proc.stderr


# ---- gRPC over TLS ----


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    require(shutil.which("openssl"), "the openssl command makes the test certificates")
    d = tmp_path_factory.mktemp("certs")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=tritium test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    for who, usage in [("server", "serverAuth"), ("client", "clientAuth")]:
        (d / f"{who}.ext").write_text(
            f"subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage={usage}\nbasicConstraints=CA:FALSE\n"
        )
        openssl("req", *ec, "-keyout", f"{who}.key", "-out", f"{who}.csr", "-subj", f"/CN={who}", cwd=d)
        openssl(
            "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{who}.pem", "-days", "2", "-extfile", f"{who}.ext",
            cwd=d,
        )  # fmt: skip
    return {name: str(d / name) for name in ["ca.pem", "server.pem", "server.key", "client.pem", "client.key"]}


def tls_infer(srv, **ssl):
    c = grpcclient.InferenceServerClient(srv.grpc_url, ssl=True, root_certificates=ssl.pop("ca"), **ssl)
    return params_of(c.infer("params", grpc_inputs(), client_timeout=60))


def test_grpc_over_tls(tmp_path, certs):
    srv = start(
        tmp_path,
        ["--grpc-use-ssl=true", "--grpc-server-cert", certs["server.pem"], "--grpc-server-key", certs["server.key"]],
        name="tls",
    )
    try:
        assert tls_infer(srv, ca=certs["ca.pem"]) == {}
        # A client that does not speak TLS gets nothing.
        with pytest.raises(InferenceServerException):
            grpcclient.InferenceServerClient(srv.grpc_url).infer("params", grpc_inputs(), client_timeout=10)
        assert "(TLS)" in srv.log_text()
    finally:
        assert srv.stop() == 0, srv.log_text()


def test_grpc_over_mutual_tls(tmp_path, certs):
    srv = start(
        tmp_path,
        [
            "--grpc-use-ssl-mutual=true",
            f"--grpc-server-cert={certs['server.pem']}",
            f"--grpc-server-key={certs['server.key']}",
            f"--grpc-root-cert={certs['ca.pem']}",
        ],
        name="mtls",
    )
    try:
        assert (
            tls_infer(srv, ca=certs["ca.pem"], private_key=certs["client.key"], certificate_chain=certs["client.pem"])
            == {}
        )
        # Without a client certificate the handshake fails.
        with pytest.raises(InferenceServerException):
            tls_infer(srv, ca=certs["ca.pem"])
        assert "(mutual TLS)" in srv.log_text()
        # The CLI talks mutual TLS with --ca-cert and --client-cert.
        tls = ["--ca-cert", certs["ca.pem"], f"--client-cert={certs['client.pem']},{certs['client.key']}"]
        listed = cli("stubs", "--json", *tls, url=f"localhost:{srv.grpc_port}")
        assert listed.returncode == 0, listed.stderr
        assert any(s["model"] == "params" for s in json.loads(listed.stdout))
    finally:
        assert srv.stop() == 0, srv.log_text()


def test_a_file_that_is_not_pem_stops_the_start(tmp_path, certs):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    cmd = [
        binary(), "serve", "--model-repository", str(tmp_path), "--http-port", str(free_port()),
        "--grpc-use-ssl=1", f"--grpc-server-cert={junk}", f"--grpc-server-key={certs['server.key']}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "--grpc-server-cert: the file has no PEM CERTIFICATE" in proc.stderr, proc.stderr
