"""Back-pressure and cancellation bookkeeping end to end: a real server, real stubs, tritonclient.

A decoupled model streams as fast as it can to a client that reads slowly: the server holds the
model back to `--max-inflight-responses` responses not yet taken by the client, so its memory
does not grow with the stream. The model records how far it got in a file of its directory (an
8-byte counter written after each send), which the test reads while it is not reading the stream.
Every test runs on both ways of serving a decoupled model: a task on the async runtime
(`--run-to-completion true`, the default) and a worker thread per instance (`false`).
"""

import os
import queue
import struct
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import Server
from test_faults import wait_for, write_model

WINDOW = 16
TOTAL = 10_000
# Each response carries this many bytes, so the transport's buffers (HTTP/2 flow-control windows,
# 64 KiB each with BDP probing off) hold a known, small number of responses.
PAYLOAD = 1024

FIREHOSE = """
import os, struct, threading, time
import numpy as np
import triton_python_backend_utils as pb_utils
from tritium import _runtime

HERE = os.path.dirname(os.path.abspath(__file__))


def record(fd, n):
    os.pwrite(fd, struct.pack("<q", n), 0)


def firehose(sender, n, size):
    fd = os.open(os.path.join(HERE, "sent"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        payload = np.zeros([size], dtype=np.uint8)
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("IDX", np.array([i], dtype=np.int64)),
                pb_utils.Tensor("DATA", payload),
            ]))
            record(fd, i + 1)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    finally:
        os.close(fd)


def until_cancelled(sender):
    i = 0
    while not sender.is_cancelled():
        sender.send(pb_utils.InferenceResponse([
            pb_utils.Tensor("IDX", np.array([i], dtype=np.int64)),
            pb_utils.Tensor("DATA", np.zeros([1], dtype=np.uint8)),
        ]))
        i += 1
        time.sleep(0.002)
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonPythonModel:
    def execute(self, requests):
        for r in requests:
            mode = int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy()[0])
            n = int(pb_utils.get_input_tensor_by_name(r, "N").as_numpy()[0])
            sender = r.get_response_sender()
            if mode == 0:
                threading.Thread(target=firehose, args=(sender, n, PAYLOAD_BYTES)).start()
            elif mode == 1:
                # From the stub's main thread, inside execute: the wait must pump the ring itself.
                firehose(sender, n, 1)
            elif mode == 2:
                threading.Thread(target=until_cancelled, args=(sender,)).start()
            elif mode == 3:
                # How many requests the stub still tracks (cancellations, credit): this one alone.
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("IDX", np.array([_runtime.channel.tracked_requests()], dtype=np.int64)),
                    pb_utils.Tensor("DATA", np.zeros([1], dtype=np.uint8)),
                ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
""".replace("PAYLOAD_BYTES", str(PAYLOAD))

FIREHOSE_CONFIG = """
name: "firehose"
backend: "python"
model_transaction_policy { decoupled: true }
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "IDX" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "DATA" data_type: TYPE_UINT8 dims: [ -1 ] }
]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""

# A model that is not decoupled, whose execute runs until its request is cancelled, and records
# that it saw the cancellation.
PATIENT = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

HERE = os.path.dirname(os.path.abspath(__file__))


class TritonPythonModel:
    def execute(self, requests):
        open(os.path.join(HERE, "started"), "w").close()
        deadline = time.time() + 30
        seen = False
        while time.time() < deadline:
            if all(r.is_cancelled() for r in requests):
                seen = True
                break
            time.sleep(0.01)
        if seen:
            with open(os.path.join(HERE, "cancelled"), "w") as f:
                f.write("yes")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], dtype=np.int32))]) for _ in requests]
"""

PATIENT_CONFIG = """
name: "patient"
backend: "python"
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [{ kind: KIND_CPU, count: 1 }]
"""

ENSEMBLE_CONFIG = """
name: "firehose_ensemble"
platform: "ensemble"
input [
  { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "IDX" data_type: TYPE_INT64 dims: [ 1 ] },
  { name: "DATA" data_type: TYPE_UINT8 dims: [ -1 ] }
]
ensemble_scheduling { step [ {
  model_name: "firehose" model_version: -1
  input_map { key: "MODE" value: "MODE" } input_map { key: "N" value: "N" }
  output_map { key: "IDX" value: "IDX" } output_map { key: "DATA" value: "DATA" }
} ] }
"""

TIMEOUT = 60


@pytest.fixture(scope="module", params=["true", "false"], ids=["task", "thread"])
def srv(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp("backpressure-repo")
    write_model(str(repo), "firehose", FIREHOSE, FIREHOSE_CONFIG)
    write_model(str(repo), "patient", PATIENT, PATIENT_CONFIG)
    os.makedirs(os.path.join(str(repo), "firehose_ensemble", "1"))
    with open(os.path.join(str(repo), "firehose_ensemble", "config.pbtxt"), "w") as f:
        f.write(ENSEMBLE_CONFIG)
    server = Server(
        str(repo),
        str(tmp_path_factory.mktemp("backpressure-log") / "tritium.log"),
        extra_args=["--max-inflight-responses", str(WINDOW), "--run-to-completion", request.param],
    )
    server.repo = str(repo)
    try:
        server.wait_models(["firehose", "patient", "firehose_ensemble"])
        yield server
    finally:
        server.stop()


def sent_so_far(srv):
    """The firehose's own count of responses it sent."""
    try:
        with open(os.path.join(srv.repo, "firehose", "1", "sent"), "rb") as f:
            data = f.read(8)
    except FileNotFoundError:
        return 0
    return struct.unpack("<q", data)[0] if len(data) == 8 else 0


def settled(read, timeout=20):
    """Waits until `read()` stops changing for a second (at most `timeout`), and returns it."""
    last, since, deadline = read(), time.time(), time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.1)
        now = read()
        if now != last:
            last, since = now, time.time()
        elif time.time() - since >= 1.0:
            break
    return last


def inputs(mode, n=0):
    out = []
    for name, v in (("MODE", mode), ("N", n)):
        i = grpcclient.InferInput(name, [1], "INT32")
        i.set_data_from_numpy(np.array([v], dtype=np.int32))
        out.append(i)
    return out


class SlowStream:
    """A gRPC stream whose reader takes one response each time the test allows it."""

    def __init__(self, url):
        # BDP probing off: the transport's flow-control windows stay at their 64 KiB default.
        self.client = grpcclient.InferenceServerClient(url, channel_args=[("grpc.http2.bdp_probe", 0)])
        self.q = queue.Queue()
        self.gate = threading.Semaphore(0)

        def callback(result, error):
            self.q.put((result, error))
            # The client's reading thread stops here until the test lets it take another.
            self.gate.acquire()

        self.client.start_stream(callback=callback)

    def take(self, count=1):
        """Lets the reader take `count` more responses and returns them."""
        got = []
        for _ in range(count):
            self.gate.release()
            got.append(self.q.get(timeout=TIMEOUT))
        return got

    def close(self, cancel=False):
        # Unblocks the reader for good, so the stream can close.
        for _ in range(TOTAL + 10):
            self.gate.release()
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


@pytest.mark.parametrize("model", ["firehose", "firehose_ensemble"])
def test_a_slow_client_holds_the_model_back_to_the_window(srv, model):
    s = SlowStream(srv.grpc_url)
    try:
        s.client.async_stream_infer(model, inputs(0, TOTAL), request_id="slow")
        read = 0
        # The client reads one response, then stops reading a while, and again: each time the
        # model may be at most the window ahead of what the server has handed to the transport.
        for _ in range(5):
            result, error = s.q.get(timeout=TIMEOUT)
            assert error is None, error
            assert int(result.as_numpy("IDX")[0]) == read
            read += 1
            ahead = settled(lambda: sent_so_far(srv)) - read
            # The window plus what the transport buffers (two 64 KiB HTTP/2 windows of 1 KiB
            # responses, the server's queue of unsent answers); without back-pressure the model
            # would have sent all 10,000 by now.
            assert ahead <= WINDOW + 400, f"the model ran {ahead} responses ahead of its client"
            s.gate.release()
        # Then it reads the rest: every response arrives, in order.
        for _ in range(TOTAL + 10):
            s.gate.release()
        while read < TOTAL:
            result, error = s.q.get(timeout=TIMEOUT)
            assert error is None, error
            r = result.get_response()
            if r.parameters["triton_final_response"].bool_param and not r.outputs:
                break
            assert int(result.as_numpy("IDX")[0]) == read
            read += 1
        assert read == TOTAL
        assert sent_so_far(srv) == TOTAL
    finally:
        s.close()


def test_a_model_sending_from_execute_on_the_main_thread_waits_without_deadlock(srv):
    s = SlowStream(srv.grpc_url)
    try:
        for _ in range(TOTAL + 10):
            s.gate.release()
        s.client.async_stream_infer("firehose", inputs(1, 2000), request_id="main")
        for i in range(2000):
            result, error = s.q.get(timeout=TIMEOUT)
            assert error is None, error
            assert int(result.as_numpy("IDX")[0]) == i
    finally:
        s.close()


def test_the_stub_forgets_requests_that_ended_even_cancelled_ones(srv):
    for _ in range(20):
        s = SlowStream(srv.grpc_url)
        for _ in range(TOTAL):
            s.gate.release()
        s.client.async_stream_infer("firehose", inputs(2), request_id="doomed")
        s.q.get(timeout=TIMEOUT)
        s.close(cancel=True)

    # The cancelled requests end (the model sees the cancellation and sends its final), and the
    # stub keeps nothing of them: only the asking request is tracked.
    def tracked():
        s = SlowStream(srv.grpc_url)
        try:
            for _ in range(10):
                s.gate.release()
            s.client.async_stream_infer("firehose", inputs(3), request_id="count")
            result, error = s.q.get(timeout=TIMEOUT)
            assert error is None, error
            return int(result.as_numpy("IDX")[0])
        finally:
            s.close()

    wait_for(lambda: tracked() == 1, what="the stub to forget the cancelled requests")


def test_a_unary_grpc_client_that_cancels_reaches_a_running_execute(srv):
    marker = os.path.join(srv.repo, "patient", "1", "cancelled")
    client = grpcclient.InferenceServerClient(srv.grpc_url)
    try:
        i = grpcclient.InferInput("IN", [1], "INT32")
        i.set_data_from_numpy(np.array([1], dtype=np.int32))
        done = queue.Queue()
        ctx = client.async_infer("patient", [i], callback=lambda result, error: done.put((result, error)))
        # The request is running (the model's execute is in its loop) before the client cancels.
        wait_for(lambda: os.path.exists(os.path.join(srv.repo, "patient", "1", "started")), what="execute")
        ctx.cancel()
        result, error = done.get(timeout=TIMEOUT)
        assert result is None and "CANCELLED" in str(error).upper(), error
        wait_for(lambda: os.path.exists(marker), what="the model to see is_cancelled()")
    finally:
        client.close()


def test_a_hundred_concurrent_streams_on_one_instance_each_get_their_responses_in_order(srv):
    streams, n = 100, 100
    clients = []
    try:
        for _ in range(streams):
            c = grpcclient.InferenceServerClient(srv.grpc_url)
            q = queue.Queue()
            c.start_stream(callback=lambda result, error, q=q: q.put((result, error)))
            clients.append((c, q))
        for k, (c, _) in enumerate(clients):
            c.async_stream_infer("firehose", inputs(0, n), request_id=f"s{k}", enable_empty_final_response=True)
        for k, (_, q) in enumerate(clients):
            got = []
            while True:
                result, error = q.get(timeout=TIMEOUT)
                assert error is None, error
                r = result.get_response()
                assert r.id == f"s{k}"
                if r.parameters["triton_final_response"].bool_param:
                    break
                got.append(int(result.as_numpy("IDX")[0]))
            assert got == list(range(n)), k
    finally:
        for c, _ in clients:
            c.stop_stream()
            c.close()
