"""The built-in backends' batch path from the wire messages (`FrameworkModel.execute_wire`),
against the pb_utils path (`execute`) it stands in for: the same answers, each request's rows and
only the outputs it asked for, per-request errors for outputs that contradict the config, and
no answer at all (so that `execute` serves the batch) for every batch it does not handle."""

import numpy as np
import pytest
from test_stub_runtime import FakeChannel, Wire, make_stub
from tritium import _runtime
from tritium.backends import FrameworkModel
from tritium.dtypes import serialize_byte_tensor
from tritium.tensor import requests_from_wire


class Input:
    """What a native `InputMsg` carries."""

    def __init__(self, name, array, dtype="FP32"):
        self.name = name
        self.dtype = dtype
        self.shape = tuple(array.shape)
        self.array = array


class Doubler(FrameworkModel):
    """Y = 2X and Z = X + 1 (FP32); `bad` makes the run fail, `wrong` makes Z FP64."""

    def __init__(self, max_batch_size=16, bad=False, wrong=False):
        self.model_name = "m"
        self.instance_name = "m_0"
        self.max_batch_size = max_batch_size
        self.outputs = ["Y", "Z"]
        self.output_dtypes = {"Y": np.dtype(np.float32), "Z": np.dtype(np.float32)}
        self.joined_views = self.joined_copies = 0
        self.runs = []
        self.bad, self.wrong = bad, wrong

    def _run(self, feed):
        x = feed["X"]
        self.runs.append(x.shape[0])
        if self.bad:
            raise RuntimeError("the runtime refused the batch")
        z = x + 1
        return {"Y": x * 2, "Z": z.astype(np.float64) if self.wrong else z}


def wire(id, rows, requested=(), value=None):
    msg = Wire(id)
    x = np.full((rows, 3), id if value is None else value, dtype=np.float32)
    msg.inputs = [Input("X", x)]
    msg.requested_outputs = list(requested)
    return msg


def by_request(answers):
    return {request: (dict((o[0], o) for o in outputs), error) for request, outputs, error in answers.one_by_one()}


def test_each_request_gets_its_rows_of_the_outputs_it_asked_for():
    model = Doubler()
    batch = [wire(1, 2), wire(2, 1, ["Z"]), wire(3, 3, ["Y"])]
    got = by_request(model.execute_wire(batch))
    assert model.runs == [6], "one run over the joined batch"
    for msg in batch:
        outputs, error = got[msg.id]
        x = msg.inputs[0].array
        assert error is None
        assert set(outputs) == (set(msg.requested_outputs) or {"Y", "Z"})
        for name, expected in (("Y", x * 2), ("Z", x + 1)):
            if name in outputs:
                _, dtype, shape, data = outputs[name]
                assert dtype == "FP32" and shape == [x.shape[0], 3]
                np.testing.assert_array_equal(data, expected)


def test_the_answers_are_those_execute_gives():
    model = Doubler()
    batch = [wire(1, 2), wire(2, 1, ["Z"]), wire(3, 1)]
    fast = by_request(model.execute_wire(batch))
    requests, _ = requests_from_wire(batch, "m", 1, False)
    for request, response in zip(requests, model.execute(requests)):
        assert not response.has_error()
        outputs, _ = fast[request._state.id]  # noqa: SLF001
        wanted = request.requested_output_names() or {"Y", "Z"}
        sent = {t.name(): t.as_numpy() for t in response.output_tensors() if t.name() in wanted}
        assert set(sent) == set(outputs)
        for name, array in sent.items():
            np.testing.assert_array_equal(outputs[name][3], array)


def test_an_output_that_contradicts_the_config_fails_the_requests_that_want_it():
    model = Doubler(wrong=True)
    got = by_request(model.execute_wire([wire(1, 1), wire(2, 1, ["Y"]), wire(3, 1, ["Z"])]))
    assert got[1][1] and "output 'Z' is float64, but the model configuration says TYPE_FP32" in got[1][1]
    assert got[2][1] is None and set(got[2][0]) == {"Y"}
    assert got[3][1] and "output 'Z'" in got[3][1]


@pytest.mark.parametrize(
    "case",
    ["bytes input", "other trailing dims", "other input name", "unbatched model", "no inputs"],
)
def test_batches_it_does_not_handle_are_left_to_execute_untouched(case):
    model = Doubler(max_batch_size=0 if case == "unbatched model" else 16)
    batch = [wire(1, 1), wire(2, 1)]
    if case == "bytes input":
        batch[1].inputs[0].dtype = "BYTES"
        batch = batch[1:] + batch[:1]
    elif case == "other trailing dims":
        batch[1].inputs = [Input("X", np.zeros((1, 4), dtype=np.float32))]
    elif case == "other input name":
        batch[1].inputs[0].name = "W"
    elif case == "no inputs":
        batch[0].inputs = []
    assert model.execute_wire(batch) is None
    assert len(batch) == 2 and all(msg.inputs for msg in batch[1:]), "the messages are left as they came"


def test_the_stub_sends_the_answers_and_ends_the_batch_or_hands_it_to_execute(monkeypatch):
    channel = FakeChannel()
    monkeypatch.setattr(_runtime, "channel", channel)
    monkeypatch.setattr(_runtime, "cancelled", set())
    model = Doubler()
    s = make_stub(channel, model, False, monkeypatch)
    s.execute_wire = model.execute_wire
    batch = [wire(1, 1), wire(2, 2)]
    s.execute(7, batch)
    assert channel.responses == [(1, None, True), (2, None, True)] and channel.done == [(7, None)]
    assert batch == [], "the input blocks are let go before the batch ends"
    assert model.runs == [3]
    # A BYTES input: `execute` serves the batch.
    bytes_batch = [wire(5, 1)]
    raw = np.frombuffer(bytes(serialize_byte_tensor(np.array([b"text"], dtype=np.object_))), dtype=np.uint8)
    bytes_batch[0].inputs = [Input("X", raw, "BYTES")]
    bytes_batch[0].inputs[0].shape = (1, 1)
    monkeypatch.setattr(model, "execute", lambda requests: [None for _ in requests])
    s.execute(9, bytes_batch)
    assert channel.done[-1] == (9, None) and model.runs == [3]


class Picky(Doubler):
    """Refuses any run that holds a row of value 99 (as a runtime rejects an index out of range)."""

    def _run(self, feed):
        self.runs.append(feed["X"].shape[0])
        if (feed["X"] == 99).any():
            raise IndexError("index 99 is out of data bounds")
        return {"Y": feed["X"] * 2, "Z": feed["X"] + 1}


def test_a_request_the_runtime_rejects_in_a_joined_batch_fails_alone():
    model = Picky()
    got = by_request(model.execute_wire([wire(1, 1), wire(2, 2, value=99), wire(3, 1)]))
    assert model.runs == [4, 1, 2, 1], "the joined run, then each request alone"
    assert got[2] == ({}, "index 99 is out of data bounds")
    for request in (1, 3):
        np.testing.assert_array_equal(got[request][0]["Y"][3], np.full((1, 3), 2 * request, dtype=np.float32))


def test_numeric_outputs_go_out_in_one_call_and_the_rest_request_by_request():
    model = Doubler()
    answers = model.execute_wire([wire(1, 2), wire(2, 1, ["Z"]), wire(3, 3)])
    assert answers.requests == [(1, []), (2, ["Z"]), (3, [])] and answers.rows == [2, 1, 3]
    assert [name for name, _, _ in answers.outputs] == ["Y", "Z"] and answers.each == []
    # An output that contradicts the config: every answer is made here, the refusals included.
    answers = Doubler(wrong=True).execute_wire([wire(1, 2), wire(2, 1, ["Y"])])
    assert answers.requests == [] and [request for request, _, _ in answers.each] == [1, 2]
    # A lone request gets every row.
    answers = Doubler().execute_wire([wire(4, 5)])
    assert answers.requests == [(4, [])] and answers.rows is None
