"""`cargo xtask compat`: Triton's own Python-backend test models run against tritium.

The models come from local copies of triton-inference-server/server (`qa/python_models`,
`qa/L0_backend_python`) and triton-inference-server/python_backend (`examples`): a checkout, or a
bare mirror (read with `git show HEAD:<path>`). They are copied at run time into a temporary
repository, laid out the way each upstream test.sh lays them out, and never committed here. Each
case is then driven the way its upstream test drives it, with checks written from what that test
asserts (the examples run their own upstream client scripts, as `L0_backend_python/examples`
does). One line per case: PASS or FAIL with the reason, SKIP with why it cannot run here, then a
summary line. The exit status is 1 when a case fails.

    python xtask/compat.py --triton-server DIR --python-backend DIR --tritium BIN --python PY [CASE...]
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request

import numpy as np


class Source:
    """Files of one upstream repository: a checkout, or a bare git mirror."""

    def __init__(self, path):
        self.path = path
        self.bare = not os.path.isdir(os.path.join(path, ".git")) and os.path.isfile(os.path.join(path, "HEAD"))
        if not self.bare and not os.path.isdir(path):
            raise SystemExit(f"compat: {path} does not exist")

    def read(self, rel):
        if self.bare:
            out = subprocess.run(["git", "--git-dir", self.path, "show", f"HEAD:{rel}"], capture_output=True)
            if out.returncode != 0:
                raise FileNotFoundError(f"{rel} is not in {self.path}: {out.stderr.decode().strip()}")
            return out.stdout
        with open(os.path.join(self.path, rel), "rb") as f:
            return f.read()

    def revision(self):
        git = ["git", "--git-dir", self.path] if self.bare else ["git", "-C", self.path]
        out = subprocess.run(git + ["log", "-1", "--format=%h %cs"], capture_output=True, text=True)
        return out.stdout.strip() or "unknown revision"


SERVER = None
BACKEND = None


def qa(rel):
    return SERVER.read("qa/python_models/" + rel)


def ex(rel):
    return BACKEND.read("examples/" + rel)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- cases


class Case:
    """One upstream model (or a few that its test uses together) and its checks."""

    def __init__(self, name, models, check, group="main", env=None, load_fails=(), skip=None):
        self.name = name
        self.models = models  # {model name: {relative path: bytes or a callable returning bytes}}
        self.check = check
        self.group = group
        self.env = env or {}
        self.load_fails = load_fails
        self.skip = skip


CASES = []


def case(name, models, group="main", env=None, load_fails=(), skip=None):
    def wrap(check):
        CASES.append(Case(name, models, check, group, env, load_fails, skip))
        return check

    return wrap


def qa_model(src, name=None, edit=None, files=("model.py",), config="config.pbtxt"):
    """A model laid out as L0_backend_python's test.sh does: `qa/python_models/<src>/model.py` in
    `1/`, its config renamed, `edit` applied to the config text."""

    def build():
        out = {}
        for f in files:
            out[f"1/{os.path.basename(f)}"] = qa(f"{src}/{f}")
        if config is not None:
            text = qa(f"{src}/{config}").decode()
            if name is not None:
                text = "\n".join(f'name: "{name}"' if line.startswith("name:") else line for line in text.splitlines())
            if edit is not None:
                text = edit(text)
            out["config.pbtxt"] = text.encode()
        return out

    return build


def http(ctx):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(ctx["http"])


def grpc(ctx):
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(ctx["grpc"])


def infer(ctx, model, inputs, outputs=None, protocol="http", **kwargs):
    """Runs one inference; `inputs` is a list of (name, array, triton dtype)."""
    if protocol == "http":
        import tritonclient.http as mod

        client = http(ctx)
    else:
        import tritonclient.grpc as mod

        client = grpc(ctx)
    tensors = []
    for name, array, dtype in inputs:
        t = mod.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    outs = [mod.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(model, tensors, outputs=outs, **kwargs)


def expect_error(fn, *texts):
    """Runs `fn`, which must raise an InferenceServerException whose text contains each of `texts`."""
    from tritonclient.utils import InferenceServerException

    try:
        fn()
    except InferenceServerException as e:
        msg = str(e)
        for t in texts:
            assert t in msg, f"error {msg!r} lacks {t!r}"
        return msg
    raise AssertionError(f"expected an error containing {texts!r}, got a success")


# --- L0_backend_python/python_test.py (test.sh's first server)


def identity_variant(dtype_name, max_batch=None, dynamic=None):
    def edit(text):
        text = text.replace("TYPE_FP32", f"TYPE_{dtype_name}")
        if max_batch is not None:
            text = "\n".join(
                f"max_batch_size: {max_batch}" if t.startswith("max_batch_size:") else t for t in text.splitlines()
            )
        if dynamic:
            text += "\n" + dynamic + "\n"
        return text

    return edit


@case("identity_fp32", {"identity_fp32": qa_model("identity_fp32")})
def _(ctx):
    for shape in ([1, 1], [1, 1000], [4, 100]):
        data = np.random.rand(*shape).astype(np.float32)
        r = infer(ctx, "identity_fp32", [("INPUT0", data, "FP32")])
        assert np.array_equal(r.as_numpy("OUTPUT0"), data)


@case(
    "identity_uint8 (python_test test_async_infer)",
    {
        "identity_uint8": qa_model(
            "identity_fp32",
            "identity_uint8",
            identity_variant(
                "UINT8", 8, "dynamic_batching { preferred_batch_size: [8], max_queue_delay_microseconds: 12000000 }"
            ),
        )
    },
)
def _(ctx):
    client = http(ctx)
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(ctx["http"], concurrency=8)
    data = [np.full((1, 16), i, np.uint8) for i in range(8)]
    pending = []
    for d in data:
        t = httpclient.InferInput("INPUT0", list(d.shape), "UINT8")
        t.set_data_from_numpy(d)
        pending.append(client.async_infer("identity_uint8", [t]))
    for d, p in zip(data, pending):
        assert np.array_equal(p.get_result(timeout=30).as_numpy("OUTPUT0"), d)
    stats = client.get_inference_statistics("identity_uint8")["model_stats"][0]
    assert stats["inference_count"] == 8, stats
    assert stats["execution_count"] == 1, f"8 requests in one batch expected: {stats}"


@case(
    "identity_uint8_nobatch",
    {
        "identity_uint8_nobatch": qa_model(
            "identity_fp32",
            "identity_uint8_nobatch",
            lambda t: t.replace("TYPE_FP32", "TYPE_UINT8").replace("max_batch_size: 64", ""),
        )
    },
)
def _(ctx):
    data = np.arange(100, dtype=np.uint8)
    assert np.array_equal(infer(ctx, "identity_uint8_nobatch", [("INPUT0", data, "UINT8")]).as_numpy("OUTPUT0"), data)


@case("identity_uint32", {"identity_uint32": qa_model("identity_fp32", "identity_uint32", identity_variant("UINT32"))})
def _(ctx):
    data = np.arange(10, dtype=np.uint32).reshape(1, 10)
    assert np.array_equal(infer(ctx, "identity_uint32", [("INPUT0", data, "UINT32")]).as_numpy("OUTPUT0"), data)


@case(
    "identity_bool (python_test test_bool)",
    {"identity_bool": qa_model("identity_fp32", "identity_bool", identity_variant("BOOL"))},
)
def _(ctx):
    data = np.array([[True, False, True]])
    for protocol in ("http", "grpc"):
        out = infer(ctx, "identity_bool", [("INPUT0", data, "BOOL")], protocol=protocol).as_numpy("OUTPUT0")
        assert np.array_equal(out, data), out


def _default_model_name():
    files = qa_model("identity_fp32", "default_model_name", lambda t: t + '\ndefault_model_filename: "mymodel.py"\n')()
    files["1/mymodel.py"] = files.pop("1/model.py")
    return files


@case("default_model_name (default_model_filename)", {"default_model_name": _default_model_name})
def _(ctx):
    data = np.ones((1, 4), np.float32)
    assert np.array_equal(infer(ctx, "default_model_name", [("INPUT0", data, "FP32")]).as_numpy("OUTPUT0"), data)


@case("init_args (python_test test_init_args)", {"init_args": qa_model("init_args")}, group="init_args")
def _(ctx):
    r = infer(ctx, "init_args", [("IN", np.zeros((1, 1), np.float32), "FP32")])
    assert r.as_numpy("OUT")[0] == 7, f"initialize args had {r.as_numpy('OUT')} keys, Triton gives 7"


@case("optional (python_test test_optional_input)", {"optional": qa_model("optional")})
def _(ctx):
    for has0 in (True, False):
        for has1 in (True, False):
            inputs = []
            in0 = np.random.randint(0, 100, (1,), np.int32)
            in1 = np.random.randint(0, 100, (1,), np.int32)
            if has0:
                inputs.append(("INPUT0", in0, "INT32"))
            if has1:
                inputs.append(("INPUT1", in1, "INT32"))
            r = infer(ctx, "optional", inputs)
            a = in0 if has0 else np.array([5], np.int32)
            b = in1 if has1 else np.array([5], np.int32)
            np.testing.assert_equal(r.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_equal(r.as_numpy("OUTPUT1"), a - b)


@case("non_contiguous (python_test test_non_contiguous)", {"non_contiguous": qa_model("non_contiguous")})
def _(ctx):
    data = np.random.rand(2, 10, 11, 6, 5).astype(np.float32)
    r = infer(ctx, "non_contiguous", [("INPUT0", data, "FP32")])
    assert np.all(data.reshape([10, 2, 6, 5, 11]) == r.as_numpy("OUTPUT0"))
    assert np.all(data.T == r.as_numpy("OUTPUT1"))
    assert np.all(np.transpose(data, [1, 0, 4, 2, 3]) == r.as_numpy("OUTPUT2"))


@case("string (python_test test_unicode)", {"string": qa_model("string")})
def _(ctx):
    # Two runs: the model answers with np.bytes_, then np.object_ (it has no third).
    for _ in range(2):
        arr = np.array(["\U0001f600".encode("utf-8")], dtype=np.bytes_)
        out = infer(ctx, "string", [("INPUT0", arr, "BYTES")]).as_numpy("OUTPUT0")
        assert out[0] == arr[0], out


@case("string_fixed (python_test test_string)", {"string_fixed": qa_model("string_fixed")})
def _(ctx):
    arr = np.array([b"x"], dtype=np.object_)
    for i in range(4):
        out = infer(ctx, "string_fixed", [("INPUT0", arr, "BYTES")]).as_numpy("OUTPUT0")
        if i % 2 == 0:
            assert out[0] == b"123456", out
        else:
            assert out.size == 0, out


def _multi_file_config():
    """multi_file's files with identity_fp32's config, as test.sh lays it out."""
    files = qa_model("multi_file", "multi_file", files=("model.py", "file1.py", "file2.py"), config=None)()
    text = qa("identity_fp32/config.pbtxt").decode().replace('name: "identity_fp32"', 'name: "multi_file"')
    files["config.pbtxt"] = text.encode()
    return files


@case("multi_file (test.sh: loads)", {"multi_file": _multi_file_config})
def _(ctx):
    assert ctx["ready"]("multi_file"), "multi_file did not load"


@case(
    "model_env (test.sh: MY_ENV reaches the model)",
    {"model_env": qa_model("model_env")},
    group="env",
    env={"MY_ENV": "MY_ENV"},
)
def _(ctx):
    assert ctx["ready"]("model_env"), "model_env did not load: " + ctx["reason"]("model_env")


# --- L0_backend_python/lifecycle (lifecycle_test.py)


@case("error_code (lifecycle test_error_code)", {"error_code": qa_model("error_code")})
def _(ctx):
    codes = [
        ("UNKNOWN", "[StatusCode.UNKNOWN]"),
        ("INTERNAL", "[StatusCode.INTERNAL]"),
        ("NOT_FOUND", "[StatusCode.NOT_FOUND]"),
        ("INVALID_ARG", "[StatusCode.INVALID_ARGUMENT]"),
        ("UNAVAILABLE", "[StatusCode.UNAVAILABLE]"),
        ("UNSUPPORTED", "[StatusCode.UNIMPLEMENTED]"),
        ("ALREADY_EXISTS", "[StatusCode.ALREADY_EXISTS]"),
        ("CANCELLED", "[StatusCode.CANCELLED]"),
        ("(default)", "[StatusCode.INTERNAL] unrecognized error code: (default)"),
    ]
    for code, expected in codes:
        arr = np.array([[code.encode()]], dtype=np.object_)
        msg = expect_error(
            lambda arr=arr: infer(ctx, "error_code", [("ERROR_CODE", arr, "BYTES")], protocol="grpc"), expected
        )
        if code != "(default)":
            assert msg == f"{expected} error code: {code}", msg


@case("execute_error (lifecycle test_batch_error)", {"execute_error": qa_model("execute_error")})
def _(ctx):
    import tritonclient.grpc as grpcclient

    client = grpc(ctx)
    # Three requests in one batch (the upstream test sends them at once with dynamic batching).
    results = []

    def one(i):
        t = grpcclient.InferInput("IN", [1, 1], "FP32")
        t.set_data_from_numpy(np.full((1, 1), i, np.float32))
        try:
            return client.infer("execute_error", [t])
        except Exception as e:  # noqa: BLE001
            return e

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, range(3)))
    errors = [r for r in results if isinstance(r, Exception)]
    assert errors, "no request failed"
    for e in errors:
        assert "An error occurred during execution" in str(e), e


@case(
    "execute_return_error (lifecycle: returns None, then [None])",
    {"execute_return_error": qa_model("execute_return_error")},
)
def _(ctx):
    # Triton (python_backend pb_stub.cc ProcessReturnedResponses) accepts both returns and sends
    # nothing; the request then ends without a response, which the client sees as an error.
    data = np.ones((1, 1), np.float32)
    for _ in range(2):
        expect_error(lambda: infer(ctx, "execute_return_error", [("INPUT", data, "FP32")], timeout=30))


@case(
    "wrong_return_type (request_rescheduling)",
    {"wrong_return_type": qa_model("wrong_return_type")},
)
def _(ctx):
    data = np.ones(4, np.float32)
    expect_error(lambda: infer(ctx, "wrong_return_type", [("INPUT0", data, "FP32")]), "")


@case(
    "init_error (lifecycle: load fails)",
    {"init_error": qa_model("init_error")},
    group="failing",
    load_fails=("init_error",),
)
def _(ctx):
    assert not ctx["ready"]("init_error")
    reason = ctx["reason"]("init_error")
    assert "name 'lorem_ipsum' is not defined" in reason, reason


@case("fini_error (lifecycle: finalize raising)", {"fini_error": qa_model("fini_error")}, group="failing")
def _(ctx):
    assert ctx["ready"]("fini_error")


# --- async_execute, logging, sequences


@case(
    "async_execute_decouple (L0 async_execute test_concurrent_execute)",
    {"async_execute_decouple": qa_model("async_execute_decouple")},
)
def _(ctx):
    import queue

    import tritonclient.grpc as grpcclient

    client = grpc(ctx)
    got = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    start = time.time()
    for _ in range(4):
        t = grpcclient.InferInput("WAIT_SECONDS", [1, 1], "FP32")
        t.set_data_from_numpy(np.array([[1.0]], np.float32))
        client.async_stream_infer("async_execute_decouple", [t])
    for _ in range(4):
        result, error = got.get(timeout=30)
        assert error is None, error
        assert np.array_equal(result.as_numpy("DUMMY_OUT"), np.zeros(1, np.float32))
    client.stop_stream()
    elapsed = time.time() - start
    assert elapsed < 3, f"4 requests of 1 s each took {elapsed:.1f} s: the coroutines did not overlap"


@case("identity_fp32_logging (L0 logging)", {"identity_fp32_logging": qa_model("identity_fp32_logging")})
def _(ctx):
    data = np.ones((1, 2), np.float32)
    infer(ctx, "identity_fp32_logging", [("INPUT0", data, "FP32")])
    time.sleep(0.5)
    log = ctx["log"]()
    for msg in ("Initialize-Specific Msg!", "Initialize-Warning Msg!", "Execute-Error Msg!", "Execute-Verbose Msg!"):
        assert msg in log, f"{msg!r} is not in the server log"


@case("sequence_py (L0 sequence: correlation ids and flags)", {"sequence_py": qa_model("sequence_py")})
def _(ctx):
    for sid in (1000, "string-id"):
        outs = []
        for i in range(3):
            r = infer(
                ctx,
                "sequence_py",
                [("INPUT0", np.array([[0]], np.int32), "INT32")],
                protocol="grpc",
                sequence_id=sid,
                sequence_start=i == 0,
                sequence_end=i == 2,
            )
            outs.append(int(r.as_numpy("OUTPUT0").flatten()[0]))
        assert outs == [1, 2, 3], (sid, outs)


# --- parameters


@case("response_parameters (L0 parameters)", {"response_parameters": qa_model("response_parameters")})
def _(ctx):
    for params in ({"bool": True}, {"str": "hello"}, {"int": 123}, {"a": 1, "b": "x", "c": False}):
        arr = np.array([[json.dumps(params).encode()]], dtype=np.object_)
        for protocol in ("http", "grpc"):
            r = infer(ctx, "response_parameters", [("RESPONSE_PARAMETERS", arr, "BYTES")], protocol=protocol)
            got = r.get_response()["parameters"] if protocol == "http" else None
            if protocol == "http":
                assert got == params, (got, params)
            else:
                raw = r.get_response().parameters
                decoded = {}
                for k, v in raw.items():
                    decoded[k] = getattr(v, v.WhichOneof("parameter_choice"))
                assert decoded == params, (decoded, params)
    arr = np.array([[json.dumps({"float": 0.5}).encode()]], dtype=np.object_)
    expect_error(
        lambda: infer(ctx, "response_parameters", [("RESPONSE_PARAMETERS", arr, "BYTES")]),
        "Expect parameters values to have type bool/int/str, found type <class 'float'>",
    )


@case("bls_parameters (L0 bls test_bls_parameters)", {"bls_parameters": qa_model("bls_parameters")})
def _(ctx):
    n = 3
    r = infer(ctx, "bls_parameters", [("NUMBER_PARAMETERS", np.array([n], np.ubyte), "UINT8")])
    got = json.loads(r.as_numpy("PARAMETERS_AGGREGATED")[0])
    want = {}
    for i in range(1, n + 1):
        want.update({f"bool_{i}": bool(i), f"int_{i}": i, f"str_{i}": str(i)})
    assert got == want, got


# --- helpers for the L0 tests below


def l0(rel):
    return SERVER.read("qa/L0_backend_python/" + rel)


def l0_model(test, name, edit=None):
    """A model kept under `qa/L0_backend_python/<test>/models/<name>`, copied as its test.sh does."""

    def build():
        text = l0(f"{test}/models/{name}/config.pbtxt").decode()
        if edit is not None:
            text = edit(text)
        return {"1/model.py": l0(f"{test}/models/{name}/1/model.py"), "config.pbtxt": text.encode()}

    return build


def append(line):
    return lambda text: text + "\n" + line + "\n"


def stream(ctx, model, requests, wait=None, cancel_after=None):
    """Sends each request's inputs (a list of InferInput) on one gRPC stream and returns the
    (result, error) pairs the stream delivered. The stream is closed after `cancel_after`
    seconds with `cancel_requests=True`, else when the server has ended every request."""
    import tritonclient.grpc as grpcclient

    got = []
    with grpcclient.InferenceServerClient(ctx["grpc"]) as client:
        client.start_stream(callback=lambda result, error: got.append((result, error)))
        for inputs in requests:
            if isinstance(inputs, tuple):
                inputs, kwargs = inputs
            else:
                kwargs = {}
            client.async_stream_infer(model, inputs, **kwargs)
        if cancel_after is not None:
            time.sleep(cancel_after)
            client.stop_stream(cancel_requests=True)
            time.sleep(2)
        else:
            if wait:
                time.sleep(wait)
            client.stop_stream()
    return got


def grpc_inputs(*tensors):
    """InferInputs for (name, array) pairs; the Triton dtype comes from the array."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    out = []
    for name, array in tensors:
        t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        t.set_data_from_numpy(array)
        out.append(t)
    return out


def subtests(checks):
    """Runs each (label, fn); raises one AssertionError naming every label that failed."""
    failed = []
    for label, fn in checks:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - collected into the case's reason
            failed.append(f"{label}: {type(e).__name__ if not isinstance(e, AssertionError) else ''}{e}")
    assert not failed, f"{len(failed)} of {len(checks)} failed: " + " | ".join(failed)


def python_unittest(model, protocol="grpc"):
    """L0's test_infer_shm_leak.py: the model runs unittest in `execute`, OUTPUT0 == [1]."""

    def check(ctx):
        import tritonclient.grpc as grpcclient

        with grpcclient.InferenceServerClient(ctx["grpc"]) as client:
            r = client.infer(model, [], client_timeout=240)
        out = r.as_numpy("OUTPUT0")
        if not (out == [1]).all():
            tail = [line for line in ctx["log"]().splitlines() if "Error" in line or "FAIL" in line or "assert" in line]
            raise AssertionError(f"the model's unittest failed (OUTPUT0 {out}): " + " / ".join(tail[-6:]))

    return check


# --- L0_backend_python/response_sender (response_sender_test.py)


def rs_model(model_file, decoupled=False, batching=False):
    def build():
        text = qa("response_sender/config.pbtxt").decode()
        if decoupled:
            text += "\nmodel_transaction_policy { decoupled: True }\n"
        if batching:
            text += "\ndynamic_batching { max_queue_delay_microseconds: 500000 }\n"
        return {
            "1/model_common.py": qa("response_sender/model_common.py"),
            "1/model.py": qa(f"response_sender/{model_file}"),
            "config.pbtxt": text.encode(),
        }

    return build


RS_MODELS = {
    "response_sender": rs_model("model.py"),
    "response_sender_decoupled": rs_model("model.py", decoupled=True),
    "response_sender_async": rs_model("model_async.py"),
    "response_sender_decoupled_async": rs_model("model_async.py", decoupled=True),
    "response_sender_batching": rs_model("model.py", batching=True),
    "response_sender_decoupled_batching": rs_model("model.py", decoupled=True, batching=True),
    "response_sender_async_batching": rs_model("model_async.py", batching=True),
    "response_sender_decoupled_async_batching": rs_model("model_async.py", decoupled=True, batching=True),
}

# (responses before return, final flag before return, return a response, responses after
# return, final flag after return), as response_sender_test.py's _inputs_parameters_*.
RS = {
    "zero_pre": (0, True, False, 0, False),
    "zero_post": (0, False, False, 0, True),
    "one_pre": (1, True, False, 0, False),
    "one_post": (0, False, False, 1, True),
    "two_pre": (2, True, False, 0, False),
    "two_post": (0, False, False, 2, True),
    "pre_and_post": (1, False, False, 3, True),
    "one_on": (0, False, True, 0, False),
    "one_pre_and_on": (1, True, True, 0, False),
    "one_on_and_post": (0, False, True, 1, True),
}


def rs_inputs(kind):
    pre, pre_final, ret, post, post_final = RS[kind]
    return grpc_inputs(
        ("NUMBER_OF_RESPONSE_BEFORE_RETURN", np.array([[pre]], np.uint8)),
        ("SEND_COMPLETE_FINAL_FLAG_BEFORE_RETURN", np.array([[pre_final]], bool)),
        ("RETURN_A_RESPONSE", np.array([[ret]], bool)),
        ("NUMBER_OF_RESPONSE_AFTER_RETURN", np.array([[post]], np.uint8)),
        ("SEND_COMPLETE_FINAL_FLAG_AFTER_RETURN", np.array([[post_final]], bool)),
    )


def rs_valid(responses, pre, ret, post):
    """_assert_responses_valid: every response a success, counted by its INDEX range."""
    seen_pre = seen_post = 0
    returned = False
    for result, error in responses:
        assert error is None, f"unexpected error: {error}"
        index = result.as_numpy("INDEX")
        rid = index.sum() / index.shape[0]
        if rid < 1000:
            assert not returned, "more than one returned response"
            returned = True
        elif rid < 2000:
            seen_pre += 1
        elif rid < 3000:
            seen_post += 1
        else:
            raise AssertionError(f"unexpected response id {rid}")
    got, want = (seen_pre, returned, seen_post), (pre, bool(ret), post)
    assert got == want, f"(before, returned, after) = {got}, expected {want}"


def rs_exception(responses, text):
    """_assert_responses_exception: exactly one response, an error containing `text`."""
    for result, error in responses:
        assert result is None and error is not None, f"expected an error, got a result ({error})"
        assert text in error.message(), f"error {error.message()!r} lacks {text!r}"
    assert len(responses) == 1, f"{len(responses)} responses, expected 1"


def rs_check(ctx, model, kind, expected=None):
    pre, _, ret, post, _ = RS[kind]
    rs_valid(stream(ctx, model, [rs_inputs(kind)]), *(expected or (pre, ret, post)))


@case("response_sender decoupled (7 patterns, sync and async)", RS_MODELS, group="response_sender")
def _(ctx):
    checks = []
    for kind in ("zero_pre", "zero_post", "one_pre", "one_post", "two_pre", "two_post", "pre_and_post"):
        for model in ("response_sender_decoupled", "response_sender_decoupled_async"):
            checks.append((f"{model} {kind}", lambda m=model, k=kind: rs_check(ctx, m, k)))
    subtests(checks)


@case("response_sender non-decoupled (one response on/pre/post return)", RS_MODELS, group="response_sender")
def _(ctx):
    checks = []
    for kind in ("one_on", "one_pre", "one_post"):
        for model in ("response_sender", "response_sender_async"):
            checks.append((f"{model} {kind}", lambda m=model, k=kind: rs_check(ctx, m, k)))
    subtests(checks)


@case("response_sender batching (multiple requests, decoupled and not)", RS_MODELS, group="response_sender")
def _(ctx):
    decoupled = [rs_inputs(k) for k in ("zero_pre", "zero_post", "one_pre", "one_post", "two_pre", "two_post")]
    decoupled.append(rs_inputs("pre_and_post"))
    plain = [rs_inputs(k) for k in ("one_on", "one_pre", "one_post")]
    checks = []
    for model in ("response_sender_decoupled_batching", "response_sender_decoupled_async_batching"):
        checks.append((model, lambda m=model: rs_valid(stream(ctx, m, decoupled), 4, False, 6)))
    for model in ("response_sender_batching", "response_sender_async_batching"):
        checks.append((model, lambda m=model: rs_valid(stream(ctx, m, plain), 1, True, 1)))
    subtests(checks)


@case(
    "response_sender misuse (decoupled returns a response, final first, two sends)", RS_MODELS, group="response_sender"
)
def _(ctx):
    must_return_none = "using the decoupled mode and the execute function must return None"
    final_first = "Non-decoupled model cannot send complete final before sending a response"
    dec = "response_sender_decoupled"
    checks = [
        (f"{dec} one_on", lambda: rs_exception(stream(ctx, dec, [rs_inputs("one_on")]), must_return_none)),
        (f"{dec} one_pre_and_on", lambda: rs_check(ctx, dec, "one_pre_and_on", (1, False, 0))),
        (
            f"{dec} one_on_and_post",
            lambda: rs_exception(stream(ctx, dec, [rs_inputs("one_on_and_post")]), must_return_none),
        ),
    ]
    for model in ("response_sender", "response_sender_async"):
        checks += [
            (f"{model} zero_pre", lambda m=model: rs_exception(stream(ctx, m, [rs_inputs("zero_pre")]), final_first)),
            (f"{model} two_pre", lambda m=model: rs_check(ctx, m, "two_pre", (1, False, 0))),
            (f"{model} one_pre_and_on", lambda m=model: rs_check(ctx, m, "one_pre_and_on", (1, False, 0))),
            (f"{model} one_on_and_post", lambda m=model: rs_check(ctx, m, "one_on_and_post", (0, True, 0))),
        ]
    subtests(checks)


@case(
    "response_sender_complete_final (send after the final flag raises)",
    {"response_sender_complete_final": qa_model("response_sender_complete_final")},
    group="response_sender_complete_final",
)
def _(ctx):
    assert "Test Passed" not in ctx["log"]()
    data = np.array([[123.45]], np.float32)
    got = stream(ctx, "response_sender_complete_final", [grpc_inputs(("INPUT0", data))])
    assert len(got) == 1, f"{len(got)} responses, expected 1"
    assert got[0][1] is None, got[0][1]
    assert np.allclose(got[0][0].as_numpy("OUTPUT0"), data)
    time.sleep(1)
    log = ctx["log"]()
    for bad in ("Unexpected request length", "Expected exception not raised", "Test FAILED"):
        assert bad not in log, f"{bad!r} is in the server log"
    assert "Test Passed" in log, "'Test Passed' is not in the server log (the second send did not raise Triton's text)"


# --- L0_backend_python/decoupled (decoupled_test.py)


def _square_int32():
    return {
        "1/model.py": ex("decoupled/square_model.py"),
        "config.pbtxt": ex("decoupled/square_config.pbtxt"),
    }


DECOUPLED = {
    "identity_fp32": qa_model("identity_fp32"),
    "execute_cancel": qa_model("execute_cancel", edit=append("model_transaction_policy { decoupled: True }")),
    "response_sender_until_cancelled": qa_model("response_sender_until_cancelled"),
    "square_int32": _square_int32,
}
for _m in (
    "decoupled_execute_error",
    "decoupled_bls_stream",
    "decoupled_return_response_error",
    "decoupled_send_after_close_error",
    "decoupled_bls_cancel",
    "decoupled_bls_async_cancel",
    "decoupled_bls_cancel_after_complete",
    "decoupled_raise_exception",
):
    DECOUPLED[_m] = l0_model("decoupled", _m)


@case("decoupled_execute_error (an error for one request of a batch)", DECOUPLED, group="decoupled")
def _(ctx):
    datas = [np.random.randn(2, 2).astype(np.float32) for _ in range(2)]
    got = stream(ctx, "decoupled_execute_error", [grpc_inputs(("IN", d)) for d in datas])
    assert len(got) == 2, f"{len(got)} responses, expected 2"
    assert got[0][1] is not None, f"the first response should be an error, got {got[0]}"
    assert got[1][1] is None, got[1][1]
    assert np.array_equal(got[1][0].as_numpy("OUT"), datas[1])


@case("decoupled_bls_stream (BLS to square_int32, streamed back)", DECOUPLED, group="decoupled")
def _(ctx):
    values = [4, 2, 0, 1]
    reqs = [(grpc_inputs(("IN", np.array([v], np.int32))), {"request_id": str(i)}) for i, v in enumerate(values)]
    got = stream(ctx, "decoupled_bls_stream", reqs)
    by_id = {}
    for result, error in got:
        assert error is None, error
        by_id.setdefault(result.get_response().id, []).append(result.as_numpy("OUT"))
    for i, v in enumerate(values):
        outs = by_id.get(str(i), [])
        assert len(outs) == v, f"request {i}: {len(outs)} responses, expected {v}"
        assert all(np.array_equal(o, np.array([v], np.int32)) for o in outs), (i, outs)


def _two_fp32_inputs():
    return grpc_inputs(
        ("INPUT0", np.random.random([16]).astype(np.float32)), ("INPUT1", np.random.random([16]).astype(np.float32))
    )


@case("decoupled_return_response_error (execute returns responses)", DECOUPLED, group="decoupled")
def _(ctx):
    got = stream(ctx, "decoupled_return_response_error", [_two_fp32_inputs()])
    assert got, "no response"
    error = got[0][1]
    if error is not None:
        want = "Python model 'decoupled_return_response_error_0_0' is using the decoupled mode and the execute function must return None."
        assert want in error.message(), f"error {error.message()!r} lacks {want!r}"


@case("decoupled_send_after_close_error (nothing reaches the client)", DECOUPLED, group="decoupled")
def _(ctx):
    got = stream(ctx, "decoupled_send_after_close_error", [_two_fp32_inputs()], wait=4)
    assert len(got) == 0, f"{len(got)} responses, expected none: {got}"


@case("execute_cancel decoupled (decoupled_test test_decoupled_execute_cancel)", DECOUPLED, group="decoupled")
def _(ctx):
    got = stream(
        ctx, "execute_cancel", [grpc_inputs(("EXECUTE_DELAY", np.array([[10.0]], np.float32)))], cancel_after=4
    )
    assert got, "no response after the cancellation"
    for result, error in got:
        assert error is not None, f"expected CANCELLED, got a result {result}"
        assert error.status() == "StatusCode.CANCELLED", f"status {error.status()}: {error.message()}"
    log = ctx["log"]()
    assert "[execute_cancel] Request not cancelled at 1.0 s" in log, "'Request not cancelled at 1.0 s' not logged"
    assert "[execute_cancel] Request cancelled at " in log, "'Request cancelled at' not logged"


def _bls_cancel_inputs(max_sum, ignore):
    return grpc_inputs(
        ("INPUT", np.array([1], np.int32)),
        ("MAX_SUM", np.array([max_sum], np.int32)),
        ("IGNORE_CANCEL", np.array([ignore], np.bool_)),
    )


def _bls_cancel(ctx, model, max_sum, ignore, cancelled, compare):
    got = stream(ctx, model, [_bls_cancel_inputs(max_sum, ignore)])
    assert got, "no response"
    result, error = got[0]
    assert error is None, error
    assert bool(result.as_numpy("IS_CANCELLED")[0]) == cancelled, f"IS_CANCELLED {result.as_numpy('IS_CANCELLED')}"
    s = result.as_numpy("SUM")
    assert compare(s, np.array([max_sum], np.int32)), f"SUM {s} (MAX_SUM {max_sum})"


@case("decoupled_bls_cancel, decoupled_bls_async_cancel (cancel a BLS stream)", DECOUPLED, group="decoupled")
def _(ctx):
    checks = []
    for model in ("decoupled_bls_cancel", "decoupled_bls_async_cancel"):
        checks.append((f"{model} cancel", lambda m=model: _bls_cancel(ctx, m, 10, False, True, np.array_equal)))
        checks.append((f"{model} ignore", lambda m=model: _bls_cancel(ctx, m, 10, True, False, np.greater)))
    subtests(checks)


@case("decoupled_bls_cancel_after_complete", DECOUPLED, group="decoupled")
def _(ctx):
    m = "decoupled_bls_cancel_after_complete"
    subtests(
        [
            ("after cancellation", lambda: _bls_cancel(ctx, m, 10, False, True, np.array_equal)),
            ("after completion", lambda: _bls_cancel(ctx, m, 25, False, False, np.less)),
        ]
    )


@case("decoupled_raise_exception (10 requests, each an error)", DECOUPLED, group="decoupled")
def _(ctx):
    got = stream(
        ctx,
        "decoupled_raise_exception",
        [grpc_inputs(("IN", np.random.randn(2, 2).astype(np.float32))) for _ in range(10)],
    )
    assert len(got) == 10, f"{len(got)} responses, expected 10"
    for result, error in got:
        assert error is not None and "Intentional Error" in error.message(), (
            f"expected 'Intentional Error', got {error or result}"
        )
    assert grpc(ctx).is_model_ready("decoupled_raise_exception")


CASES.append(Case("decoupled_bls", {}, None, skip="needs torch (DLPack to torch tensors)"))


# --- L0_backend_python/lifecycle: execute_cancel, auto_complete_error


@case("execute_cancel (lifecycle test_execute_cancel)", {"execute_cancel": qa_model("execute_cancel")})
def _(ctx):
    import tritonclient.grpc as grpcclient

    response = {}
    with grpcclient.InferenceServerClient(ctx["grpc"]) as client:
        future = client.async_infer(
            "execute_cancel",
            grpc_inputs(("EXECUTE_DELAY", np.array([[4.0]], np.float32))),
            lambda result, error: response.update(result=result, error=error),
        )
        time.sleep(2)
        assert not response, f"answered before the cancellation: {response}"
        future.cancel()
        time.sleep(2)
        assert response, "no answer 2 s after the cancellation"
    assert response["result"] is None, "a result instead of CANCELLED"
    assert response["error"].status() == "StatusCode.CANCELLED", response["error"]
    log = ctx["log"]()
    assert "[execute_cancel] Request not cancelled at 1.0 s" in log, "'Request not cancelled at 1.0 s' not logged"
    assert "[execute_cancel] Request cancelled at " in log, "'Request cancelled at' not logged"


@case(
    "auto_complete_error (lifecycle: an error in auto_complete_config)",
    {"auto_complete_error": qa_model("auto_complete_error", config=None)},
    group="auto_complete_error",
    load_fails=("auto_complete_error",),
)
def _(ctx):
    assert not ctx["ready"]("auto_complete_error")
    text = "name 'undefined_variable' is not defined"
    assert text in ctx["log"]() or text in ctx["reason"]("auto_complete_error"), (
        f"{text!r} is neither logged nor the reason"
    )


# --- L0_backend_python/bls: error cases and memory


@case(
    "bls_init_error (BLS in initialize)",
    {"bls_init_error": qa_model("bls_init_error")},
    group="bls_init_error",
    load_fails=("bls_init_error",),
)
def _(ctx):
    assert not ctx["ready"]("bls_init_error"), "loaded, but BLS in initialize must fail it"
    text = "BLS is only supported during the 'execute' function."
    assert text in ctx["log"]() or text in ctx["reason"]("bls_init_error"), f"{text!r} is neither logged nor the reason"


@case(
    "bls_finalize_error (BLS in finalize)",
    {"bls_finalize_error": qa_model("bls_finalize_error"), "square_int32": _square_int32},
    group="bls_finalize_error",
)
def _(ctx):
    ctx["stop"]()
    text = "BLS is only supported during the 'execute' function."
    assert text in ctx["log"](), f"{text!r} is not in the server log after shutdown"


@case(
    "bls_memory, bls_memory_async (1 GiB and 4 x 200 MiB tensors through BLS)",
    {
        "bls_memory": qa_model("bls_memory"),
        "bls_memory_async": qa_model("bls_memory_async"),
        "identity_fp32": qa_model("identity_fp32"),
    },
    group="bls_memory",
    env={"BLS_KIND": "non_decoupled"},
)
def _(ctx):
    subtests([(m, lambda m=m: python_unittest(m)(ctx)) for m in ("bls_memory", "bls_memory_async")])


# --- L0_backend_python/argument_validation


@case(
    "argument_validation (pb_utils argument checks, in-model unittest)",
    {"argument_validation": l0_model("argument_validation", "argument_validation")},
)
def _(ctx):
    python_unittest("argument_validation")(ctx)


# --- L0_backend_python/ensemble


def _add_sub():
    return {"1/model.py": qa("add_sub/model.py"), "config.pbtxt": qa("add_sub/config.pbtxt")}


@case(
    "ensemble (two add_sub steps)",
    {
        "ensemble": lambda: {"config.pbtxt": qa("ensemble/config.pbtxt"), "1/.keep": b""},
        "add_sub_1": _add_sub,
        "add_sub_2": _add_sub,
    },
    group="ensemble",
)
def _(ctx):
    a, b = np.random.random([16]).astype(np.float32), np.random.random([16]).astype(np.float32)
    r = infer(ctx, "ensemble", [("INPUT0", a, "FP32"), ("INPUT1", b, "FP32")])
    assert np.allclose(r.as_numpy("OUTPUT0"), 2 * a, atol=1e-6), r.as_numpy("OUTPUT0")
    assert np.allclose(r.as_numpy("OUTPUT1"), 2 * b, atol=1e-6), r.as_numpy("OUTPUT1")


CASES.append(Case("ensemble_gpu", {}, None, skip="needs a GPU and the libtorch backend"))


# --- L0_backend_python/python_based_backends


def _pbb_model(op, versions):
    def build():
        out = {"config.pbtxt": b'backend: "add_sub"\n'}
        for v in versions:
            out[f"{v}/model.json"] = json.dumps({"operation": op}).encode()
        return out

    return build


def _add_sub_v12():
    files = _add_sub()
    files["2/model.py"] = files["1/model.py"]
    return files


def _add_sub_check(ctx, model, version="1", shape=(4,), single=False):
    import tritonclient.grpc as grpcclient

    a, b = np.random.rand(*shape).astype(np.float32), np.random.rand(*shape).astype(np.float32)
    outs = ["OUTPUT"] if single else ["OUTPUT0", "OUTPUT1"]
    with grpcclient.InferenceServerClient(ctx["grpc"]) as client:
        assert client.is_model_ready(model, model_version=version), f"{model} v{version} not ready"
        r = client.infer(
            model,
            grpc_inputs(("INPUT0", a), ("INPUT1", b)),
            model_version=version,
            request_id="42",
            outputs=[grpcclient.InferRequestedOutput(o) for o in outs],
        )
    if single:
        want = a + b if model == "add" else a - b
        assert np.allclose(r.as_numpy("OUTPUT"), want), (model, version)
    else:
        assert np.allclose(r.as_numpy("OUTPUT0"), a + b) and np.allclose(r.as_numpy("OUTPUT1"), a - b), model


@case(
    "python_based_backends (add, sub, add_sub with --backend-directory, explicit loads)",
    {"add": _pbb_model("add", (1, 2)), "sub": _pbb_model("sub", (1,)), "add_sub": _add_sub_v12},
    group="python_based_backends",
)
def _(ctx):
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(ctx["grpc"]) as client:
        client.load_model("add", config='{"backend":"add_sub","version_policy":{"latest":{"num_versions":2}}}')
        client.load_model("sub")
        client.load_model("add_sub")
    subtests(
        [
            ("add v2", lambda: _add_sub_check(ctx, "add", "2", single=True)),
            ("add v1", lambda: _add_sub_check(ctx, "add", "1", single=True)),
            ("sub", lambda: _add_sub_check(ctx, "sub", "1", single=True)),
            ("add_sub v2", lambda: _add_sub_check(ctx, "add_sub", "2", shape=(16,))),
        ]
    )


CASES.append(Case("python_based_backends add_sub_pytorch", {}, None, skip="needs torch (a TorchScript model)"))


# --- L0_backend_python/model_control (model_control_test.py)

MODEL_CONTROL = {
    "identity_fp32": qa_model("identity_fp32"),
    "simple_identity_fp32": lambda: {"config.pbtxt": qa("simple_identity_fp32/config.pbtxt"), "1/.keep": b""},
}


@case(
    "model_control (explicit load/unload of a model and an ensemble, 5 times)",
    MODEL_CONTROL,
    group="model_control",
)
def _(ctx):
    import tritonclient.http as httpclient

    client = http(ctx)
    data = np.expand_dims(np.arange(16, dtype=np.float32), 0)
    for i in range(5):
        for m in ("identity_fp32", "simple_identity_fp32"):
            assert not client.is_model_ready(m), f"round {i}: {m} ready before its load"
        client.load_model("identity_fp32")
        client.load_model("simple_identity_fp32")
        for m in ("identity_fp32", "simple_identity_fp32"):
            assert client.is_model_ready(m), f"round {i}: {m} not ready after its load"
            t = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            t.set_data_from_numpy(data)
            r = client.infer(m, [t], outputs=[httpclient.InferRequestedOutput("OUTPUT0")])
            assert np.all(r.as_numpy("OUTPUT0") == data), m
        client.unload_model("simple_identity_fp32")
        client.unload_model("identity_fp32")
        for m in ("identity_fp32", "simple_identity_fp32"):
            assert not client.is_model_ready(m), f"round {i}: {m} still ready after its unload"


def _load_with_files(ctx, name):
    """ModelIDValidationTest._send_load_model_request: a raw POST, the name unescaped."""
    import base64
    import http.client

    code = (
        "import triton_python_backend_utils as pb_utils\n\nclass TritonPythonModel:\n"
        "    def execute(self, requests):\n        responses = []\n        for request in requests:\n"
        "            t = pb_utils.get_input_tensor_by_name(request, 'INPUT0')\n"
        "            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor('OUTPUT0', t.as_numpy())]))\n"
        "        return responses\n"
    )
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    body = json.dumps(
        {"parameters": {"config": json.dumps(config), "file:/1/model.py": base64.b64encode(code.encode()).decode()}}
    )
    host, port = ctx["http"].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.putrequest("POST", f"/v2/repository/models/{name}/load", skip_accept_encoding=True)
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body.encode())
        r = conn.getresponse()
        return r.status, r.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:
        return 0, f"Error: {e}"
    finally:
        conn.close()


@case("model_control model ids (ModelIDValidationTest)", MODEL_CONTROL, group="model_control")
def _(ctx):
    client = http(ctx)
    checks = []
    for name in (
        "model;test",
        "model|test",
        "model&test",
        "model$test",
        "model`test`",
        "model<test>",
        "model(test)",
        "model{test}",
        "model\\test",
        'model"test"',
        "model'test'",
        "model*test",
        "model~test",
        "model!test",
    ):

        def bad(name=name):
            status, text = _load_with_files(ctx, name)
            assert status != 200, "200 OK"
            want = "failed to load" if "{" in name else "Invalid stub name: contains invalid characters"
            assert want in text, f"HTTP {status} {text[:160]!r} lacks {want!r}"

        checks.append((repr(name), bad))
    for name in ("TestModel123", "model-with-hyphens", "model_with_underscores"):

        def good(name=name):
            status, text = _load_with_files(ctx, name)
            assert status == 200, f"HTTP {status}: {text[:200]}"
            assert client.is_model_ready(name), "not ready"
            client.unload_model(name)

        checks.append((name, good))
    subtests(checks)


GROUP_ARGS = {
    "auto_complete_error": lambda d: ["--strict-model-config", "false"],
    "python_based_backends": lambda d: [
        "--model-control-mode",
        "explicit",
        "--backend-directory",
        os.path.join(d, "backends"),
    ],
    "model_control": lambda d: ["--model-control-mode", "explicit"],
}
EXPLICIT = {"python_based_backends", "model_control"}
GROUP_FILES = {
    "python_based_backends": lambda: {
        "backends/add_sub/model.py": qa("python_based_backends/add_sub_backend/model.py")
    },
}


# ---------------------------------------------------------------- python_backend/examples


def example(dirname, model, config):
    def build():
        out = {"1/model.py": ex(f"{dirname}/{model}")}
        if config is not None:
            out["config.pbtxt"] = ex(f"{dirname}/{config}")
        return out

    return build


def run_client(script_rel):
    def check(ctx):
        path = os.path.join(ctx["tmp"], "clients", script_rel.replace("/", "_"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(ex(script_rel))
        out = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=300, cwd=ctx["tmp"])
        text = out.stdout + out.stderr
        assert out.returncode == 0 and "PASS" in out.stdout, f"exit {out.returncode}: {text.strip()[-600:]}"

    return check


EXAMPLES = [
    ("examples/add_sub", {"add_sub": example("add_sub", "model.py", "config.pbtxt")}, "add_sub/client.py"),
    ("examples/bls sync", {"bls_sync": example("bls", "sync_model.py", "sync_config.pbtxt")}, "bls/sync_client.py"),
    (
        "examples/bls async",
        {"bls_async": example("bls", "async_model.py", "async_config.pbtxt")},
        "bls/async_client.py",
    ),
    (
        "examples/decoupled repeat",
        {"repeat_int32": example("decoupled", "repeat_model.py", "repeat_config.pbtxt")},
        "decoupled/repeat_client.py",
    ),
    (
        "examples/decoupled square",
        {"square_int32": example("decoupled", "square_model.py", "square_config.pbtxt")},
        "decoupled/square_client.py",
    ),
    (
        "examples/auto_complete",
        {
            "nobatch_auto_complete": example("auto_complete", "nobatch_model.py", None),
            "batch_auto_complete": example("auto_complete", "batch_model.py", None),
        },
        "auto_complete/client.py",
    ),
    (
        "examples/bls_decoupled sync",
        {"bls_decoupled_sync": example("bls_decoupled", "sync_model.py", "sync_config.pbtxt")},
        "bls_decoupled/sync_client.py",
    ),
    (
        "examples/bls_decoupled async",
        {"bls_decoupled_async": example("bls_decoupled", "async_model.py", "async_config.pbtxt")},
        "bls_decoupled/async_client.py",
    ),
    (
        "examples/custom_metrics",
        {"custom_metrics": example("custom_metrics", "model.py", "config.pbtxt")},
        "custom_metrics/client.py",
    ),
]

for _name, _models, _client in EXAMPLES:
    CASES.append(Case(_name, _models, run_client(_client), group="examples"))

# The examples' models that call each other: BLS examples need add_sub and pytorch, and the
# decoupled BLS examples need square_int32.
EXAMPLE_DEPENDENCIES = {"add_sub", "square_int32"}

try:
    import torch  # noqa: F401 - only whether it is there

    _TORCH = None
except ImportError:
    _TORCH = "needs torch (not numpy-only), which this Python does not have"
# The BLS examples call the pytorch example model too, so it runs whenever torch is there.
CASES.append(
    Case(
        "examples/pytorch",
        {"pytorch": example("pytorch", "model.py", "config.pbtxt")},
        run_client("pytorch/client.py"),
        group="examples",
        skip=_TORCH,
    )
)
CASES.append(Case("examples/jax", {}, None, group="examples", skip="needs jax (not numpy-only)"))
CASES.append(Case("examples/instance_kind", {}, None, group="examples", skip="needs torch and a GPU (resnet50)"))
CASES.append(Case("examples/preprocessing", {}, None, group="examples", skip="needs TensorRT and a GPU"))

for _name, _why in [
    (
        "bls, bls_async, dlpack_*, identity_bf16, pytorch_fp32_fp32, variable_gpu_output",
        "need torch or cupy (not numpy-only)",
    ),
    ("add_sub_gpu, ensemble_gpu, cuda_memory_consumer", "need a GPU"),
    ("bls_onnx_warmup", "needs the ONNX Runtime C++ backend and torch"),
    ("torchvision/resnet50", "needs torchvision"),
]:
    CASES.append(Case(_name, {}, None, skip=_why))


# ---------------------------------------------------------------- driving tritium


class Tritium:
    def __init__(self, binary, python, repo, log_path, env, ports=None, extra=()):
        self.http_port, self.grpc_port, self.metrics_port = ports or (free_port(), free_port(), free_port())
        self.log_path = log_path
        args = [binary, "serve", "--model-repository", repo, "--python", python]
        args += ["--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port)]
        args += ["--metrics-port", str(self.metrics_port), "--log-verbose", "1"] + list(extra)
        full_env = dict(os.environ)
        full_env.update(env)
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=full_env)

    def get(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except OSError:
            return None, b""

    def index(self):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http_port}/v2/repository/index", data=b"{}", method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            return []

    def settle(self, models, timeout=120):
        """Waits until every model is READY or UNAVAILABLE (or the server died)."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            states = {m["name"]: m.get("state", "") for m in self.index()}
            if models and all(states.get(m) in ("READY", "UNAVAILABLE") for m in models):
                return
            time.sleep(0.2)

    def live(self, timeout=60):
        """Waits until the server answers /v2/health/live (explicit model control: nothing loads)."""
        deadline = time.time() + timeout
        while time.time() < deadline and self.proc.poll() is None:
            if self.get("/v2/health/live")[0] == 200:
                return
            time.sleep(0.2)

    def ready(self, model):
        return self.get(f"/v2/models/{model}/ready")[0] == 200

    def reason(self, model):
        for m in self.index():
            if m["name"] == model:
                return m.get("reason", "")
        return "(not in the repository index)"

    def stop(self):
        if self.log.closed:
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def run_group(group, cases, args, tmp):
    """Lays out one repository for `cases`, starts tritium on it, runs their checks."""
    results = []
    repo = os.path.join(tmp, group, "models")
    if group == "init_args":
        # init_args expects its repository at $TRITON_DIR/qa/L0_backend_python/models.
        repo = os.path.join(tmp, group, "qa", "L0_backend_python", "models")
    os.makedirs(repo, exist_ok=True)
    runnable = []
    for c in cases:
        try:
            for model, build in c.models.items():
                for rel, data in build().items():
                    dest = os.path.join(repo, model, rel)
                    os.makedirs(os.path.dirname(dest), exist_ok=True)
                    with open(dest, "wb") as f:
                        f.write(data)
            runnable.append(c)
        except FileNotFoundError as e:
            results.append((c, "FAIL", f"upstream file missing: {e}"))
    env = {}
    for c in runnable:
        env.update(c.env)
    if group == "init_args":
        env["TRITON_DIR"] = os.path.join(tmp, group)
    gdir = os.path.join(tmp, group)
    for rel, data in GROUP_FILES.get(group, dict)().items():
        dest = os.path.join(gdir, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with open(dest, "wb") as f:
            f.write(data)
    extra = GROUP_ARGS.get(group, lambda d: [])(gdir)
    ports = (8000, 8001, 8002) if group == "examples" else None
    server = Tritium(args.tritium, args.python, repo, os.path.join(tmp, f"{group}.log"), env, ports, extra)
    explicit = group in EXPLICIT
    try:
        names = sorted(os.listdir(repo))
        if explicit:
            server.live()
        else:
            server.settle(names)
        ctx = {
            "http": f"127.0.0.1:{server.http_port}",
            "grpc": f"127.0.0.1:{server.grpc_port}",
            "ready": server.ready,
            "reason": server.reason,
            "tmp": os.path.join(tmp, group),
            "log": lambda: open(server.log_path, errors="replace").read(),
            "stop": server.stop,
        }
        for c in runnable:
            not_ready = [] if explicit else [m for m in c.models if m not in c.load_fails and not server.ready(m)]
            if not_ready:
                reasons = "; ".join(
                    f"{m}: {server.reason(m).splitlines()[0] if server.reason(m) else 'not ready'}" for m in not_ready
                )
                results.append((c, "FAIL", f"did not load: {reasons}"))
                continue
            try:
                c.check(ctx)
                results.append((c, "PASS", ""))
            except AssertionError as e:
                results.append((c, "FAIL", str(e) or traceback.format_exc().strip().splitlines()[-1]))
            except Exception as e:  # noqa: BLE001 - a client error is the case's failure
                results.append((c, "FAIL", f"{type(e).__name__}: {e}"))
    finally:
        code = server.stop()
        if code not in (0, None):
            results.append((Case(f"(server for {group})", {}, None), "FAIL", f"tritium exited with {code} on SIGTERM"))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton-server", required=True)
    parser.add_argument("--python-backend", required=True)
    parser.add_argument("--tritium", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the temporary repositories and logs")
    parser.add_argument("--full", action="store_true", help="print each reason whole, not its first 400 characters")
    parser.add_argument("cases", nargs="*", help="run only the cases whose name contains one of these")
    args = parser.parse_args()
    global SERVER, BACKEND
    SERVER, BACKEND = Source(args.triton_server), Source(args.python_backend)
    print(f"compat: triton-inference-server/server {SERVER.revision()}, python_backend {BACKEND.revision()}")
    selected = [c for c in CASES if not args.cases or any(s in c.name for s in args.cases)]
    tmp = tempfile.mkdtemp(prefix="tritium-compat-")
    groups = {}
    for c in selected:
        if c.skip is None:
            groups.setdefault(c.group, []).append(c)
    if "examples" in groups:
        # The BLS examples call add_sub (and pytorch); the decoupled BLS ones call square_int32.
        names = {m for c in groups["examples"] for m in c.models}
        for dep, (_, models, _) in zip(["add_sub", "square_int32"], [EXAMPLES[0], EXAMPLES[4]]):
            if dep not in names:
                groups["examples"].append(Case(f"(dependency {dep})", models, lambda ctx: None, group="examples"))
    results = []
    for group, cases in groups.items():
        results += run_group(group, cases, args, tmp)
    results = [r for r in results if not r[0].name.startswith("(dependency")]
    for c in selected:
        if c.skip is not None:
            results.append((c, "SKIP", c.skip))
    width = max(len(c.name) for c, _, _ in results) if results else 0
    for c, verdict, reason in results:
        line = f"{verdict:4}  {c.name:{width}}"
        if reason:
            line += "  " + (reason if args.full else " ".join(reason.split())[:400])
        print(line)
    counts = {v: sum(1 for _, verdict, _ in results if verdict == v) for v in ("PASS", "FAIL", "SKIP")}
    print(
        f"compat: {counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped (not numpy-only or need a GPU)"
    )
    if args.keep:
        print(f"compat: repositories and logs in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
