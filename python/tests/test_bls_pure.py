"""Tests for the pure-Python parts of BLS: the stage check, the response iterator, the cancellation set."""

import numpy as np
import pytest
from tritium import _runtime, bls, pb_utils
from tritium.errors import ErrorCode, TritonModelException


class FakeCall:
    """Stands in for a call in flight: hands out prepared (response, final) pairs."""

    def __init__(self, responses):
        self.responses = list(responses)
        self.cancelled = 0
        self.channel = self
        self.call = 1

    def next(self):
        return self.responses.pop(0)

    def bls_cancel(self, call):
        self.cancelled += 1


def response(i):
    return pb_utils.InferenceResponse([pb_utils.Tensor("IDX", np.array([i], dtype=np.int32))])


def test_exec_outside_execute_raises_tritons_error():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(TritonModelException, match=r"^BLS is only supported during the 'execute' function\.$"):
        request.exec()
    with pytest.raises(TritonModelException, match="BLS is only supported"):
        request.exec(decoupled=True)


def test_the_constructor_takes_tritons_keywords():
    request = pb_utils.InferenceRequest(
        request_id="r",
        correlation_id=7,
        inputs=[],
        requested_output_names=["A"],
        model_name="m",
        model_version=2,
        flags=1,
        timeout=5,
        preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        trace=None,
        parameters={"k": 1},
    )
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("r", 7, 1, 5)
    assert request.model_name() == "m" and request.parameters() == '{"k":1}'


def test_the_iterator_yields_every_response_then_starts_over_once_finished():
    final = pb_utils.InferenceResponse()
    call = FakeCall([(response(0), False), (response(1), False), (final, True)])
    it = bls.ResponseIterator(call)
    got = list(it)
    # The final flag alone is a last response without outputs, as in Triton.
    assert [len(r.output_tensors()) for r in got] == [1, 1, 0]
    assert list(it) == got
    it.cancel()
    assert call.cancelled == 0, "a finished iterator has nothing to cancel"


def test_cancel_asks_the_server_while_responses_are_due():
    call = FakeCall([(response(0), False), (response(1), True)])
    it = bls.ResponseIterator(call)
    next(it)
    it.cancel()
    assert call.cancelled == 1
    assert len(list(it)) == 1


def test_error_responses_keep_their_code():
    class Msg:
        error = ("gone", int(ErrorCode.NOT_FOUND))
        outputs = []
        parameters = {"x": 1.5}
        final_response = True

    r = bls._response(Msg())
    assert r.has_error() and r.error().message() == "gone" and r.error().code() == ErrorCode.NOT_FOUND
    assert r.parameters() == '{"x":1.5}'


def test_model_control_outside_a_stub_raises():
    with pytest.raises(TritonModelException, match="only available inside a model"):
        pb_utils.is_model_ready("m")


def test_cancellations_outside_a_stub_are_a_plain_set():
    assert 5 not in _runtime.cancelled
    _runtime.cancelled.add(5)
    assert 5 in _runtime.cancelled
    _runtime.cancelled.difference_update([5])
    assert 5 not in _runtime.cancelled
