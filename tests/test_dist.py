"""The wheel from `cargo xtask dist`, installed with pip into a fresh venv, serves a model
repository with no checkout: `tritium serve` finds its Python package in the venv's
site-packages and runs the stubs on the venv's interpreter."""

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from conftest import ROOT, free_port, require
from test_faults import index


def test_the_wheel_installs_into_a_fresh_venv_and_serves(tmp_path):
    cargo = shutil.which("cargo")
    require(cargo is not None, "cargo is needed to build the wheel")
    built = subprocess.run([cargo, "xtask", "dist"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr[-4000:]
    wheel = built.stdout.strip().splitlines()[-1]
    assert wheel.endswith(".whl") and os.path.isfile(wheel), built.stdout

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run(pip + [wheel], check=True, timeout=600)
    tritium = venv / "bin" / "tritium"
    assert tritium.is_file()
    # The stubs' copy of the package, alone in its directory (see dist_wheel.py).
    shared = sorted(set(os.listdir(venv / "share" / "tritium" / "python")) - {"__pycache__"})
    assert shared == ["tritium", "triton_python_backend_utils.py"], shared

    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "examples", "models", "add_sub"), str(repo / "add_sub"))
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "tritium.log"
    with open(log_path, "w") as log:
        # Run from elsewhere, with a clean PATH: nothing of the checkout is reachable.
        proc = subprocess.Popen(
            [
                str(tritium),
                "serve",
                "--model-repository",
                str(repo),
                "--http-port",
                str(http_port),
                "--grpc-port",
                str(grpc_port),
                "--metrics-port",
                str(metrics_port),
            ],
            cwd=str(tmp_path),
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        class Handle:
            http_url = f"127.0.0.1:{http_port}"

        deadline = time.time() + 120
        state = None
        while time.time() < deadline and proc.poll() is None:
            try:
                state = index(Handle).get("add_sub", {}).get("state")
            except OSError:
                state = None
            if state in ("READY", "UNAVAILABLE"):
                break
            time.sleep(0.2)
        assert state == "READY", log_path.read_text()
        log = log_path.read_text()
        assert f"python={venv / 'bin' / 'python'} " in log, log
        assert f"python_path={venv / 'share' / 'tritium' / 'python'}\n" in log, log
        client = httpclient.InferenceServerClient(Handle.http_url)
        a = np.arange(4, dtype=np.float32)
        b = np.ones(4, dtype=np.float32)
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer("add_sub", inputs)
        assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
