"""The bench's machine lines: first-launch compile time and cached-load time, each in a fresh
process, and the heat gradient with one busy process per core running alongside."""

from __future__ import annotations

import os
import time

from tapegrad.bench.timing import _median_ms


def describe() -> dict:
    """The machine and software a bench's JSON results were measured with, and when."""
    import datetime
    import platform
    from importlib import metadata

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f
                         if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}          # installed distributions, read without importing them
    for name in ("tapegrad", "numpy", "numba", "cupy-cuda13x", "cupy-cuda12x", "pyopencl",
                 "jax", "torch", "warp-lang", "taichi"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpu": model, "cores": cores, "python": platform.python_version(),
            "versions": versions}


def _compile_times() -> dict:
    """First launch with an empty kernel cache, then again in a new process (cache hit)."""
    import subprocess
    import sys
    import tempfile
    code = ("import time, numpy as np; t0 = time.perf_counter(); import tapegrad as tg; "
            "from tapegrad.bench import saxpy; t1 = time.perf_counter(); X = np.ones(16); "
            "saxpy(tg.CPU())(X, 2.0, X, ndrange=16); t2 = time.perf_counter(); "
            "print(t1 - t0, t2 - t1)")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TAPEGRAD_CACHE_DIR=cache)
        out = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=env, timeout=300)
            out.append([float(v) for v in proc.stdout.split()])
    result = {"import_s": out[1][0], "first_launch_compile_s": out[0][1],
              "first_launch_cached_s": out[1][1]}
    print(f"\nfirst launch of a kernel in a new process: {result['first_launch_compile_s']:.2f} s "
          f"compiling, {result['first_launch_cached_s']:.3f} s from the on-disk cache "
          f"(import tapegrad: {result['import_s']:.2f} s)")
    return result


_BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _busy_machine(quick: bool) -> dict:
    """The heat gradient with one busy process per core running alongside, against idle: the
    fair share of the cores is about 2x (more threads than granted cores would wait at
    barriers for descheduled ones: tapegrad/backends/cpu/threads.py)."""
    import subprocess
    import sys

    from tapegrad.bench.problems import make_tapegrad, problems
    heat = next(p for p in problems(quick) if p["kind"] == "heat")
    _, gradient = make_tapegrad(heat)
    repeats = 5 if quick else 15
    gradient()
    idle = _median_ms(gradient, repeats)
    cores = os.cpu_count() or 1
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(seconds=120)])
            for _ in range(cores)]
    try:
        time.sleep(0.5)                     # (the busy processes started and running)
        loaded = _median_ms(gradient, repeats)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    result = {"kernel": heat["name"], "idle_ms": idle, "busy_ms": loaded,
              "busy_over_idle": loaded / idle, "busy_processes": cores}
    print(f"\nbusy machine ({cores} busy processes, one per core): {heat['name']} gradient "
          f"{idle:.2f} ms idle, {loaded:.2f} ms busy: {loaded / idle:.2f}x (fair share ~2x)")
    return result
