"""The generate extension (`/generate`, `/generate_stream`), `triton_grpc_error` streams, and
cancellation by clients that go away, end to end: a real server, real stubs, real clients.

The models are written here: `gen` (batching, answers once), `story` (decoupled, sends the words
of its input one response each, then the final flag alone) and `slow` (one instance, records
each request it executes, then sleeps as long as asked).
"""

import http.client
import json
import os
import queue
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import Server
from test_faults import wait_for, write_model
from tritonclient.utils import InferenceServerException

GEN = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()
            t = text.reshape(-1)[0].decode()
            if t == "boom":
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("boom from gen")))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([[t.upper().encode()]], dtype=np.object_)),
                pb_utils.Tensor("params", np.array([[r.parameters().encode()]], dtype=np.object_)),
                pb_utils.Tensor("shape", np.array([list(text.shape)], dtype=np.int32)),
            ]))
        return out
"""

GEN_CONFIG = """
name: "gen"
backend: "python"
max_batch_size: 8
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "params" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "shape" data_type: TYPE_INT32 dims: [ 2 ] }
]
"""

STORY = """
import json, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

CANCELLED = []


def word(i, w):
    return pb_utils.InferenceResponse([
        pb_utils.Tensor("text_output", np.array([w.encode()], dtype=np.object_)),
        pb_utils.Tensor("IDX", np.array([i], dtype=np.int32)),
    ])


def tell(sender, words, mode):
    if mode == "endless":
        for i in range(100000):
            if sender.is_cancelled():
                CANCELLED.append(i)
                break
            sender.send(word(i, "again"))
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return
    if mode == "one":
        sender.send(word(0, "only"), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return
    if mode == "silent":
        # Sends nothing until cancelled: the server must tell it without a response to answer.
        for _ in range(3000):
            if sender.is_cancelled():
                CANCELLED.append(-1)
                break
            time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return
    for i, w in enumerate(words):
        sender.send(word(i, w))
    if mode == "error":
        sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("story failed")))
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def report(sender):
    deadline = time.time() + 20
    while not CANCELLED and time.time() < deadline:
        time.sleep(0.01)
    text = f"cancelled after {CANCELLED.pop()}" if CANCELLED else "not cancelled"
    sender.send(word(0, text), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy().reshape(-1)[0].decode()
            mode = json.loads(r.parameters()).get("mode", "")
            sender = r.get_response_sender()
            if mode == "report":
                # From a thread: the stub takes the server's cancellation between executes.
                threading.Thread(target=report, args=(sender,)).start()
                continue
            if mode == "raise":
                raise ValueError("story raised")
            threading.Thread(target=tell, args=(sender, text.split(), mode)).start()
        return None
"""

STORY_CONFIG = """
name: "story"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] }
]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

SLOW = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executed.txt")

    def execute(self, requests):
        out = []
        for r in requests:
            rid = pb_utils.get_input_tensor_by_name(r, "ID").as_numpy()[0].decode()
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0])
            with open(self.log, "a") as f:
                f.write(rid + "\\n")
            time.sleep(ms / 1000.0)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([rid.encode()], dtype=np.object_))]))
        return out
"""

SLOW_CONFIG = """
name: "slow"
backend: "python"
input [
  { name: "ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "MS" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""

TIMEOUT = 30


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    repo = tmp_path_factory.mktemp("generate-repo")
    write_model(str(repo), "gen", GEN, GEN_CONFIG)
    write_model(str(repo), "story", STORY, STORY_CONFIG)
    write_model(str(repo), "slow", SLOW, SLOW_CONFIG)
    server = Server(str(repo), str(tmp_path_factory.mktemp("generate-log") / "tritium.log"))
    try:
        server.wait_models(["gen", "story", "slow"])
        yield server
    finally:
        server.stop()


def post(srv, path, body, headers=None):
    """(status, content type, raw body) of a POST; `body` is JSON unless bytes."""
    conn = http.client.HTTPConnection(srv.http_url, timeout=TIMEOUT)
    try:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.getheader("Content-Type"), r.read()
    finally:
        conn.close()


def events(raw):
    """The JSON objects of an SSE body, checking the framing is exactly `data: ...\\n\\n`."""
    text = raw.decode()
    assert text.endswith("\n\n"), repr(text)
    chunks = text[:-2].split("\n\n")
    assert all(c.startswith("data: ") and "\n" not in c for c in chunks), repr(text)
    return [json.loads(c[len("data: ") :]) for c in chunks]


# ---- /generate ----


def test_generate_maps_keys_to_inputs_and_parameters(srv):
    status, ctype, raw = post(
        srv,
        "/v2/models/gen/generate",
        {"id": "42", "text_input": "hello", "temperature": 0.5, "parameters": {"max_tokens": 7, "stream": False}},
    )
    assert (status, ctype) == (200, "application/json"), raw
    body = json.loads(raw)
    assert body["text_output"] == "HELLO"
    assert (body["id"], body["model_name"], body["model_version"]) == ("42", "gen", "1")
    # A batching model's input gets the batch dimension: [1, 1]; two elements stay an array.
    assert body["shape"] == [1, 1]
    assert json.loads(body["params"]) == {"id": "42", "temperature": 0.5, "max_tokens": 7, "stream": False}
    # Keys come in Triton's (std::map) order.
    assert list(body) == sorted(body)


def test_a_batching_model_takes_several_elements_as_a_batch(srv):
    status, _, raw = post(srv, "/v2/models/gen/generate", {"text_input": ["a", "b"]})
    assert status == 200, raw
    # The model answers the first element of its [2, 1] input.
    assert json.loads(raw)["shape"] == [2, 1]


def test_generate_with_a_version_in_the_path(srv):
    status, _, raw = post(srv, "/v2/models/gen/versions/1/generate", {"text_input": "v"})
    assert status == 200 and json.loads(raw)["text_output"] == "V"
    assert "id" not in json.loads(raw)


def test_generate_errors_have_tritons_texts_and_codes(srv):
    status, ctype, raw = post(srv, "/v2/models/nope/generate", {"text_input": "x"})
    assert (status, ctype) == (404, "application/json")
    assert "nope" in json.loads(raw)["error"]

    status, _, raw = post(srv, "/v2/models/slow/generate", {"ID": ["a", "b"], "MS": 0})
    assert status == 400
    assert json.loads(raw) == {"error": "The schema can not convert input 'ID' to tensor with proper shape"}

    status, _, raw = post(srv, "/v2/models/gen/generate", {"text_input": "x", "bad": [1, 2]})
    assert status == 400
    assert (
        json.loads(raw)["error"] == "parameter 'bad' has invalid type. It should be either 'int', 'bool', or 'string'."
    )

    status, _, raw = post(srv, "/v2/models/gen/generate", {"text_input": 5})
    assert status == 400 and json.loads(raw)["error"].startswith("Unable to parse JSON bytes array"), raw

    # A missing input is the core's validation error.
    status, _, raw = post(srv, "/v2/models/gen/generate", {"prompt": "x"})
    assert status == 400 and "text_input" in json.loads(raw)["error"], raw

    status, _, raw = post(srv, "/v2/models/gen/generate", b"{not json")
    assert status == 400 and json.loads(raw)["error"].startswith("failed to parse the request JSON buffer"), raw

    status, _, raw = post(srv, "/v2/models/gen/generate", {"text_input": "x"}, {"Content-Encoding": "gzip"})
    assert status == 400
    assert json.loads(raw)["error"] == "Unsupported content-encoding, only 'identity' is supported."


def test_a_model_error_is_the_answer_with_its_status(srv):
    status, ctype, raw = post(srv, "/v2/models/gen/generate", {"text_input": "boom"})
    assert (status, ctype) == (500, "application/json"), raw
    assert json.loads(raw) == {"error": "boom from gen"}


def test_generate_on_a_decoupled_model_wants_exactly_one_response(srv):
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "x", "mode": "one"})
    assert status == 200 and json.loads(raw)["text_output"] == "only", raw
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "one"})
    assert status == 200 and json.loads(raw)["text_output"] == "one", raw
    # More than one: Triton's error, with the status of the first response (200).
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "a b c"})
    assert status == 200
    assert json.loads(raw) == {
        "error": "generate expects model to produce exactly 1 response, use generate stream for model that "
        "generates various number of responses"
    }
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": ""})
    assert status == 200 and "exactly 1 response" in json.loads(raw)["error"]


# ---- /generate_stream ----


def test_generate_stream_sends_one_event_per_response(srv):
    status, ctype, raw = post(srv, "/v2/models/story/generate_stream", {"id": "s1", "text_input": "once upon a time"})
    assert (status, ctype) == (200, "text/event-stream; charset=utf-8")
    got = events(raw)
    assert [e["text_output"] for e in got] == ["once", "upon", "a", "time"]
    assert [e["IDX"] for e in got] == [0, 1, 2, 3]
    assert all(e["id"] == "s1" and e["model_name"] == "story" for e in got)


def test_generate_stream_on_a_model_that_is_not_decoupled(srv):
    status, ctype, raw = post(srv, "/v2/models/gen/generate_stream", {"text_input": "abc"})
    assert (status, ctype) == (200, "text/event-stream; charset=utf-8")
    assert [e["text_output"] for e in events(raw)] == ["ABC"]


def test_generate_stream_errors(srv):
    # An error in a later response is an error event; the status stays the first one's.
    status, _, raw = post(srv, "/v2/models/story/generate_stream", {"text_input": "a b", "mode": "error"})
    assert status == 200
    assert events(raw) == [events(raw)[0], events(raw)[1], {"error": "story failed"}]
    # The first response failing sets the status.
    status, ctype, raw = post(srv, "/v2/models/gen/generate_stream", {"text_input": "boom"})
    assert (status, ctype) == (500, "text/event-stream; charset=utf-8")
    assert raw == b'data: {"error":"boom from gen"}\n\n'
    status, _, raw = post(srv, "/v2/models/story/generate_stream", {"text_input": "x", "mode": "raise"})
    assert status == 500 and "story raised" in events(raw)[0]["error"], raw
    # Before inference: a plain JSON error.
    status, ctype, raw = post(srv, "/v2/models/story/generate_stream", {"nothing": 1})
    assert (status, ctype) == (400, "application/json"), raw


def test_empty_final_response_parameter_is_accepted_and_sends_nothing(srv):
    body = {"text_input": "a b", "parameters": {"triton_enable_empty_final_response": True}}
    status, _, raw = post(srv, "/v2/models/story/generate_stream", body)
    assert status == 200 and [e["text_output"] for e in events(raw)] == ["a", "b"]
    body["parameters"]["triton_enable_empty_final_response"] = 1
    status, _, raw = post(srv, "/v2/models/story/generate_stream", body)
    assert status == 400
    assert json.loads(raw)["error"] == (
        "Converting keyword: 'parameters': invalid value type for 'triton_enable_empty_final_response' parameter, "
        "expected bool_param."
    )


def test_infer_on_a_decoupled_model_has_tritons_text(srv):
    body = {"inputs": [{"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}
    status, _, raw = post(srv, "/v2/models/story/infer", body)
    assert status == 501
    assert json.loads(raw) == {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    with pytest.raises(InferenceServerException) as e:
        c.infer("story", [inp])
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in e.value.message()


# ---- triton_grpc_error ----


def gen_input(text):
    inp = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    return [inp]


class Stream:
    def __init__(self, url, headers=None):
        self.client = grpcclient.InferenceServerClient(url)
        self.q = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.q.put((result, error)), headers=headers)

    def next(self):
        return self.q.get(timeout=TIMEOUT)

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_without_triton_grpc_error_an_error_is_a_message_and_the_stream_goes_on(srv):
    s = Stream(srv.grpc_url)
    try:
        s.client.async_stream_infer("gen", gen_input("boom"), request_id="1")
        result, error = s.next()
        assert result is None and "boom from gen" in str(error)
        s.client.async_stream_infer("gen", gen_input("ok"), request_id="2")
        result, error = s.next()
        assert error is None and result.as_numpy("text_output")[0][0] == b"OK"
    finally:
        s.close()


def test_triton_grpc_error_ends_the_stream_with_the_status(srv):
    s = Stream(srv.grpc_url, headers={"triton_grpc_error": "true"})
    try:
        s.client.async_stream_infer("gen", gen_input("fine"), request_id="1")
        result, error = s.next()
        assert error is None and result.as_numpy("text_output")[0][0] == b"FINE"
        s.client.async_stream_infer("gen", gen_input("boom"), request_id="2")
        result, error = s.next()
        assert result is None
        assert error.status() == "StatusCode.INTERNAL", error.status()
        assert "boom from gen" in error.message()
    finally:
        s.close()


def test_triton_grpc_error_on_a_decoupled_stream(srv):
    s = Stream(srv.grpc_url, headers={"triton_grpc_error": "true"})
    try:
        inp = grpcclient.InferInput("text_input", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
        s.client.async_stream_infer("story", [inp], request_id="r", parameters={"mode": "raise"})
        result, error = s.next()
        assert result is None
        assert error.status() == "StatusCode.INTERNAL", error.status()
        assert "story raised" in error.message()
    finally:
        s.close()


# ---- cancellation ----


def executed(srv):
    path = os.path.join(srv.repository, "slow", "executed.txt")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


def slow_body(rid, ms):
    return {"ID": rid, "MS": ms}


def infer_body(rid, ms):
    return {
        "inputs": [
            {"name": "ID", "shape": [1], "datatype": "BYTES", "data": [rid]},
            {"name": "MS", "shape": [1], "datatype": "INT32", "data": [ms]},
        ]
    }


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream", "infer"])
def test_a_queued_request_whose_http_client_went_away_is_never_executed(srv, endpoint):
    hold, gone = f"hold-{endpoint}", f"gone-{endpoint}"
    holder = threading.Thread(target=post, args=(srv, "/v2/models/slow/generate", slow_body(hold, 3000)))
    holder.start()
    wait_for(lambda: hold in executed(srv), what="the first request to run")
    # The second waits in the queue behind the first; its client goes away.
    sock = socket.create_connection((("127.0.0.1"), srv.http_port), timeout=TIMEOUT)
    body = infer_body(gone, 0) if endpoint == "infer" else slow_body(gone, 0)
    payload = json.dumps(body).encode()
    sock.sendall(
        f"POST /v2/models/slow/{endpoint} HTTP/1.1\r\n".encode()
        + b"Host: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    time.sleep(0.5)
    sock.close()
    holder.join(TIMEOUT)
    status, _, raw = post(srv, "/v2/models/slow/generate", slow_body("after", 0))
    assert status == 200 and json.loads(raw)["OUT"] == "after", raw
    assert gone not in executed(srv), executed(srv)
    stats = grpcclient.InferenceServerClient(srv.grpc_url).get_inference_statistics("slow", as_json=True)
    assert int(stats["model_stats"][0]["inference_stats"]["fail"].get("count", 0)) >= 1


def test_a_queued_grpc_request_past_its_deadline_is_never_executed(srv):
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    holder = threading.Thread(target=post, args=(srv, "/v2/models/slow/generate", slow_body("hold2", 3000)))
    holder.start()
    wait_for(lambda: "hold2" in executed(srv), what="the first request to run")
    ids = grpcclient.InferInput("ID", [1], "BYTES")
    ids.set_data_from_numpy(np.array([b"late"], dtype=np.object_))
    ms = grpcclient.InferInput("MS", [1], "INT32")
    ms.set_data_from_numpy(np.array([0], dtype=np.int32))
    with pytest.raises(InferenceServerException) as e:
        c.infer("slow", [ids, ms], client_timeout=0.5)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED", e.value.status()
    holder.join(TIMEOUT)
    status, _, _ = post(srv, "/v2/models/slow/generate", slow_body("after2", 0))
    assert status == 200
    assert "late" not in executed(srv), executed(srv)


def test_closing_a_generate_stream_cancels_the_decoupled_request(srv):
    conn = http.client.HTTPConnection(srv.http_url, timeout=TIMEOUT)
    conn.request("POST", "/v2/models/story/generate_stream", body=json.dumps({"text_input": "x", "mode": "endless"}))
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")
    conn.close()
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "x", "mode": "report"})
    assert status == 200
    assert json.loads(raw)["text_output"].startswith("cancelled after "), raw


def test_stop_stream_with_cancel_requests_reaches_the_model(srv):
    # The reporter above may have run first in this module: both only need some cancellation seen.
    s = Stream(srv.grpc_url)
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    s.client.async_stream_infer("story", [inp], request_id="e", parameters={"mode": "endless"})
    assert s.next()[1] is None
    s.close(cancel=True)
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "x", "mode": "report"})
    assert status == 200 and json.loads(raw)["text_output"].startswith("cancelled after "), raw


def test_a_queued_request_of_a_cancelled_grpc_stream_is_never_executed(srv):
    holder = threading.Thread(target=post, args=(srv, "/v2/models/slow/generate", slow_body("hold3", 3000)))
    holder.start()
    wait_for(lambda: "hold3" in executed(srv), what="the first request to run")
    s = Stream(srv.grpc_url)
    ids = grpcclient.InferInput("ID", [1], "BYTES")
    ids.set_data_from_numpy(np.array([b"streamed"], dtype=np.object_))
    ms = grpcclient.InferInput("MS", [1], "INT32")
    ms.set_data_from_numpy(np.array([0], dtype=np.int32))
    s.client.async_stream_infer("slow", [ids, ms], request_id="q")
    time.sleep(0.5)
    s.close(cancel=True)
    holder.join(TIMEOUT)
    status, _, _ = post(srv, "/v2/models/slow/generate", slow_body("after3", 0))
    assert status == 200
    assert "streamed" not in executed(srv), executed(srv)


def cancelled_count(srv):
    """Requests of `slow` counted as failed with reason CANCELED."""
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=TIMEOUT) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("nv_inference_request_failure") and 'model="slow"' in line and "CANCELED" in line:
            return float(line.split()[-1])
    return 0.0


def test_a_queued_unary_grpc_call_whose_client_closed_is_never_executed(srv):
    before = cancelled_count(srv)
    holder = threading.Thread(target=post, args=(srv, "/v2/models/slow/generate", slow_body("hold4", 3000)))
    holder.start()
    wait_for(lambda: "hold4" in executed(srv), what="the first request to run")
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    ids = grpcclient.InferInput("ID", [1], "BYTES")
    ids.set_data_from_numpy(np.array([b"closed"], dtype=np.object_))
    ms = grpcclient.InferInput("MS", [1], "INT32")
    ms.set_data_from_numpy(np.array([0], dtype=np.int32))
    c.async_infer("slow", [ids, ms], callback=lambda result, error: None)
    time.sleep(0.5)
    c.close()
    holder.join(TIMEOUT)
    status, _, _ = post(srv, "/v2/models/slow/generate", slow_body("after4", 0))
    assert status == 200
    assert "closed" not in executed(srv), executed(srv)
    assert cancelled_count(srv) == before + 1


def test_a_silent_decoupled_request_is_cancelled_when_its_http_client_goes_away(srv):
    sock = socket.create_connection(("127.0.0.1", srv.http_port), timeout=TIMEOUT)
    payload = json.dumps({"text_input": "x", "mode": "silent"}).encode()
    sock.sendall(
        b"POST /v2/models/story/generate_stream HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    time.sleep(0.5)
    sock.close()
    status, _, raw = post(srv, "/v2/models/story/generate", {"text_input": "x", "mode": "report"})
    assert status == 200
    assert json.loads(raw)["text_output"] == "cancelled after -1", raw
