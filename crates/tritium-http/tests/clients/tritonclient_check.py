"""Drives tritium's HTTP frontend (over the echo mock of tests/common) with the real
`tritonclient.http`, as users do. Usage: tritonclient_check.py PORT. Prints OK on success."""

import sys

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

URL = f"127.0.0.1:{sys.argv[1]}"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def make_input(name, array, binary):
    inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    inp.set_data_from_numpy(array, binary_data=binary)
    return inp


def main():
    client = httpclient.InferenceServerClient(URL)
    check(client.is_server_live(), "live")
    check(client.is_server_ready(), "ready")
    meta = client.get_server_metadata()
    check(meta["name"] == "triton" and "binary_tensor_data" in meta["extensions"], meta)
    mm = client.get_model_metadata("simple")
    check(mm["inputs"][0]["name"] == "IN" and mm["platform"] == "python", mm)
    check(client.get_model_metadata("simple", "3")["versions"] == ["3"], "versioned metadata")
    check(client.get_model_config("simple")["max_batch_size"] == 4, "config")
    check(client.is_model_ready("simple"), "model ready")
    check(not client.is_model_ready("missing"), "missing model not ready")

    arrays = {
        "b": np.array([[True, False, True]]),
        "u8": np.arange(6, dtype=np.uint8).reshape(2, 3),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "u32": np.array([1, 2**32 - 1], dtype=np.uint32),
        "u64": np.array([2**64 - 1], dtype=np.uint64),
        "i8": np.array([-128, 127], dtype=np.int8),
        "i16": np.array([-3, 4], dtype=np.int16),
        "i32": np.arange(-4, 4, dtype=np.int32).reshape(2, 2, 2),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "f32": np.array([[0.1, -2.5], [np.inf, 3.0]], dtype=np.float32),
        "f64": np.array([1e300, -0.1], dtype=np.float64),
        "s": np.array(["héllo", "", "日本"], dtype=np.object_),
    }
    for binary_in in (False, True):
        for binary_out in (False, True):
            for req_c, resp_c in ((None, None), ("gzip", "deflate"), ("deflate", "gzip")):
                inputs = [make_input(k, v, binary_in) for k, v in arrays.items()]
                outputs = [httpclient.InferRequestedOutput("OUT_" + k, binary_data=binary_out) for k in arrays]
                result = client.infer(
                    "simple",
                    inputs,
                    outputs=outputs,
                    request_id="r1",
                    request_compression_algorithm=req_c,
                    response_compression_algorithm=resp_c,
                    parameters={"custom": "v"},
                )
                for k, v in arrays.items():
                    got = result.as_numpy("OUT_" + k)
                    if v.dtype == np.object_:
                        expect = np.array([s.encode() for s in v], dtype=np.object_)
                        if binary_out:
                            check(list(got) == list(expect), (k, got))
                        else:
                            check(list(got) == list(v), (k, got))
                    else:
                        check(got.dtype == v.dtype and got.shape == v.shape and np.array_equal(got, v), (k, got, binary_in, binary_out))
                check(result.get_response()["id"] == "r1", "id echoed")

    # FP16 and BF16 need binary data; without outputs listed everything comes back binary.
    h = np.array([1.5, -2.0], dtype=np.float16)
    result = client.infer("simple", [make_input("h", h, True)])
    check(np.array_equal(result.as_numpy("OUT_h"), h), "fp16")
    # JSON FP16 input is refused as Triton refuses it.
    try:
        client.infer("simple", [make_input("h", h, False)])
        raise AssertionError("FP16 JSON accepted")
    except InferenceServerException as e:
        check(e.status() == "400" and "FP16" in e.message(), e)

    # Non-UTF-8 BYTES outputs in JSON fail in the client exactly as with Triton.
    raw = np.array([b"\xff\xfe"], dtype=np.object_)
    result = client.infer("simple", [make_input("r", raw, True)])
    check(result.as_numpy("OUT_r")[0] == b"\xff\xfe", "binary non-UTF-8 BYTES")
    try:
        client.infer("simple", [make_input("r", raw, True)], outputs=[httpclient.InferRequestedOutput("OUT_r", binary_data=False)])
        raise AssertionError("non-UTF-8 JSON output parsed")
    except Exception as e:  # noqa: BLE001 - the client raises its own UTF-8 error
        check("UTF-8" in str(e) or "utf-8" in str(e), e)

    # Classification.
    probs = np.array([[0.1, 0.6, 0.3]], dtype=np.float32)
    result = client.infer(
        "simple", [make_input("p", probs, True)], outputs=[httpclient.InferRequestedOutput("OUT_p", class_count=2)]
    )
    check(list(result.as_numpy("OUT_p").reshape(-1)) == [b"0.600000:1", b"0.300000:2"], result.as_numpy("OUT_p"))

    # Sequences, async inference.
    x = np.array([1, 2], dtype=np.int32)
    client.infer("simple", [make_input("x", x, True)], sequence_id=7, sequence_start=True, timeout=1000)
    check(client.async_infer("simple", [make_input("x", x, True)]).get_result().as_numpy("OUT_x").tolist() == [1, 2], "async")

    # Errors come back with Triton's statuses and messages.
    for model, status in (("err_notfound", "404"), ("err_unavailable", "503"), ("err_internal", "500")):
        try:
            client.infer(model, [make_input("x", x, True)])
            raise AssertionError(model)
        except InferenceServerException as e:
            check(e.status() == status and e.message().startswith("model failed"), (model, e.status(), e.message()))

    stats = client.get_inference_statistics("simple")
    check(stats["model_stats"][0]["inference_stats"]["success"]["count"] == 5, stats)
    check(client.get_inference_statistics()["model_stats"][0]["name"] == "a", "all stats")
    index = client.get_model_repository_index()
    # Triton's keys, then tritium's own (interpreter, environment), which tritonclient passes through.
    triton_keys = {k: v for k, v in index[0].items() if not k.startswith("tritium_")}
    check(triton_keys == {"name": "a", "version": "1", "state": "READY"}, index)
    check(index[0]["tritium_python"] == "/e/bin/python" and index[0]["tritium_environment"] == "/e", index)
    client.load_model("simple")
    client.unload_model("simple", unload_dependents=True)
    check(client.get_system_shared_memory_status() == [], "shm status")
    check(client.get_cuda_shared_memory_status() == [], "cuda shm status")
    client.unregister_system_shared_memory()
    try:
        client.register_system_shared_memory("r", "/no-such-tritium-key", 64)
        raise AssertionError("shm registered")
    except InferenceServerException as e:
        check(e.status() == "500" and "Unable to open shared memory region: '/no-such-tritium-key'" in e.message(), e)
    client.close()
    print("OK")


main()
