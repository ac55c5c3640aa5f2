"""`cargo xtask compare`: the same HTTP and gRPC requests to Triton and to tritium serving one
repository, and every answer that differs (status and body; configs key by key; statistics by
their keys). A report for people: it exits 0 whatever it finds, with the number of differences."""

import argparse
import json
import queue
import re
import time
import urllib.error
import urllib.request

import numpy as np
import tritonclient.grpc as g
import tritonclient.http as h
from tritonclient.utils import InferenceServerException

MODELS = [
    "add_sub",
    "batched_scale",
    "stream_words",
    "sequence_accumulate",
    "ensemble_pipeline",
    "preprocess",
    "reshaped",
    "misbehaving",
    "introspect",
    "outputs",
    "bls_probe",
    "sender_probe",
    "auto_probe",
    "cached",
]


def http(url, method, path, body=None):
    req = urllib.request.Request(f"http://{url}{path}", method=method, data=body)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def norm(body):
    try:
        return json.loads(body)
    except ValueError:
        return body[:300]


def wait_models(url):
    deadline = time.time() + 300
    for m in MODELS:
        while http(url, "GET", f"/v2/models/{m}/ready")[0] != 200:
            if time.time() > deadline:
                raise SystemExit(f"{m} never became ready on {url}")
            time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser()
    for name in ("triton-http", "triton-grpc", "tritium-http", "tritium-grpc", "triton-metrics", "tritium-metrics"):
        ap.add_argument("--" + name, required=True)
    a = ap.parse_args()
    wait_models(a.triton_http)
    wait_models(a.tritium_http)
    diffs = []

    def compare(name, triton, tritium):
        if triton != tritium:
            diffs.append(name)
            print(f"--- {name}\n  triton : {triton}\n  tritium: {tritium}")

    probes = (
        [
            ("GET", "/v2/models/add_sub", None),
            ("GET", "/v2/models/add_sub/versions/1", None),
            ("GET", "/v2/models/nope", None),
            ("GET", "/v2/models/add_sub/versions/7", None),
            ("GET", "/v2/models/broken_init/ready", None),
            ("GET", "/v2/models/nope/ready", None),
            ("GET", "/v2/health/ready", None),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[3],"datatype":"FP32","data":[1,2,3]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"INT32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUTX","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"outputs":[{"name":"NOPE"}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"outputs":[{"name":"OUTPUT1"}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":["a",2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            ("POST", "/v2/models/add_sub/infer", b'{"inputs":'),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"id":"my-id","parameters":{"x":1},"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[[1,2],[3,4]]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            ("POST", "/v2/models/nope/infer", b'{"inputs":[]}'),
            ("POST", "/v2/models/stream_words/infer", b'{"inputs":[]}'),
            (
                "POST",
                "/v2/models/batched_scale/infer",
                b'{"inputs":[{"name":"X","shape":[100,4],"datatype":"FP32","data":[0]}]}',
            ),
            ("POST", "/v2/repository/models/add_sub/load", b""),
            ("POST", "/v2/repository/models/add_sub/unload", b""),
            ("GET", "/v2/models/add_sub/trace/setting", None),
            ("GET", "/v2/logging", None),
            ("GET", "/v2/systemsharedmemory/status", None),
            ("GET", "/v2/cudasharedmemory/status", None),
            ("POST", "/v2/systemsharedmemory/region/x/register", b'{"key":"/nope","byte_size":8}'),
            ("GET", "/v2/models/stats", None),
            ("GET", "/v2/nope", None),
            ("GET", "/v2/models/nope/stats", None),
            ("GET", "/v2/models/add_sub/versions/9/stats", None),
            ("GET", "/v2/models/sequence_accumulate", None),
            (
                "POST",
                "/v2/models/sequence_accumulate/infer",
                b'{"inputs":[{"name":"INPUT","shape":[1,1],"datatype":"INT32","data":[1]}]}',
            ),
            (
                "POST",
                "/v2/models/sequence_accumulate/infer",
                b'{"parameters":{"sequence_id":5,"sequence_end":true},"inputs":[{"name":"INPUT","shape":[1,1],"datatype":"INT32","data":[1]}]}',
            ),
            (
                "POST",
                "/v2/models/sequence_accumulate/infer",
                b'{"parameters":{"sequence_id":7,"sequence_start":true},"inputs":[{"name":"INPUT","shape":[1,1],"datatype":"INT32","data":[3]}]}',
            ),
            (
                "POST",
                "/v2/models/sequence_accumulate/infer",
                b'{"parameters":{"sequence_id":7},"inputs":[{"name":"INPUT","shape":[1,1],"datatype":"INT32","data":[4]}]}',
            ),
            (
                "POST",
                "/v2/models/sequence_accumulate/infer",
                b'{"parameters":{"sequence_id":7,"sequence_end":true},"inputs":[{"name":"INPUT","shape":[1,1],"datatype":"INT32","data":[5]}]}',
            ),
            (
                "POST",
                "/v2/models/batched_scale/infer",
                b'{"inputs":[{"name":"X","shape":[9,4],"datatype":"FP32","data":[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]}]}',
            ),
            (
                "POST",
                "/v2/models/batched_scale/infer",
                b'{"inputs":[{"name":"X","shape":[4],"datatype":"FP32","data":[0,0,0,0]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"outputs":[{"name":"OUTPUT0","parameters":{"classification":2}}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]},{"name":"EXTRA","shape":[1],"datatype":"FP32","data":[1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4],"parameters":{"binary_data_size":16}},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP64","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[-4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"XYZ","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"parameters":{"priority":5}}',
            ),
            (
                "POST",
                "/v2/models/add_sub/infer",
                b'{"inputs":[{"name":"INPUT0","shape":[4],"datatype":"FP32","data":[1,2,3,4]},{"name":"INPUT1","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"parameters":{"timeout":5}}',
            ),
            (
                "POST",
                "/v2/models/preprocess/infer",
                b'{"inputs":[{"name":"IMAGE","shape":[1,1],"datatype":"BYTES","data":["not an image"]}]}',
            ),
            ("POST", "/v2/models/ensemble_pipeline/infer", b'{"inputs":[]}'),
        ]
        + [
            # An ensemble: whole, one output asked for, a wrong dtype, a wrong shape, one input missing.
            ("POST", "/v2/models/ensemble_pipeline/infer", body)
            for body in (
                b'{"id":"e1","inputs":[{"name":"A","shape":[4],"datatype":"FP32","data":[1,2,3,4]},'
                b'{"name":"B","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
                b'{"inputs":[{"name":"A","shape":[4],"datatype":"FP32","data":[1,2,3,4]},'
                b'{"name":"B","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"outputs":[{"name":"TWICE_B"}]}',
                b'{"inputs":[{"name":"A","shape":[4],"datatype":"INT32","data":[1,2,3,4]},'
                b'{"name":"B","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
                b'{"inputs":[{"name":"A","shape":[3],"datatype":"FP32","data":[1,2,3]},'
                b'{"name":"B","shape":[4],"datatype":"FP32","data":[1,1,1,1]}]}',
                b'{"inputs":[{"name":"A","shape":[4],"datatype":"FP32","data":[1,2,3,4]}]}',
                b'{"inputs":[{"name":"A","shape":[4],"datatype":"FP32","data":[1,2,3,4]},'
                b'{"name":"B","shape":[4],"datatype":"FP32","data":[1,1,1,1]}],"outputs":[{"name":"SUM"}]}',
            )
        ]
        + [
            ("GET", "/v2/models/ensemble_pipeline/stats", None),
            ("GET", "/v2/models/ensemble_pipeline", None),
            ("GET", "/v2/models/preprocess", None),
            ("GET", "/v2/models/stream_words", None),
            ("POST", "/v2/models/stream_words/generate", b'{"text":"a b c"}'),
            ("POST", "/v2/models/add_sub/generate", b'{"INPUT0":[1,2,3,4],"INPUT1":[1,1,1,1]}'),
            (
                "POST",
                "/v2/models/reshaped/infer",
                b'{"inputs":[{"name":"X","shape":[2,4],"datatype":"FP32","data":[0,1,2,3,4,5,6,7]},'
                b'{"name":"S","shape":[2,1],"datatype":"INT32","data":[1,2]}]}',
            ),
            ("POST", "/v2/models/reshaped/infer", b'{"id":5,"inputs":[]}'),
            ("POST", "/v2/models/reshaped/versions/3/infer", b'{"id":5,"inputs":[]}'),
        ]
        + [
            (
                "POST",
                "/v2/models/misbehaving/infer",
                b'{"inputs":[{"name":"MODE","shape":[1],"datatype":"INT32","data":[%d]}]}' % mode,
            )
            for mode in range(6)
        ]
    )
    for method, path, body in probes:
        ta = http(a.triton_http, method, path, body)
        tb = http(a.tritium_http, method, path, body)
        na, nb = norm(ta[1]), norm(tb[1])
        if isinstance(na, dict) and isinstance(nb, dict) and "model_stats" in na:
            ka = sorted(na["model_stats"][0].keys()) if na["model_stats"] else []
            kb = sorted(nb["model_stats"][0].keys()) if nb.get("model_stats") else []
            compare(f"{method} {path} (statistics keys)", (ta[0], ka), (tb[0], kb))
            continue
        compare(f"{method} {path}", (ta[0], na), (tb[0], nb))

    for m in MODELS:
        ca = json.loads(http(a.triton_http, "GET", f"/v2/models/{m}/config")[1])
        cb = json.loads(http(a.tritium_http, "GET", f"/v2/models/{m}/config")[1])
        for k in sorted(set(ca) | set(cb)):
            compare(f"{m} config[{k}]", ca.get(k), cb.get(k))

    ga, gb = g.InferenceServerClient(a.triton_grpc), g.InferenceServerClient(a.tritium_grpc)

    # The same configs and metadata over gRPC (the protobuf messages as dicts).
    for m in MODELS:
        for what, call in (
            ("config", lambda c, m=m: c.get_model_config(m, as_json=True)),
            ("metadata", lambda c, m=m: c.get_model_metadata(m, as_json=True)),
        ):
            try:
                va, vb = call(ga), call(gb)
            except InferenceServerException as e:
                compare(f"grpc {what} of {m} raised", "", e.message())
                continue
            for path, x, y in differences(va, vb, f"grpc {what} of {m}"):
                compare(path, x, y)

    def gerr(c, call):
        try:
            return ("ok", str(call(c))[:300])
        except InferenceServerException as e:
            return (e.status(), e.message())

    def inp(shape, dtype="FP32", data=None):
        i = g.InferInput("INPUT0", shape, dtype)
        i.set_data_from_numpy(data if data is not None else np.ones(shape, dtype=np.float32))
        j = g.InferInput("INPUT1", [4], "FP32")
        j.set_data_from_numpy(np.ones(4, dtype=np.float32))
        return [i, j]

    gprobes = {
        "infer ok": lambda c: c.infer("add_sub", inp([4])).as_numpy("OUTPUT0").tolist(),
        "infer bad shape": lambda c: c.infer("add_sub", inp([3], data=np.ones(3, dtype=np.float32))),
        "infer bad dtype": lambda c: c.infer("add_sub", inp([4], "INT32", np.ones(4, dtype=np.int32))),
        "infer unknown model": lambda c: c.infer("nope", inp([4])),
        "infer decoupled": lambda c: c.infer("stream_words", []),
        "metadata unknown": lambda c: c.get_model_metadata("nope"),
        "config unknown": lambda c: c.get_model_config("nope"),
        "ready broken": lambda c: c.is_model_ready("broken_init"),
        "stats unknown": lambda c: c.get_inference_statistics("nope"),
        "load in none mode": lambda c: c.load_model("add_sub"),
        "trace settings": lambda c: c.get_trace_settings(),
        "log settings": lambda c: c.get_log_settings(),
        "metadata": lambda c: c.get_model_metadata("add_sub"),
        "server metadata": lambda c: c.get_server_metadata(),
    }
    for name, call in gprobes.items():
        compare("grpc " + name, gerr(ga, call), gerr(gb, call))
    introspect_probes = introspect(a, ga, gb)
    for name, (ta, tb) in introspect_probes.items():
        for path, va, vb in differences(ta, tb, name):
            compare(path, va, vb)
    output_probes = outputs(a, ga, gb)
    for name, (ta, tb) in output_probes.items():
        compare(name, ta, tb)
    composed = bls_and_streams(a)
    for name, (ta, tb) in composed.items():
        for path, va, vb in differences(ta, tb, name):
            compare(path, va, vb)
    # /metrics: the families each server exports, with their label names (values differ).
    fa, fb = metric_families(a.triton_metrics), metric_families(a.tritium_metrics)
    # tritium's own families (`tritium_*`) are not Triton's to have.
    for name in sorted(n for n in set(fa) | set(fb) if not n.startswith("tritium_")):
        compare(f"/metrics family {name}", fa.get(name, "<absent>"), fb.get(name, "<absent>"))
    cached = cache_probes(a)
    for name, (ta, tb) in cached.items():
        for path, va, vb in differences(ta, tb, name):
            compare(path, va, vb)
    total = len(cached) + len(probes) + len(gprobes) + len(introspect_probes) + len(output_probes) + len(composed)
    print(f"{len(diffs)} differences in {total} requests and {len(MODELS)} configs")


def cache_probes(a):
    """The `cached` model (response cache on): the answers to a request, the same again (a hit),
    another (a miss), then the model's statistics counts (durations left out)."""

    def call(url, x):
        body = json.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": x}]}).encode()
        status, text = http(url, "POST", "/v2/models/cached/infer", body)
        return [status, norm(text)]

    def counts(value):
        if isinstance(value, dict):
            return {k: counts(v) for k, v in value.items() if k not in ("ns", "last_inference")}
        if isinstance(value, list):
            return [counts(v) for v in value]
        return value

    found = {}
    for step, x in enumerate(([1, 2], [1, 2], [3, 4])):
        found[f"cached request {step}"] = (call(a.triton_http, x), call(a.tritium_http, x))
    stats = [json.loads(http(url, "GET", "/v2/models/cached/stats")[1]) for url in (a.triton_http, a.tritium_http)]
    found["cached statistics"] = tuple(counts(s) for s in stats)
    return found


def metric_families(url):
    """{family: sorted label names of its series} from a /metrics page."""
    with urllib.request.urlopen(f"http://{url}/metrics", timeout=30) as r:
        text = r.read().decode()
    families = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        labels = sorted(re.findall(r'(\w+)="', line.split("}", 1)[0])) if "{" in line else []
        families.setdefault(name, set()).add(",".join(labels))
    return {name: sorted(sets) for name, sets in families.items()}


def differences(a, b, path):
    """(path, a's value, b's value) for every leaf where the two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            yield from differences(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from differences(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b


def introspect(a, ga, gb):
    """The `introspect` model's reports (what model code sees) for the same requests to each
    server, over HTTP and gRPC: {probe: (Triton's, tritium's)}."""

    def report(answer):
        if isinstance(answer, dict) and "outputs" in answer:
            out = {o["name"]: o for o in answer["outputs"]}
            rep = json.loads(out["REPORT"]["data"][0]) if "REPORT" in out else None
            return {
                "report": rep,
                "outputs": {
                    k: {"shape": v["shape"], "datatype": v["datatype"], "data": v.get("data")}
                    for k, v in out.items()
                    if k != "REPORT"
                },
            }
        return answer

    def post(url, body):
        status, text = http(url, "POST", "/v2/models/introspect/infer", json.dumps(body).encode())
        try:
            return [status, report(json.loads(text))]
        except ValueError:
            return [status, text]

    inputs = [
        {"name": "S", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "bc"]},
        {"name": "B", "shape": [1, 2], "datatype": "BOOL", "data": [True, False]},
        # FP16 (input H) cannot travel as JSON; gRPC sends it.
    ]
    bodies = {
        "http everything": {
            "id": "r1",
            "parameters": {"p": "x", "n": 3, "b": True, "f": 1.5},
            "inputs": inputs,
            "outputs": [{"name": "REPORT"}],
        },
        "http optional input": {
            "inputs": inputs + [{"name": "OPT", "shape": [1, 1], "datatype": "INT64", "data": [7]}]
        },
        "http sequence flags on a plain model": {
            "parameters": {"sequence_id": 9, "sequence_start": True},
            "inputs": inputs,
        },
        "http timeout": {"parameters": {"timeout": 5000000}, "inputs": inputs},
        "http object parameter": {"parameters": {"obj": {"a": 1}}, "inputs": inputs},
        "http array parameter": {"parameters": {"arr": [1]}, "inputs": inputs},
        "http null parameter": {"parameters": {"nil": None}, "inputs": inputs},
        "http number parameters": {"parameters": {"neg": -5, "big": 18446744073709551615, "f": 2.5}, "inputs": inputs},
    }
    found = {}
    for name, body in bodies.items():
        found[name] = (post(a.triton_http, body), post(a.tritium_http, body))

    def ginfer(c, **kw):
        s = g.InferInput("S", [1, 3], "BYTES")
        s.set_data_from_numpy(np.array([[b"\xff\x00z", "é".encode(), b""]], dtype=np.object_))
        b = g.InferInput("B", [1, 2], "BOOL")
        b.set_data_from_numpy(np.array([[False, True]]))
        h = g.InferInput("H", [1, 2], "FP16")
        h.set_data_from_numpy(np.array([[0.25, 65504]], dtype=np.float16))
        try:
            r = c.infer("introspect", [s, b, h], **kw)
        except InferenceServerException as e:
            return [e.status(), e.message()]
        echo = r.as_numpy("ECHO_S")
        return [
            "ok",
            {
                "report": json.loads(r.as_numpy("REPORT").reshape(-1)[0]),
                "echo": [repr(x) for x in echo.reshape(-1)],
                "echo_shape": list(echo.shape),
                "parameters": {k: str(v) for k, v in r.get_response().parameters.items()},
            },
        ]

    gcalls = {
        "grpc everything": {"request_id": "g1", "parameters": {"p": "x", "n": 3, "b": True, "f": 1.5}},
        "grpc requested output": {"outputs": [g.InferRequestedOutput("REPORT"), g.InferRequestedOutput("ECHO_S")]},
        "grpc string sequence id on a plain model": {"sequence_id": "abc", "sequence_start": True},
    }
    for name, kw in gcalls.items():
        found[name] = (ginfer(ga, **kw), ginfer(gb, **kw))
    return found


def outputs(a, ga, gb):
    """The `outputs` model's answers in each MODE (dtypes, error codes, odd responses) as clients
    see them: JSON over HTTP, tritonclient's binary HTTP, and gRPC with every output or FP32
    alone. {probe: (Triton's, tritium's)}."""
    mode_input = {"name": "MODE", "shape": [1], "datatype": "INT32"}

    def json_call(url, mode):
        body = json.dumps({"inputs": [dict(mode_input, data=[mode])]}).encode()
        status, text = http(url, "POST", "/v2/models/outputs/infer", body)
        return status, norm(text)

    def binary_call(url, mode):
        i = h.InferInput("MODE", [1], "INT32")
        i.set_data_from_numpy(np.array([mode], dtype=np.int32), binary_data=True)
        try:
            r = h.InferenceServerClient(url).infer("outputs", [i])
        except InferenceServerException as e:
            return e.status(), e.message()
        resp = r.get_response()
        got = {o["name"]: (o["datatype"], o["shape"], repr(r.as_numpy(o["name"]).tolist())) for o in resp["outputs"]}
        return got, resp.get("parameters")

    def grpc_call(client, mode, only=None):
        i = g.InferInput("MODE", [1], "INT32")
        i.set_data_from_numpy(np.array([mode], dtype=np.int32))
        try:
            r = client.infer("outputs", [i], outputs=[g.InferRequestedOutput(o) for o in only] if only else None)
        except InferenceServerException as e:
            return e.status(), e.message()
        resp = r.get_response()
        got = {o.name: (o.datatype, list(o.shape), repr(r.as_numpy(o.name).tolist())) for o in resp.outputs}
        return got, {k: str(v) for k, v in resp.parameters.items()}

    found = {}
    for mode in range(16):
        found[f"outputs mode {mode} http json"] = (json_call(a.triton_http, mode), json_call(a.tritium_http, mode))
        found[f"outputs mode {mode} http binary"] = (
            binary_call(a.triton_http, mode),
            binary_call(a.tritium_http, mode),
        )
        found[f"outputs mode {mode} grpc"] = (grpc_call(ga, mode), grpc_call(gb, mode))
        found[f"outputs mode {mode} grpc FP32 only"] = (grpc_call(ga, mode, ["FP32"]), grpc_call(gb, mode, ["FP32"]))
    return found


def bls_and_streams(a):
    """What BLS calls return to model code (`bls_probe`, each MODE) and what a gRPC stream
    client receives from a decoupled model's response sender (`sender_probe`, each MODE, with
    and without `enable_empty_final_response`). {probe: (Triton's, tritium's)}."""

    def bls(url, mode):
        body = json.dumps({"inputs": [{"name": "MODE", "shape": [1], "datatype": "INT32", "data": [mode]}]})
        status, text = http(url, "POST", "/v2/models/bls_probe/infer", body.encode())
        try:
            return [status, json.loads(json.loads(text)["outputs"][0]["data"][0])]
        except (ValueError, KeyError, IndexError):
            return [status, norm(text)]

    def stream(url, mode, empty_final):
        client = g.InferenceServerClient(url)
        answers = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        i = g.InferInput("MODE", [1], "INT32")
        i.set_data_from_numpy(np.array([mode], dtype=np.int32))
        client.async_stream_infer("sender_probe", [i], enable_empty_final_response=empty_final)
        got = []
        # Whatever comes within 3 s: a stream that never ends is a difference too.
        deadline = time.time() + 3
        while time.time() < deadline:
            try:
                result, error = answers.get(timeout=max(0.01, deadline - time.time()))
            except queue.Empty:
                break
            if error is not None:
                got.append(["error", error.status(), error.message()])
                continue
            resp = result.get_response()
            params = {k: str(v).strip() for k, v in resp.parameters.items()}
            got.append(["response", {o.name: result.as_numpy(o.name).tolist() for o in resp.outputs}, params])
            if params.get("triton_final_response") == "bool_param: true":
                break
        client.stop_stream()
        return got

    def sequence(client, steps):
        """Each step `(sequence_id, start, end, value)` on sequence_accumulate: its OUTPUT, or
        its error."""
        got = []
        for seq, start, end, value in steps:
            i = g.InferInput("INPUT", [1, 1], "INT32")
            i.set_data_from_numpy(np.array([[value]], dtype=np.int32))
            try:
                r = client.infer("sequence_accumulate", [i], sequence_id=seq, sequence_start=start, sequence_end=end)
                got.append(r.as_numpy("OUTPUT").tolist())
            except InferenceServerException as e:
                got.append([e.status(), e.message()])
        return got

    found = {}
    sequences = {
        "interleaved": [
            (11, True, False, 1),
            (12, True, False, 10),
            (11, False, False, 2),
            (12, False, True, 20),
            (11, False, True, 3),
        ],
        "no start": [(21, False, False, 1)],
        "end without start": [(22, False, True, 1)],
        "started twice": [(23, True, False, 1), (23, True, False, 5), (23, False, True, 1)],
        "after its end": [(24, True, True, 1), (24, False, False, 2)],
        "string id on a numeric model": [("abc", True, True, 1)],
        "id zero": [(0, True, True, 1)],
    }
    ga, gb = g.InferenceServerClient(a.triton_grpc), g.InferenceServerClient(a.tritium_grpc)
    for name, steps in sequences.items():
        found[f"sequence {name}"] = (sequence(ga, steps), sequence(gb, steps))
    for mode in range(13):
        found[f"bls mode {mode}"] = (bls(a.triton_http, mode), bls(a.tritium_http, mode))
    for mode in range(11):
        for empty_final in (True, False):
            name = f"stream mode {mode} empty_final={empty_final}"
            found[name] = (stream(a.triton_grpc, mode, empty_final), stream(a.tritium_grpc, mode, empty_final))
    return found


if __name__ == "__main__":
    main()
