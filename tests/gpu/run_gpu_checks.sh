#!/usr/bin/env bash
# The GPU checks, in one call, on a machine with an NVIDIA GPU (uses only what such a machine
# has: numba, numba-cuda, CuPy; tapegrad runs from this checkout).  Results go to $OUT (the
# device tool's folder) or ./gpu_results.  Budget: under 8 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TAPEGRAD_TEST_GPU=1
# a fresh private folder: a fixed path in the shared temporary folder could be another user's
TAPEGRAD_CACHE_DIR="$(mktemp -d)"
export TAPEGRAD_CACHE_DIR
trap 'rm -rf "$TAPEGRAD_CACHE_DIR"' EXIT
unset NUMBA_ENABLE_CUDASIM
RESULTS="${OUT:-gpu_results}"
mkdir -p "$RESULTS"

nvidia-smi > "$RESULTS/nvidia-smi.txt" 2>&1
python -c "import numba, numba_cuda, cupy; print('numba', numba.__version__, 'numba-cuda', numba_cuda.__version__, 'cupy', cupy.__version__)" | tee "$RESULTS/versions.txt"

status=0
# 1. the GPU tests, then the CUDA-parametrized language, barrier and atomic tests on the GPU
timeout 240 python -m pytest -q -n 0 -p no:cacheprovider tests/gpu/test_gpu.py 2>&1 | tee "$RESULTS/pytest_gpu.log" || status=1
timeout 240 python -m pytest -q -n 0 -p no:cacheprovider -k cuda tests/backends/test_language.py tests/backends/test_barriers.py tests/backends/test_atomics.py 2>&1 | tee "$RESULTS/pytest_cuda.log" || status=1
# 2. the GPU benchmarks (n = 2^26 elementwise; copy bandwidth measured on the spot)
timeout 180 python -m tapegrad bench --backend cuda --json "$RESULTS/bench_cuda.json" 2>&1 | tee "$RESULTS/bench_cuda.log" || status=1
echo "run_gpu_checks: status $status" | tee -a "$RESULTS/summary.txt"
exit $status
