"""Run in a subprocess without the CUDA simulator: compile the primal, tangent and adjoint
kernels of a corpus to PTX for sm_90 and print one line per kernel."""

from __future__ import annotations

import os
import sys
import tempfile

os.environ.pop("NUMBA_ENABLE_CUDASIM", None)

import numpy as np  # noqa: E402

import tapegrad as tg  # noqa: E402
from tapegrad.backends.cuda.ptx import PTXTarget  # noqa: E402
from tapegrad.runtime.adjoint import compile_adjoint
from tapegrad.runtime.arguments import check_args
from tapegrad.runtime.launch import compile_kernel
from tapegrad.runtime.tangent import compile_tangent
from tests.ad import test_forward as F  # noqa: E402
from tests.ad import test_reverse as R  # noqa: E402
from tests.test_primitives import ROWS, load_every_row  # noqa: E402

EVERY_ROW = np.zeros((8, len(ROWS)))

F64 = np.zeros(8)
CASES = [   # kernel, example arguments, ndrange, workgroup size, differentiated arguments
    (R.sin_kernel, (F64, F64), 8, (64,), (0, 1)),
    (R.saxpy, (F64, 1.0, F64), 8, (64,), (0, 1, 2)),
    (R.all_unary, (np.zeros((8, 25)), F64), 8, (32,), (0, 1)),
    (R.all_binary, (np.zeros((8, 9)), F64, F64), 8, (32,), (0, 1, 2)),
    (R.stencil, (F64, F64), 8, (32,), (0, 1)),
    (R.gather, (F64, F64, np.zeros(8, np.int64)), 8, (32,), (0, 1)),
    (R.loops, (F64, F64, 3), 8, (32,), (0, 1)),
    (R.fibonacci, (F64, F64, 3), 8, (32,), (0, 1)),
    (R.nested_dynamic, (F64, F64, np.zeros(8, np.int64)), 8, (32,), (0, 1)),
    (R.newton_sqrt, (F64, F64), 8, (32,), (0, 1)),
    (R.early_exit, (F64, F64), 8, (32,), (0, 1)),
    (R.uses_funcs, (F64, F64, F64), 8, (32,), (0, 1, 2)),
    (R.uses_softplus, (F64, F64), 8, (32,), (0, 1)),
    (R.matmul, (np.zeros((8, 8)), np.zeros((8, 8)), np.zeros((8, 8))), (8, 8), (4, 4), (0, 1, 2)),
    (R.block_sum_of_squares, (np.zeros(4), np.zeros(32)), 32, (8,), (0, 1)),
    (R.dense_tanh, (F64, np.zeros((8, 3)), np.zeros(3), F64), 8, (32,), (0, 1, 2, 3)),
    (R.square, (F64,), 8, (32,), (0,)),
    (F.histogram_weights, (np.zeros(3), np.zeros(8, np.int64), F64), 8, (32,), (0, 2)),
    # every row of the primitive table, its helpers for numba-cuda included
    (load_every_row(tempfile.mkdtemp()), (EVERY_ROW, EVERY_ROW, EVERY_ROW), 8, (32,), (0, 1, 2)),
]


def main(shard: int = 0, shards: int = 1) -> int:
    """Compile cases ``shard``, ``shard + shards``, ... (the test runs two shards side by
    side: each is a single-threaded compile)."""
    target = PTXTarget((9, 0))
    failures = 0
    for kernel, args, nd, wgs, diff in CASES[shard::shards]:
        nd_t = (nd,) if isinstance(nd, int) else nd
        argtypes = check_args(kernel, tg.CPU(), args)
        activity = tuple(("dup" if hasattr(a, "shape") else "active") if k in diff else "const"
                         for k, a in enumerate(args))
        for mode in ("primal", "forward", "reverse"):
            try:
                if mode == "primal":
                    ptx = compile_kernel(kernel, mode, target, argtypes, len(nd_t), wgs)
                elif mode == "forward":
                    ptx = compile_tangent(kernel, target, argtypes, activity, len(nd_t), wgs, 2)[1]
                else:
                    compiled = compile_adjoint(kernel, target, argtypes, activity,
                                               len(nd_t), wgs, None)
                    ptx = compiled.launcher
                    if not isinstance(ptx, str):   # a stencil adjoint: gather kernels + rest
                        ptx = "\n".join([g.adding for g in ptx.gathers]
                                        + [target.compile(g.storing_typed) for g in ptx.gathers]
                                        + [ptx.rest or ""])
                    if compiled.storing is not None:    # storing into new gradients
                        ptx += "\n" + compiled.storing(compiled.storing.storable)
                ok = ".entry" in ptx and ".target sm_90" in ptx
                print(f"{'ok' if ok else 'BAD'} {kernel.name} {mode} {len(ptx)} "
                      f"atom={'atom.' in ptx} bar={'bar.sync' in ptx}")
                failures += not ok
            except Exception as exc:   # report every kernel, then fail
                failures += 1
                print(f"FAIL {kernel.name} {mode}: {type(exc).__name__}: {exc}".splitlines()[0])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(*map(int, sys.argv[1:3])))
