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
    grid = launch_shape(nd, cuda_launcher.groupsize, cuda_launcher.limits, cuda_launcher.items)
    fn, block = cuda_launcher.function, cuda_launcher.block
    noop = cupy.RawKernel(r'extern "C" __global__ void noop(float *z) {}', "noop")
    rows = {
        "cupy RawKernel, no work, 1 argument": lambda: noop((1,), (64,), (z,)),
        "cupy Function, tapegrad's packed arguments": lambda: fn(grid, block, values),
        "tapegrad pack": lambda: cuda_launcher.pack((z, 0.5, x, y), nd),
        "tapegrad launch_shape": lambda: launch_shape(nd, cuda_launcher.groupsize,
                                                      cuda_launcher.limits, cuda_launcher.items),
        "cupy.cuda.runtime.getDevice": cupy.cuda.runtime.getDevice,
        "tapegrad compiled launcher": lambda: cuda_launcher((z, 0.5, x, y), nd),
        "tapegrad written-out launch (cuda/plan.py)": lambda: cuda_launcher.launch(
            (z, 0.5, x, y), nd),
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


def captured_heat() -> None:
    """The bench's heat simulation (100 steps of 256^2, float32) on the GPU: wall time per
    step (to the GPU's finish) launched from Python, captured with its runs of launches called
    from lists and as CUDA graphs, the GPU's own time per step, and the gradients."""
    import os

    from tapegrad.bench.problems import heat_simulation
    x = cupy.random.rand(256, 256, dtype=np.float32)
    w = cupy.random.rand(256, 256, dtype=np.float32)
    # (np.empty_like of a CuPy array is a CuPy array: NumPy hands it to CuPy)
    simulate = heat_simulation({"steps": 100, "alpha": 0.2}, tg.CUDA())
    os.environ["TAPEGRAD_CAPTURE_CUDA_GRAPHS"] = "0"          # (launched from lists)
    listed = tg.capture(simulate)
    listed(x)
    listed(x)
    tg.gradient(lambda t: tg.dot(listed(t), w), x)
    tg.gradient(lambda t: tg.dot(listed(t), w), x)
    os.environ["TAPEGRAD_CAPTURE_CUDA_GRAPHS"] = "1"          # (off until run on a GPU)
    captured = tg.capture(simulate)
    stream = cupy.cuda.get_current_stream()

    def wall_us(fn, calls: int = 20) -> float:
        fn()
        fn()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        stream.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    captured(x)
    start.record()
    captured(x)
    stop.record()
    stop.synchronize()
    gpu = cupy.cuda.get_elapsed_time(start, stop) * 1e3 / 100
    rows = {
        "launched from Python, per step": wall_us(lambda: simulate(x)) / 100,
        "captured (launch lists), per step": wall_us(lambda: listed(x)) / 100,
        "captured (CUDA graphs), per step": wall_us(lambda: captured(x)) / 100,
        "the GPU's own time in a captured call, per step": gpu,
        "gradient, per step": wall_us(lambda: tg.gradient(lambda t: tg.dot(simulate(t), w),
                                                         x)) / 100,
        "gradient captured (launch lists), per step": wall_us(lambda: tg.gradient(
            lambda t: tg.dot(listed(t), w), x)) / 100,
        "gradient captured (CUDA graphs), per step": wall_us(lambda: tg.gradient(
            lambda t: tg.dot(captured(t), w), x)) / 100,
    }
    print("\nheat, 100 steps of 256^2 float32 on the GPU:")
    for label, us in rows.items():
        print(f"{label:<50} {us:7.2f} us")
    (program,) = next(iter(captured.programs.values()))
    print("replay plan:", [type(what).__name__ for graph, what in program.compiled or ()])
    for r in program.reverses.values():
        print("reverse plan:", r and [type(what).__name__ for graph, what in r.compiled or ()])


if __name__ == "__main__":
    main()
    captured_heat()
