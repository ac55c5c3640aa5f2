"""The response sender in models that are not decoupled (Triton 24.06 and later): a model may
answer each request with exactly one response through `request.get_response_sender()`, inside
`execute`, from a thread after `execute` returned None, or from an `async def execute`, for a
batch answered in any order; Triton's rules hold (a second response is an error to the model, a
response both sent and returned fails the request, a model that sends and then raises fails the
request, a request dropped unanswered gets an error instead of hanging). As Triton's own
response_sender tests (qa/L0_backend_python/response_sender) show, a response the model already
sent stands when a later step fails (a second send, a returned response, an exception): the
request had completed; the failure is an error to the model and is logged."""

import concurrent.futures
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import write_model
from tritonclient.utils import InferenceServerException

CONFIG = """
name: "sender_nd"
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 300000 }
input [ { name: "MODE" data_type: TYPE_STRING dims: [ 1 ] }, { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""

MODEL = """
import asyncio
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def answer(request):
    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
    return pb_utils.InferenceResponse([pb_utils.Tensor("Y", (x * 2).astype(np.int32))])


def mode(request):
    return pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy().reshape(-1)[0].decode()


class TritonPythonModel:
    def initialize(self, args):
        self.log = pb_utils.Logger
        self.kept = []

    def execute(self, requests):
        modes = {mode(r) for r in requests}
        if modes == {"async"}:
            return self.execute_async(requests)
        if modes == {"thread"}:
            # Every request of the batch, answered in reverse order after execute returned.
            def later():
                time.sleep(0.05)
                for r in reversed(requests):
                    r.get_response_sender().send(answer(r), flags=FINAL)

            threading.Thread(target=later).start()
            return None
        out = []
        for r in requests:
            m = mode(r)
            sender = r.get_response_sender()
            if m == "inside":
                sender.send(answer(r), flags=FINAL)
                out.append(None)
            elif m == "then_flag":
                sender.send(answer(r))
                sender.send(flags=FINAL)
                out.append(None)
            elif m == "twice":
                sender.send(answer(r))
                try:
                    sender.send(answer(r), flags=FINAL)
                except pb_utils.TritonModelException as e:
                    self.log.log_error(f"second send refused: {e}")
                out.append(None)
            elif m == "both":
                sender.send(answer(r), flags=FINAL)
                out.append(answer(r))
            elif m == "raise":
                sender.send(answer(r), flags=FINAL)
                raise RuntimeError("raised after sending")
            elif m == "drop":
                out.append(None)
            elif m == "keep":
                self.kept.append(r)
                threading.Timer(0.2, lambda r=r: r.get_response_sender().send(answer(r), flags=FINAL)).start()
                out.append(None)
        return None if all(o is None for o in out) else out

    async def execute_async(self, requests):
        await asyncio.sleep(0.01)
        for r in requests:
            r.get_response_sender().send(answer(r), flags=FINAL)
        return None
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from conftest import Server

    tmp = tmp_path_factory.mktemp("sender")
    repo = str(tmp / "repo")
    write_model(repo, "sender_nd", CONFIG, MODEL)
    server = Server(repo, str(tmp / "tritium.log"))
    try:
        server.wait_models(["sender_nd"])
        yield server
    finally:
        server.stop()


def infer(module, url, m, x):
    client = module.InferenceServerClient(url)
    mode = module.InferInput("MODE", [1, 1], "BYTES")
    mode.set_data_from_numpy(np.array([[m.encode()]], dtype=np.object_))
    value = module.InferInput("X", [1, 1], "INT32")
    value.set_data_from_numpy(np.array([[x]], dtype=np.int32))
    return int(client.infer("sender_nd", [mode, value]).as_numpy("Y")[0][0])


@pytest.fixture(params=["http", "grpc"])
def via(request, srv):
    module = httpclient if request.param == "http" else grpcclient
    url = srv.http_url if request.param == "http" else srv.grpc_url
    return lambda m, x: infer(module, url, m, x)


@pytest.mark.parametrize("mode", ["inside", "then_flag", "thread", "async", "keep"])
def test_one_response_through_the_sender_answers_the_request(via, mode):
    assert via(mode, 21) == 42


def test_a_batch_answered_in_reverse_order_from_a_thread(srv):
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda x: infer(grpcclient, srv.grpc_url, "thread", x), range(6)))
    assert got == [2 * x for x in range(6)]
    stats = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("sender_nd")
    stats = stats["model_stats"][0]
    assert stats["execution_count"] < stats["inference_count"], stats


def test_a_second_response_is_an_error_to_the_model(via, srv):
    assert via("twice", 5) == 10
    deadline = time.time() + 5
    while "second send refused" not in srv.log_text() and time.time() < deadline:
        time.sleep(0.05)
    line = next(x for x in srv.log_text().splitlines() if "second send refused" in x)
    assert "Non-decoupled model cannot send more than one response" in line, line


@pytest.mark.parametrize(
    "mode, logged",
    [
        ("both", "Non-decoupled model cannot send more than one response"),
        ("raise", "raised after sending"),
    ],
)
def test_a_sent_response_stands_when_execute_then_fails_and_the_error_is_logged(via, srv, mode, logged):
    """Triton's test_non_decoupled_one_response_pre_and_on_return and _two_response_pre_return:
    the client gets the response sent first; the error that follows goes to the log."""
    assert via(mode, 3) == 6
    deadline = time.time() + 5
    while not any(logged in x and "ERROR" in x for x in srv.log_text().splitlines()):
        assert time.time() < deadline, srv.log_text()[-3000:]
        time.sleep(0.05)
    assert via("inside", 4) == 8


def test_a_request_dropped_unanswered_gets_an_error(via):
    with pytest.raises(InferenceServerException, match="the model sent no response for this request"):
        via("drop", 1)
    # The instance serves on.
    assert via("inside", 4) == 8
