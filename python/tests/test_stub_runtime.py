"""Tests for the stub's runtime pieces that need no server: the event loop of `async def` methods,
a decoupled model's background coroutines, Python-based backend imports, and the request API
additions (trace, release flags, get_model_dir), over a fake channel that records what would go
to the server."""

import asyncio
import gc
import sys
import threading

import pytest
from tritium import _runtime, pb_utils, stub
from tritium.tensor import InferenceRequest


class FakeChannel:
    """Records what the stub sends."""

    def __init__(self):
        self.lock = threading.Lock()
        self.responses = []
        self.done = []
        self.logs = []
        self.finalized = []
        self.event = threading.Event()

    def send_response(self, request, outputs, error=None, parameters=(), final_response=True, wake=True):
        with self.lock:
            self.responses.append((request, error, final_response))
        self.event.set()

    def send_rows(self, requests, outputs, rows=None):
        with self.lock:
            self.responses += [(request, None, True) for request, _ in requests]
        self.event.set()

    def send_final_flag(self, request):
        with self.lock:
            self.responses.append((request, None, True))
        self.event.set()

    def wait_for_room(self, request, sent):
        pass

    def send_execute_done(self, batch, error=None):
        self.done.append((batch, error))

    def send_log(self, level, file, line, message, logger=""):
        with self.lock:
            self.logs.append((int(level), message))

    def send_finalize_done(self, error=None):
        self.finalized.append(error)


class Wire:
    """What a native `RequestMsg` carries."""

    def __init__(self, id):
        self.id = id
        self.request_id = f"r{id}"
        self.correlation_id = 0
        self.flags = 0
        self.timeout_us = 0
        self.parameters = {}
        self.inputs = []
        self.requested_outputs = []
        self.trace = ""


@pytest.fixture
def channel(monkeypatch):
    fake = FakeChannel()
    monkeypatch.setattr(_runtime, "channel", fake)
    monkeypatch.setattr(_runtime, "cancelled", set())
    yield fake
    gc.collect()


def make_stub(channel, model, decoupled, monkeypatch):
    monkeypatch.setattr(_runtime, "decoupled", decoupled)
    s = stub.Stub(channel)
    s.model = model
    s.instance_name = "m_0_0"
    return s


def test_a_decoupled_coroutine_runs_in_the_background_and_execute_done_goes_at_once(channel, monkeypatch):
    release = threading.Event()

    class Model:
        async def execute(self, requests):
            sender = requests[0].get_response_sender()
            while not release.is_set():
                await asyncio.sleep(0.001)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    s = make_stub(channel, Model(), True, monkeypatch)
    s.execute(1, [Wire(10)])
    # The batch is done while its coroutine still waits.
    assert channel.done == [(1, None)] and channel.responses == []
    release.set()
    assert channel.event.wait(30)
    assert channel.responses == [(10, None, True)]
    s.finalize()


def test_an_exception_in_a_background_coroutine_ends_its_open_requests(channel, monkeypatch):
    class Model:
        async def execute(self, requests):
            requests[0].get_response_sender().send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            raise KeyError("late")

    s = make_stub(channel, Model(), True, monkeypatch)
    s.execute(2, [Wire(20), Wire(21)])
    for _ in range(3000):
        with channel.lock:
            if len(channel.responses) == 2 and channel.logs:
                break
        threading.Event().wait(0.01)
    assert channel.done == [(2, None)]
    # Request 20 had its final already; 21 gets the error as its final.
    assert channel.responses[0] == (20, None, True)
    request, error, final = channel.responses[1]
    assert (request, final) == (21, True)
    assert error[0].startswith("Failed to process the request(s) for model 'm_0_0', message: KeyError: 'late'")
    assert any("Traceback (most recent call last)" in m and "KeyError: 'late'" in m for _, m in channel.logs)
    s.finalize()


def test_a_coupled_coroutine_is_awaited_before_the_batch_is_done(channel, monkeypatch):
    class Model:
        async def execute(self, requests):
            await asyncio.sleep(0)
            return [None for _ in requests]

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(3, [Wire(30)])
    assert channel.done == [(3, None)]
    s.finalize()


def test_a_coroutine_that_raises_is_rendered_with_the_models_frames_alone(channel, monkeypatch):
    # The stub waits for a coupled coroutine through a concurrent.futures Future, whose re-raise
    # once added its own frames to the "At:" lines; Triton's show the model's alone.
    class Model:
        async def execute(self, requests):
            await asyncio.sleep(0)
            raise ValueError("async boom")

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(4, [Wire(40)])
    ((batch, error),) = channel.done
    message = error[0]
    assert batch == 4 and "message: ValueError: async boom\n\nAt:\n" in message, message
    at = message.split("At:\n", 1)[1].splitlines()
    assert len(at) == 1 and at[0].endswith("): execute"), at
    s.finalize()


def test_a_finalize_exception_is_logged_in_tritons_rendering_and_finalize_succeeds(channel, monkeypatch):
    class Model:
        async def finalize(self):
            raise ValueError("bye")

    s = make_stub(channel, Model(), False, monkeypatch)
    s.finalize()
    assert channel.finalized == [None]
    (level, message), *_ = channel.logs
    assert level == int(pb_utils.Logger.INFO)
    assert message.startswith("ValueError: bye\n\nAt:\n") and "): finalize" in message


def test_a_rescheduled_request_ends_with_triton_cores_error(channel, monkeypatch):
    class Model:
        def execute(self, requests):
            requests[0].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [None]

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(4, [Wire(40)])
    ((request, error, final),) = channel.responses
    assert request == 40 and final
    assert error[0] == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
        "configured to handle such a flag."
    )


def test_a_rescheduled_request_with_a_response_is_refused_with_tritons_text(channel, monkeypatch):
    class Model:
        def execute(self, requests):
            requests[0].set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            return [pb_utils.InferenceResponse()]

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(5, [Wire(50)])
    ((batch, error),) = channel.done
    assert "Expected a None object in the execute function return list for reschduled request" in error[0]


def test_request_trace_release_flags_and_response_parameters():
    r = InferenceRequest(model_name="m")
    assert isinstance(r.trace(), pb_utils.InferenceTrace)
    assert r.trace().get_context() is None
    r.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL)
    with pytest.raises(TypeError):
        r.set_release_flags("2")
    assert pb_utils.InferenceResponse(parameters={"a": True}).parameters() == '{"a":true}'
    assert pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2


def test_a_python_based_backend_is_imported_as_model_from_its_directory(tmp_path, monkeypatch):
    backend = tmp_path / "backends" / "wordy"
    backend.mkdir(parents=True)
    (backend / "model.py").write_text("class TritonPythonModel:\n    NAME = __name__\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "model", raising=False)
    cls = stub._import_model(str(backend / "model.py"), python_based_backend=True)
    assert cls.NAME == "model"
    assert str(backend) in sys.path
    assert stub._backend_of('{"backend": "wordy"}') == "wordy"
    assert stub._backend_of("not json") == "python"


def test_get_model_dir_is_the_runtime_model_dir(monkeypatch):
    monkeypatch.setattr(_runtime, "model_dir", "/repo/m/1")
    assert pb_utils.get_model_dir() == "/repo/m/1"


def test_the_stub_gives_model_code_an_argv_of_one_empty_string(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["python -m tritium.stub", "--control-fd", "3"])

    def stop(*args):
        raise SystemExit(0)

    monkeypatch.setattr(stub._native, "Channel", stop)
    with pytest.raises(SystemExit):
        stub.main(["--control-fd", "3", "--socket-fd", "4"])
    assert sys.argv == [""]


def test_a_non_decoupled_batch_ends_once_its_senders_answered_after_execute(channel, monkeypatch):
    """Triton 24.06+: a model that is not decoupled may return None and answer each request from
    its own thread; the batch's ExecuteDone follows the last response, never precedes it."""

    class Model:
        def execute(self, requests):
            def later():
                for r in reversed(requests):
                    r.get_response_sender().send(
                        pb_utils.InferenceResponse(), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    )

            threading.Timer(0.05, later).start()
            return None

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(6, [Wire(60), Wire(61)])
    assert [r[0] for r in channel.responses] == [61, 60]
    assert channel.done == [(6, None)]


def test_a_non_decoupled_request_dropped_unanswered_ends_its_batch(channel, monkeypatch):
    class Model:
        def execute(self, requests):
            return None

    s = make_stub(channel, Model(), False, monkeypatch)
    s.execute(7, [Wire(70)])
    assert channel.responses == [] and channel.done == [(7, None)]
