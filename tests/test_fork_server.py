"""Stubs forked from a fork server (`--stub-fork-server`, on by default): a stub is the server's
child (reparented to it), runs the fork server's command line (no exec), serves, restarts, and is
never ready while dead; a model with `FORK_SERVER: "false"` and a server with
`--stub-fork-server=false` start stubs plainly; a killed fork server is replaced at the next start;
the stubs die with the server (`PR_SET_PDEATHSIG`, set after the reparenting); a restart waits
for the new stub's start, not for the old stub's `finalize`; an instance costs the server no
thread of its own, and no stub or fork server dies with the pool thread that asked for it."""

import json
import os
import signal
import subprocess
import time

import numpy as np
import tritonclient.http as httpclient
from conftest import binary, write_model

CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""

# Answers IN + its own pid, so a test sees which stub served.
MODEL = """
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + np.float32(os.getpid() % 1000))]))
        return out
"""

# Notes each initialize and finalize (with the stub's pid) in a file; finalize takes 8 s.
SLOW_FINALIZE = """
import os
import time
import triton_python_backend_utils as pb_utils

LOG = {log!r}


def note(what):
    with open(LOG, "a") as f:
        f.write(f"{{what}} {{os.getpid()}}\\n")


class TritonPythonModel:
    def initialize(self, args):
        note("initialize")

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]

    def finalize(self):
        note("finalize-start")
        time.sleep(8)
        note("finalize-end")
"""

OPT_OUT = 'parameters { key: "FORK_SERVER" value: { string_value: "false" } }'


def stubs(srv, model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    proc = subprocess.run(
        [binary(), "stubs", model, "--json", "--url", srv.grpc_url], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def restart(srv, name):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITIUM_")}
    proc = subprocess.run(
        [binary(), "restart", name, "--url", srv.grpc_url], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().replace(b"\0", b" ").decode()


def ppid(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("PPid:")))


def forked(pid):
    return "tritium.forkserver" in cmdline(pid)


def fork_servers(srv):
    """The fork servers among the server's children: the command line of the fork server, which
    its stubs share, and a single thread (a stub has several)."""
    kids = []
    for task in os.listdir(f"/proc/{srv.proc.pid}/task"):
        try:
            with open(f"/proc/{srv.proc.pid}/task/{task}/children") as f:
                kids += [int(p) for p in f.read().split()]
        except OSError:
            continue
    out = []
    for k in kids:
        try:
            if "tritium.forkserver" in cmdline(k) and len(os.listdir(f"/proc/{k}/task")) == 1:
                out.append(k)
        except OSError:
            continue
    return out


def infer(srv, model):
    c = httpclient.InferenceServerClient(srv.http_url)
    x = np.array([1, 2], dtype=np.float32)
    i = httpclient.InferInput("IN", [2], "FP32")
    i.set_data_from_numpy(x)
    return c.infer(model, [i]).as_numpy("OUT")


def alive(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line for line in f)
    except OSError:
        return False


def test_stubs_come_from_the_fork_server_and_restart(start):
    write_model(start.repo, "forked", CONFIG.format(name="forked", count=2, extra=""), MODEL)
    write_model(start.repo, "plain", CONFIG.format(name="plain", count=1, extra=OPT_OUT), MODEL)
    srv = start(["forked", "plain"])
    listed = stubs(srv, "forked")
    assert len(listed) == 2
    for s in listed:
        assert forked(s["pid"]), cmdline(s["pid"])
        assert ppid(s["pid"]) == srv.proc.pid, "a forked stub is reparented to the server"
    # The model that opts out runs `python -m tritium.stub`.
    (p,) = stubs(srv, "plain")
    assert "tritium.stub" in cmdline(p["pid"]) and not forked(p["pid"])
    assert ppid(p["pid"]) == srv.proc.pid
    assert "fork server ready" in srv.log_text()
    before = {s["pid"] for s in listed}
    restart(srv, "forked")
    after = stubs(srv, "forked")
    assert {s["pid"] for s in after}.isdisjoint(before)
    assert all(forked(s["pid"]) and s["state"] == "ready" for s in after), after
    out = infer(srv, "forked")
    assert out[0] - 1 in {s["pid"] % 1000 for s in after}


def test_a_killed_fork_server_is_replaced_and_a_killed_stub_restarts(start):
    write_model(start.repo, "forked", CONFIG.format(name="forked", count=1, extra=""), MODEL)
    srv = start(["forked"], ["--stub-backoff-max-secs", "1"])
    (s,) = stubs(srv, "forked")
    servers = fork_servers(srv)
    assert len(servers) == 1 and s["pid"] not in servers, servers
    os.kill(servers[0], signal.SIGKILL)
    time.sleep(0.2)
    assert alive(s["pid"]), "a stub outlives its fork server"
    assert infer(srv, "forked") is not None
    # The next start, a restart, gets a new fork server.
    restart(srv, "forked")
    (s2,) = stubs(srv, "forked")
    assert s2["state"] == "ready" and forked(s2["pid"])
    assert infer(srv, "forked")[0] - 1 == s2["pid"] % 1000
    # A stub killed with SIGKILL is never reported ready once dead, not even in the moment before
    # the server's watcher sees its pidfd; the server sees its exit and restarts it.
    os.kill(s2["pid"], signal.SIGKILL)
    deadline = time.time() + 60
    while True:
        dead = not alive(s2["pid"])
        (s3,) = stubs(srv, "forked")
        if s3["pid"] == s2["pid"]:
            assert not (dead and s3["state"] == "ready"), "a dead stub reported ready"
        elif s3["pid"] and s3["state"] == "ready":
            break
        assert time.time() < deadline, s3
        time.sleep(0.05)
    assert forked(s3["pid"]) and alive(s3["pid"])
    assert s3["last_exit"]["status"].startswith("killed by signal 9"), s3
    assert infer(srv, "forked")[0] - 1 == s3["pid"] % 1000


def test_the_flag_turns_it_off(start):
    write_model(start.repo, "m", CONFIG.format(name="m", count=1, extra=""), MODEL)
    srv = start(["m"], ["--stub-fork-server=false"])
    (s,) = stubs(srv, "m")
    assert "tritium.stub" in cmdline(s["pid"]) and not forked(s["pid"])
    assert not fork_servers(srv)


def test_forked_stubs_die_with_the_server(start):
    write_model(start.repo, "m", CONFIG.format(name="m", count=2, extra=""), MODEL)
    srv = start(["m"])
    pids = [s["pid"] for s in stubs(srv, "m")] + fork_servers(srv)
    assert len(pids) >= 3
    srv.proc.send_signal(signal.SIGKILL)
    srv.proc.wait()
    deadline = time.time() + 10
    while any(alive(p) for p in pids):
        assert time.time() < deadline, [p for p in pids if alive(p)]
        time.sleep(0.05)


def test_a_restart_does_not_wait_for_the_old_stub_to_finalize(start, tmp_path):
    log = tmp_path / "events.log"
    model = SLOW_FINALIZE.format(log=str(log))
    write_model(start.repo, "slow_finalize", CONFIG.format(name="slow_finalize", count=1, extra=""), model)
    srv = start(["slow_finalize"])
    (old,) = stubs(srv, "slow_finalize")
    restart(srv, "slow_finalize")
    # `tritium restart` returned: the replacement is ready and serves while the old stub is still
    # in its 8 s finalize, which runs beside it.
    (new,) = stubs(srv, "slow_finalize")
    assert new["pid"] != old["pid"] and new["state"] == "ready", new
    assert infer(srv, "slow_finalize") is not None
    events = log.read_text().splitlines()
    assert f"initialize {new['pid']}" in events, events
    assert f"finalize-end {old['pid']}" not in events, "the restart waited for the old stub's finalize"
    # The old stub still finishes its finalize and exits, and is not counted as a crash.
    deadline = time.time() + 60
    while f"finalize-end {old['pid']}" not in log.read_text().splitlines() or alive(old["pid"]):
        assert time.time() < deadline, log.read_text()
        time.sleep(0.1)
    (after,) = stubs(srv, "slow_finalize")
    assert after["pid"] == new["pid"] and after["state"] == "ready" and after["restarts"] == 1, after


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


# Past the keep-alive (10 s) of the runtime's blocking pool, whose threads start the stubs.
POOL_KEEP_ALIVE = 12


def test_instances_hold_no_server_thread_and_outlive_the_threads_that_started_them(start):
    write_model(start.repo, "plain", CONFIG.format(name="plain", count=1, extra=OPT_OUT), MODEL)
    write_model(start.repo, "one", CONFIG.format(name="one", count=1, extra=""), MODEL)
    write_model(start.repo, "many", CONFIG.format(name="many", count=12, extra=""), MODEL)
    srv = start(["plain", "one"], ["--model-control-mode", "explicit", "--load-model", "plain", "--load-model", "one"])
    (plain,) = stubs(srv, "plain")
    (one,) = stubs(srv, "one")
    (fork_server,) = fork_servers(srv)
    time.sleep(POOL_KEEP_ALIVE)
    before = threads(srv.proc.pid)
    # The stubs and the fork server were started from blocking-pool threads that have ended by
    # now: a child's PR_SET_PDEATHSIG fires when the thread that forked it ends, so they must
    # have been forked by a thread that lives on.
    assert alive(plain["pid"]) and alive(one["pid"]) and alive(fork_server)
    assert stubs(srv, "plain")[0]["pid"] == plain["pid"]
    assert infer(srv, "plain")[0] - 1 == plain["pid"] % 1000
    httpclient.InferenceServerClient(srv.http_url).load_model("many")
    assert len(stubs(srv, "many")) == 12
    time.sleep(POOL_KEEP_ALIVE)
    after = threads(srv.proc.pid)
    # An instance used to hold a supervisor thread: 12 more instances, 12 more threads.
    assert after <= before + 1, (before, after)
    assert fork_servers(srv) == [fork_server]
    assert infer(srv, "many") is not None and infer(srv, "one")[0] - 1 == one["pid"] % 1000
