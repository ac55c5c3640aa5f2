"""GPU tensors end to end, on the shared server (the models are tests/models/gpu_*):

- `gpu_dlpack` returns `pb_utils.Tensor.from_dlpack` of a CUDA tensor, which the stub copies to
  the host into the response's shared memory; without CUDA the same model gets Triton's refusal;
- `gpu_bls` calls add_sub with `PreferredMemory(TRITONSERVER_MEMORY_GPU, 0)`: a GPU output where
  CUDA is usable (CPU where not), returned as an output and sent as a BLS input;
- `gpu_kind` is a KIND_GPU instance reporting its device and the device bound on its threads.

Whether CUDA is usable is asked of the native module in this process, the same machine and
environment as the server's stubs. Without CUDA the GPU-only tests skip, saying why (they do not
use conftest's `require`: a machine without GPUs is not a missing prerequisite).
"""

import os
import sys
import time

import numpy as np
import pytest
from conftest import ROOT
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.join(ROOT, "python"))
from tritium import _native  # noqa: E402

REASON = _native.cuda_unavailable_reason()


def skip_without_cuda():
    """Skips a GPU-only test without CUDA; fails it under TRITIUM_REQUIRE_GPU (`cargo xtask gpu-check`)."""
    if REASON is None:
        return
    if os.environ.get("TRITIUM_REQUIRE_GPU"):
        pytest.fail(f"TRITIUM_REQUIRE_GPU is set but CUDA is not usable: {REASON}")
    pytest.skip(f"needs a usable CUDA device; here: {REASON}")


GPU_TEXT = "DLPack capsule passed pointer to memory allocated on GPU device, when GPU is not available"


def infer(client, model, inputs, outputs):
    tc, c = client
    tensors = []
    for name, array in inputs.items():
        t = tc.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "INT32")
        t.set_data_from_numpy(array)
        tensors.append(t)
    result = c.infer(model, tensors, outputs=[tc.InferRequestedOutput(o) for o in outputs])
    return {o: result.as_numpy(o) for o in outputs}


def dlpack_inputs(mode):
    return {"IN": np.arange(6, dtype=np.float32), "MODE": np.array([mode], dtype=np.int32)}


def error_of(client, model, inputs, outputs):
    with pytest.raises(InferenceServerException) as e:
        infer(client, model, inputs, outputs)
    return e.value.message()


@pytest.fixture
def gpu_server(server):
    server.wait_models(["gpu_dlpack", "gpu_bls", "add_sub"])
    return server


def test_a_gpu_tensor_from_dlpack_is_an_output(gpu_server, client):
    if REASON is not None:
        assert GPU_TEXT in error_of(client, "gpu_dlpack", dlpack_inputs(0), ["OUT", "WHERE"])
        return
    out = infer(client, "gpu_dlpack", dlpack_inputs(0), ["OUT", "WHERE"])
    assert out["OUT"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert out["WHERE"].tolist() == [b"cuda:0"]


def test_a_gpu_output_that_cannot_be_copied_fails_its_request_only(gpu_server, client):
    text = error_of(client, "gpu_dlpack", dlpack_inputs(1), ["OUT", "WHERE"])
    assert "Failed to send the response" in text, text
    if REASON is not None:
        assert f"CUDA is not available: {REASON}" in text, text
    else:
        assert "is not CUDA device memory" in text, text
    # The stub is still there and serving.
    tc, c = client
    assert c.is_model_ready("gpu_dlpack")
    if REASON is not None:
        assert GPU_TEXT in error_of(client, "gpu_dlpack", dlpack_inputs(0), ["OUT"])
    else:
        assert infer(client, "gpu_dlpack", dlpack_inputs(0), ["OUT"])["OUT"][1] == 2.0


def test_a_torch_cuda_tensor_is_an_output(gpu_server, client):
    skip_without_cuda()
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    out = infer(client, "gpu_dlpack", dlpack_inputs(2), ["OUT", "WHERE"])
    assert out["OUT"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0] and out["WHERE"].tolist() == [b"cuda:0"]


def test_bls_with_gpu_preferred_memory(gpu_server, client):
    a = np.array([1, 2, 3, 4], dtype=np.float32)
    out = infer(client, "gpu_bls", {"A": a}, ["OUTPUT0", "IS_CPU", "ROUNDTRIP"])
    # Without CUDA the outputs stay CPU tensors (PreferredMemory's documented fallback).
    assert out["IS_CPU"].tolist() == [REASON is not None]
    assert out["OUTPUT0"].tolist() == [2.0, 3.0, 4.0, 5.0]
    assert out["ROUNDTRIP"].tolist() == [3.0, 4.0, 5.0, 6.0]


def model_state(server, name, timeout=120):
    """The model's (state, reason) in the repository index, once it is READY or UNAVAILABLE."""
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(server.http_url)
    deadline = time.time() + timeout
    while True:
        entry = {m["name"]: m for m in c.get_model_repository_index()}.get(name, {})
        if entry.get("state") in ("READY", "UNAVAILABLE") or time.time() > deadline:
            return entry.get("state"), entry.get("reason", "")
        time.sleep(0.2)


def test_a_kind_gpu_instance_runs_on_its_device(server, client):
    state, reason = model_state(server, "gpu_kind")
    if REASON is not None:
        # A server without GPUs refuses KIND_GPU (Triton does not fall back to the CPU for it).
        assert state == "UNAVAILABLE", (state, reason)
        skip_without_cuda()
    assert state == "READY", reason
    tc, c = client
    x = tc.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([0], dtype=np.int32))
    result = c.infer("gpu_kind", [x])
    assert result.as_numpy("KIND").tolist() == [b"GPU"]
    device = int(result.as_numpy("DEVICE")[0])
    assert 0 <= device < _native.cuda_device_count()
    assert result.as_numpy("BOUND").tolist() == [device, device], "initialize and execute ran on its device"
