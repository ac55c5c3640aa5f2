"""Tracing end to end: the real server exports OpenTelemetry spans over OTLP/HTTP (protobuf) to a
collector in the test, in the caller's trace (W3C `traceparent` over HTTP and gRPC), with a
model's BLS calls as children of its request; `rate` and `count` are honoured; the trace
extension (`/v2/trace/setting`, gRPC `TraceSetting`) reads and updates the settings with
Triton's shapes and errors; triton mode writes Triton's JSON trace file; `--model-config-name`
picks a config variant."""

import http.server
import json
import os
import shutil
import subprocess
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import ROOT, binary, free_port
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from tritonclient.utils import InferenceServerException

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"

BLS_TRACED_CONFIG = """
name: "bls_traced"
backend: "python"
max_batch_size: 0
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "CONTEXT" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

BLS_TRACED_MODEL = '''
"""Calls add_sub with the request's trace (Triton's `trace=request.trace()`) and answers with
add_sub's OUTPUT0 and the trace context the model saw."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            bls = pb_utils.InferenceRequest(
                model_name="add_sub",
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
                requested_output_names=["OUTPUT0"],
                trace=request.trace(),
            )
            out = bls.exec()
            if out.has_error():
                raise pb_utils.TritonModelException(out.error().message())
            context = request.trace().get_context() or ""
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", pb_utils.get_output_tensor_by_name(out, "OUTPUT0").as_numpy()),
                        pb_utils.Tensor("CONTEXT", np.array([context.encode()], dtype=np.object_)),
                    ]
                )
            )
        return responses
'''


class Collector:
    """An OTLP/HTTP receiver: POST /v1/traces with an ExportTraceServiceRequest (protobuf)."""

    def __init__(self):
        self.spans = []
        self.posts = 0
        self.lock = threading.Lock()
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                if ok:
                    req = trace_service_pb2.ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with collector.lock:
                        collector.posts += 1
                        for rs in req.resource_spans:
                            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                            for ss in rs.scope_spans:
                                for span in ss.spans:
                                    collector.spans.append((resource, span))
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def wait(self, predicate, timeout=20):
        """The spans once `predicate(spans)` holds (fails the test after `timeout`)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            with self.lock:
                spans = [s for _, s in self.spans]
            if predicate(spans):
                return spans
            time.sleep(0.05)
        pytest.fail(f"spans never satisfied the test; got {[(s.name, s.trace_id.hex()) for s in spans]}")

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def collector():
    c = Collector()
    yield c
    c.stop()


def copy_models(repo, *names):
    for name in names:
        shutil.copytree(os.path.join(ROOT, "examples/models", name), os.path.join(repo, name))


def write_bls_traced(repo):
    os.makedirs(os.path.join(repo, "bls_traced", "1"))
    with open(os.path.join(repo, "bls_traced", "config.pbtxt"), "w") as f:
        f.write(BLS_TRACED_CONFIG)
    with open(os.path.join(repo, "bls_traced", "1", "model.py"), "w") as f:
        f.write(BLS_TRACED_MODEL)


def otel_args(collector, *extra):
    args = [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        f"--trace-config=opentelemetry,url={collector.url}",
        "--trace-config=opentelemetry,bsp_schedule_delay=20",
        "--trace-config=opentelemetry,resource=deployment=test",
    ]
    for e in extra:
        args.append(f"--trace-config={e}")
    return args


def traceparent(span=CALLER_SPAN, trace=TRACE_ID):
    return f"00-{trace}-{span}-01"


def http_inputs(module, model="add_sub"):
    a = np.arange(4, dtype=np.float32)
    inputs = [module.InferInput("INPUT0", [4], "FP32"), module.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs


def by_trace(spans, trace_hex):
    return [s for s in spans if s.trace_id.hex() == trace_hex]


def attrs(span):
    out = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def check_request_tree(spans, trace_hex, caller_span, model, request_id):
    """InferRequest (child of the caller) -> <model> (Triton's attributes, request events) ->
    compute (compute events); returns the three spans."""
    mine = by_trace(spans, trace_hex)
    root = next(s for s in mine if s.name == "InferRequest" and s.parent_span_id.hex() == caller_span)
    request = next(s for s in mine if s.name == model and s.parent_span_id == root.span_id)
    compute = next(s for s in mine if s.name == "compute" and s.parent_span_id == request.span_id)
    a = attrs(request)
    assert a["triton.model_name"] == model
    assert a["triton.model_version"] == 1
    assert a.get("triton.request_id", "") == request_id, "set when the client sent an id, as in Triton"
    assert "triton.trace_id" in a
    assert [e.name for e in request.events] == ["REQUEST_START", "QUEUE_START", "REQUEST_END"]
    assert [e.name for e in compute.events] == [
        "COMPUTE_START",
        "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START",
        "COMPUTE_END",
    ]
    times = [e.time_unix_nano for e in request.events]
    assert times == sorted(times)
    assert root.start_time_unix_nano <= compute.start_time_unix_nano <= compute.end_time_unix_nano
    assert compute.end_time_unix_nano <= root.end_time_unix_nano
    assert abs(root.start_time_unix_nano / 1e9 - time.time()) < 60, "timestamps are wall-clock nanoseconds"
    return root, request, compute


def test_http_and_grpc_requests_join_the_callers_trace(start, collector):
    copy_models(start.repo, "add_sub")
    # A huge rate: only requests that carry a trace context are traced.
    srv = start(["add_sub"], otel_args(collector, "rate=1000000"))
    h = httpclient.InferenceServerClient(srv.http_url)
    h.infer("add_sub", http_inputs(httpclient), request_id="h1", headers={"traceparent": traceparent()})
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    grpc_trace = "0af7651916cd43dd8448eb211c80319c"
    g.infer(
        "add_sub",
        http_inputs(grpcclient),
        request_id="g1",
        headers={"traceparent": traceparent("b7ad6b7169203331", grpc_trace)},
    )
    # Untraced requests (no context, or an invalid one) send nothing.
    h.infer("add_sub", http_inputs(httpclient), headers={"traceparent": "00-zz-zz-01"})
    h.infer("add_sub", http_inputs(httpclient))
    spans = collector.wait(lambda s: len(by_trace(s, TRACE_ID)) >= 3 and len(by_trace(s, grpc_trace)) >= 3)
    check_request_tree(spans, TRACE_ID, CALLER_SPAN, "add_sub", "h1")
    check_request_tree(spans, grpc_trace, "b7ad6b7169203331", "add_sub", "g1")
    time.sleep(0.3)
    with collector.lock:
        assert len(collector.spans) == 6, [(s.name, s.trace_id.hex()) for _, s in collector.spans]
        resource = collector.spans[0][0]
    assert resource["service.name"] == "triton-inference-server"
    assert resource["deployment"] == "test"


def test_bls_calls_are_children_of_the_calling_request(start, collector):
    copy_models(start.repo, "add_sub", "bls_add_sub")
    write_bls_traced(start.repo)
    srv = start(["add_sub", "bls_add_sub", "bls_traced"], otel_args(collector, "rate=1000000"))
    h = httpclient.InferenceServerClient(srv.http_url)
    result = h.infer("bls_traced", http_inputs(httpclient), request_id="b1", headers={"traceparent": traceparent()})
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), np.arange(4) * 2)
    context = json.loads(result.as_numpy("CONTEXT")[0].decode())
    assert context["traceparent"].startswith(f"00-{TRACE_ID}-")
    # Explicit: InferenceRequest(..., trace=request.trace()).
    spans = collector.wait(lambda s: len(by_trace(s, TRACE_ID)) >= 5)
    _, _, compute = check_request_tree(spans, TRACE_ID, CALLER_SPAN, "bls_traced", "b1")
    assert context["traceparent"].split("-")[2] == compute.span_id.hex()
    child = next(s for s in by_trace(spans, TRACE_ID) if s.name == "add_sub")
    assert child.parent_span_id == compute.span_id, "the BLS call hangs off the caller's compute span"
    assert not any(s.name == "InferRequest" and s.parent_span_id == compute.span_id for s in spans)
    assert any(s.name == "compute" and s.parent_span_id == child.span_id for s in spans)
    # Implicit (a model that does not pass trace=): the executing request's trace.
    other = "11111111111111111111111111111111"
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    g.infer("bls_add_sub", http_inputs(grpcclient), headers={"traceparent": traceparent(trace=other)})
    spans = collector.wait(lambda s: len(by_trace(s, other)) >= 5)
    _, _, compute = check_request_tree(spans, other, CALLER_SPAN, "bls_add_sub", "")
    child = next(s for s in by_trace(spans, other) if s.name == "add_sub")
    assert child.parent_span_id == compute.span_id


def test_rate_and_count_are_honoured(start, collector):
    copy_models(start.repo, "add_sub")
    srv = start(["add_sub"], otel_args(collector, "rate=2", "count=3"))
    h = httpclient.InferenceServerClient(srv.http_url)
    for _ in range(10):
        h.infer("add_sub", http_inputs(httpclient))
    spans = collector.wait(lambda s: sum(x.name == "InferRequest" for x in s) >= 3)
    time.sleep(0.5)
    with collector.lock:
        roots = [s for _, s in collector.spans if s.name == "InferRequest"]
    assert len(roots) == 3, "every 2nd request, 3 traces at most"
    assert len({s.trace_id for s in roots}) == 3, "each sampled request is a trace of its own"
    assert all(not s.parent_span_id for s in roots)
    assert h.get_trace_settings()["trace_count"] == "0"
    del spans


def test_a_dead_collector_never_fails_requests(start):
    copy_models(start.repo, "add_sub")
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    args = [
        "--trace-config=mode=opentelemetry",
        "--trace-config=level=TIMESTAMPS",
        "--trace-config=rate=1",
        f"--trace-config=opentelemetry,url={dead}",
        "--trace-config=opentelemetry,bsp_schedule_delay=10",
    ]
    srv = start(["add_sub"], args)
    h = httpclient.InferenceServerClient(srv.http_url)
    for _ in range(20):
        result = h.infer("add_sub", http_inputs(httpclient))
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), np.arange(4) * 2)
    deadline = time.time() + 20
    while "cannot export" not in srv.log_text() and time.time() < deadline:
        time.sleep(0.1)
    assert "cannot export" in srv.log_text()


def test_trace_settings_over_http_and_grpc(start, collector):
    copy_models(start.repo, "add_sub")
    srv = start(["add_sub"], otel_args(collector, "rate=1000"))
    h = httpclient.InferenceServerClient(srv.http_url)
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    settings = h.get_trace_settings()
    assert settings == {
        "trace_level": ["TIMESTAMPS"],
        "trace_rate": "1000",
        "trace_count": "-1",
        "trace_mode": "opentelemetry",
        "url": collector.url,
        "resource": "deployment=test",
        "bsp_max_queue_size": "2048",
        "bsp_schedule_delay": "20",
        "bsp_max_export_batch_size": "512",
    }
    # A model's setting takes what it does not set from the global one, and follows it there.
    m = h.update_trace_settings("add_sub", {"trace_rate": "1"})
    assert (m["trace_rate"], m["trace_level"]) == ("1", ["TIMESTAMPS"])
    assert h.get_trace_settings()["trace_rate"] == "1000"
    g.update_trace_settings(settings={"trace_count": "5"})
    gm = g.get_trace_settings("add_sub", as_json=True)["settings"]
    assert gm["trace_rate"]["value"] == ["1"]
    assert gm["trace_count"]["value"] == ["5"]
    # With rate 1 on add_sub, plain requests are traced now.
    h.infer("add_sub", http_inputs(httpclient))
    collector.wait(lambda s: any(x.name == "InferRequest" for x in s))
    # Clearing (null / an empty list) goes back to the global value.
    assert h.update_trace_settings("add_sub", {"trace_rate": None})["trace_rate"] == "1000"
    g.update_trace_settings(settings={"trace_count": []})
    assert h.get_trace_settings()["trace_count"] == "-1"
    # Triton's errors.
    for client in (h, g):
        with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
            client.update_trace_settings(settings={"trace_file": "/tmp/x"})
        with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate', got: often"):
            client.update_trace_settings(settings={"trace_rate": "often"})
        with pytest.raises(InferenceServerException, match="Expect only one trace level 'OFF' is specified"):
            client.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})
        with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
            client.get_trace_settings("nope")
    with pytest.raises(InferenceServerException, match="expect only 1 value for 'trace_count'"):
        g.update_trace_settings(settings={"trace_count": ["1", "2"]})
    assert "trace" in h.get_server_metadata()["extensions"]


def test_trace_settings_are_a_restricted_group(start):
    copy_models(start.repo, "add_sub")
    srv = start(["add_sub"], ["--http-restricted-api=trace:key=v", "--grpc-restricted-protocol=trace:key=v"])
    h = httpclient.InferenceServerClient(srv.http_url)
    with pytest.raises(InferenceServerException, match="This API is restricted"):
        h.get_trace_settings()
    assert h.get_trace_settings(headers={"key": "v"})["trace_mode"] == "triton"
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        g.get_trace_settings()
    assert g.get_trace_settings(headers={"triton-grpc-protocol-key": "v"}).settings["trace_level"].value == ["OFF"]


def test_triton_mode_writes_tritons_trace_file(start, tmp_path):
    copy_models(start.repo, "add_sub")
    path = str(tmp_path / "trace.json")
    srv = start(
        ["add_sub"],
        [
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=1",
            f"--trace-config=triton,file={path}",
            "--trace-config=triton,log-frequency=1",
        ],
    )
    h = httpclient.InferenceServerClient(srv.http_url)
    settings = h.get_trace_settings()
    assert (settings["trace_mode"], settings["trace_file"], settings["log_frequency"]) == ("triton", path, "1")
    h.infer("add_sub", http_inputs(httpclient), request_id="t1")
    h.infer("add_sub", http_inputs(httpclient), request_id="t2")
    deadline = time.time() + 10
    while not os.path.exists(path + ".1") and time.time() < deadline:
        time.sleep(0.05)
    for i, request_id in enumerate(["t1", "t2"]):
        with open(f"{path}.{i}") as f:
            items = json.load(f)
        head = items[0]
        assert (head["model_name"], head["model_version"], head["request_id"]) == ("add_sub", 1, request_id)
        names = [t["name"] for item in items[1:] for t in item["timestamps"]]
        assert names == [
            "REQUEST_START",
            "QUEUE_START",
            "COMPUTE_START",
            "COMPUTE_INPUT_END",
            "COMPUTE_OUTPUT_START",
            "COMPUTE_END",
            "REQUEST_END",
        ]
        assert all(item["id"] == head["id"] for item in items)
    # Without a log frequency, the traces go to the file itself at shutdown.
    path2 = str(tmp_path / "at_exit.json")
    srv2 = start(["add_sub"], ["--trace-level=TIMESTAMPS", "--trace-rate=1", f"--trace-file={path2}"])
    httpclient.InferenceServerClient(srv2.http_url).infer("add_sub", http_inputs(httpclient))
    assert not os.path.exists(path2)
    assert srv2.stop() == 0
    with open(path2) as f:
        items = json.load(f)
    assert items[0]["model_name"] == "add_sub"
    assert "deprecated" in srv2.log_text()


def test_bad_trace_flags_refuse_to_start(tmp_path):
    out = subprocess.run(
        [binary(), "serve", "--model-repository", str(tmp_path), "--trace-config=level=LOUD"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--trace-config" in out.stderr and "invalid value for trace level option: loud" in out.stderr


def test_model_config_name_picks_the_variant(start):
    copy_models(start.repo, "add_sub", "bls_add_sub")
    configs = os.path.join(start.repo, "add_sub", "configs")
    os.makedirs(configs)
    with open(os.path.join(start.repo, "add_sub", "config.pbtxt")) as f:
        base = f.read()
    variant = base + '\nparameters { key: "variant" value: { string_value: "small" } }\n'
    with open(os.path.join(configs, "small.pbtxt"), "w") as f:
        f.write(variant)
    srv = start(["add_sub", "bls_add_sub"], ["--model-config-name=small"])
    h = httpclient.InferenceServerClient(srv.http_url)
    assert h.get_model_config("add_sub")["parameters"]["variant"]["string_value"] == "small"
    # A model without the variant falls back to its config.pbtxt.
    assert "variant" not in h.get_model_config("bls_add_sub").get("parameters", {})
    # Without the flag, config.pbtxt is read.
    srv2 = start(["add_sub"])
    h2 = httpclient.InferenceServerClient(srv2.http_url)
    assert "variant" not in h2.get_model_config("add_sub").get("parameters", {})
