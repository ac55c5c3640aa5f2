"""Client request limits with real clients: `--http-max-input-size` (Triton's flag and texts) and
`--grpc-max-message-size`, on a server started with small limits. Every over-limit request fails
alone and the server keeps serving."""

import gzip
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from conftest import Server

LIMIT = 1 << 20
FLAG = "Use --http-max-input-size to increase the limit."


@pytest.fixture(scope="module")
def small(repository, tmp_path_factory):
    log = tmp_path_factory.mktemp("limits") / "server.log"
    s = Server(
        repository,
        str(log),
        ["--http-max-input-size", str(LIMIT), "--grpc-max-message-size", str(LIMIT)],
    )
    try:
        s.wait_models(["echo", "add_sub"])
        yield s
    finally:
        s.stop()


def post(server, body, headers=None, model="echo"):
    req = urllib.request.Request(
        f"http://{server.http_url}/v2/models/{model}/infer", data=body, headers=headers or {}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def still_serves(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.http_url)
    a = np.arange(4, dtype=np.float32)
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    out = c.infer("add_sub", inputs).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out, a + a)
    assert server.proc.poll() is None


def json_body(n):
    return json.dumps(
        {"inputs": [{"name": "IN_UINT8", "datatype": "UINT8", "shape": [n], "data": [0] * n}]}, separators=(",", ":")
    ).encode()


def error_of(body):
    return json.loads(body)["error"]


def test_json_body_over_the_limit(small):
    body = json_body(LIMIT // 2)
    assert len(body) > LIMIT
    code, answer = post(small, body)
    assert code == 400
    assert error_of(answer) == (
        f"request JSON size of {len(body)} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {FLAG}"
    )
    still_serves(small)


def test_binary_data_past_the_limit_is_not_counted_as_in_triton(small):
    # Triton limits the JSON header of a request with binary data, not the binary data itself.
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(small.http_url)
    i = httpclient.InferInput("IN_UINT8", [LIMIT + 4096], "UINT8")
    data = (np.arange(LIMIT + 4096) % 251).astype(np.uint8)
    i.set_data_from_numpy(data, binary_data=True)
    r = c.infer("echo", [i])
    assert (r.as_numpy("OUT_UINT8") == data).all()


def test_json_header_over_the_limit(small):
    header = b" " * (LIMIT + 1)
    code, answer = post(small, header + b"\0" * 16, {"Inference-Header-Content-Length": str(len(header))})
    assert code == 400
    assert error_of(answer) == (
        f"request JSON size of {LIMIT + 1} bytes exceeds the maximum allowed input size of {LIMIT} bytes. {FLAG}"
    )
    still_serves(small)


def test_raw_body_over_the_limit(small):
    code, answer = post(small, b"\0" * (LIMIT + 1), {"Inference-Header-Content-Length": "0"}, model="add_sub")
    assert code == 400
    assert error_of(answer) == (
        f"Raw input has a byte_size ({LIMIT + 1} bytes) that exceeds the maximum allowed value of {LIMIT} bytes. {FLAG}"
    )
    still_serves(small)


def test_gzip_bomb(small):
    # 256 MiB of zeros in a few hundred KiB: decompression must stop at the limit.
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)
    assert len(bomb) < LIMIT
    code, answer = post(small, bomb, {"Content-Encoding": "gzip"})
    assert code == 400
    assert error_of(answer) == f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. {FLAG}"
    still_serves(small)


def test_just_under_the_limit_succeeds(small):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(small.http_url)
    n = LIMIT - 4096
    data = np.arange(n, dtype=np.uint8)
    i = httpclient.InferInput("IN_UINT8", [n], "UINT8")
    i.set_data_from_numpy(data, binary_data=True)
    out = c.infer("echo", [i], outputs=[httpclient.InferRequestedOutput("OUT_UINT8", binary_data=True)])
    np.testing.assert_array_equal(out.as_numpy("OUT_UINT8"), data)
    # And a gzip body that inflates to just under the limit.
    body = json_body(LIMIT // 2 - 8192)
    assert len(body) < LIMIT
    code, answer = post(small, gzip.compress(body), {"Content-Encoding": "gzip"})
    assert code == 200, answer


def test_grpc_message_over_the_limit(small):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    c = grpcclient.InferenceServerClient(small.grpc_url)
    i = grpcclient.InferInput("IN_UINT8", [LIMIT], "UINT8")
    i.set_data_from_numpy(np.zeros(LIMIT, dtype=np.uint8))
    with pytest.raises(InferenceServerException) as info:
        c.infer("echo", [i])
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "Use --grpc-max-message-size to increase the limit." in info.value.message()
    # Under the limit still works, and so does everything else.
    n = LIMIT // 2
    i = grpcclient.InferInput("IN_UINT8", [n], "UINT8")
    i.set_data_from_numpy(np.ones(n, dtype=np.uint8))
    assert c.infer("echo", [i]).as_numpy("OUT_UINT8").sum() == n
    still_serves(small)
