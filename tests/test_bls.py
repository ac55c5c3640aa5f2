"""BLS end to end: models that call other models with `InferenceRequest.exec` / `async_exec`,
on a real server with real stubs, through tritonclient over HTTP and gRPC.

The repository is written here: add_sub and bls_add_sub from the examples, a caller model `bls`
whose MODE input picks what it does, `chain_b` (the middle of a chain three deep), a decoupled
callee `stream`, `bls_init` (calls BLS from `initialize`), and `looper` (a decoupled model whose
`execute` loops until its request is cancelled).
"""

import json
import os
import queue
import shutil

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT
from test_faults import wait_for, write_model

TIMEOUT = 60

BLS = """
import asyncio, json, threading
import numpy as np
import triton_python_backend_utils as pb_utils


def add_sub(a, b, model="add_sub", outputs=("OUTPUT0", "OUTPUT1")):
    return pb_utils.InferenceRequest(
        model_name=model,
        inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", b)],
        requested_output_names=list(outputs),
    )


def error_text(response):
    return response.error().message() if response.has_error() else "no error"


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = np.ones(4, dtype=np.float32)
            out, text = np.zeros(4, dtype=np.float32), ""
            if mode == 0:
                r = add_sub(a, b).exec()
                assert not r.has_error(), error_text(r)
                out = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
                # Every output when none is named.
                everything = add_sub(a, b, outputs=()).exec()
                text = ",".join(sorted(t.name() for t in everything.output_tensors()))
            elif mode == 1:
                n = int(a[0])
                req = pb_utils.InferenceRequest(
                    model_name="stream",
                    inputs=[pb_utils.Tensor("N", np.array([n], dtype=np.int32))],
                    requested_output_names=["IDX"],
                )
                seen = []
                for r in req.exec(decoupled=True):
                    assert not r.has_error(), error_text(r)
                    if r.output_tensors():
                        seen.append(int(pb_utils.get_output_tensor_by_name(r, "IDX").as_numpy()[0]))
                    else:
                        seen.append("final")
                text = json.dumps(seen)
            elif mode == 2:
                r1, r2 = await asyncio.gather(add_sub(a, b).async_exec(), add_sub(a, 2 * b).async_exec())
                out = (pb_utils.get_output_tensor_by_name(r1, "OUTPUT0").as_numpy()
                       + pb_utils.get_output_tensor_by_name(r2, "OUTPUT0").as_numpy())
                it = await add_sub(a, b).async_exec(decoupled=True)
                text = str(len(list(it)))
            elif mode == 3:
                r = add_sub(a, b, model="chain_b", outputs=("OUTPUT0",)).exec()
                assert not r.has_error(), error_text(r)
                out = pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()
            elif mode == 4:
                got = []
                thread = threading.Thread(target=lambda: got.append(add_sub(a, b).exec()))
                thread.start()
                thread.join(60)
                out = pb_utils.get_output_tensor_by_name(got[0], "OUTPUT0").as_numpy()
            elif mode == 5:
                text = error_text(add_sub(a, b, model="no_such_model").exec())
            elif mode == 6:
                req = pb_utils.InferenceRequest(
                    model_name="stream",
                    inputs=[pb_utils.Tensor("N", np.array([1], dtype=np.int32))],
                    requested_output_names=["IDX"],
                )
                text = error_text(req.exec())
            elif mode == 7:
                req = pb_utils.InferenceRequest(
                    model_name="bls",
                    inputs=[pb_utils.Tensor("MODE", np.array([0], dtype=np.int32)), pb_utils.Tensor("A", a)],
                    requested_output_names=["OUT"],
                )
                text = error_text(req.exec())
            elif mode == 8:
                # A bad input fails the call, not the caller.
                text = error_text(add_sub(a[:2], b[:2]).exec())
            elif mode == 9:
                req = pb_utils.InferenceRequest(
                    model_name="looper",
                    inputs=[pb_utils.Tensor("MODE", np.array([0], dtype=np.int32))],
                    requested_output_names=["TEXT"],
                )
                it = req.exec(decoupled=True)
                got = [next(it) for _ in range(3)]
                it.cancel()
                rest = list(it)
                text = f"{len(got)} then {len(rest)}: {error_text(rest[-1])}"
            elif mode == 12:
                req = pb_utils.InferenceRequest(
                    model_name="looper",
                    inputs=[pb_utils.Tensor("MODE", np.array([2], dtype=np.int32))],
                    requested_output_names=["TEXT"],
                )
                it = req.exec(decoupled=True)
                got = [next(it) for _ in range(2)]
                it.cancel()
                rest = [r for r in it if pb_utils.get_output_tensor_by_name(r, "TEXT") is not None]
                text = f"{len(got)} then {len(rest)} more"
            elif mode == 10:
                req = pb_utils.InferenceRequest(
                    model_name="slow",
                    inputs=[pb_utils.Tensor("MS", np.array([3000], dtype=np.int32))],
                    requested_output_names=["MS"],
                    timeout=200000,
                )
                text = error_text(req.exec())
            elif mode == 11:
                words = np.array([b"alpha", b"", "gr\u00fc\u00df".encode()], dtype=np.object_)
                r = pb_utils.InferenceRequest(
                    model_name="echo_bytes", inputs=[pb_utils.Tensor("T", words)], requested_output_names=["T"]
                ).exec()
                got = pb_utils.get_output_tensor_by_name(r, "T").as_numpy()
                text = json.dumps([w.decode() for w in got.tolist()])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", out.astype(np.float32)),
                pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_)),
            ]))
        return responses
"""

BLS_CONFIG = """
name: "bls"
backend: "python"
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

CHAIN_B = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            r = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=request.inputs(),
                requested_output_names=["OUTPUT0"],
            ).exec()
            if r.has_error():
                responses.append(pb_utils.InferenceResponse(error=r.error()))
            else:
                responses.append(pb_utils.InferenceResponse(r.output_tensors()))
        return responses
"""

CHAIN_B_CONFIG = """
name: "chain_b"
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

STREAM = """
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


def later(sender):
    # After execute returned, from a thread of the model's own.
    a = np.full(4, 5, dtype=np.float32)
    r = pb_utils.InferenceRequest(
        model_name="add_sub",
        inputs=[pb_utils.Tensor("INPUT0", a), pb_utils.Tensor("INPUT1", np.ones(4, dtype=np.float32))],
        requested_output_names=["OUTPUT0"],
    ).exec()
    value = int(pb_utils.get_output_tensor_by_name(r, "OUTPUT0").as_numpy()[0])
    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([value], dtype=np.int32))]))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            if n < 0:
                threading.Thread(target=later, args=(sender,)).start()
                continue
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([i], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

STREAM_CONFIG = """
name: "stream"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

BLS_INIT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.text = "no error"
        try:
            pb_utils.InferenceRequest(
                model_name="add_sub", inputs=[], requested_output_names=["OUTPUT0"]
            ).exec()
        except pb_utils.TritonModelException as e:
            self.text = str(e)

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([self.text.encode()], dtype=np.object_))])
                for _ in requests]
"""

BLS_INIT_CONFIG = """
name: "bls_init"
backend: "python"
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

LOOPER = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils

SEEN = []


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            sender = request.get_response_sender()
            if mode == 0:
                # Loops inside execute until the request is cancelled (or 60 s pass).
                deadline = time.time() + 60
                i = 0
                while time.time() < deadline:
                    if request.is_cancelled():
                        SEEN.append(i)
                        break
                    if i < 3:
                        # Three responses, then silence: the cancellation must come anyway.
                        sender.send(pb_utils.InferenceResponse([
                            pb_utils.Tensor("TEXT", np.array([str(i).encode()], dtype=np.object_))]))
                    i += 1
                    time.sleep(0.01)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == 2:
                # Ignores the cancellation: five responses, then the final flag.
                for i in range(5):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("TEXT", np.array([str(i).encode()], dtype=np.object_))]))
                    time.sleep(0.02)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                text = f"cancelled in execute after {SEEN[-1]}" if SEEN else "not cancelled"
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_))]),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

LOOPER_CONFIG = """
name: "looper"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

SLOW = """
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            ms = pb_utils.get_input_tensor_by_name(request, "MS")
            time.sleep(int(ms.as_numpy()[0]) / 1000.0)
            out.append(pb_utils.InferenceResponse([ms]))
        return out
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
input [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

ECHO_BYTES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "T")]) for r in requests]
"""

ECHO_BYTES_CONFIG = """
name: "echo_bytes"
backend: "python"
input [ { name: "T" data_type: TYPE_STRING dims: [ -1 ] } ]
output [ { name: "T" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

MODELS = ["add_sub", "bls_add_sub", "bls", "chain_b", "stream", "bls_init", "looper", "slow", "echo_bytes"]


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from conftest import Server

    repo = str(tmp_path_factory.mktemp("bls_repo"))
    for name in ("add_sub", "bls_add_sub"):
        shutil.copytree(os.path.join(ROOT, "examples", "models", name), os.path.join(repo, name))
    write_model(repo, "bls", BLS, BLS_CONFIG)
    write_model(repo, "chain_b", CHAIN_B, CHAIN_B_CONFIG)
    write_model(repo, "stream", STREAM, STREAM_CONFIG)
    write_model(repo, "bls_init", BLS_INIT, BLS_INIT_CONFIG)
    write_model(repo, "looper", LOOPER, LOOPER_CONFIG)
    write_model(repo, "slow", SLOW, SLOW_CONFIG)
    write_model(repo, "echo_bytes", ECHO_BYTES, ECHO_BYTES_CONFIG)
    server = Server(repo, str(tmp_path_factory.mktemp("bls_log") / "tritium.log"))
    try:
        server.wait_models(MODELS)
        yield server
    finally:
        code = server.stop()
        assert code == 0, f"tritium exited with {code}; log:\n{server.log_text()}"


@pytest.fixture(params=["http", "grpc"])
def tc(request, srv):
    """(tritonclient module, client) for the protocol under test."""
    if request.param == "http":
        return httpclient, httpclient.InferenceServerClient(srv.http_url, network_timeout=TIMEOUT)
    return grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)


A = np.array([1, 2, 3, 4], dtype=np.float32)


def call_bls(tc, mode, a=A):
    module, client = tc
    inputs = [module.InferInput("MODE", [1], "INT32"), module.InferInput("A", [4], "FP32")]
    inputs[0].set_data_from_numpy(np.array([mode], dtype=np.int32))
    inputs[1].set_data_from_numpy(a)
    kw = {} if module is httpclient else {"client_timeout": TIMEOUT}
    r = client.infer("bls", inputs, **kw)
    return r.as_numpy("OUT"), r.as_numpy("TEXT")[0].decode()


def test_the_example_calls_add_sub_and_returns_its_result(tc):
    module, client = tc
    b = np.array([10, 20, 30, 40], dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(A)
    inputs[1].set_data_from_numpy(b)
    r = client.infer("bls_add_sub", inputs)
    assert np.array_equal(r.as_numpy("OUTPUT0"), A + b)
    assert np.array_equal(r.as_numpy("OUTPUT1"), A - b)


def test_exec_returns_the_callees_outputs_and_all_of_them_when_none_is_named(tc):
    out, text = call_bls(tc, 0)
    assert np.array_equal(out, A + 1)
    assert text == "OUTPUT0,OUTPUT1"


def test_exec_decoupled_iterates_the_responses_and_ends_with_the_final_flag(tc):
    _, text = call_bls(tc, 1, a=np.array([3, 0, 0, 0], dtype=np.float32))
    # As in Triton, the final flag sent alone comes as a last response without outputs.
    assert json.loads(text) == [0, 1, 2, "final"]


def test_a_decoupled_model_calls_from_its_thread_after_execute_returned(tc):
    _, text = call_bls(tc, 1, a=np.array([-1, 0, 0, 0], dtype=np.float32))
    assert json.loads(text) == [6, "final"]


def test_async_exec_runs_calls_concurrently_with_gather(tc):
    out, text = call_bls(tc, 2)
    assert np.array_equal(out, (A + 1) + (A + 2))
    # A model that is not decoupled answers a decoupled call with one final response.
    assert text == "1"


def test_string_tensors_cross_both_ways(tc):
    _, text = call_bls(tc, 11)
    assert json.loads(text) == ["alpha", "", "gr\u00fc\u00df"]


def test_a_chain_three_deep(tc):
    out, _ = call_bls(tc, 3)
    assert np.array_equal(out, A + 1)


def test_exec_from_a_thread_that_execute_started(tc):
    out, _ = call_bls(tc, 4)
    assert np.array_equal(out, A + 1)


def test_an_unknown_model_is_an_error_response_with_tritons_text(tc):
    _, text = call_bls(tc, 5)
    assert text == (
        "Model no_such_model - Error when running inference: Failed for execute the inference request. "
        "Model 'no_such_model' is not ready."
    )


def test_a_decoupled_callee_needs_decoupled_true(tc):
    _, text = call_bls(tc, 6)
    assert text.startswith("Model stream - Error when running inference: Model stream is using the decoupled."), text
    assert "Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls" in text


def test_a_bad_request_fails_the_call_not_the_caller(tc):
    _, text = call_bls(tc, 8)
    assert text.startswith("Model add_sub - Error when running inference: "), text
    assert "INPUT0" in text


def test_cancel_on_the_iterator_ends_the_callees_stream(tc):
    # The callee sees the cancellation, stops and sends its final flag, which ends the
    # iteration (Triton's ResponseIterator.cancel()).
    _, text = call_bls(tc, 9)
    assert text == "3 then 1: no error", text


def test_a_callee_that_ignores_the_cancellation_is_still_heard_to_the_end(tc):
    # As in Triton (L0_backend_python decoupled_bls_cancel with IGNORE_CANCEL): cancel() asks,
    # and what the callee still sends reaches the caller.
    _, text = call_bls(tc, 12)
    assert text == "2 then 3 more", text


def test_a_call_past_its_timeout_is_an_error_response(tc):
    _, text = call_bls(tc, 10)
    assert text == "Request timeout expired"


def test_exec_in_initialize_raises_tritons_error(tc):
    module, client = tc
    inp = module.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    r = client.infer("bls_init", [inp])
    assert r.as_numpy("TEXT")[0].decode() == "BLS is only supported during the 'execute' function."


def test_a_self_call_that_would_deadlock_fails_with_a_clear_error(tc):
    _, text = call_bls(tc, 7)
    assert "would never run" in text and "'bls'" in text, text
    # The model still serves.
    out, _ = call_bls(tc, 0)
    assert np.array_equal(out, A + 1)


def test_a_cancelled_stream_is_seen_by_execute_while_it_runs(srv):
    results = queue.Queue()
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    inp = grpcclient.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    client.async_stream_infer("looper", [inp], request_id="long")
    for _ in range(3):
        result, error = results.get(timeout=TIMEOUT)
        assert error is None, error
    client.stop_stream(cancel_requests=True)
    client.close()

    reporter = grpcclient.InferenceServerClient(srv.grpc_url)
    answers = queue.Queue()
    reporter.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:

        def report():
            reporter.async_stream_infer("looper", [inp_report()], request_id="report")
            result, error = answers.get(timeout=TIMEOUT)
            assert error is None, error
            return result.as_numpy("TEXT")[0].decode()

        text = wait_for(lambda: (t := report()).startswith("cancelled") and t, timeout=TIMEOUT, what="cancel")
        assert text.startswith("cancelled in execute after "), text
    finally:
        reporter.stop_stream()
        reporter.close()


def inp_report():
    inp = grpcclient.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    return inp


CONTROL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def attempt(f):
    try:
        f()
        return "ok"
    except pb_utils.TritonModelException as e:
        return str(e)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            if mode == 0:
                text = ",".join(str(x) for x in (
                    pb_utils.is_model_ready("add_sub"),
                    pb_utils.is_model_ready("add_sub", "1"),
                    pb_utils.is_model_ready("add_sub", "7"),
                    pb_utils.is_model_ready("no_such_model"),
                ))
            elif mode == 1:
                text = attempt(lambda: pb_utils.load_model("add_sub"))
                text += f",{pb_utils.is_model_ready('add_sub')}"
            elif mode == 2:
                text = attempt(lambda: pb_utils.unload_model("add_sub"))
            else:
                text = attempt(lambda: pb_utils.load_model("control"))
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_))]))
        return out
"""

CONTROL_CONFIG = """
name: "control"
backend: "python"
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""


def control(url, mode):
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("MODE", [1], "INT32")
    inp.set_data_from_numpy(np.array([mode], dtype=np.int32))
    return client.infer("control", [inp], client_timeout=TIMEOUT).as_numpy("TEXT")[0].decode()


@pytest.fixture
def control_repo(tmp_path):
    """Starts a server over add_sub and `control` with the given models and flags."""
    from conftest import Server

    repo = str(tmp_path / "repo")
    shutil.copytree(os.path.join(ROOT, "examples", "models", "add_sub"), os.path.join(repo, "add_sub"))
    write_model(repo, "control", CONTROL, CONTROL_CONFIG)
    servers = []

    def start(models, extra_args=()):
        srv = Server(repo, str(tmp_path / "tritium.log"), extra_args)
        servers.append(srv)
        srv.wait_models(models)
        return srv

    yield start
    for srv in servers:
        assert srv.stop() == 0, srv.log_text()


def test_model_control_from_a_model_needs_explicit_mode(control_repo):
    srv = control_repo(["control", "add_sub"])
    assert control(srv.grpc_url, 0) == "True,True,False,False"
    text = "explicit model load / unload is not allowed if polling is enabled"
    assert control(srv.grpc_url, 1) == f"{text},True"
    assert control(srv.grpc_url, 2) == text


def test_load_and_unload_model_from_a_model_in_explicit_mode(control_repo):
    srv = control_repo(["control"], ["--model-control-mode", "explicit", "--load-model", "control"])
    assert control(srv.grpc_url, 0) == "False,False,False,False"
    assert control(srv.grpc_url, 1) == "ok,True"
    assert control(srv.grpc_url, 3).startswith("model 'control' cannot load itself from its own code")
    assert control(srv.grpc_url, 2) == "ok"
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    wait_for(lambda: not client.is_model_ready("add_sub"), timeout=TIMEOUT, what="add_sub unloaded")
