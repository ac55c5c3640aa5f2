"""Bad input gets Triton's status codes and clear messages; broken models never stop good ones."""

import numpy as np
import pytest
from conftest import write_model
from test_warmup import index
from tritonclient.utils import InferenceServerException


def add_sub_inputs(tc, a_type="FP32", a_shape=(4,), names=("INPUT0", "INPUT1")):
    inputs = []
    for name in names:
        np_type = np.float64 if (name == "INPUT0" and a_type == "FP64") else np.float32
        shape = list(a_shape) if name == "INPUT0" else [4]
        t = tc.InferInput(name, shape, a_type if name == "INPUT0" else "FP32")
        t.set_data_from_numpy(np.zeros(shape, dtype=np_type))
        inputs.append(t)
    return inputs


def status(e):
    """The status a client sees: HTTP code as a string, or the gRPC StatusCode name."""
    return str(e.status())


@pytest.mark.parametrize(
    "case,expected,http_status,grpc_status",
    [
        ("unknown_model", "Request for unknown model: 'nope' is not found", "404", "StatusCode.NOT_FOUND"),
        (
            "wrong_dtype",
            "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'",
            "400",
            "StatusCode.INVALID_ARGUMENT",
        ),
        (
            "wrong_shape",
            "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [3]",
            "400",
            "StatusCode.INVALID_ARGUMENT",
        ),
        (
            "missing_input",
            "expected 2 inputs but got 1 inputs for model 'add_sub'",
            "400",
            "StatusCode.INVALID_ARGUMENT",
        ),
        (
            "unknown_output",
            "unexpected inference output 'NOPE' for model 'add_sub'",
            "400",
            "StatusCode.INVALID_ARGUMENT",
        ),
        (
            "unknown_version",
            "Request for unknown model: 'add_sub' version 7 is not found",
            "404",
            "StatusCode.NOT_FOUND",
        ),
    ],
)
def test_validation_errors(client, protocol, case, expected, http_status, grpc_status):
    tc, c = client
    kwargs = {}
    model = "add_sub"
    if case == "unknown_model":
        model, inputs = "nope", add_sub_inputs(tc)
    elif case == "wrong_dtype":
        inputs = add_sub_inputs(tc, a_type="FP64")
    elif case == "wrong_shape":
        inputs = add_sub_inputs(tc, a_shape=(3,))
    elif case == "missing_input":
        inputs = add_sub_inputs(tc, names=("INPUT0",))
    elif case == "unknown_output":
        inputs, kwargs = add_sub_inputs(tc), {"outputs": [tc.InferRequestedOutput("NOPE")]}
    else:
        inputs, kwargs = add_sub_inputs(tc), {"model_version": "7"}
    with pytest.raises(InferenceServerException) as info:
        c.infer(model, inputs, **kwargs)
    assert expected in info.value.message(), info.value.message()
    assert status(info.value) == (http_status if protocol == "http" else grpc_status)


def test_broken_models_are_reported_and_others_serve(server, client, protocol):
    tc, c = client
    index = c.get_model_repository_index()
    if not isinstance(index, list):
        from google.protobuf import json_format

        index = json_format.MessageToDict(index, preserving_proto_field_name=True)["models"]
    by_name = {m["name"]: m for m in index}
    assert by_name["add_sub"]["state"] == "READY"
    broken = by_name["broken_config"]
    assert broken["state"] == "UNAVAILABLE"
    assert "broken_config/config.pbtxt:8" in broken["reason"] and "TYPE_NOT_A_TYPE" in broken["reason"], broken
    init = by_name["broken_init"]
    # The version that failed is listed, as in Triton (a config error comes before versions).
    assert init["state"] == "UNAVAILABLE" and init["version"] == "1", init
    assert "version" not in broken or not broken["version"], broken
    assert "RuntimeError: the weights file is missing" in init["reason"], init
    assert "model.py(3): initialize" in init["reason"], init
    # As in Triton, the reason is the exception's rendering; its Python traceback is in the log.
    assert "Traceback (most recent call last)" not in init["reason"], init
    assert "stub.py" not in init["reason"], init
    log = server.log_text()
    assert "initialize failed" in log and "Traceback (most recent call last)" in log
    with pytest.raises(InferenceServerException) as info:
        c.infer("broken_init", add_sub_inputs(tc, names=("X",)))
    assert "broken_init" in info.value.message()
    # Strict readiness: a broken model makes the server not ready, but it stays live and serving.
    assert c.is_server_live()
    assert not c.is_server_ready()


def test_model_errors_carry_the_traceback(client):
    tc, c = client
    inp = tc.InferInput("IMAGE", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[b"not an image"]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        c.infer("preprocess", [inp])
    assert "cannot decode image" in info.value.message()


def test_malformed_http_bodies_get_400(server):
    import urllib.request

    for body, headers in [
        (b"{not json", {}),
        (b'{"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2]}]}', {}),
        (b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}),
    ]:
        req = urllib.request.Request(
            f"http://{server.http_url}/v2/models/add_sub/infer", data=body, headers=headers, method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(req, timeout=10)
        assert info.value.code == 400
        assert b"error" in info.value.read()
    assert server.proc.poll() is None


def test_execute_failures_read_as_tritons(server, client, protocol):
    """The texts a client gets when `execute` raises or returns the wrong thing are Triton's: an
    exception as "Type: message", then "At:" and the model's frames (none of tritium's, no Python
    traceback), and the backend's own checks without a Python rendering (tests/models/misbehaving)."""
    import os

    tc, c = client
    model_file = os.path.join(server.repository, "misbehaving", "1", "model.py")

    def failure(mode):
        inp = tc.InferInput("MODE", [1], "INT32")
        inp.set_data_from_numpy(np.array([mode], dtype=np.int32))
        with pytest.raises(InferenceServerException) as info:
            c.infer("misbehaving", [inp])
        return info.value.message()

    prefix = "Failed to process the request(s) for model 'misbehaving_0', message: "
    assert failure(0) == f"{prefix}ValueError: exploded\n\nAt:\n  {model_file}(13): execute\n"
    assert failure(1) == (
        f"{prefix}Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
        "InferenceRequest(s) size is:1, and InferenceResponse(s) size is:0\n"
    )
    assert failure(2) == (
        f"{prefix}Expected an 'InferenceResponse' object in the execute function return list, "
        "found type '<class 'str'>'."
    )
    assert failure(3) == f"{prefix}Expected a list in the execute return, found type '<class 'str'>'."
    text = failure(4)
    assert text.startswith(f"{prefix}TritonModelException: Tensor name cannot be an empty string.\n\nAt:\n"), text
    assert text.endswith(f"  {model_file}(22): execute\n") and "tritium" not in text.replace(server.repository, ""), (
        text
    )


def test_an_unknown_model_or_version_is_the_answer_whatever_the_body(server):
    """As in Triton, which looks the model up before it reads the body: a request for a model or
    version the server does not have gets 404 with Triton's text, even with a malformed body."""
    import json
    import urllib.request

    for path, expected in [
        ("/v2/models/nope/infer", "Request for unknown model: 'nope' is not found"),
        ("/v2/models/add_sub/versions/9/infer", "Request for unknown model: 'add_sub' version 9 is not found"),
    ]:
        for body in (b'{"id": 5, "inputs": []}', b"{not json"):
            req = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST")
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(req, timeout=10)
            assert info.value.code == 404, path
            assert json.loads(info.value.read()) == {"error": expected}


def test_stream_answers_say_they_are_final_and_failed_ones_name_their_model(server):
    """Triton's stream handler, checked side by side with 2.51: every answer of a queued request
    carries `triton_final_response` (also for a model that is not decoupled), a failed one also
    the request's id, model and version; a request refused before it was queued has its id
    alone."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    def tensor(name, datatype, values, field):
        t = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=[len(values)])
        getattr(t.contents, field).extend(values)
        return t

    requests = [
        pb.ModelInferRequest(
            model_name="add_sub",
            id="sum",
            inputs=[tensor(n, "FP32", [1, 2, 3, 4], field="fp32_contents") for n in ("INPUT0", "INPUT1")],
        ),
        pb.ModelInferRequest(
            model_name="misbehaving",
            model_version="1",
            id="raises",
            inputs=[tensor("MODE", "INT32", [0], field="int_contents")],
        ),
        pb.ModelInferRequest(model_name="nope", id="unknown"),
    ]
    with grpc.insecure_channel(server.grpc_url) as channel:
        answers = list(pbg.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(requests), timeout=30))
    ok, failed, refused = answers
    assert not ok.error_message and ok.infer_response.id == "sum"
    assert ok.infer_response.parameters["triton_final_response"].bool_param is True
    assert "ValueError: exploded" in failed.error_message, failed
    r = failed.infer_response
    assert (r.id, r.model_name, r.model_version) == ("raises", "misbehaving", "1")
    assert r.parameters["triton_final_response"].bool_param is True
    assert refused.error_message == "Request for unknown model: 'nope' is not found"
    assert refused.infer_response.id == "unknown" and not refused.infer_response.parameters


def test_a_model_file_that_does_not_import_is_reported_without_the_import_machinery(start):
    """As Triton reports it: a syntax error is "SyntaxError: ..." alone, an import that fails
    names model.py's frame; importlib's frames are not the model's."""
    config = """
        backend: "python"
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """
    write_model(start.repo, "unparsable", config, "class TritonPythonModel:\n    x = 1 +\n")
    write_model(start.repo, "missing_dep", config, "import numpy\nimport tritium_no_such_package\n")
    write_model(start.repo, "fine", config, "class TritonPythonModel:\n    pass\n")
    srv = start(["fine"], ["--strict-readiness", "false"])
    # The broken models may still be loading when "fine" is ready: read them once they settled.
    reasons = {name: m.get("reason", "") for name, m in index(srv, settled=["unparsable", "missing_dep"]).items()}
    # Triton 2.51 prefixes the reason of a version that failed to start with its status code.
    unparsable = reasons["unparsable"]
    assert unparsable.startswith("Internal: SyntaxError: ") and "(model.py, line 2)" in unparsable, reasons
    assert "\nAt:" not in reasons["unparsable"], reasons
    missing = reasons["missing_dep"]
    assert missing.startswith("Internal: ModuleNotFoundError: No module named 'tritium_no_such_package'\n\nAt:\n"), (
        missing
    )
    assert "model.py(2): <module>" in missing and "importlib" not in missing, missing
