"""The `tritium` CLI against real servers: `stubs` (JSON and table, pids of live stub processes),
`restart` (new pids, restart counts, errors), `models`, `load` and `unload` with explicit model
control, connection errors, and who may restart (loopback always; other peers with the token)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import GOOD_MODELS, ROOT, Server, binary, free_port, require, write_model

STUB_KEYS = {
    "model",
    "version",
    "instance",
    "pid",
    "state",
    "uptime_secs",
    "restarts",
    "last_exit",
    "rss_bytes",
    "shm_bytes",
    "inflight",
    "executions",
    "impossible_transitions",
    "pss_bytes",
    "uss_bytes",
    "rss_growth_bytes",
    "requests_taken",
    "recycled",
}
TABLE_COLUMNS = [
    "MODEL",
    "VERSION",
    "INSTANCE",
    "PID",
    "STATE",
    "UPTIME",
    "RESTARTS",
    "LAST EXIT",
    "RSS",
    "PSS",
    "GROWTH",
    "SHM",
    "INFLIGHT",
    "EXECUTIONS",
]


def tritium(*args, url=None, env=None, timeout=180):
    """Runs the CLI; returns the completed process (text output)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    full_env.update(env or {})
    cmd = [binary()] + list(args) + (["--url", url] if url else [])
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout)


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr: {proc.stderr}"
    return proc.stdout


def one_line_error(proc):
    """Asserts a failure with one `tritium: ...` line on stderr and nothing on stdout; returns it."""
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tritium: "), proc.stderr
    return lines[0]


def stubs(url, *args):
    return json.loads(ok(tritium("stubs", "--json", *args, url=url)))


def is_stub_process(pid):
    """Whether `pid` is a live stub: started plainly (`python -m tritium.stub`) or forked from a
    fork server (whose command line it keeps)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"tritium.stub" in cmdline or b"tritium.forkserver" in cmdline


def parse_table(text):
    """Rows of a CLI table as dicts, cut at the header's column starts (cells may hold spaces)."""
    lines = text.rstrip("\n").split("\n")
    header = lines[0]
    names = [n for n in header.split("  ") if n.strip()]
    starts = [header.index(n.strip()) for n in names]
    rows = []
    for line in lines[1:]:
        if not line.strip():
            break
        cells = [line[s:e].strip() for s, e in zip(starts, starts[1:] + [None])]
        rows.append(dict(zip([n.strip() for n in names], cells)))
    return [n.strip() for n in names], rows


def copy_models(tmp_path, names):
    repo = tmp_path / "repo"
    for name in names:
        base = "examples/models" if os.path.isdir(os.path.join(ROOT, "examples/models", name)) else "tests/models"
        shutil.copytree(os.path.join(ROOT, base, name), str(repo / name))
    return str(repo)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with an admin token and two small models. Tests reach it on loopback only; the
    token check for other peers is unit-tested in tritium-grpc (src/admin.rs)."""
    tmp = tmp_path_factory.mktemp("guarded")
    repo = copy_models(tmp, ["add_sub", "batched_scale"])
    srv = Server(repo, str(tmp / "tritium.log"), ["--admin-token", "s3cret"])
    try:
        srv.wait_models(["add_sub", "batched_scale"])
        yield srv
    finally:
        assert srv.stop() == 0, srv.log_text()


# Ensembles run their steps' stubs and start none of their own.
ENSEMBLES = {"ensemble_pipeline", "image_pipeline"}


def test_stubs_json_lists_live_stub_processes(server):
    all_stubs = stubs(server.grpc_url)
    assert {s["model"] for s in all_stubs} >= set(GOOD_MODELS) - ENSEMBLES
    assert not {s["model"] for s in all_stubs} & ENSEMBLES
    for s in all_stubs:
        assert set(s) == STUB_KEYS, s
        assert isinstance(s["version"], int) and isinstance(s["restarts"], int), s
        assert s["impossible_transitions"] == 0, s
        if s["model"] not in GOOD_MODELS:
            continue
        assert s["state"] == "ready", s
        assert isinstance(s["pid"], int) and is_stub_process(s["pid"]), s
        assert s["uptime_secs"] > 0 and s["rss_bytes"] > 0, s
        assert s["inflight"] == 0 and s["executions"] >= 0, s
        assert s["last_exit"] is None or set(s["last_exit"]) == {"status", "unix_ms"}, s
    assert len({s["pid"] for s in all_stubs if s["pid"]}) == len([s for s in all_stubs if s["pid"]])

    # batched_scale has two instances; a model filter returns only that model's.
    scale = stubs(server.grpc_url, "batched_scale")
    assert sorted(s["instance"] for s in scale) == ["batched_scale_0_0", "batched_scale_0_1"]


def test_stubs_table(server):
    expected = {s["instance"]: s for s in stubs(server.grpc_url)}
    out = ok(tritium("stubs", url=server.grpc_url))
    columns, rows = parse_table(out)
    assert columns == TABLE_COLUMNS, out
    assert {r["INSTANCE"] for r in rows} == set(expected), out
    for r in rows:
        s = expected[r["INSTANCE"]]
        assert r["MODEL"] == s["model"] and r["VERSION"] == str(s["version"]), out
        assert r["PID"] == (str(s["pid"]) if s["pid"] else "-"), out
        assert r["STATE"] == s["state"], out
        if s["pid"]:
            assert r["RSS"].endswith("B") and r["UPTIME"].endswith(("s", "m", "h")), out


def test_a_killed_stub_shows_its_signal(tmp_path):
    repo = copy_models(tmp_path, ["add_sub"])
    srv = Server(repo, str(tmp_path / "tritium.log"))
    try:
        srv.wait_models(["add_sub"])
        url = srv.grpc_url
        pid = stubs(url, "add_sub")[0]["pid"]
        os.kill(pid, signal.SIGKILL)

        def restarted():
            s = stubs(url, "add_sub")[0]
            return s["state"] == "ready" and s["pid"] not in (None, pid)

        wait_for(restarted, "the killed stub to be restarted", 30)
        s = stubs(url, "add_sub")[0]
        assert s["restarts"] == 1 and s["last_exit"]["status"] == "killed by signal 9 (SIGKILL)", s
        assert isinstance(s["last_exit"]["unix_ms"], int) and s["last_exit"]["unix_ms"] > 0, s
        _, rows = parse_table(ok(tritium("stubs", "add_sub", url=url)))
        assert re.fullmatch(r"SIGKILL \(\d+s ago\)", rows[0]["LAST EXIT"]), rows
    finally:
        assert srv.stop() == 0, srv.log_text()


def test_stubs_of_an_unknown_model(server):
    line = one_line_error(tritium("stubs", "no_such_model", url=server.grpc_url))
    assert "no_such_model" in line and "not found" in line, line


def test_unreachable_server():
    port = free_port()
    proc = tritium("stubs", url=f"127.0.0.1:{port}")
    assert one_line_error(proc) == f"tritium: cannot reach the server at 127.0.0.1:{port}: connection refused"
    # TRITIUM_URL is the default of --url.
    proc = tritium("models", env={"TRITIUM_URL": f"127.0.0.1:{port}"})
    assert f"cannot reach the server at 127.0.0.1:{port}" in one_line_error(proc)


def test_models_json_and_table(server):
    models = json.loads(ok(tritium("models", "--json", url=server.grpc_url)))
    for m in models:
        assert set(m) == {"name", "version", "state", "reason", "python", "environment"}, m
    by_name = {m["name"]: m for m in models}
    # Which interpreter each model runs on: the server's --python (no environment of its own).
    assert by_name["add_sub"]["python"] == sys.executable and by_name["add_sub"]["environment"] == ""
    assert by_name["ensemble_pipeline"]["python"] == "", "an ensemble runs no stub"
    for name in GOOD_MODELS:
        assert by_name[name]["state"] == "READY" and by_name[name]["version"] == "1", by_name[name]
    assert by_name["broken_init"]["state"] == "UNAVAILABLE"
    assert by_name["broken_init"]["reason"], by_name["broken_init"]

    columns, rows = parse_table(ok(tritium("models", url=server.grpc_url)))
    assert columns == ["NAME", "VERSION", "STATE", "PYTHON", "ENV", "REASON"]
    row = {r["NAME"]: r for r in rows}["add_sub"]
    assert (row["STATE"], row["PYTHON"], row["ENV"]) == ("READY", sys.executable, "-")


def test_load_is_refused_without_explicit_model_control(server):
    line = one_line_error(tritium("load", "add_sub", url=server.grpc_url))
    assert line.startswith("tritium: load of add_sub failed: ") and "not allowed" in line, line


def test_restart_model_from_loopback_without_token(guarded):
    before = stubs(guarded.grpc_url, "add_sub")
    assert len(before) == 1 and is_stub_process(before[0]["pid"])
    out = ok(tritium("restart", "add_sub", url=guarded.grpc_url))
    after = stubs(guarded.grpc_url, "add_sub")
    old, new = before[0], after[0]
    assert new["pid"] != old["pid"] and is_stub_process(new["pid"]), (old, new)
    assert new["restarts"] == old["restarts"] + 1 and new["state"] == "ready", new
    assert out == "restarted add_sub/add_sub_0_0: pid {} -> {}, ready\n".format(old["pid"], new["pid"])
    # A requested restart is not an unexpected exit.
    assert new["last_exit"] is None


def test_restart_one_instance_with_a_wrong_token_from_loopback(guarded):
    before = {s["instance"]: s for s in stubs(guarded.grpc_url, "batched_scale")}
    out = ok(tritium("restart", "batched_scale/batched_scale_0_1", "--admin-token", "wrong", url=guarded.grpc_url))
    after = {s["instance"]: s for s in stubs(guarded.grpc_url, "batched_scale")}
    assert after["batched_scale_0_0"]["pid"] == before["batched_scale_0_0"]["pid"]
    assert after["batched_scale_0_0"]["restarts"] == before["batched_scale_0_0"]["restarts"]
    assert after["batched_scale_0_1"]["pid"] != before["batched_scale_0_1"]["pid"]
    assert after["batched_scale_0_1"]["restarts"] == before["batched_scale_0_1"]["restarts"] + 1
    assert out.startswith("restarted batched_scale/batched_scale_0_1: pid "), out


def test_restart_errors(guarded):
    line = one_line_error(tritium("restart", "no_such_model", url=guarded.grpc_url))
    assert line == "tritium: restart of no_such_model failed: Request for unknown model: 'no_such_model' is not found"
    line = one_line_error(tritium("restart", "add_sub/add_sub_9_9", url=guarded.grpc_url))
    assert line == "tritium: restart of add_sub/add_sub_9_9 failed: model 'add_sub' has no instance named 'add_sub_9_9'"


def wait_for(predicate, what, timeout=10):
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "timed out waiting for " + what
        time.sleep(0.05)


def wait_live(srv, timeout=60):
    def live():
        assert srv.proc.poll() is None, srv.log_text()
        return srv.get("/v2/health/live") == 200

    wait_for(live, "the server to answer", timeout)


def test_load_and_unload_with_explicit_model_control(tmp_path):
    repo = copy_models(tmp_path, ["add_sub", "echo"])
    srv = Server(repo, str(tmp_path / "tritium.log"), ["--model-control-mode", "explicit"])
    try:
        url = srv.grpc_url
        wait_live(srv)
        models = json.loads(ok(tritium("models", "--json", url=url)))
        assert {m["name"]: m["state"] for m in models} == {"add_sub": "", "echo": ""}
        assert ok(tritium("stubs", url=url)) == "no stubs: no model is loaded\n"

        assert ok(tritium("load", "add_sub", url=url)) == "loaded add_sub\n"
        loaded = stubs(url, "add_sub")
        assert len(loaded) == 1 and loaded[0]["state"] == "ready" and is_stub_process(loaded[0]["pid"])
        states = {m["name"]: m["state"] for m in json.loads(ok(tritium("models", "--json", url=url)))}
        assert states == {"add_sub": "READY", "echo": ""}

        assert ok(tritium("unload", "add_sub", url=url)) == "unloaded add_sub\n"
        assert stubs(url, "add_sub") == []
        assert ok(tritium("stubs", "add_sub", url=url)) == 'no stubs: model "add_sub" is not loaded\n'
        wait_for(lambda: not is_stub_process(loaded[0]["pid"]), "the unloaded stub to exit")

        line = one_line_error(tritium("load", "no_such_model", url=url))
        assert line.startswith("tritium: load of no_such_model failed: "), line
        # A model that does not exist leaves nothing behind, also after an unload of its name
        # (it once appeared in the index as "unloaded").
        # An unknown name is already unloaded: that succeeds, as in Triton.
        assert ok(tritium("unload", "no_such_model", url=url)) == "unloaded no_such_model\n"
        names = {m["name"] for m in json.loads(ok(tritium("models", "--json", url=url)))}
        assert names == {"add_sub", "echo"}, names
    finally:
        assert srv.stop() == 0, srv.log_text()


def test_models_prints_the_default_interpreter_as_a_normalised_path(tmp_path):
    """Without --python the server runs the checkout's `.venv`; `tritium models` prints its path
    without `python/..` (issue 35, item 8)."""
    venv_python = os.path.join(ROOT, ".venv", "bin", "python")
    require(os.path.isfile(venv_python), "the checkout's .venv (cargo xtask setup)")
    repo = copy_models(tmp_path, ["add_sub"])
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    with open(tmp_path / "tritium.log", "w") as log:
        proc = subprocess.Popen(
            [binary(), "serve", "--model-repository", repo, "--http-port", str(http_port)]
            + ["--grpc-port", str(grpc_port), "--metrics-port", str(metrics_port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        url = f"127.0.0.1:{grpc_port}"
        deadline = time.time() + 120
        while True:
            proc_out = tritium("models", "--json", url=url)
            states = json.loads(proc_out.stdout) if proc_out.returncode == 0 else []
            if [m["state"] for m in states] == ["READY"]:
                break
            assert proc.poll() is None and time.time() < deadline, (tmp_path / "tritium.log").read_text()
            time.sleep(0.2)
        python = states[0]["python"]
        assert python == os.path.normpath(venv_python), python
        _, rows = parse_table(ok(tritium("models", url=url)))
        assert rows[0]["PYTHON"] == python
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0


RUNNER_CONFIG = """
name: "runner"
backend: "python"
max_batch_size: 0
input [ { name: "CMD" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
"""

# A model that runs a command (a process it starts, as model code may) and answers with how it ended.
RUNNER = """
import json
import subprocess

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            cmd = json.loads(pb_utils.get_input_tensor_by_name(r, "CMD").as_numpy()[0])
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            text = json.dumps({"rc": done.returncode, "stderr": done.stderr})
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_))]))
        return out
"""


@pytest.mark.parametrize("token", [None, "s3cret"], ids=["no-token", "token"])
def test_a_model_on_loopback_cannot_restart_other_models(tmp_path, token):
    """Loopback trust is for the operator: a model's stub, or a process it starts, is on loopback
    too, and may not restart other models' stubs without the admin token."""
    repo = copy_models(tmp_path, ["add_sub"])
    write_model(repo, "runner", RUNNER_CONFIG, RUNNER)
    srv = Server(repo, str(tmp_path / "tritium.log"), ["--admin-token", token] if token else [])
    try:
        srv.wait_models(["add_sub", "runner"])
        before = stubs(srv.grpc_url, "add_sub")
        cmd = [binary(), "restart", "add_sub", "--url", srv.grpc_url]
        c = httpclient.InferenceServerClient(srv.http_url)
        x = httpclient.InferInput("CMD", [1], "BYTES")
        x.set_data_from_numpy(np.array([json.dumps(cmd).encode()], dtype=np.object_))
        ran = json.loads(c.infer("runner", [x]).as_numpy("OUT")[0])
        assert ran["rc"] != 0, ran
        assert (
            "not allowed from a model's process" in ran["stderr"] or "needs the server's admin token" in ran["stderr"]
        )
        assert [s["pid"] for s in stubs(srv.grpc_url, "add_sub")] == [s["pid"] for s in before]
        # With the token, the model's process is allowed as any peer with it is.
        if token:
            x.set_data_from_numpy(np.array([json.dumps(cmd + ["--admin-token", token]).encode()], dtype=np.object_))
            ran = json.loads(c.infer("runner", [x]).as_numpy("OUT")[0])
            assert ran["rc"] == 0, ran
        # The operator on the host is still trusted.
        ok(tritium("restart", "add_sub", url=srv.grpc_url))
    finally:
        srv.stop()
