"""Where a CUDA launch's host time goes (run by run_gpu_checks.sh on a GPU machine): CuPy's
own launch of the same compiled function against tapegrad's launcher, its packing and its
grid, and a profile of tapegrad's launch.  Prints microseconds per call."""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import cupy
import numpy as np

import tapegrad as tg
from tapegrad.backends.cuda.limits import launch_shape
from tapegrad.bench.problems import saxpy_k
from tapegrad.runtime.launch import prepare


def per_call_us(fn, calls: int = 2000) -> float:
    fn()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    cupy.cuda.get_current_stream().synchronize()
    return best


def main() -> None:
    backend = tg.CUDA()
    n = 64
    z, x, y = (cupy.zeros(n, np.float32) for _ in range(3))
    cfg = saxpy_k(backend)
    cuda_launcher, nd, _ = prepare(cfg, (z, 0.5, x, y), n)
    values = tuple(cuda_launcher.pack((z, 0.5, x, y), nd))
    grid = launch_shape(nd, cuda_launcher.groupsize, cuda_launcher.limits)
    fn, block = cuda_launcher.function, cuda_launcher.block
    noop = cupy.RawKernel(r'extern "C" __global__ void noop(float *z) {}', "noop")
    rows = {
        "cupy RawKernel, no work, 1 argument": lambda: noop((1,), (64,), (z,)),
        "cupy Function, tapegrad's packed arguments": lambda: fn(grid, block, values),
        "tapegrad pack": lambda: cuda_launcher.pack((z, 0.5, x, y), nd),
        "tapegrad launch_shape": lambda: launch_shape(nd, cuda_launcher.groupsize,
                                                      cuda_launcher.limits),
        "cupy.cuda.runtime.getDevice": cupy.cuda.runtime.getDevice,
        "tapegrad compiled launcher": lambda: cuda_launcher((z, 0.5, x, y), nd),
        "tapegrad prepare": lambda: prepare(cfg, (z, 0.5, x, y), n),
        "tapegrad launch cfg(...)": lambda: cfg(z, 0.5, x, y, ndrange=n),
    }
    for label, f in rows.items():
        print(f"{label:<45} {per_call_us(f):7.2f} us")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3000):
        cfg(z, 0.5, x, y, ndrange=n)
    profile.disable()
    pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
