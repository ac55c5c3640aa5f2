"""The deployment recipes in deploy/: the Kubernetes manifests are valid (kubernetes-validate,
strict), the KServe resources are valid against the `kserve` Python SDK's models and have the
fields KServe requires, and the flags, ports and probe paths they give tritium are ones the real
server accepts and answers on.

Each container's command line is run for real: the model repository is swapped for a tmp one
holding examples/models/add_sub, every port for a free one, 0.0.0.0 for 127.0.0.1; the probe paths
must answer 200, and SIGTERM must stop the server with exit code 0.
"""

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import kubernetes.client.models as k8s_models  # python/requirements-dev.txt, as kubernetes_validate
import kubernetes_validate  # python/requirements-dev.txt: `cargo xtask setup` installs it, so CI never skips
import pytest
import yaml
from conftest import ROOT, binary, free_port

DEPLOY = os.path.join(ROOT, "deploy")
MANIFESTS = [
    os.path.join(DEPLOY, "kubernetes", "deployment.yaml"),
    os.path.join(DEPLOY, "kserve", "servingruntime.yaml"),
    os.path.join(DEPLOY, "kserve", "inferenceservice.yaml"),
]
MODEL_PATHS = {"/models", "/mnt/models"}
# tritium's defaults, used when a command line leaves a port out.
DEFAULT_PORTS = {"--http-port": 8000, "--grpc-port": 8001, "--metrics-port": 8002}
PORT_FLAGS = set(DEFAULT_PORTS) | {"--openai-port"}
MODEL_FLAGS = {"--model-repository", "--model-store"}
HOST_FLAGS = {"--host", "--http-address", "--grpc-address", "--metrics-address"}


def documents():
    for path in MANIFESTS:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    yield os.path.relpath(path, ROOT), doc


def containers():
    """(name, container) for every container in the manifests."""
    found = []
    for path, doc in documents():
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec", spec)
        for c in pod.get("containers", []):
            found.append((f"{path}:{doc['kind']}/{c['name']}", c, doc))
    return found


def validate(doc):
    version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(doc, version, strict=True)


def kserve_models():
    """The kserve SDK's generated model classes (`kserve.models`; python/requirements-nodeps.txt,
    installed without its dependencies), imported without running `kserve/__init__.py`, which
    starts importing KServe's model server (fastapi, cloudevents, ...) that these tests do not
    need."""
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")
        assert spec and spec.submodule_search_locations, "the kserve SDK is missing: run `cargo xtask setup`"
        package = importlib.util.module_from_spec(importlib.machinery.ModuleSpec("kserve", None, is_package=True))
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    import kserve.models

    return kserve.models


PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def sdk_object(value, type_name, where):
    """Builds the SDK object of `type_name` (a kserve or Kubernetes model class, or the SDKs'
    `list[...]`/`List[...]`, `dict(str, ...)`/`Dict[str, ...]` and primitive type strings) from a manifest's value: every
    field must be one the class has (by its JSON name), of the class's type, and the class's own
    constructor checks run (required fields, allowed values)."""
    if type_name.startswith(("list[", "List[")):
        assert isinstance(value, list), f"{where}: expected a list, found {value!r}"
        return [sdk_object(v, type_name[5:-1], f"{where}[{i}]") for i, v in enumerate(value)]
    if type_name.startswith(("dict(", "Dict[")):
        inner = type_name[5:-1].split(", ", 1)[1]
        assert isinstance(value, dict), f"{where}: expected a mapping, found {value!r}"
        return {k: sdk_object(v, inner, f"{where}.{k}") for k, v in value.items()}
    if type_name in PRIMITIVES:
        assert isinstance(value, PRIMITIVES[type_name]), f"{where}: expected {type_name}, found {value!r}"
        return value
    if type_name == "object":
        return value
    cls = getattr(kserve_models(), type_name, None) or getattr(k8s_models, type_name)
    assert isinstance(value, dict), f"{where}: expected a {type_name} mapping, found {value!r}"
    field_of = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    unknown = sorted(set(value) - set(field_of))
    assert not unknown, f"{where}: {type_name} has no field {unknown} (it has {sorted(field_of)})"
    kwargs = {field_of[k]: sdk_object(v, cls.openapi_types[field_of[k]], f"{where}.{k}") for k, v in value.items()}
    return cls(**kwargs)


def test_kubernetes_manifests_are_valid():
    kinds = set()
    for path, doc in documents():
        if doc["apiVersion"].startswith("serving.kserve.io/"):
            continue
        try:
            validate(doc)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{path}: {doc['kind']}/{doc['metadata']['name']}: {e}")
        kinds.add(doc["kind"])
    assert kinds == {"Deployment", "Service", "PodDisruptionBudget"}


def test_kubernetes_deployment_wiring():
    docs = {doc["kind"]: doc for _, doc in documents()}
    deployment, service, pdb = docs["Deployment"], docs["Service"], docs["PodDisruptionBudget"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for sel in (deployment["spec"]["selector"]["matchLabels"], service["spec"]["selector"]):
        assert sel.items() <= labels.items()
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    for p in service["spec"]["ports"]:
        assert p["targetPort"] in named
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == named["metrics"] == flag(c, "--metrics-port")
    assert "0.0.0.0" == flag(c, "--host")
    # The grace period covers the preStop sleep and tritium's drain.
    sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    assert pod["terminationGracePeriodSeconds"] > sleep + flag(c, "--exit-timeout-secs")
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


SDK_CLASSES = {"ClusterServingRuntime": "V1alpha1ClusterServingRuntime", "InferenceService": "V1beta1InferenceService"}


def test_kserve_resources_are_valid_sdk_objects():
    found = []
    for path, doc in documents():
        if doc["kind"] in SDK_CLASSES:
            obj = sdk_object(doc, SDK_CLASSES[doc["kind"]], f"{path}:{doc['kind']}")
            found.append(type(obj).__name__)
    assert sorted(found) == sorted(SDK_CLASSES.values())
    # The validation can fail: a misspelled field, a wrong type, a container without a name.
    isvc = {"apiVersion": "serving.kserve.io/v1beta1", "kind": "InferenceService", "metadata": {"name": "x"}}
    bad = [
        {"predictor": {"model": {"modelFormat": {"name": "triton"}, "storageURI": "gs://b/m"}}},
        {"predictor": {"model": {"modelFormat": {"name": "triton"}, "storageUri": 7}}},
        {"predictor": {"containers": [{"image": "tritium"}]}},
    ]
    for spec in bad:
        with pytest.raises((AssertionError, ValueError)):
            sdk_object({**isvc, "spec": spec}, "V1beta1InferenceService", "bad")


def test_kserve_resources_have_the_required_fields():
    docs = {doc["kind"]: doc for _, doc in documents()}
    runtime, isvc = docs["ClusterServingRuntime"], docs["InferenceService"]
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["metadata"]["name"]
    spec = runtime["spec"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert formats["triton"]["version"] == "2" and "python" in formats
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"}
    (c,) = spec["containers"]
    assert c["name"] == "kserve-container" and c["image"]
    assert c["securityContext"]["runAsNonRoot"] is True
    assert flag(c, "--model-store") == "/mnt/models"
    assert flag(c, "--http-port") == 8080 and flag(c, "--grpc-port") == 9000
    assert flag(c, "--host") == "0.0.0.0"
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == flag(c, "--metrics-port")
    # The container itself is a valid Kubernetes container.
    validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": {"containers": [c]}})

    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    assert isvc["metadata"]["name"]
    model = isvc["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in spec["protocolVersions"]
    assert model["storageUri"]


def split_args(argv):
    """`--flag=value` and `--flag value` as (flag, value) pairs; other tokens as (token, None)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            out.append(tuple(a.split("=", 1)))
        elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append((a, argv[i + 1]))
            i += 1
        else:
            out.append((a, None))
        i += 1
    return out


def command_line(c):
    argv = list(c.get("command", [])) + list(c.get("args", []))
    assert argv[:2] == ["tritium", "serve"], argv
    return argv[2:]


def flag(c, name):
    for k, v in split_args(command_line(c)):
        if k == name:
            return int(v) if name in PORT_FLAGS or name == "--exit-timeout-secs" else v
    return None


def dockerfile():
    with open(os.path.join(DEPLOY, "Dockerfile")) as f:
        text = f.read()
    cmd = json.loads(re.findall(r"^CMD (\[.*\])$", text, re.M)[-1])
    health = re.search(r"CMD curl -fsS http://127\.0\.0\.1:(\d+)(/\S+)", text)
    assert health, "HEALTHCHECK curls the ready endpoint"
    exposed = [int(p) for p in re.search(r"^EXPOSE (.*)$", text, re.M).group(1).split()]
    return text, cmd, int(health.group(1)), health.group(2), exposed


def test_dockerfile_shape():
    text, cmd, port, path, exposed = dockerfile()
    assert path == "/v2/health/ready"
    assert exposed == [8000, 8001, 8002] and port == 8000
    assert cmd == ["tritium", "serve", "--model-repository", "/models", "--host", "0.0.0.0"]
    assert re.search(r"^USER (?!root|0\b)", text, re.M), "runs as non-root"
    assert re.search(r'^VOLUME \["/models"\]', text, re.M)
    # `tritium serve` finds python/tritium/_native.abi3.so next to an ancestor of its binary.
    assert "/opt/tritium/bin/tritium" in text and "/opt/tritium/python/tritium" in text
    assert "_native.abi3.so" in text
    # The build context is the repository root: keep target/ and the venv out of it.
    with open(os.path.join(DEPLOY, "Dockerfile.dockerignore")) as f:
        ignored = set(f.read().split())
    assert {"target", ".venv", ".git"} <= ignored


def probe_ports(c):
    """(port, path) of every HTTP probe, with named ports resolved."""
    named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    probes = []
    for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = c.get(kind, {}).get("httpGet")
        if get:
            port = get["port"]
            probes.append((named[port] if isinstance(port, str) else port, get["path"]))
    return probes


def cases():
    out = []
    for name, c, _doc in containers():
        out.append(pytest.param(command_line(c), probe_ports(c), id=name))
    _, cmd, port, path, _ = dockerfile()
    out.append(pytest.param(cmd[2:], [(port, path)], id="Dockerfile:CMD"))
    return out


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


@pytest.mark.parametrize("args,probes", cases())
def test_command_line_serves_and_stops(tmp_path, args, probes):
    assert probes, "every container has HTTP probes"
    repo = tmp_path / "models"
    shutil.copytree(os.path.join(ROOT, "examples", "models", "add_sub"), str(repo / "add_sub"))
    ports = {}

    def port(p):
        return ports.setdefault(int(p), free_port())

    argv, seen = [], set()
    for k, v in split_args(args):
        seen.add(k)
        if v is None:
            argv.append(k)
            continue
        if k in MODEL_FLAGS:
            assert v in MODEL_PATHS, v
            v = str(repo)
        elif k in PORT_FLAGS:
            v = str(port(v))
        elif k in HOST_FLAGS:
            assert v == "0.0.0.0", f"{k} must be 0.0.0.0 in a container"
            v = "127.0.0.1"
        argv.append(f"{k}={v}")
    for k, default in DEFAULT_PORTS.items():
        if k not in seen:
            argv.append(f"{k}={port(default)}")
    http = {p for p, _ in probes}
    assert len(http) == 1 and next(iter(http)) in ports, (probes, ports)

    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [binary(), "serve", *argv, "--python", sys.executable], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            http_port = ports[next(iter(http))]
            deadline = time.time() + 120
            while get(http_port, "/v2/health/ready") != 200:
                if proc.poll() is not None or time.time() > deadline:
                    pytest.fail(f"not ready with {argv}; log:\n{log_path.read_text()}")
                time.sleep(0.2)
            for _, path in probes:
                assert get(http_port, path) == 200, path
            assert get(http_port, "/v2/models/add_sub/ready") == 200
            metrics = ports.get(8002)
            assert metrics and get(metrics, "/metrics") == 200
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log_path.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
