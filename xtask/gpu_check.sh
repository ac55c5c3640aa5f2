#!/usr/bin/env bash
# The GPU path end to end, in one run, on a machine with an NVIDIA GPU and its driver:
# - tritium-cuda's own test against the real driver (device memory, IPC export, copies);
# - tests/test_cuda_shm.py: CUDA shared memory from tritonclient over HTTP and gRPC (register,
#   inputs and outputs in regions, status, unregister while in use, Triton's errors), KIND_GPU
#   placement and a missing gpu id;
# - tests/test_gpu_tensors.py and python/tests/test_cuda.py: GPU tensors through a stub
#   (DLPack into torch or cupy, GPU outputs, BLS with preferred_memory GPU, KIND_GPU binding).
# TRITIUM_REQUIRE_GPU=1 turns every "needs a GPU" skip into a failure.
#
# Usage, from the repository root:
#   xtask/gpu_check.sh          after `cargo xtask build` (what `cargo xtask gpu-check` runs)
#   xtask/gpu_check.sh .gpu     with a bundle from `cargo xtask gpu-check --bundle` (no cargo,
#                               no network: the binary, the native module and wheels travel)
# TRITIUM_GPU_PYTHON picks the interpreter (default python3; it should have numpy, pytest,
# and torch or cupy if those are to be checked too).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-}
py=${TRITIUM_GPU_PYTHON:-python3}
cuda_tests=""
if [ -n "$bundle" ]; then
    site=/tmp/tritium-gpu-site
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$bundle"/wheels/*.whl || exit 1
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    install -m 755 "$bundle/_native.abi3.so" python/tritium/_native.abi3.so || exit 1
    export TRITIUM_BIN="$PWD/$bundle/bin/tritium"
    cuda_tests="$bundle/bin/tritium-cuda-tests"
fi
echo "gpu-check: $(nvidia-smi -L 2>&1 | head -8)"
"$py" - <<'PY'
import importlib
for name in ("numpy", "torch", "cupy", "tritonclient", "cuda.bindings"):
    try:
        m = importlib.import_module(name)
        print(f"gpu-check: {name} {getattr(m, '__version__', '')}")
    except Exception as e:  # noqa: BLE001
        print(f"gpu-check: {name} missing ({e.__class__.__name__}: {e})")
PY
export TRITIUM_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
status=0
if [ -n "$cuda_tests" ]; then
    "$cuda_tests" --test-threads 1 || status=1
fi
# Two runs: python/tests and tests each have a conftest.py of their own.
"$py" -m pytest -v -rs -p no:cacheprovider python/tests/test_cuda.py || status=1
"$py" -m pytest -v -rs -p no:cacheprovider tests/test_cuda_shm.py tests/test_gpu_tensors.py || status=1
if [ "$status" = 0 ]; then echo "gpu-check: PASSED"; else echo "gpu-check: FAILED"; fi
exit "$status"
