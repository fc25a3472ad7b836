"""``python -m tapegrad bench``: tapegrad side by side with its peers, in one run, on the same
data.

1. Kernels against the same loops written by hand with ``numba.njit(parallel=True)`` and
   against NumPy, and the copy bandwidth measured on the spot (the floor of each kernel).
2. Primal and gradient of seven problems (float32) for tapegrad, NumPy with hand-written
   derivatives, JAX ``jit(grad)``, PyTorch autograd, NVIDIA Warp (``wp.Tape``) and Taichi
   (``ti.ad.Tape``); peers that are not installed are skipped with a note.
3. Adjoint and tangent launches against their primal and against adjoints written by hand.
4. The overhead per launch: a tiny kernel called directly, launched, recorded on a tape,
   its adjoint replayed, and differentiated with ``tg.autodiff``.
5. First-launch compile time and cached-load time, each in a fresh process.

Times are medians of several runs after a warm-up call; in the peers' table each
implementation's primal and gradient are timed in turn, so that a slow minute of a shared
machine slows both and their ratio stays honest.  Benchmarks never run as timed tests; the
test suite only smoke-runs ``--quick``.
"""

from __future__ import annotations

import json
import os
import platform
import time

import numba
import numpy as np

import tapegrad as tg
from tapegrad.bench.device import device_main
from tapegrad.bench.kernel_times import _bandwidth_gbs, _cases, _gradient_cases, saxpy
from tapegrad.bench.machine import _busy_machine, _compile_times, describe
from tapegrad.bench.overheads import _launch_overheads
from tapegrad.bench.peer_table import WARMUP, _alternating_medians, _peer_table
from tapegrad.bench.timing import _median_ms

__all__ = ["main", "device_main", "saxpy", "WARMUP", "_alternating_medians", "_peer_table",
           "_median_ms"]


def main(quick: bool = False, json_path: str | None = None, backend: str = "cpu") -> int:
    if backend != "cpu":
        return device_main(backend, quick, json_path)
    repeats = 5 if quick else 20
    print(f"tapegrad {tg.__version__} bench ({'quick' if quick else 'full'}): "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"numba {numba.__version__}, numpy {np.__version__}")
    gbs = _bandwidth_gbs(quick)
    print(f"memory bandwidth (numpy copy, measured now): {gbs:.1f} GB/s")
    header = (f"{'kernel':<34} {'first launch':>12} {'tapegrad':>10} {'numba':>10} "
              f"{'numpy':>10} {'tg/numba':>9} {'tg/numpy':>9} {'floor':>8}")
    print(header)
    print("-" * len(header))
    results = []
    for case in _cases(quick):
        t0 = time.perf_counter()
        case["tapegrad"]()
        first = time.perf_counter() - t0
        case["numba"]()
        row = {"kernel": case["name"], "first_launch_s": first}
        for impl in ("tapegrad", "numba", "numpy"):
            row[f"{impl}_ms"] = _median_ms(case[impl], repeats)
        row["floor_ms"] = case["bytes"] / (gbs * 1e9) * 1e3
        row["tg_over_numba"] = row["tapegrad_ms"] / row["numba_ms"]
        row["tg_over_numpy"] = row["tapegrad_ms"] / row["numpy_ms"]
        results.append(row)
        print(f"{row['kernel']:<34} {first:>10.3f} s {row['tapegrad_ms']:>7.3f} ms "
              f"{row['numba_ms']:>7.3f} ms {row['numpy_ms']:>7.3f} ms "
              f"{row['tg_over_numba']:>8.2f}x {row['tg_over_numpy']:>8.2f}x "
              f"{row['floor_ms']:>5.2f} ms")
    print("numba = the same loop written by hand with numba.njit(parallel=True); "
          "floor = bytes moved / bandwidth")
    print()
    header = (f"{'gradient':<38} {'primal':>10} {'adjoint':>10} {'autodiff':>10} "
              f"{'by hand':>10} {'adj/primal':>10} {'adj/hand':>9} {'tangent':>10} "
              f"{'tan/primal':>10}")
    print(header)
    print("-" * len(header))
    gradients = []
    for case in _gradient_cases(quick):
        case["hand"]()
        row = {"kernel": case["name"]}
        for impl in ("primal", "adjoint", "autodiff", "hand", "tangent"):
            row[f"{impl}_ms"] = _median_ms(case[impl], repeats)
        row["adjoint_over_primal"] = row["adjoint_ms"] / row["primal_ms"]
        row["adjoint_over_hand"] = row["adjoint_ms"] / row["hand_ms"]
        row["tangent_over_primal"] = row["tangent_ms"] / row["primal_ms"]
        gradients.append(row)
        print(f"{row['kernel']:<38} {row['primal_ms']:>7.3f} ms {row['adjoint_ms']:>7.3f} ms "
              f"{row['autodiff_ms']:>7.3f} ms {row['hand_ms']:>7.3f} ms "
              f"{row['adjoint_over_primal']:>9.2f}x {row['adjoint_over_hand']:>8.2f}x "
              f"{row['tangent_ms']:>7.3f} ms {row['tangent_over_primal']:>9.2f}x")
    print("adjoint = the generated adjoint kernel's launch; autodiff = tg.autodiff, i.e. the "
          "primal launch, then the adjoint; by hand = the adjoint loop written with numba; "
          "tangent = the forward-mode launch (outputs and tangents)")
    peers = _peer_table(quick, repeats)
    from tapegrad.bench.determinism import deterministic_lines
    ordered = deterministic_lines(quick, repeats)
    from tapegrad.bench.second import hvp_lines
    second = hvp_lines(quick, repeats)
    overheads = _launch_overheads(quick)
    from tapegrad.bench.interop import main as interop
    wrapped = interop(quick)
    compile_times = _compile_times()
    busy = _busy_machine(quick)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": describe(), "bandwidth_gbs": gbs, "quick": quick,
                       "results": results,
                       "gradients": gradients, "peers": peers, "overhead_us": overheads,
                       "compile": compile_times, "busy_machine": busy,
                       "deterministic": ordered, "hvp": second,
                       "interop": wrapped}, f, indent=2)
        print(f"wrote {json_path}")
    return 0
