"""Elementwise kernels against the copy bandwidth on the GPU, under the current
``TAPEGRAD_ITEMS_PER_THREAD`` / ``TAPEGRAD_RESTRICT`` (run_gpu_checks.sh runs it once per
setting: tapegrad/backends/c/items.py).  2^26 float32: ``sin`` primal, the saxpy ``Z = a X + Y``
primal and adjoint; many launches between one pair of events (no host latency in the figure).
Prints one line per kernel."""

from __future__ import annotations

import os

import cupy
import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import saxpy_k, sin_k

N = 1 << 26
LAUNCHES = 50


def gpu_ms(fn) -> float:
    """Milliseconds per call of ``fn``, on the GPU's clock, best of three runs."""
    fn()
    cupy.cuda.get_current_stream().synchronize()
    best = float("inf")
    for _ in range(3):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(LAUNCHES):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, cupy.cuda.get_elapsed_time(start, stop) / LAUNCHES)
    return best


def main() -> None:
    gpu = tg.CUDA()
    x, y, z = (cupy.random.rand(N, dtype=np.float32) for _ in range(3))
    w = cupy.random.rand(N, dtype=np.float32)
    dx, dy, dz = (cupy.zeros(N, np.float32) for _ in range(3))
    setting = (f"items per thread {os.environ.get('TAPEGRAD_ITEMS_PER_THREAD', '4 (default)')}, "
               f"restrict {os.environ.get('TAPEGRAD_RESTRICT', '1 (default)')}")
    copy = 8 * N / (gpu_ms(lambda: z.__setitem__(Ellipsis, x)) * 1e-3) / 1e9
    rows = {
        "sin primal": (8 * N, lambda: sin_k(gpu)(z, x, ndrange=N)),
        "saxpy primal": (12 * N, lambda: saxpy_k(gpu)(z, 0.5, x, y, ndrange=N)),
        # (Enzyme's form, the output's shadow consumed: 3 loads and 3 stores per item)
        "saxpy adjoint": (24 * N, lambda: tg.autodiff(
            tg.Reverse, saxpy_k(gpu), tg.Const, tg.DuplicatedNoNeed(z, dz), 0.5,
            tg.Duplicated(x, dx), tg.Duplicated(y, dy), ndrange=N)),
    }
    print(f"{gpu!r}, 2^26 float32, {setting}: copy {copy:.0f} GB/s")
    for label, (nbytes, fn) in rows.items():
        if label == "saxpy adjoint":
            dz[...] = w
        ms = gpu_ms(fn)
        print(f"  {label:<14} {ms * 1e3:8.1f} us {nbytes / (ms * 1e-3) / 1e9:7.0f} GB/s "
              f"{nbytes / (ms * 1e-3) / 1e9 / copy:6.0%} of copy")


if __name__ == "__main__":
    main()
