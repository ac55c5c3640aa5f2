"""tritonclient over HTTP and gRPC against a real tritium: every dtype, strings, batching,
instance groups, auto-completed configs and large tensors."""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import write_model
from tritonclient.utils import InferenceServerException

DTYPES = [
    ("BOOL", np.bool_),
    ("UINT8", np.uint8),
    ("UINT16", np.uint16),
    ("UINT32", np.uint32),
    ("UINT64", np.uint64),
    ("INT8", np.int8),
    ("INT16", np.int16),
    ("INT32", np.int32),
    ("INT64", np.int64),
    ("FP16", np.float16),
    ("FP32", np.float32),
    ("FP64", np.float64),
]


def sample(np_type, n=7):
    if np_type == np.bool_:
        return np.arange(n) % 3 == 0
    info = np.iinfo(np_type) if np.issubdtype(np_type, np.integer) else np.finfo(np_type)
    values = np.linspace(float(info.min) / 2, float(info.max) / 2, n)
    return values.astype(np_type)


@pytest.mark.parametrize("wire,np_type", DTYPES)
def test_every_dtype_round_trips(client, wire, np_type):
    tc, c = client
    data = sample(np_type)
    inp = tc.InferInput("IN_" + ("STRING" if wire == "BYTES" else wire), list(data.shape), wire)
    inp.set_data_from_numpy(data)
    result = c.infer("echo", [inp], outputs=[tc.InferRequestedOutput("OUT_" + wire)])
    out = result.as_numpy("OUT_" + wire)
    assert out.dtype == data.dtype and np.array_equal(out, data)


@pytest.mark.parametrize("binary", [True, False])
def test_http_json_and_binary_tensors(server, binary):
    import tritonclient.http as tc

    c = tc.InferenceServerClient(server.http_url)
    for wire, np_type in DTYPES:
        if wire == "FP16" and not binary:
            continue  # FP16 has no JSON form in KServe v2.
        data = sample(np_type, 5)
        inp = tc.InferInput("IN_" + wire, [5], wire)
        inp.set_data_from_numpy(data, binary_data=binary)
        result = c.infer("echo", [inp], outputs=[tc.InferRequestedOutput("OUT_" + wire, binary_data=binary)])
        assert np.array_equal(result.as_numpy("OUT_" + wire), data), wire


def test_strings_keep_empty_and_non_ascii_elements(client):
    tc, c = client
    data = np.array(["", "hello", "grüße, 世界", "x" * 1000], dtype=np.object_)
    data = np.array([s.encode("utf-8") for s in data], dtype=np.object_)
    inp = tc.InferInput("IN_STRING", [4], "BYTES")
    inp.set_data_from_numpy(data)
    out = c.infer("echo", [inp], outputs=[tc.InferRequestedOutput("OUT_STRING")]).as_numpy("OUT_STRING")
    assert list(out) == list(data)


def test_add_sub(client):
    tc, c = client
    a, b = np.arange(4, dtype=np.float32), np.full(4, 0.5, dtype=np.float32)
    inputs = [tc.InferInput("INPUT0", [4], "FP32"), tc.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = c.infer("add_sub", inputs, request_id="my-id")
    assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert (response["id"] if isinstance(response, dict) else response.id) == "my-id"


def test_dynamic_batching_hands_concurrent_requests_to_one_execute(server, protocol):
    if protocol == "http":
        import tritonclient.http as tc

        url = server.http_url
    else:
        import tritonclient.grpc as tc

        url = server.grpc_url

    def infer(i):
        c = tc.InferenceServerClient(url)
        inp = tc.InferInput("X", [1, 2], "FP32")
        inp.set_data_from_numpy(np.full((1, 2), i, dtype=np.float32))
        r = c.infer("slow_batch", [inp])
        assert np.array_equal(r.as_numpy("Y"), np.full((1, 2), i + 1, dtype=np.float32))
        return int(r.as_numpy("N")[0, 0])

    with ThreadPoolExecutor(4) as pool:
        sizes = list(pool.map(infer, range(4)))
    assert max(sizes) >= 2, sizes


def test_instance_groups_run_separate_stubs(server):
    import tritonclient.grpc as tc

    def infer(_):
        c = tc.InferenceServerClient(server.grpc_url)
        inp = tc.InferInput("DELAY_MS", [1], "INT32")
        inp.set_data_from_numpy(np.array([300], dtype=np.int32))
        r = c.infer("whoami", [inp])
        return int(r.as_numpy("PID")[0]), r.as_numpy("INSTANCE")[0].decode()

    with ThreadPoolExecutor(3) as pool:
        seen = list(pool.map(infer, range(3)))
    pids = {p for p, _ in seen}
    names = {n for _, n in seen}
    assert len(pids) == 3, seen
    assert names == {"whoami_0_0", "whoami_0_1", "extra_0"}, names


def tc_json(message):
    from google.protobuf import json_format

    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def config_of(c, model):
    """The model config as a dict, from either client (HTTP returns it bare, gRPC wrapped)."""
    config = c.get_model_config(model)
    return config if isinstance(config, dict) else tc_json(config)["config"]


def test_config_from_auto_complete(client):
    tc, c = client
    inp = tc.InferInput("X", [3], "INT32")
    inp.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
    assert c.infer("no_config", [inp]).as_numpy("SUM")[0] == 6
    config = config_of(c, "no_config")
    assert [i["name"] for i in config["input"]] == ["X"]
    assert config["backend"] == "python"


def test_metadata_and_config(client, protocol):
    tc, c = client
    meta = c.get_model_metadata("add_sub")
    meta = meta if isinstance(meta, dict) else tc_json(meta)
    assert meta["name"] == "add_sub" and meta["versions"] == ["1"] and meta["platform"] == "python"
    assert [i["name"] for i in meta["inputs"]] == ["INPUT0", "INPUT1"]
    assert [int(d) for d in meta["inputs"][0]["shape"]] == [4] and meta["inputs"][0]["datatype"] == "FP32"
    config = config_of(c, "batched_scale")
    assert int(config["max_batch_size"]) == 8
    assert [int(p) for p in config["dynamic_batching"]["preferred_batch_size"]] == [4, 8]
    assert c.is_server_live() and c.is_model_ready("add_sub")
    assert not c.is_model_ready("broken_init")


def test_a_version_policy_serves_the_versions_it_names_and_metadata_says_which(start):
    """Triton's answers, checked side by side with 2.51: metadata lists every loaded version, or
    only the one in the path; a version the policy leaves out is unknown."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    model = """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.version = args["model_version"]

            def execute(self, requests):
                return [pb_utils.InferenceResponse([pb_utils.Tensor("V", np.array([self.version], dtype=np.object_))])
                        for _ in requests]
        """
    write_model(
        start.repo,
        "vers",
        """
        name: "vers"
        backend: "python"
        version_policy: { specific { versions: [ 1, 3 ] } }
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "V" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        model,
    )
    for v in ("2", "3"):
        shutil.copytree(os.path.join(start.repo, "vers", "1"), os.path.join(start.repo, "vers", v))
    srv = start(["vers"])
    for tc, c in (
        (httpclient, httpclient.InferenceServerClient(srv.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)),
    ):

        def versions(c=c, **kw):
            meta = c.get_model_metadata("vers", **kw)
            return list(meta["versions"] if isinstance(meta, dict) else meta.versions)

        assert versions() == ["1", "3"]
        assert versions(model_version="1") == ["1"] and versions(model_version="3") == ["3"]
        with pytest.raises(InferenceServerException, match="'vers' version 2 is not found"):
            versions(model_version="2")
        x = tc.InferInput("X", [1], "INT32")
        x.set_data_from_numpy(np.array([1], np.int32))
        assert c.infer("vers", [x]).as_numpy("V")[0] == b"3"
        assert c.infer("vers", [x], model_version="1").as_numpy("V")[0] == b"1"
        with pytest.raises(InferenceServerException, match="'vers' version 2 is not found"):
            c.infer("vers", [x], model_version="2")
        assert c.is_model_ready("vers", "1") and not c.is_model_ready("vers", "2")


def test_classification_ranks_each_batch_entry_with_labels(client):
    tc, c = client
    inp = tc.InferInput("INPUT", [2, 4], "FP32")
    inp.set_data_from_numpy(np.array([[1, 3, 2, 0], [float("nan"), -1, 5, 4]], dtype=np.float32))
    out = tc.InferRequestedOutput("OUTPUT", class_count=2)
    result = c.infer("batched_scale", [inp], outputs=[out])
    classes = result.as_numpy("OUTPUT")
    # value:index[:label], labels from the model's labels.txt (index 3 has none); NaN ranks last.
    assert classes.shape == (2, 2)
    assert classes.tolist() == [[b"6.000000:1:one", b"4.000000:2:two"], [b"10.000000:2:two", b"8.000000:3"]]
    # Triton ranks integers, FP32 and FP64 only; the refusal is INVALID_ARGUMENT on both protocols.
    half = tc.InferInput("IN_FP16", [2], "FP16")
    half.set_data_from_numpy(np.array([1, 2], dtype=np.float16))
    with pytest.raises(InferenceServerException, match="unsupported type 'FP16'") as refused:
        c.infer("echo", [half], outputs=[tc.InferRequestedOutput("OUT_FP16", class_count=1)])
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("mib", [300])
def test_large_tensors(client, protocol, mib):
    tc, c = client
    n = mib * (1 << 20)
    data = np.frombuffer(np.random.default_rng(1).bytes(n), dtype=np.uint8)
    inp = tc.InferInput("IN_UINT8", [n], "UINT8")
    inp.set_data_from_numpy(data)
    out = c.infer("echo", [inp], outputs=[tc.InferRequestedOutput("OUT_UINT8")]).as_numpy("OUT_UINT8")
    assert out.shape == (n,) and np.array_equal(out, data)
