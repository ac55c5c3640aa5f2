"""Decoupled models end to end: a real server, real stubs, tritonclient's gRPC streaming.

The model is written here. Its MODE input picks what it does: 0 sends N responses from a thread
after `execute` returned, then the final flag alone; the others exercise Triton's rules and the
failures a client must see as errors, never as a hang.

Every test runs on both of the server's ways of serving a decoupled model: a task on the async
runtime (`--run-to-completion true`, the default) and a worker thread per instance (`false`).
"""

import os
import queue
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import Server
from test_faults import wait_for, write_model
from tritonclient.utils import InferenceServerException

MODEL = """
import os, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

LAST_ERROR = []
CANCELLED = []


def response(idx, tag, text=""):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("IDX", np.array([idx], dtype=np.int32)),
        pb_utils.Tensor("TAG", np.array([tag], dtype=np.int32)),
        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
        pb_utils.Tensor("TEXT", np.array([text.encode()], dtype=np.object_)),
    ])


def stream(sender, n, tag, delay_ms):
    for i in range(n):
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        sender.send(response(i, tag))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def after_final(sender):
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    try:
        sender.send(response(0, 0))
    except pb_utils.TritonModelException as e:
        LAST_ERROR.append(str(e))


def until_cancelled(sender):
    for i in range(3000):
        if sender.is_cancelled():
            CANCELLED.append(i)
            break
        sender.send(response(i, 0))
        time.sleep(0.005)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def report_cancelled(sender, tag):
    deadline = time.time() + 10
    while not CANCELLED and time.time() < deadline:
        time.sleep(0.01)
    text = f"cancelled after {CANCELLED[-1]}" if CANCELLED else "not cancelled"
    sender.send(response(0, tag, text), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def hang(sender):
    sender.send(response(0, 0))
    time.sleep(60)


class TritonPythonModel:
    def execute(self, requests):
        value = lambda r, name: int(pb_utils.get_input_tensor_by_name(r, name).as_numpy()[0])
        for r in requests:
            mode, n, tag, delay = (value(r, k) for k in ("MODE", "N", "TAG", "DELAY_MS"))
            sender = r.get_response_sender()
            if mode == 0:
                threading.Thread(target=stream, args=(sender, n, tag, delay)).start()
            elif mode == 1:
                raise ValueError("boom from the model")
            elif mode == 2:
                threading.Thread(target=after_final, args=(sender,)).start()
            elif mode == 3:
                deadline = time.time() + 10
                while not LAST_ERROR and time.time() < deadline:
                    time.sleep(0.01)
                sender.send(response(0, tag, LAST_ERROR[-1] if LAST_ERROR else "none"),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == 4:
                return [response(0, tag) for _ in requests]
            elif mode == 5:
                threading.Thread(target=hang, args=(sender,)).start()
            elif mode == 7:
                threading.Thread(target=until_cancelled, args=(sender,)).start()
            elif mode == 8:
                # From a thread: the stub takes the server's cancellation between executes.
                threading.Thread(target=report_cancelled, args=(sender, tag)).start()
            elif mode == 9:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad item")))
                sender.send(response(1, tag), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            elif mode == 10:
                # A response without outputs, carrying the final flag: a response, not the flag alone.
                sender.send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            # mode 6: the request and its sender are dropped without the final flag.
        return None
"""

CONFIG = """
name: "decoupled"
backend: "python"
model_transaction_policy { decoupled: true }
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "TAG" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "PID" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

COUPLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

SECOND = []


def text(value):
    return pb_utils.InferenceResponse([pb_utils.Tensor("TEXT", np.array([value.encode()], dtype=np.object_))])


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        if mode == 1:
            return [text(SECOND[-1] if SECOND else "none") for _ in requests]
        for r in requests:
            sender = r.get_response_sender()
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                first = "no error"
            except pb_utils.TritonModelException as e:
                first = str(e)
            sender.send(text(first))
            try:
                sender.send(text("again"))
            except pb_utils.TritonModelException as e:
                SECOND.append(str(e))
        return None
"""

COUPLED_CONFIG = """
name: "coupled"
backend: "python"
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

TIMEOUT = 30


@pytest.fixture(scope="module", params=["true", "false"], ids=["task", "thread"])
def srv(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("decoupled-repo")
    write_model(str(repo), "decoupled", MODEL, CONFIG)
    write_model(str(repo), "coupled", COUPLED, COUPLED_CONFIG)
    server = Server(
        str(repo),
        str(tmp_path_factory.mktemp("decoupled-log") / "tritium.log"),
        extra_args=["--run-to-completion", request.param],
    )
    try:
        server.wait_models(["decoupled", "coupled"])
        yield server
    finally:
        server.stop()


def inputs(mode=0, n=0, tag=0, delay_ms=0, cls=grpcclient.InferInput):
    out = []
    for name, v in (("MODE", mode), ("N", n), ("TAG", tag), ("DELAY_MS", delay_ms)):
        i = cls(name, [1], "INT32")
        i.set_data_from_numpy(np.array([v], dtype=np.int32))
        out.append(i)
    return out


class Stream:
    """One gRPC stream; every callback lands in a queue."""

    def __init__(self, url):
        self.client = grpcclient.InferenceServerClient(url)
        self.q = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)))

    def send(self, request_id, empty_final=True, **kw):
        self.client.async_stream_infer(
            "decoupled", inputs(**kw), request_id=request_id, enable_empty_final_response=empty_final
        )

    def next(self):
        return self.q.get(timeout=TIMEOUT)

    def until_final(self, request_id):
        """Every answer for `request_id` up to its final one; other ids' answers are kept apart."""
        got = []
        while True:
            result, error = self.next()
            if error is not None:
                got.append(("error", str(error)))
                return got
            r = result.get_response()
            final = r.parameters["triton_final_response"].bool_param
            if r.id == request_id:
                got.append(("final", None) if final and not r.outputs else ("response", result))
                if final:
                    return got

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.fixture
def stream(srv):
    s = Stream(srv.grpc_url)
    yield s
    s.close()


def idx(result):
    return int(result.as_numpy("IDX")[0])


def test_responses_from_a_thread_then_the_final_flag_alone(stream):
    stream.send("a", n=5)
    got = stream.until_final("a")
    assert [kind for kind, _ in got] == ["response"] * 5 + ["final"]
    assert [idx(r) for _, r in got[:5]] == list(range(5))
    for _, r in got[:5]:
        assert r.get_response().parameters["triton_final_response"].bool_param is False


def test_the_final_flag_alone_is_dropped_unless_asked_for(stream):
    stream.send("quiet", empty_final=False, n=3)
    stream.send("marker", n=0)
    seen = []

    def record(result, error):
        assert error is None, error
        r = result.get_response()
        seen.append((r.id, bool(r.outputs), r.parameters["triton_final_response"].bool_param))

    # The two requests' responses come from different threads, so they may interleave: read
    # until both are complete, then make sure nothing else (a dropped empty final) follows.
    while sum(1 for s in seen if s[0] == "quiet") < 3 or not any(s[0] == "marker" for s in seen):
        record(*stream.next())
    try:
        record(*stream.q.get(timeout=1.0))
    except queue.Empty:
        pass
    assert [s for s in seen if s[0] == "quiet"] == [("quiet", True, False)] * 3
    assert [s for s in seen if s[0] == "marker"] == [("marker", False, True)]


def test_an_empty_response_with_the_final_flag_reaches_a_client_that_asked_for_no_empty_final(stream):
    # As in Triton: only the final flag sent alone is dropped for such a client; a response the
    # model sent, outputs or not, is written (it once was taken for the flag alone and lost, so
    # the client never saw its request end).
    stream.send("empty", empty_final=False, mode=10)
    result, error = stream.next()
    assert error is None, error
    r = result.get_response()
    assert (r.id, list(r.outputs), r.parameters["triton_final_response"].bool_param) == ("empty", [], True)


def test_a_thousand_responses_keep_their_order(stream):
    stream.send("many", n=1000)
    got = stream.until_final("many")
    assert len(got) == 1001 and got[-1][0] == "final", got[-1]
    assert [idx(r) for _, r in got[:-1]] == list(range(1000))


def test_two_requests_on_one_instance_interleave(stream):
    stream.send("x", n=40, tag=1, delay_ms=5)
    stream.send("y", n=40, tag=2, delay_ms=5)
    order, finals = [], set()
    while len(finals) < 2:
        result, error = stream.next()
        assert error is None, error
        r = result.get_response()
        if r.parameters["triton_final_response"].bool_param:
            finals.add(r.id)
            continue
        assert int(result.as_numpy("TAG")[0]) == {"x": 1, "y": 2}[r.id]
        order.append((r.id, idx(result)))
    for rid in ("x", "y"):
        assert [i for r, i in order if r == rid] == list(range(40))
    # Both ran at once on the one instance: their responses are interleaved on the stream.
    ids = [r for r, _ in order]
    assert ids.index("y") < len(ids) - 1 - ids[::-1].index("x")


def test_an_exception_in_execute_is_an_error_and_the_stream_stays_usable(stream):
    stream.send("bad", mode=1)
    result, error = stream.next()
    assert result is None
    assert (
        "Failed to process the request(s) for model 'decoupled_0_0', message: ValueError: boom from the model"
        in str(error)
    )
    stream.send("good", n=2)
    got = stream.until_final("good")
    assert [kind for kind, _ in got] == ["response", "response", "final"], got


def test_an_error_response_does_not_end_the_request(stream):
    stream.send("mixed", mode=9)
    result, error = stream.next()
    assert result is None and str(error) == "bad item"
    result, error = stream.next()
    assert error is None and idx(result) == 1
    assert result.get_response().parameters["triton_final_response"].bool_param is True


def test_send_after_the_final_flag_raises_tritons_error(stream):
    stream.send("closer", mode=2)
    assert [k for k, _ in stream.until_final("closer")] == ["final"]
    stream.send("report", mode=3)
    (kind, result), *_ = stream.until_final("report")
    assert kind == "response"
    assert result.as_numpy("TEXT")[0].decode() == "Unable to send response. Response sender has been closed."


def first_error(srv, mode, request_id):
    """The error of the first answer on a new stream to one request in `mode`."""
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    got = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put(error))
    try:
        c.async_stream_infer("decoupled", inputs(mode=mode), request_id=request_id)
        return got.get(timeout=TIMEOUT)
    finally:
        c.stop_stream()
        c.close()


def test_execute_returning_a_list_is_tritons_error(srv):
    error = first_error(srv, 4, "list")
    assert str(error).startswith(
        "Failed to process the request(s) for model 'decoupled_0_0', message: "
        "Python model 'decoupled_0_0' is using the decoupled mode and the execute function must return None."
    )


def test_a_request_dropped_without_the_final_flag_ends_with_an_error(srv):
    error = first_error(srv, 6, "dropped")
    assert "released the request without sending its final response" in str(error)


def test_unary_inference_of_a_decoupled_model_is_refused(srv):
    with pytest.raises(InferenceServerException) as e:
        grpcclient.InferenceServerClient(srv.grpc_url).infer("decoupled", inputs())
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(e.value)
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    with pytest.raises(InferenceServerException) as e:
        httpclient.InferenceServerClient(srv.http_url).infer("decoupled", inputs(cls=httpclient.InferInput))
    assert "HTTP end point doesn't support models with decoupled transaction policy" in str(e.value)


def test_a_model_that_is_not_decoupled_may_send_one_response_through_its_sender(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)

    def call(mode):
        i = grpcclient.InferInput("MODE", [1], "INT32")
        i.set_data_from_numpy(np.array([mode], dtype=np.int32))
        return c.infer("coupled", [i]).as_numpy("TEXT")[0].decode()

    assert call(0) == (
        "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
    )
    assert call(1) == "Unable to send response. Non-decoupled model cannot send more than one response."


def test_statistics_count_a_decoupled_request_once(stream, srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)

    def successes():
        stats = c.get_inference_statistics("decoupled", as_json=True)["model_stats"][0]
        return int(stats["inference_stats"].get("success", {}).get("count", 0))

    before = successes()
    stream.send("counted", n=7)
    assert stream.until_final("counted")[-1][0] == "final"
    assert wait_for(lambda: successes() == before + 1, timeout=10, what="one success")


def test_a_client_that_goes_away_cancels_its_request(srv):
    s = Stream(srv.grpc_url)
    s.send("long", mode=7)
    for _ in range(3):
        assert s.next()[1] is None
    s.close(cancel=True)
    reporter = Stream(srv.grpc_url)
    try:
        reporter.send("report", mode=8)
        (kind, result), *_ = reporter.until_final("report")
        assert kind == "response"
        text = result.as_numpy("TEXT")[0].decode()
        assert text.startswith("cancelled after "), text
        assert int(text.split()[-1]) < 3000
    finally:
        reporter.close()


def test_a_killed_stub_ends_the_stream_with_an_error_naming_it(srv):
    s = Stream(srv.grpc_url)
    try:
        s.send("doomed", mode=5)
        result, error = s.next()
        assert error is None, error
        pid = int(result.as_numpy("PID")[0])
        os.kill(pid, signal.SIGKILL)
        result, error = s.next()
        assert result is None
        assert "stub decoupled_0_0" in str(error) and "SIGKILL" in str(error), str(error)
    finally:
        s.close()
    # The instance restarts and serves streams again.
    deadline = time.time() + 60
    while True:
        s = Stream(srv.grpc_url)
        try:
            s.send("after", n=1)
            got = s.until_final("after")
            if got[0][0] != "error":
                assert [k for k, _ in got] == ["response", "final"]
                break
        finally:
            s.close()
        assert time.time() < deadline, got
        time.sleep(0.5)
