"""Faults with real stubs: killed stubs under load, initialize that never returns, crash loops,
the server killed with SIGKILL, SIGTERM with requests in flight, and a reload under load.

The faults of a running stub are checked on both of the server's serve paths (`RTC`): a task on
the async runtime (`--run-to-completion true`, the default for models that are not decoupled)
and a worker thread per instance (`false`)."""

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

SLEEPY = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = {value}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0])
            time.sleep(ms / 1000.0)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("VALUE", np.array([VALUE], dtype=np.int64)),
            ]))
        return out
"""

SLEEPY_CONFIG = """
name: "{name}"
backend: "python"
input [ {{ name: "MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "PID" data_type: TYPE_INT64 dims: [ 1 ] }}, {{ name: "VALUE" data_type: TYPE_INT64 dims: [ 1 ] }} ]
instance_group [ {{ count: {count}, kind: KIND_CPU }} ]
{extra}
"""


def write_model(repo, name, source, config):
    os.makedirs(os.path.join(repo, name, "1"), exist_ok=True)
    with open(os.path.join(repo, name, "config.pbtxt"), "w") as f:
        f.write(textwrap.dedent(config))
    with open(os.path.join(repo, name, "1", "model.py"), "w") as f:
        f.write(textwrap.dedent(source))


# Both serve paths, as `start(models, rtc)` arguments.
RTC = pytest.mark.parametrize(
    "rtc", [["--run-to-completion", "true"], ["--run-to-completion", "false"]], ids=["task", "thread"]
)


def sleepy(repo, name="sleepy", count=1, value=1, extra=""):
    write_model(repo, name, SLEEPY.format(value=value), SLEEPY_CONFIG.format(name=name, count=count, extra=extra))


def call(url, model="sleepy", ms=0):
    c = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([ms], dtype=np.int32))
    r = c.infer(model, [inp])
    return int(r.as_numpy("PID")[0]), int(r.as_numpy("VALUE")[0])


def index(server):
    req = urllib.request.Request(f"http://{server.http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return {m["name"]: m for m in json.loads(r.read())}


def wait_for(predicate, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@RTC
def test_kill_9_of_a_stub_under_load(start, rtc):
    sleepy(start.repo, count=1)
    srv = start(["sleepy"], rtc)
    victim, _ = call(srv.grpc_url)
    results, lock = [], threading.Lock()

    def load():
        for _ in range(40):
            try:
                r = ("ok", call(srv.grpc_url, ms=10)[0])
            except InferenceServerException as e:
                r = ("error", e.message())
            with lock:
                results.append(r)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(120)
    assert len(results) == 160, "every request got exactly one answer"
    errors = [m for kind, m in results if kind == "error"]
    for m in errors:
        assert "exited unexpectedly" in m and "killed by signal 9" in m, m
    assert len(errors) <= 4, f"only the requests in flight on the killed stub fail: {errors}"
    pids = {p for kind, p in results if kind == "ok"}
    new = pids - {victim}
    assert new, "the instance came back with a new stub and the load went on"
    assert not alive(victim)
    assert wait_for(lambda: srv.get("/v2/models/sleepy/ready") == 200, what="model ready again")
    print("recovered within", time.time() - killed_at, "s")


def test_initialize_that_never_returns_times_out(start):
    write_model(
        start.repo,
        "stuck",
        "import time\nclass TritonPythonModel:\n    def initialize(self, args):\n        time.sleep(3600)\n    def execute(self, requests):\n        return []\n",
        'name: "stuck"\nbackend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\nparameters { key: "stub_init_timeout_secs" value: { string_value: "1.5" } }\n',
    )
    sleepy(start.repo)
    srv = start(["sleepy"])
    stuck = wait_for(
        lambda: index(srv)["stuck"].get("state") == "UNAVAILABLE" and index(srv)["stuck"], what="stuck to fail"
    )
    reason = stuck["reason"]
    assert "'stuck'" in reason and "within 1.5s" in reason and "stub_init_timeout_secs" in reason, reason
    assert call(srv.grpc_url)[1] == 1, "the other model serves"
    assert srv.proc.poll() is None


@RTC
def test_crash_loop_ends_in_failed(start, rtc):
    write_model(
        start.repo,
        "crashy",
        "import os, threading\nclass TritonPythonModel:\n    def initialize(self, args):\n        threading.Timer(0.2, os._exit, [7]).start()\n    def execute(self, requests):\n        return []\n",
        'name: "crashy"\nbackend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\nparameters { key: "stub_restart_limit" value: { string_value: "2" } }\n',
    )
    srv = start(["crashy"], rtc)
    entry = wait_for(
        lambda: index(srv)["crashy"]["state"] == "UNAVAILABLE" and index(srv)["crashy"], what="crashy to fail"
    )
    assert "crashed 3 times" in entry["reason"] and "exit code 7" in entry["reason"], entry
    assert srv.get("/v2/models/crashy/ready") == 400
    assert srv.get("/v2/health/ready") == 400
    assert srv.get("/v2/health/live") == 200


def children(pid):
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def dev_shm_files(pid):
    """The /dev/shm files process `pid` has open or mapped."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            found.add(target)
    with open(f"/proc/{pid}/maps") as f:
        found.update(line.split()[-1] for line in f if " /dev/shm/" in line)
    return sorted(found)


def test_server_killed_with_sigkill_leaves_nothing(start):
    sleepy(start.repo, count=2)
    srv = start(["sleepy"])
    stubs = children(srv.proc.pid)
    # The two stubs and the fork server they were forked from.
    assert len(stubs) == 3, stubs
    # Nothing of theirs lives in /dev/shm (memfds only), so nothing there can be left behind. (Read
    # from the processes: tests in other pytest workers create client regions there meanwhile.)
    assert [f for p in [srv.proc.pid, *stubs] for f in dev_shm_files(p)] == []
    srv.proc.kill()
    srv.proc.wait()
    wait_for(lambda: not any(alive(p) for p in stubs), timeout=2, what="stubs to exit within 2 s")


def test_sigterm_answers_requests_in_flight(start):
    sleepy(start.repo, count=2)
    srv = start(["sleepy"])
    results = []

    def one():
        try:
            results.append(("ok", call(srv.grpc_url, ms=700)))
        except InferenceServerException as e:
            results.append(("error", e.message()))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(60)
    assert [k for k, _ in results] == ["ok"] * 4, results
    assert srv.proc.wait(60) == 0
    assert "stopped" in srv.log_text()


def test_model_reloaded_under_load_without_failures(start):
    sleepy(start.repo, count=1, value=1)
    srv = start(["sleepy"], ["--model-control-mode", "poll", "--repository-poll-secs", "1"])
    results, stop = [], threading.Event()

    def load():
        while not stop.is_set():
            try:
                results.append(("ok", call(srv.grpc_url, ms=5)[1]))
            except InferenceServerException as e:
                results.append(("error", e.message()))

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    time.sleep(1.1)  # a different mtime second for the poller
    sleepy(start.repo, count=1, value=2)
    try:
        wait_for(
            lambda: any(v == 2 for k, v in results[-20:] if k == "ok"), timeout=60, what="the new version to serve"
        )
        time.sleep(0.5)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    errors = [m for k, m in results if k == "error"]
    assert not errors, errors[:3]
    values = [v for _, v in results]
    assert values[0] == 1 and values[-1] == 2


def test_explicit_load_and_unload(start):
    sleepy(start.repo)
    sleepy(start.repo, name="other")
    config = 'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    config += 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    model = "class TritonPythonModel:\n    def initialize(self, args):\n        raise ValueError('no weights')\n"
    write_model(start.repo, "broken", model, config)
    srv = start(["sleepy"], ["--model-control-mode", "explicit", "--load-model", "sleepy"])
    c = httpclient.InferenceServerClient(srv.http_url)
    assert not c.is_model_ready("other")
    c.load_model("other")
    assert c.is_model_ready("other")
    c.unload_model("other")
    assert not c.is_model_ready("other")
    # As in Triton, the index lists the unloaded version with its state and why.
    unloaded = [m for m in c.get_model_repository_index() if m["name"] == "other"]
    assert unloaded == [{"name": "other", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}], unloaded
    # A version that fails to start: Triton's text and index entry.
    with pytest.raises(InferenceServerException) as info:
        c.load_model("broken")
    message = info.value.message()
    prefix = "load failed for model 'broken': version 1 is at UNAVAILABLE state: Internal: ValueError: no weights"
    assert message.startswith(prefix) and message.endswith(";\n"), message
    (broken,) = [m for m in c.get_model_repository_index() if m["name"] == "broken"]
    assert (broken["version"], broken["state"]) == ("1", "UNAVAILABLE"), broken
    assert broken["reason"].startswith("Internal: ValueError: no weights"), broken
    with pytest.raises(InferenceServerException) as info:
        c.load_model("nope")
    assert info.value.message().startswith("failed to load 'nope', failed to poll from model repository"), info.value
    with pytest.raises(InferenceServerException):
        c.load_model("../escape")
    g = grpcclient.InferenceServerClient(srv.grpc_url)
    for bad in ["../escape", "a/b", ".."]:
        with pytest.raises(InferenceServerException) as info:
            g.load_model(bad)
        assert "invalid model name" in info.value.message(), info.value.message()


def test_a_second_signal_forces_the_exit(start):
    sleepy(start.repo, count=1)
    srv = start(["sleepy"])
    stubs = children(srv.proc.pid)
    t = threading.Thread(target=lambda: pytest.raises(InferenceServerException, call, srv.grpc_url, "sleepy", 20000))
    t.start()
    time.sleep(0.5)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert srv.proc.poll() is None, "the first signal drains: the 20 s request is still running"
    began = time.time()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(10) == 130
    assert time.time() - began < 5
    wait_for(lambda: not any(alive(p) for p in stubs), timeout=2, what="stubs to exit")
    t.join(30)


@RTC
def test_execute_timeout_kills_and_restarts_a_stuck_stub(start, rtc):
    sleepy(start.repo, extra='parameters { key: "execute_timeout_secs" value: { string_value: "1" } }')
    srv = start(["sleepy"], rtc)
    victim, _ = call(srv.grpc_url)
    began = time.time()
    with pytest.raises(InferenceServerException) as info:
        call(srv.grpc_url, ms=30000)
    assert time.time() - began < 10
    message = info.value.message()
    assert "did not finish execute within 1s" in message and "execute_timeout_secs" in message, message
    pid, _ = wait_for(lambda: _try_call(srv.grpc_url), what="the restarted instance to serve")
    assert pid != victim and not alive(victim)


def _try_call(url):
    try:
        return call(url)
    except InferenceServerException:
        return None


@RTC
def test_a_frozen_stub_is_found_by_its_heartbeat(start, rtc):
    sleepy(start.repo)
    srv = start(["sleepy"], ["--stub-heartbeat-timeout-secs", "1", *rtc])
    victim, _ = call(srv.grpc_url)
    os.kill(victim, signal.SIGSTOP)
    try:
        pid, _ = wait_for(lambda: _try_call(srv.grpc_url), timeout=30, what="a new stub after the heartbeat was lost")
    finally:
        try:
            os.kill(victim, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert pid != victim
    assert "heartbeat lost" in srv.log_text()


def sleeps(pid, thread):
    """How many times the threads of process `pid` named `thread` have slept (their voluntary
    context switches)."""
    total, found = 0, False
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            if not f.read().startswith(thread):
                continue
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    total, found = total + int(line.split()[1]), True
    assert found, f"process {pid} has no thread {thread}"
    return total


def main_thread_sleeps(pid):
    """How many times the main thread of process `pid` has slept."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:"))


def test_an_idle_instance_wakes_a_few_times_a_second(start):
    # While the stub's main thread waits for work it takes whatever comes, so the heartbeat thread
    # only beats, every 250 ms instead of every 20 (a server with hundreds of idle instances
    # woke each fifty times a second), and a 1 s heartbeat timeout still never fires.
    sleepy(start.repo)
    srv = start(["sleepy"], ["--stub-heartbeat-timeout-secs", "1"])
    first, _ = call(srv.grpc_url)
    # The stub, not the fork server it was forked from (which runs one thread).
    (stub,) = [p for p in children(srv.proc.pid) if len(os.listdir(f"/proc/{p}/task")) > 1]
    before = sleeps(stub, "tritium-heartbe"), sleeps(srv.proc.pid, "tokio-rt-worker"), main_thread_sleeps(stub)
    time.sleep(2)
    slept = sleeps(stub, "tritium-heartbe") - before[0]
    assert slept <= 16, f"the heartbeat thread of an idle stub slept {slept} times in 2 s"
    # The stub's main thread waits for its next request in one sleep a second (its parent check):
    # the ring's wait no longer cuts that sleep into 100 ms slices (it woke ten times a second).
    main = main_thread_sleeps(stub) - before[2]
    assert main <= 6, f"the main thread of an idle stub slept {main} times in 2 s"
    # Nor does the server's runtime wake for it: the idle instance's lane checks on its stub
    # every 250 ms (it woke every 50 ms), its stub's messages and exit ring its doorbell.
    woke = sleeps(srv.proc.pid, "tokio-rt-worker") - before[1]
    assert woke <= 20, f"the server's runtime woke {woke} times in 2 s with one idle instance"
    second, _ = call(srv.grpc_url, ms=1500)
    assert second == first, "the stub was replaced"
    assert "heartbeat lost" not in srv.log_text()


def test_a_busy_stub_does_not_wake_its_heartbeat_thread_per_request(start):
    # The heartbeat thread takes its long beat only when the main thread took nothing during its
    # last one. It took it whenever the main thread was waiting for a request, and the main thread
    # then woke it on its way to every `execute`: a futex wake and a context switch per request
    # in a stub serving back-to-back requests (and the woken thread's pump held the receive lock
    # the main thread came back for).
    sleepy(start.repo)
    srv = start(["sleepy"])
    c = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    c.infer("sleepy", [inp])
    (stub,) = [p for p in children(srv.proc.pid) if len(os.listdir(f"/proc/{p}/task")) > 1]
    requests = 600
    before, started = sleeps(stub, "tritium-heartbe"), time.monotonic()
    for _ in range(requests):
        c.infer("sleepy", [inp])
    slept, took = sleeps(stub, "tritium-heartbe") - before, time.monotonic() - started
    # Its 20 ms beat while requests come, plus a few long beats where the client paused.
    allowed = int(took / 0.02) + 10
    assert slept <= allowed, f"the heartbeat thread slept {slept} times over {requests} requests in {took:.2f} s"


@RTC
def test_requests_abandoned_by_their_client_are_not_executed(start, rtc):
    sleepy(start.repo, count=1)
    srv = start(["sleepy"], rtc)
    busy = threading.Thread(target=call, args=(srv.grpc_url, "sleepy", 1500))
    busy.start()
    time.sleep(0.2)
    impatient = grpcclient.InferenceServerClient(srv.grpc_url)
    inp = grpcclient.InferInput("MS", [1], "INT32")
    inp.set_data_from_numpy(np.array([0], dtype=np.int32))
    with pytest.raises(InferenceServerException):
        impatient.infer("sleepy", [inp], client_timeout=0.3)
    busy.join(30)
    call(srv.grpc_url)
    stats = httpclient.InferenceServerClient(srv.http_url).get_inference_statistics("sleepy")["model_stats"][0]
    assert stats["execution_count"] == 2, "the abandoned request never reached the model"
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'nv_inference_request_failure{model="sleepy",reason="CANCELED",version="1"} 1' in text, text


CRASHY = """
import os, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            ms = int(pb_utils.get_input_tensor_by_name(r, "MS").as_numpy()[0])
            time.sleep(abs(ms) / 1000.0)
            if ms < 0:
                os._exit(3)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                pb_utils.Tensor("VALUE", np.array([1], dtype=np.int64)),
            ]))
        return out
"""


@RTC
def test_a_crash_fails_its_own_request_and_not_those_queued_behind_it(start, rtc):
    """The worker sends the next queued request to the stub while the current one runs
    (pipelining); when the stub dies in the current one, the one sent behind it was never
    started, and goes back to the queue for the restarted stub instead of failing with it."""
    write_model(start.repo, "crashy", CRASHY, SLEEPY_CONFIG.format(name="crashy", count=1, extra=""))
    srv = start(["crashy"], rtc)
    victim, _ = call(srv.grpc_url, model="crashy")
    results, lock = {}, threading.Lock()

    def one(key, ms):
        try:
            r = ("ok", call(srv.grpc_url, model="crashy", ms=ms)[0])
        except InferenceServerException as e:
            r = ("error", e.message())
        with lock:
            results[key] = r

    # A slow request runs while the crashing one and three more queue up behind it; when it
    # ends, the worker takes the crashing one and sends the next one behind it at once.
    slow = threading.Thread(target=one, args=("slow", 600))
    crash = threading.Thread(target=one, args=("crash", -300))
    behind = [threading.Thread(target=one, args=(i, 0)) for i in range(3)]
    slow.start()
    time.sleep(0.2)
    crash.start()
    time.sleep(0.1)
    for t in behind:
        t.start()
    for t in [slow, crash, *behind]:
        t.join(120)
    assert results["slow"] == ("ok", victim)
    kind, message = results["crash"]
    assert kind == "error" and "exited unexpectedly" in message and "exit code 3" in message, message
    for i in range(3):
        kind, pid = results[i]
        assert kind == "ok", f"request {i} queued behind the crash failed: {pid}"
        assert pid != victim, "it ran on the restarted stub"
