"""Triton's sequence batcher end to end, with tritonclient over HTTP and gRPC (`sequence_id`,
`sequence_start`, `sequence_end`): sequences accumulate on the instance that holds them, the
model sees the control inputs, idle sequences are released, the oldest strategy batches
sequences together, and Triton's errors for requests that break the rules."""

import json
import os
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT, Server
from tritonclient.utils import InferenceServerException

MODEL_DIR = os.path.join(ROOT, "tests", "models", "sequence_accumulator")

OUTPUTS = """
output [
  { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CONTROLS" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "CORRID_SEEN" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ID_SEEN" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INSTANCE" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


def controls(corrid_type):
    return f"""
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]"""


def config(name, batching, max_batch_size=4, count=1):
    return f"""
name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
{OUTPUTS}
sequence_batching {{ {batching} }}
instance_group [ {{ kind: KIND_CPU, count: {count} }} ]
"""


# The variants the tests need, each a copy of the test model with its own config.
VARIANTS = {
    "seq_string": config("seq_string", controls("TYPE_STRING")),
    "seq_idle": config("seq_idle", "max_sequence_idle_microseconds: 200000" + controls("TYPE_UINT64")),
    "seq_oldest": config(
        "seq_oldest",
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }"
        + controls("TYPE_UINT64"),
    ),
    "seq_backlog": config(
        "seq_backlog", "max_sequence_idle_microseconds: 10000000" + controls("TYPE_UINT64"), max_batch_size=1
    ),
    "seq_state": config(
        "seq_state",
        'state [ { input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] } ]',
    ),
}
LOADED = ["sequence_accumulator", "seq_string", "seq_idle", "seq_oldest", "seq_backlog", "seq_decoupled"]

# A decoupled sequence model: the running sum, sent through the request's response sender.
DECOUPLED_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


def flag(request, name):
    return bool(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            total = 0
            if flag(request, "READY"):
                key = request.correlation_id()
                value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
                total = (0 if flag(request, "START") else self.sums.get(key, 0)) + value
                self.sums[key] = total
            out = pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32))
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

DECOUPLED_CONFIG = """
name: "seq_decoupled"
backend: "python"
max_batch_size: 2
model_transaction_policy { decoupled: true }
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
}
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sequence")
    repo = tmp / "repo"
    shutil.copytree(MODEL_DIR, str(repo / "sequence_accumulator"))
    for name, text in VARIANTS.items():
        os.makedirs(str(repo / name / "1"))
        shutil.copy(os.path.join(MODEL_DIR, "1", "model.py"), str(repo / name / "1" / "model.py"))
        (repo / name / "config.pbtxt").write_text(text)
    os.makedirs(str(repo / "seq_decoupled" / "1"))
    (repo / "seq_decoupled" / "1" / "model.py").write_text(DECOUPLED_MODEL)
    (repo / "seq_decoupled" / "config.pbtxt").write_text(DECOUPLED_CONFIG)
    srv = Server(str(repo), str(tmp / "tritium.log"))
    try:
        srv.wait_models(LOADED)
        yield srv
    finally:
        assert srv.stop() == 0, srv.log_text()


def client_for(server, protocol):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url, connection_timeout=60, network_timeout=60)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def infer(module, client, model, value, **sequence):
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    r = client.infer(model, [inp], **sequence)
    text = lambda name: r.as_numpy(name).reshape(-1)[0].decode()  # noqa: E731
    return {
        "sum": int(r.as_numpy("OUTPUT").reshape(-1)[0]),
        "batch": int(r.as_numpy("BATCH").reshape(-1)[0]),
        "controls": [float(v) for v in r.as_numpy("CONTROLS").reshape(-1)],
        "corrid": text("CORRID_SEEN"),
        "id": text("ID_SEEN"),
        "instance": text("INSTANCE"),
    }


def statistics(server, model):
    with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/stats", timeout=10) as r:
        return json.load(r)["model_stats"][0]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_accumulate_on_the_instance_that_holds_them(seq_server, protocol):
    base = 1000 if protocol == "http" else 2000
    ids = [base + k for k in range(8)]
    before = statistics(seq_server, "sequence_accumulator")["inference_stats"]["success"]["count"]
    results = {cid: [] for cid in ids}
    errors = []
    barrier = threading.Barrier(len(ids))

    def run(cid):
        # One client per thread, each sequence in order; the threads interleave their requests.
        module, client = client_for(seq_server, protocol)
        try:
            barrier.wait()
            for step in range(5):
                value = (cid % 100) * 10 + step
                flags = {"sequence_start": step == 0, "sequence_end": step == 4}
                results[cid].append(infer(module, client, "sequence_accumulator", value, sequence_id=cid, **flags))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(cid,)) for cid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    instances = set()
    for cid in ids:
        seen = results[cid]
        values = [(cid % 100) * 10 + step for step in range(5)]
        assert [r["sum"] for r in seen] == list(np.cumsum(values)), (cid, seen)
        assert {r["instance"] for r in seen} == {seen[0]["instance"]}, f"sequence {cid} moved: {seen}"
        assert all(r["corrid"] == str(cid) and r["id"] == str(cid) for r in seen), seen
        instances.add(seen[0]["instance"])
    assert instances == {"sequence_accumulator_0_0", "sequence_accumulator_0_1"}, instances
    # Every request counts once in the statistics; the null requests of direct batches do not.
    after = statistics(seq_server, "sequence_accumulator")["inference_stats"]["success"]["count"]
    assert after - before == 40


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_control_inputs_as_the_model_sees_them(seq_server, protocol):
    module, client = client_for(seq_server, protocol)
    cid = 31 if protocol == "http" else 32
    first = infer(module, client, "sequence_accumulator", 5, sequence_id=cid, sequence_start=True)
    middle = infer(module, client, "sequence_accumulator", 6, sequence_id=cid)
    last = infer(module, client, "sequence_accumulator", 7, sequence_id=cid, sequence_end=True)
    assert [first["controls"], middle["controls"], last["controls"]] == [[1, 0, 1], [0, 0, 1], [0, 1, 1]]
    assert [first["sum"], middle["sum"], last["sum"]] == [5, 11, 18]
    assert {first["corrid"], middle["corrid"], last["corrid"]} == {str(cid)}
    # A sequence of one request is START and END at once.
    only = infer(module, client, "sequence_accumulator", 9, sequence_id=cid, sequence_start=True, sequence_end=True)
    assert (only["controls"], only["sum"]) == ([1, 1, 1], 9)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_string_correlation_ids(seq_server, protocol):
    module, client = client_for(seq_server, protocol)
    cid = f"session-{protocol}"
    sums = []
    for step in range(3):
        flags = {"sequence_start": step == 0, "sequence_end": step == 2}
        r = infer(module, client, "seq_string", step + 1, sequence_id=cid, **flags)
        assert (r["corrid"], r["id"]) == (cid, cid), r
        sums.append(r["sum"])
    assert sums == [1, 3, 6]
    # An integer id for a model whose CORRID control is a string: Triton's text.
    with pytest.raises(InferenceServerException) as e:
        infer(module, client, "seq_string", 1, sequence_id=5, sequence_start=True)
    assert "sequence batching control 'CORRID' data-type is 'UINT64', but model 'seq_string' expects 'BYTES'" in str(
        e.value
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_that_break_the_sequence_rules_get_tritons_errors(seq_server, protocol):
    module, client = client_for(seq_server, protocol)
    with pytest.raises(InferenceServerException) as e:
        infer(module, client, "sequence_accumulator", 1)
    assert (
        "inference request to model 'sequence_accumulator' must specify a non-zero or non-empty correlation ID"
        in str(e.value)
    )
    with pytest.raises(InferenceServerException) as e:
        infer(module, client, "sequence_accumulator", 1, sequence_id=4242)
    assert (
        "inference request for sequence 4242 to model 'sequence_accumulator' must specify the START flag on the "
        "first request of the sequence" in str(e.value)
    )
    with pytest.raises(InferenceServerException) as e:
        infer(module, client, "sequence_accumulator", 1, sequence_id=4243, sequence_end=True)
    assert "must specify the START flag" in str(e.value)


def test_an_idle_sequence_is_released(seq_server):
    module, client = client_for(seq_server, "grpc")
    assert infer(module, client, "seq_idle", 4, sequence_id=77, sequence_start=True)["sum"] == 4
    assert infer(module, client, "seq_idle", 4, sequence_id=77)["sum"] == 8
    time.sleep(1.0)
    with pytest.raises(InferenceServerException) as e:
        infer(module, client, "seq_idle", 4, sequence_id=77)
    assert "inference request for sequence 77 to model 'seq_idle' must specify the START flag" in str(e.value)
    assert "sequence 77 of model 'seq_idle' was idle for longer than max_sequence_idle_microseconds" in (
        seq_server.log_text()
    )
    # A new sequence runs.
    assert infer(module, client, "seq_idle", 3, sequence_id=78, sequence_start=True, sequence_end=True)["sum"] == 3


def test_a_sequence_waits_for_a_slot_while_another_holds_it(seq_server):
    # seq_backlog has one instance with one slot: a second sequence waits (in Triton's backlog)
    # until the first ends, then runs on the freed slot.
    module, client = client_for(seq_server, "http")
    assert infer(module, client, "seq_backlog", 1, sequence_id=501, sequence_start=True)["sum"] == 1
    done = []

    def second():
        _, c = client_for(seq_server, "http")
        done.append(infer(module, c, "seq_backlog", 10, sequence_id=502, sequence_start=True, sequence_end=True))

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.5)
    assert not done, "the second sequence ran while the only slot was held"
    assert infer(module, client, "seq_backlog", 2, sequence_id=501, sequence_end=True)["sum"] == 3
    t.join(30)
    assert done and done[0]["sum"] == 10


def test_the_oldest_strategy_batches_requests_of_different_sequences(seq_server):
    results = []
    errors = []

    def run(cid):
        module, client = client_for(seq_server, "grpc")
        try:
            first = infer(module, client, "seq_oldest", cid, sequence_id=cid, sequence_start=True)
            second = infer(module, client, "seq_oldest", 1, sequence_id=cid, sequence_end=True)
            results.append((cid, first, second))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(cid,)) for cid in range(61, 65)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert len(results) == 4
    for cid, first, second in results:
        # The four STARTs reach one execute (preferred size 4); each sequence keeps its own sum.
        assert first["batch"] == 4, first
        assert (first["sum"], second["sum"]) == (cid, cid + 1)


def test_implicit_state_is_refused_at_load(seq_server):
    req = urllib.request.Request(f"http://{seq_server.http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        index = {m["name"]: m for m in json.load(r)}
    assert index["seq_state"]["state"] == "UNAVAILABLE", index["seq_state"]
    assert "sequence_batching.state" in index["seq_state"]["reason"], index["seq_state"]
    assert "not supported" in index["seq_state"]["reason"], index["seq_state"]


def test_a_decoupled_sequence_model_streams_each_sequences_sum(seq_server):
    # Two sequences on one instance with two slots (batch indexes 0 and 1), over one gRPC stream:
    # a batch with a request in slot 1 alone carries a null request in slot 0, whose response
    # must reach neither the stream nor the statistics.
    answers = {}
    done = threading.Event()

    def callback(result, error):
        if error is not None:
            answers[f"error-{len(answers)}"] = str(error)
        else:
            answers[result.get_response().id] = int(result.as_numpy("OUTPUT").reshape(-1)[0])
        if len(answers) == 6:
            done.set()

    client = grpcclient.InferenceServerClient(seq_server.grpc_url)
    client.start_stream(callback=callback)
    try:
        for step in range(3):
            for cid, base in ((71, 1), (72, 100)):
                inp = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                inp.set_data_from_numpy(np.array([[base * (step + 1)]], dtype=np.int32))
                client.async_stream_infer(
                    "seq_decoupled",
                    [inp],
                    request_id=f"{cid}-{step}",
                    sequence_id=cid,
                    sequence_start=step == 0,
                    sequence_end=step == 2,
                )
        assert done.wait(30), answers
    finally:
        client.stop_stream()
    assert answers == {"71-0": 1, "71-1": 3, "71-2": 6, "72-0": 100, "72-1": 300, "72-2": 600}
    stats = statistics(seq_server, "seq_decoupled")["inference_stats"]
    assert stats["success"]["count"] == 6, stats
