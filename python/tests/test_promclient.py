"""`tritium.promclient.collect`: prometheus_client's default registry in the text format's terms, without
the default collectors and `_created` samples, and nothing at all when the model never imported it."""

import subprocess
import sys

import prometheus_client
import pytest
from tritium import promclient


@pytest.fixture
def registered():
    made = [
        prometheus_client.Counter("pc_requests", "Requests", ["path"]),
        prometheus_client.Histogram("pc_latency", "Latency", buckets=[0.5]),
        prometheus_client.Info("pc_build", "Build"),
        prometheus_client.Enum("pc_state", "State", states=["a", "b"]),
        prometheus_client.Summary("pc_size", "Size"),
    ]
    yield made
    for m in made:
        prometheus_client.REGISTRY.unregister(m)


def test_families_in_the_text_formats_terms(registered):
    requests, latency, build, state, size = registered
    requests.labels(path="x").inc(2)
    latency.observe(0.25)
    build.info({"v": "1"})
    size.observe(3)
    families = {name: (help, kind, samples) for name, help, kind, samples in promclient.collect()}
    assert families["pc_requests_total"] == ("Requests", "counter", [("pc_requests_total", [("path", "x")], 2.0)])
    help, kind, samples = families["pc_latency"]
    assert kind == "histogram"
    assert [s[0] for s in samples] == ["pc_latency_bucket", "pc_latency_bucket", "pc_latency_count", "pc_latency_sum"]
    assert samples[0] == ("pc_latency_bucket", [("le", "0.5")], 1.0)
    assert families["pc_build_info"] == ("Build", "gauge", [("pc_build_info", [("v", "1")], 1.0)])
    assert families["pc_state"][1] == "gauge"
    assert families["pc_size"][1] == "summary"
    for _, _, samples in families.values():
        assert not any(s[0].endswith("_created") for s in samples)
    # The process, platform and GC collectors are the server's business (tritium_stub_*).
    assert not any(n.startswith(("process_", "python_")) for n in families)


def test_nothing_when_the_model_never_imported_it():
    code = "import sys; from tritium import promclient; print(promclient.collect(), 'prometheus_client' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=promclient.__file__.rsplit("/tritium/", 1)[0]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] False"
