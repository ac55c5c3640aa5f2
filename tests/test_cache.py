"""The response cache end to end: `--cache-config local,size=N` and `response_cache { enable: true }`.

The model appends a line to a file in its directory at each execution, so a test sees whether a
request reached it; a cache hit must not.
"""

import os
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_faults import index, wait_for, write_model

COUNTING = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executions.log")

    def execute(self, requests):
        responses = []
        for request in requests:
            with open(self.log, "a") as f:
                f.write("x\\n")
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", (x * 2).astype(np.float32)),
                pb_utils.Tensor("OUTPUT1", (x + 1).astype(np.float32)),
            ]))
        return responses
"""

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
{extra}
"""

CACHED = "response_cache { enable: true }"

DECOUPLED = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return None
"""


def executions(repo, name):
    path = os.path.join(repo, name, "executions.log")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return len(f.readlines())


def clients(srv):
    return [
        (httpclient, httpclient.InferenceServerClient(srv.http_url)),
        (grpcclient, grpcclient.InferenceServerClient(srv.grpc_url)),
    ]


def infer(module, client, name, values, outputs=None, rid=None):
    inp = module.InferInput("INPUT0", [len(values)], "FP32")
    inp.set_data_from_numpy(np.array(values, dtype=np.float32))
    requested = [module.InferRequestedOutput(o) for o in outputs] if outputs else None
    return client.infer(name, [inp], outputs=requested, request_id=rid or "first")


def cache_stats(module, client, name):
    """(hits, misses, inference_count, execution_count) from the statistics extension."""
    stats = client.get_inference_statistics(name, as_json=True) if module is grpcclient else None
    if stats is None:
        stats = client.get_inference_statistics(name)
    s = stats["model_stats"][0]
    inf = s["inference_stats"]
    hit = int(inf.get("cache_hit", {}).get("count", 0))
    miss = int(inf.get("cache_miss", {}).get("count", 0))
    return hit, miss, int(s.get("inference_count", 0)), int(s.get("execution_count", 0))


def metrics(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(text, name, model):
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}",version="1"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.fixture
def cached_server(start):
    write_model(start.repo, "cached", COUNTING, CONFIG.format(name="cached", extra=CACHED))
    write_model(start.repo, "uncached", COUNTING, CONFIG.format(name="uncached", extra=""))
    write_model(
        start.repo,
        "decoupled_cached",
        DECOUPLED,
        CONFIG.format(name="decoupled_cached", extra=CACHED + "\nmodel_transaction_policy { decoupled: true }"),
    )
    return start(["cached", "uncached"], ["--cache-config", "local,size=1048576"])


def test_hits_skip_the_model_and_show_in_statistics_and_metrics(cached_server):
    srv, repo = cached_server, cached_server.repository
    for n, (module, client) in enumerate(clients(srv)):
        values = [float(n), 2.0, 3.0]
        first = infer(module, client, "cached", values)
        before = executions(repo, "cached")
        second = infer(module, client, "cached", values, rid="second")
        assert executions(repo, "cached") == before, "a cache hit must not reach the model"
        np.testing.assert_array_equal(first.as_numpy("OUTPUT0"), second.as_numpy("OUTPUT0"))
        np.testing.assert_array_equal(second.as_numpy("OUTPUT1"), np.array(values, dtype=np.float32) + 1)
        response = second.get_response()
        rid = response.id if module is grpcclient else response["id"]
        assert rid == "second", "a hit answers with its own request id"
    # Two distinct requests (one per protocol), each twice: both protocols share the cache.
    assert executions(repo, "cached") == 2
    for module, client in clients(srv):
        hits, misses, inferences, execs = cache_stats(module, client, "cached")
        assert (hits, misses) == (2, 2)
        assert (inferences, execs) == (2, 2), "hits are not inferences nor executions"
    text = metrics(srv)
    assert metric(text, "nv_cache_num_hits_per_model", "cached") == 2
    assert metric(text, "nv_cache_num_misses_per_model", "cached") == 2
    assert metric(text, "nv_cache_hit_duration_per_model", "cached") is not None
    assert metric(text, "nv_cache_miss_duration_per_model", "cached") is not None
    assert metric(text, "nv_inference_request_success", "cached") == 4
    assert metric(text, "nv_inference_count", "cached") == 2
    # A model without the cache has no cache series and runs every request.
    module, client = clients(srv)[0]
    infer(module, client, "uncached", [1.0])
    infer(module, client, "uncached", [1.0])
    assert executions(repo, "uncached") == 2
    assert metric(metrics(srv), "nv_cache_num_hits_per_model", "uncached") is None


def test_a_request_differing_in_shape_outputs_or_data_is_a_miss(cached_server):
    srv, repo = cached_server, cached_server.repository
    module, client = clients(srv)[1]
    infer(module, client, "cached", [5.0, 6.0])
    infer(module, client, "cached", [5.0, 6.0], outputs=["OUTPUT1"])
    infer(module, client, "cached", [5.0, 7.0])
    infer(module, client, "cached", [5.0])
    assert executions(repo, "cached") == 4
    r = infer(module, client, "cached", [5.0, 6.0], outputs=["OUTPUT1"])
    assert executions(repo, "cached") == 4
    assert r.as_numpy("OUTPUT0") is None, "a hit answers the outputs its request asked for"
    np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), np.array([6.0, 7.0], dtype=np.float32))


def test_decoupled_models_with_the_cache_are_refused_with_tritons_text(cached_server):
    entry = wait_for(
        lambda: (
            index(cached_server)["decoupled_cached"]["state"] == "UNAVAILABLE"
            and index(cached_server)["decoupled_cached"]
        ),
        what="the decoupled model's load to fail",
    )
    assert entry["state"] == "UNAVAILABLE"
    assert (
        "Response Cache does not currently support model decoupled_cached with 'decoupled' transaction policy"
        in entry["reason"]
    )


def test_least_recently_used_entries_are_evicted_from_a_small_cache(start):
    write_model(start.repo, "cached", COUNTING, CONFIG.format(name="cached", extra=CACHED))
    # One entry holds 2 x 4000 bytes of outputs: the cache holds two entries, not three.
    srv = start(["cached"], ["--cache-config=local,size=20000"])
    repo = srv.repository
    module, client = clients(srv)[0]
    a, b, c = [1.0] * 1000, [2.0] * 1000, [3.0] * 1000
    infer(module, client, "cached", a)
    infer(module, client, "cached", b)
    infer(module, client, "cached", a)  # a hit: a becomes the most recently used
    assert executions(repo, "cached") == 2
    infer(module, client, "cached", c)  # evicts b
    assert executions(repo, "cached") == 3
    infer(module, client, "cached", a)
    assert executions(repo, "cached") == 3, "a is still cached"
    infer(module, client, "cached", b)
    assert executions(repo, "cached") == 4, "b was evicted"
    # An answer larger than the whole cache is served and not kept.
    big = [4.0] * 5000
    infer(module, client, "cached", big)
    infer(module, client, "cached", big)
    assert executions(repo, "cached") == 6
    # The server's cache on /metrics, in tritium's own families and Triton's.
    lines = metrics(srv).splitlines()
    assert "tritium_cache_capacity_bytes 20000" in lines
    assert "tritium_cache_entries 2" in lines
    assert "tritium_cache_evictions_total 2" in lines, "b, then c to make room for b again"
    # Lookups a, b, a (hit), c, a (hit), b, big, big: 8, of which 2 hits.
    for line in (
        "nv_cache_num_entries 2",
        "nv_cache_num_evictions 2",
        "nv_cache_num_lookups 8",
        "nv_cache_num_hits 2",
        "nv_cache_num_misses 6",
    ):
        assert line in lines, (line, [x for x in lines if x.startswith("nv_cache_")])
    used = [float(x.split()[1]) for x in lines if x.startswith("nv_cache_util ")]
    assert len(used) == 1 and 0 < used[0] <= 1, used


def test_the_deprecated_byte_size_flag_makes_a_local_cache(start):
    write_model(start.repo, "cached", COUNTING, CONFIG.format(name="cached", extra=CACHED))
    srv = start(["cached"], ["--response-cache-byte-size=65536"])
    module, client = clients(srv)[1]
    infer(module, client, "cached", [1.0])
    infer(module, client, "cached", [1.0])
    assert executions(srv.repository, "cached") == 1
    assert "--response-cache-byte-size' has been deprecated" in srv.log_text()


def test_a_model_enabling_the_cache_on_a_server_without_one_runs_every_request(start):
    write_model(start.repo, "cached", COUNTING, CONFIG.format(name="cached", extra=CACHED))
    srv = start(["cached"])
    module, client = clients(srv)[0]
    infer(module, client, "cached", [1.0])
    infer(module, client, "cached", [1.0])
    assert executions(srv.repository, "cached") == 2
    assert "the server has no cache" in srv.log_text()
    assert cache_stats(module, client, "cached")[:2] == (0, 0)
