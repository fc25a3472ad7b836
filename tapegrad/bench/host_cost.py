"""``python -m tapegrad bench --backend cuda-standin``: what a CUDA launch costs tapegrad on
the host, measured without a GPU.  ``tg.CUDA()`` runs its whole host path (kernels compiled by
NVRTC, arguments checked, packed and handed to the driver) on a stand-in CuPy whose driver
call does nothing (``standin_cupy.py``); so every change to the launch path is measured in the
development machine's terms.  On a GPU, ``bench --backend cuda`` prints the same rows with the
real driver (whose ``cuLaunchKernel`` adds about 2 us)."""

from __future__ import annotations

import json
import os
import platform

import tapegrad as tg
from tapegrad.bench.machine import describe
from tapegrad.bench.overheads import _launch_overheads
from tapegrad.bench.standin_cupy import installed

# what issue 44 asks of the host path, per launch (microseconds).  The recorded row is the
# recording's own: each recorded step allocates its output (a simulation's new state), and
# that allocation, the stand-in's (CuPy's on a GPU), is taken out, as the launch row, which
# launches into an existing array, has none.
# The nonlinear rows are a chain of sin steps, whose adjoints read the states the tape kept.
TARGETS_US = {"launch": 3.0, "recorded_launch": 8.0, "replayed_adjoint": 3.0,
              "recorded_nonlinear_launch": 8.0, "replayed_nonlinear_adjoint": 3.0}


def host_cost_main(quick: bool = False, json_path: str | None = None) -> int:
    with installed() as cupy:
        backend = tg.CUDA()
        print(f"tapegrad {tg.__version__} host cost per CUDA launch on a stand-in driver (no "
              f"GPU): {platform.processor() or platform.machine()}, {os.cpu_count()} cores")
        us = _launch_overheads(quick, backend)
        launches = cupy.cuda.driver.launches
    print(f"({launches} launches handed to the stand-in driver)")
    rows = dict(us, recorded_launch=us["recorded_launch"] - us["allocation"],
                recorded_nonlinear_launch=us["recorded_nonlinear_launch"] - us["allocation"])
    for row, target in TARGETS_US.items():
        print(f"{row:<26} {rows[row]:6.2f} us  (target <= {target:.0f} us: "
              f"{'ok' if rows[row] <= target else 'over'})"
              + (f"  (+ {us['allocation']:.2f} us for the step's new array)"
                 if row.startswith("recorded") else ""))
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": describe(), "device": "stand-in CUDA driver",
                       "launch_overhead_us": us,
                       "targets_us": TARGETS_US,
                       "against_targets_us": {row: rows[row] for row in TARGETS_US}},
                      f, indent=2)
        print(f"wrote {json_path}")
    return 0
