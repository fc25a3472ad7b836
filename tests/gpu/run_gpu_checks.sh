#!/usr/bin/env bash
# The GPU checks, in one call, on a machine with an NVIDIA GPU and CuPy (NVRTC from
# cuda-bindings, else CuPy's own); tapegrad runs from this checkout.  Results go to $OUT (the
# device tool's folder) or ./gpu_results.  Budget: under 4 minutes on an H200 (the
# first run there, 2026-12-04, took 84 s).
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
    step gpu_tests 120 "${PYTEST[@]}" -n 0 tests/gpu/test_gpu.py
    # 2. every backend-parametrised test on the GPU (kernels, tangents, adjoints, the tape),
    #    checked against the same expectations as the CPU's
    #    (test_opencl.py and test_cuda_c.py need PyOpenCL, which GPU images lack; they run in
    #    CI, on PoCL and NVRTC)
    step suite_on_cuda 200 "${PYTEST[@]}" -n 8 --dist loadfile -k "cuda" \
        --ignore tests/backends/test_opencl.py --ignore tests/backends/test_cuda_c.py \
        tests/backends tests/ad tests/tape tests/frontend
    # 2b. the GPU guide's CUDA example, as written (tests/docs/guides.py)
    step guide_gpu 120 "${PYTEST[@]}" -n 0 "tests/docs/test_guides.py::test_guide_examples_run[gpu.md]"
    # 3. host cost per launch, primal bandwidth, adjoint/tangent over primal, results vs CPU,
    #    PyTorch CUDA on the same kernels (the full sizes: 2^26 elements)
    step bench_cuda 200 python -m tapegrad bench --backend cuda --json "$RESULTS/bench_cuda.json"
    # 4. where a launch's host time goes: CuPy's own launch against tapegrad's
    step host_cost 90 python tests/gpu/host_cost.py
    # 5. sin and saxpy (2^26 float32) against the copy bandwidth: one work-item per thread
    #    (the code before tapegrad/backends/c/items.py), 4 without and with restrict
    #    pointers (the default), 8 per thread
    step items_one 60 env TAPEGRAD_ITEMS_PER_THREAD=1 TAPEGRAD_RESTRICT=0 \
        python tests/gpu/items_bandwidth.py
    step items_four_plain 60 env TAPEGRAD_RESTRICT=0 python tests/gpu/items_bandwidth.py
    step items_four 60 python tests/gpu/items_bandwidth.py
    step items_eight 60 env TAPEGRAD_ITEMS_PER_THREAD=8 python tests/gpu/items_bandwidth.py
fi
echo "run_gpu_checks: status $status" | tee -a "$RESULTS/summary.txt"
exit $status
