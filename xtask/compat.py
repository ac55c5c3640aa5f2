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

    def ready(self, model):
        return self.get(f"/v2/models/{model}/ready")[0] == 200

    def reason(self, model):
        for m in self.index():
            if m["name"] == model:
                return m.get("reason", "")
        return "(not in the repository index)"

    def stop(self):
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
    ports = (8000, 8001, 8002) if group == "examples" else None
    server = Tritium(args.tritium, args.python, repo, os.path.join(tmp, f"{group}.log"), env, ports)
    try:
        names = sorted(os.listdir(repo))
        server.settle(names)
        ctx = {
            "http": f"127.0.0.1:{server.http_port}",
            "grpc": f"127.0.0.1:{server.grpc_port}",
            "ready": server.ready,
            "reason": server.reason,
            "tmp": os.path.join(tmp, group),
            "log": lambda: open(server.log_path, errors="replace").read(),
        }
        for c in runnable:
            not_ready = [m for m in c.models if m not in c.load_fails and not server.ready(m)]
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
            line += "  " + " ".join(reason.split())[:400]
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
