"""Per-model Python environments with real stubs: a packed environment (`EXECUTION_ENV_PATH`, a
tarball unpacked once into the cache, or a directory), `requirements.txt` environments built with
pip from PyPI (two models with conflicting pins each get their own), and the load errors: a
broken requirement (pip's message), an archive entry climbing out with `..`, an environment
without numpy. One server loads them all at once, so the environments are made concurrently."""

import glob
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import Server, binary
from test_faults import index, write_model

WHERE = """
import sys
import numpy as np
import triton_python_backend_utils as pb_utils
{imports}

class TritonPythonModel:
    def execute(self, requests):
        info = [sys.executable, sys.prefix, {version}]
        out = np.array([s.encode() for s in info], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", out)]) for _ in requests]
"""

WHERE_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "INFO" data_type: TYPE_STRING dims: [ 3 ] }} ]
{extra}
"""

PACKED_PARAMETER = """parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{path}" }} }}"""


def where_model(repo, name, imports="", version="''", extra=""):
    write_model(
        repo,
        name,
        WHERE.format(imports=imports, version=version),
        WHERE_CONFIG.format(name=name, extra=extra),
    )


def where(url, model):
    c = httpclient.InferenceServerClient(url)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))
    info = c.infer(model, [x]).as_numpy("INFO")
    return [v.decode() if isinstance(v, bytes) else str(v) for v in info]


def make_venv(path, with_numpy):
    """A venv on this interpreter, without pip; numpy copied in from the test venv's."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)
    if with_numpy:
        site = glob.glob(os.path.join(path, "lib", "python3*", "site-packages"))[0]
        here = os.path.dirname(os.path.dirname(np.__file__))
        for name in os.listdir(here):
            if name == "numpy" or name.startswith("numpy-") or name == "numpy.libs":
                shutil.copytree(
                    os.path.join(here, name),
                    os.path.join(site, name),
                    ignore=shutil.ignore_patterns("tests", "__pycache__", "*.pyi"),
                )


def pack(env_dir, archive):
    """A venv tarball as conda-pack lays one out: the environment's files at the top."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as t:
        t.add(env_dir, arcname=".")


def wait_loaded(server, models, timeout, progress=None):
    """Waits until `models` are ready, failing at once when one of them failed to load; the
    reasons the index gives for loading models go into `progress` (model -> reasons seen)."""
    deadline = time.time() + timeout
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError("the server exited; log:\n" + server.log_text())
        try:
            states = index(server)
        except OSError:
            states = {}
        if progress is not None:
            for m, s in states.items():
                if s.get("state") == "LOADING" and s.get("reason"):
                    progress.setdefault(m, []).append(s["reason"])
        failed = {m: states[m].get("reason") for m in models if states.get(m, {}).get("state") == "UNAVAILABLE"}
        if failed:
            raise RuntimeError(f"models failed to load: {failed}")
        if all(states.get(m, {}).get("state") == "READY" for m in models):
            return
        if time.time() > deadline:
            raise RuntimeError(f"models not ready in {timeout} s: {states}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("envs")
    repo = str(tmp / "repo")
    cache = str(tmp / "cache")
    os.makedirs(repo)

    # A packed environment, shared by two models (unpacked once).
    make_venv(str(tmp / "env"), with_numpy=True)
    for name in ("packed", "packed_too"):
        where_model(repo, name, extra=PACKED_PARAMETER.format(path="$$TRITON_MODEL_DIRECTORY/env.tar.gz"))
        if name == "packed":
            pack(str(tmp / "env"), os.path.join(repo, name, "env.tar.gz"))
        else:
            shutil.copy(os.path.join(repo, "packed", "env.tar.gz"), os.path.join(repo, name, "env.tar.gz"))

    # A directory used as it is, without numpy: a clear load error naming it.
    make_venv(str(tmp / "bare"), with_numpy=False)
    where_model(repo, "no_numpy", extra=PACKED_PARAMETER.format(path=str(tmp / "bare")))

    # An archive with an entry climbing out of its directory.
    evil = str(tmp / "evil.tar.gz")
    with tarfile.open(evil, "w:gz") as t:
        data = str(tmp / "payload")
        with open(data, "w") as f:
            f.write("x")
        t.add(data, arcname="../escaped")
    where_model(repo, "escape", extra=PACKED_PARAMETER.format(path=evil))

    # requirements.txt: two conflicting pins of one package, and a requirement that cannot be met.
    for name, pin in (("six_old", "six==1.16.0"), ("six_new", "six==1.17.0")):
        where_model(repo, name, imports="import six", version="six.__version__")
        with open(os.path.join(repo, name, "requirements.txt"), "w") as f:
            f.write(pin + "\n")
    where_model(repo, "broken_requirement")
    with open(os.path.join(repo, "broken_requirement", "requirements.txt"), "w") as f:
        f.write("tritium-no-such-package-anywhere==0.0.1\n")

    server = Server(
        repo,
        str(tmp / "tritium.log"),
        # `no_numpy` and `escape` name environments outside their model directories.
        ["--env-cache-dir", cache, "--model-load-thread-count", "8", "--allow-config-path", str(tmp)],
    )
    try:
        server.progress = {}
        wait_loaded(server, ["packed", "packed_too", "six_old", "six_new"], timeout=900, progress=server.progress)
        server.cache = cache
        yield server
    finally:
        server.stop()


def test_a_packed_environment_runs_the_model_on_its_interpreter(envs):
    executable, prefix, _ = where(envs.http_url, "packed")
    unpacked = os.path.join(envs.cache, "packed")
    assert prefix.startswith(unpacked + os.sep), prefix
    assert executable == os.path.join(prefix, "bin", "python"), executable
    assert os.path.isfile(os.path.join(prefix, ".tritium-complete"))


def test_the_index_and_tritium_models_show_each_models_interpreter_and_environment(envs):
    req = urllib.request.Request(f"http://{envs.http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        index = {m["name"]: m for m in json.loads(r.read())}
    for name in ("packed", "six_old"):
        executable, prefix, _ = where(envs.http_url, name)
        entry = index[name]
        assert os.path.realpath(entry["tritium_environment"]) == os.path.realpath(prefix), entry
        assert entry["tritium_environment"].startswith(envs.cache + os.sep), entry
        assert entry["tritium_python"] == os.path.join(entry["tritium_environment"], "bin", "python"), entry
        assert os.path.realpath(entry["tritium_python"]) == os.path.realpath(executable), entry
    # Triton's keys are unchanged, so tritonclient reads the index as before.
    assert {"name", "version", "state"} <= set(index["packed"])
    # `tritium models` (over gRPC) shows the same.
    out = subprocess.run(
        [binary(), "models", "--json", "--url", envs.grpc_url], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    models = {m["name"]: m for m in json.loads(out.stdout)}
    for name in ("packed", "six_old"):
        assert models[name]["python"] == index[name]["tritium_python"]
        assert models[name]["environment"] == index[name]["tritium_environment"]
    assert models["broken_requirement"]["python"] == "", "a model that failed to load runs nothing"


def test_a_model_building_its_environment_says_so_in_the_index(envs):
    # While pip runs, the index (and so `tritium models`) gives the step and pip's latest line.
    seen = envs.progress.get("six_old", []) + envs.progress.get("six_new", [])
    assert any(r.startswith("building the Python environment of ") for r in seen), envs.progress
    assert any("six" in r for r in seen), seen
    # Once loaded, no reason is left behind.
    assert index(envs)["six_old"].get("reason", "") == ""


def test_models_sharing_an_archive_share_one_unpacked_copy(envs):
    assert where(envs.http_url, "packed")[1] == where(envs.http_url, "packed_too")[1]
    packed = os.path.join(envs.cache, "packed")
    complete = [e for e in os.listdir(packed) if os.path.isfile(os.path.join(packed, e, ".tritium-complete"))]
    assert len(complete) == 1, complete
    unpacked = [line for line in envs.log_text().splitlines() if "unpacking a Python environment" in line]
    assert len([line for line in unpacked if "env.tar.gz" in line]) == 1, unpacked


def test_requirements_get_their_own_environment_per_pin(envs):
    old_exe, old_prefix, old = where(envs.http_url, "six_old")
    new_exe, new_prefix, new = where(envs.http_url, "six_new")
    assert (old, new) == ("1.16.0", "1.17.0")
    assert old_prefix != new_prefix
    for prefix in (old_prefix, new_prefix):
        assert prefix.startswith(os.path.join(envs.cache, "venvs") + os.sep), prefix
    log = envs.log_text()
    assert "uv is not on PATH" in log or "with uv" in log


def test_a_broken_requirement_fails_that_model_with_the_installers_message_in_the_log(envs):
    reason = index(envs)["broken_requirement"].get("reason", "")
    assert "cannot build the Python environment for" in reason, reason
    assert "the installer's output is in the server log" in reason, reason
    # The installer can quote the files it read: its lines reach the log, never a client.
    assert "No matching distribution" not in reason and "not found" not in reason, reason
    log = envs.log_text()
    assert "building a Python environment failed" in log, log[-3000:]
    assert "tritium-no-such-package-anywhere" in log and ("No matching distribution" in log or "not found" in log)


def test_an_archive_entry_climbing_out_is_refused(envs):
    reason = index(envs)["escape"].get("reason", "")
    assert "refusing to unpack the Python environment" in reason, reason
    assert "../escaped" in reason, reason
    assert not os.path.exists(os.path.join(envs.cache, "packed", "escaped"))


def test_an_environment_without_numpy_is_a_load_error_naming_it(envs):
    reason = index(envs)["no_numpy"].get("reason", "")
    assert "cannot run tritium's stub" in reason and "numpy" in reason, reason
    assert "bare" in reason, reason


def test_the_cache_is_reused_by_the_next_server(envs, tmp_path):
    # The same repository again on a second server: nothing is unpacked or built again.
    second = Server(envs.repository, str(tmp_path / "second.log"), ["--env-cache-dir", envs.cache])
    try:
        wait_loaded(second, ["packed", "six_old"], timeout=300)
        assert where(second.http_url, "six_old")[2] == "1.16.0"
        # (The models that failed try again: a failed build leaves nothing in the cache.)
        made = [
            line
            for line in second.log_text().splitlines()
            if ("unpacking a Python environment" in line and "env.tar.gz" in line)
            or ("building a Python environment" in line and "six_" in line)
        ]
        assert made == [], made
    finally:
        second.stop()
