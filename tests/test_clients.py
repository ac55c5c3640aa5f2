"""The example client scripts and a short perf_analyzer run, against a real tritium."""

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, require

CLIENTS = [
    "add_sub",
    "preprocess",
    "batched_scale",
    "caption",
    "ensemble_pipeline",
    "sequence_accumulate",
    "image_pipeline",
]


@pytest.mark.parametrize("script", CLIENTS)
def test_example_clients(server, protocol, script):
    url = server.http_url if protocol == "http" else server.grpc_url
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "clients", script + ".py"),
            "--protocol",
            protocol,
            "--url",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def perf_analyzer():
    path = os.path.join(os.path.dirname(sys.executable), "perf_analyzer")
    if not os.path.exists(path):
        path = shutil.which("perf_analyzer")
    require(path, "perf_analyzer is not installed (cargo xtask setup installs it as root)")
    return path


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_perf_analyzer_runs_against_tritium(server, proto):
    url = server.grpc_url if proto == "grpc" else server.http_url
    out = subprocess.run(
        [
            perf_analyzer(),
            "-m",
            "add_sub",
            "-u",
            url,
            "-i",
            proto,
            "--concurrency-range",
            "2",
            "--measurement-interval",
            "1000",
            "--stability-percentage",
            "1000",
            "--max-trials",
            "10",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    m = re.search(r"Throughput: ([0-9.]+) infer/sec", text)
    assert m and float(m.group(1)) > 0, text
    server_side = re.search(r"queue (\d+) usec \+ compute input \d+ usec \+ compute infer (\d+) usec", text)
    assert server_side, text
    queue, infer = int(server_side.group(1)), int(server_side.group(2))
    assert queue > 0 and infer > 0, text


@pytest.mark.parametrize(
    "model,extra",
    [
        # Random INT32 inputs summed over sequences of 5 (the example once overflowed and failed).
        ("sequence_accumulate", ["--sequence-length", "5", "--concurrency-range", "2"]),
        ("stream_words", ["--streaming"]),
        ("batched_scale", ["-b", "4", "--shape", "INPUT:16"]),
    ],
)
def test_perf_analyzer_modes_run_without_errors(server, model, extra):
    out = subprocess.run(
        [perf_analyzer(), "-m", model, "-u", server.grpc_url, "-i", "grpc", "--measurement-interval", "500"]
        + ["--stability-percentage", "1000", "--max-trials", "3", *extra],
        capture_output=True,
        text=True,
        timeout=180,
    )
    text = out.stdout + out.stderr
    # When its measurement stops, perf_analyzer may end a sequence it never started (ids past the
    # "Sequence count" it printed); the server's answer, Triton's text, is then printed as a
    # thread's error. That one is the client's; any other error fails the test.
    teardown = re.compile(
        r"had error: inference request for sequence \d+ to model '\w+' must specify the START flag", re.IGNORECASE
    )
    errors = [line for line in text.lower().splitlines() if "error" in line and not teardown.search(line)]
    assert out.returncode == 0 and not errors, text
    m = re.search(r"Throughput: ([0-9.]+) infer/sec", text)
    assert m and float(m.group(1)) > 0, text
