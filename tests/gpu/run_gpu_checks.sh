#!/usr/bin/env bash
# The GPU checks, in one call, on a machine with an NVIDIA GPU and CuPy (NVRTC from
# cuda-bindings, else CuPy's own); tapegrad runs from this checkout.  Results go to $OUT (the
# device tool's folder) or ./gpu_results.  Budget: under 7 minutes on an H200.
#
#   tests/gpu/run_gpu_checks.sh            on the GPU machine
#   tests/gpu/run_gpu_checks.sh --dry-run  anywhere: every step that needs no GPU (the GPU
#                                          tests collected, the bench on OpenCL instead)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
[ "$DRY" = 1 ] || export TAPEGRAD_TEST_GPU=1
# a fresh private folder: a fixed path in the shared temporary folder could be another user's
TAPEGRAD_CACHE_DIR="$(mktemp -d)"
export TAPEGRAD_CACHE_DIR
trap 'rm -rf "$TAPEGRAD_CACHE_DIR"' EXIT
RESULTS="${OUT:-gpu_results}"
mkdir -p "$RESULTS"
PYTEST=(python -m pytest -q -p no:cacheprovider -o addopts="")

status=0
step() {   # step NAME SECONDS COMMAND...: run it with a time limit, log it, note a failure
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$RESULTS/$name.log"
    echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$RESULTS/summary.txt"
    [ "$rc" = 0 ] || status=1
}

{ nvidia-smi || echo "no nvidia-smi"; } > "$RESULTS/nvidia-smi.txt" 2>&1
python - > "$RESULTS/versions.txt" 2>&1 <<'PY'
import importlib, platform
print("python", platform.python_version())
for name in ("numpy", "numba", "cupy", "cuda.bindings", "torch", "warp", "jax"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:
        print(name, "-", type(e).__name__)
try:
    from tapegrad.backends.cuda import nvrtc
    print("nvrtc", nvrtc.version(), "archs", nvrtc.supported_archs())
except Exception as e:
    print("nvrtc -", e)
PY
cat "$RESULTS/versions.txt"

if [ "$DRY" = 1 ]; then
    step collect 120 "${PYTEST[@]}" --collect-only tests/gpu/test_gpu.py
    step bench_opencl 300 python -m tapegrad bench --backend opencl --quick --json "$RESULTS/bench_opencl.json"
else
    # 1. the GPU's own tests: CuPy arrays, big sizes, streams, limits, > 48 KiB shared memory
    step gpu_tests 150 "${PYTEST[@]}" -n 0 tests/gpu/test_gpu.py
    # 2. every backend-parametrised test on the GPU (kernels, tangents, adjoints, the tape),
    #    checked against the same expectations as the CPU's
    step suite_on_cuda 240 "${PYTEST[@]}" -n 8 --dist loadfile -k "cuda" tests/backends tests/ad tests/tape tests/frontend
    # 3. host cost per launch, primal bandwidth, adjoint/tangent over primal, results vs CPU
    step bench_cuda 120 python -m tapegrad bench --backend cuda --quick --json "$RESULTS/bench_cuda.json"
fi
echo "run_gpu_checks: status $status" | tee -a "$RESULTS/summary.txt"
exit $status
