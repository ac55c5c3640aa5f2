"""Tests for pb_utils.InferenceResponseSender's rules (Triton's `response_sender.cc` texts) over a
fake channel that records what would go to the server."""

import gc
import threading

import numpy as np
import pytest
from tritium import _runtime, pb_utils
from tritium.sender import InferenceResponseSender, ResponseState
from tritium.tensor import InferenceRequest, requests_from_wire

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class FakeChannel:
    """Records `send_response` calls as (request, output names, error, final), and
    `send_final_flag` calls (the flag without a response) as (request, None, None, True)."""

    def __init__(self):
        self.sent = []
        self.waits = []
        self.lock = threading.Lock()

    def send_response(self, request, outputs, error=None, parameters=(), final_response=True, wake=True):
        with self.lock:
            self.sent.append((request, [o[0] for o in outputs], error, final_response))

    def send_final_flag(self, request):
        with self.lock:
            self.sent.append((request, None, None, True))

    def wait_for_room(self, request, sent):
        self.waits.append((request, sent, len(self.sent)))


@pytest.fixture
def channel(monkeypatch):
    fake = FakeChannel()
    monkeypatch.setattr(_runtime, "channel", fake)
    monkeypatch.setattr(_runtime, "cancelled", set())
    yield fake
    # Senders a test left open (held by tracebacks) report to this test's channel, not the next.
    gc.collect()


def sender(decoupled=True, request_id=7, requested=()):
    return InferenceResponseSender(ResponseState(request_id, set(requested), decoupled))


def response(*names):
    return pb_utils.InferenceResponse([pb_utils.Tensor(n, np.zeros(1, np.float32)) for n in names])


def test_the_final_flag_constant_is_tritons():
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1


def test_decoupled_responses_then_a_flag_only_final(channel):
    s = sender()
    s.send(response("A"))
    s.send(response("A"))
    s.send(flags=FINAL)
    assert channel.sent == [(7, ["A"], None, False), (7, ["A"], None, False), (7, None, None, True)]


def test_an_empty_response_with_the_final_flag_is_a_response_not_the_flag_alone(channel):
    # Triton's gRPC stream writes an empty response always, the flag alone only when the client
    # asked for an empty final response.
    sender().send(pb_utils.InferenceResponse([]), flags=FINAL)
    assert channel.sent == [(7, [], None, True)]


def test_a_response_with_the_final_flag_is_final(channel):
    sender().send(response("A"), flags=FINAL)
    assert channel.sent == [(7, ["A"], None, True)]


def test_only_requested_outputs_are_sent(channel):
    sender(requested=["B"]).send(response("A", "B"), flags=FINAL)
    assert channel.sent == [(7, ["B"], None, True)]


def test_send_after_the_final_raises(channel):
    s = sender()
    s.send(flags=FINAL)
    with pytest.raises(
        pb_utils.TritonModelException, match="^Unable to send response. Response sender has been closed.$"
    ):
        s.send(response("A"))
    assert len(channel.sent) == 1


@pytest.mark.parametrize("flags", [2, 3, -1])
def test_unsupported_flags_raise(channel, flags):
    s = sender()
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. Unsupported flag provided.$"):
        s.send(response("A"), flags=flags)
    assert channel.sent == []
    s._state.close()


def test_a_missing_response_without_flags_raises(channel):
    s = sender()
    s._state.close()
    with pytest.raises(pb_utils.TritonModelException) as e:
        s.send()
    assert str(e.value) == "Inference Response object must be provided when the response flags is set to zero."


def test_a_non_decoupled_model_sends_at_most_one_response(channel):
    s = sender(decoupled=False)
    with pytest.raises(pb_utils.TritonModelException) as e:
        s.send(flags=FINAL)
    assert str(e.value) == (
        "Unable to send response. Non-decoupled model cannot send complete final before sending a response."
    )
    s.send(response("A"))
    with pytest.raises(pb_utils.TritonModelException) as e:
        s.send(response("A"))
    assert str(e.value) == "Unable to send response. Non-decoupled model cannot send more than one response."
    # Its one response is final on the wire; the final flag after it sends nothing more.
    s.send(flags=FINAL)
    assert channel.sent == [(7, ["A"], None, True)]


def test_a_dropped_decoupled_state_without_final_ends_the_request_with_an_error(channel):
    s = sender(request_id=9)
    s.send(response("A"))
    del s
    gc.collect()
    assert len(channel.sent) == 2
    request, outputs, error, final = channel.sent[1]
    assert (request, outputs, final) == (9, [], True)
    assert "released the request without sending its final response" in error[0]


def test_a_closed_or_non_decoupled_state_sends_nothing_when_dropped(channel):
    s = sender()
    s.send(flags=FINAL)
    del s
    closed = ResponseState(3, set(), True)
    closed.close()
    del closed
    unused = sender(decoupled=False)
    del unused
    gc.collect()
    assert channel.sent == [(7, None, None, True)]


def test_sends_from_many_threads_are_each_one_frame(channel):
    s = sender()
    threads = [threading.Thread(target=lambda: [s.send(response("A")) for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.send(flags=FINAL)
    assert len(channel.sent) == 201 and channel.sent[-1][3] is True


def test_is_cancelled_follows_the_server(channel):
    s = sender(request_id=5)
    assert not s.is_cancelled()
    _runtime.cancelled.add(5)
    assert s.is_cancelled()


def test_a_request_returns_the_same_sender_and_a_users_request_has_none():
    class Wire:
        id = 4
        request_id = "r"
        correlation_id = 0
        flags = 0
        timeout_us = 0
        parameters = {}
        inputs = []
        requested_outputs = []
        trace = ""

    [req], _ = requests_from_wire([Wire()], "m", 1, decoupled=True)
    assert req.get_response_sender() is req.get_response_sender()
    req._state.close()
    with pytest.raises(pb_utils.TritonModelException, match="no reference to the decoupled state"):
        InferenceRequest("m", []).get_response_sender()


def test_a_decoupled_send_waits_for_room_in_the_window_before_it_goes(channel):
    s = sender(decoupled=True, request_id=5)
    s.send(pb_utils.InferenceResponse([]))
    s.send(pb_utils.InferenceResponse([]))
    s.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    # Each wait names the request and how many responses it sent, and comes before the send.
    assert channel.waits == [(5, 0, 0), (5, 1, 1), (5, 2, 2)]
    with pytest.raises(pb_utils.TritonModelException, match="closed"):
        s.send(pb_utils.InferenceResponse([]))
    # A closed sender raises at once instead of waiting.
    assert len(channel.waits) == 3


def test_a_sender_of_a_model_that_is_not_decoupled_never_waits(channel):
    sender(decoupled=False).send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert channel.waits == []


def test_a_send_on_the_stubs_event_loop_thread_never_waits(channel, monkeypatch):
    monkeypatch.setattr(_runtime, "loop_thread", threading.current_thread())
    s = sender(decoupled=True)
    s.send(pb_utils.InferenceResponse([]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert channel.waits == [] and len(channel.sent) == 1
