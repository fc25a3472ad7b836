"""``tg.fma(x, y, z)`` on the CPU: ``x * y + z`` rounded once, through ``llvm.fma`` (the FMA
instruction of a CPU that has one, a libm call on one without), so that a loop of them still
vectorises.  Generated modules import this only where a kernel calls ``tg.fma``
(``expressions.module_imports``)::

    for i in range(n):
        C[i] = fused.fma(A[i], B[i], C[i])      # one vfmadd per 16 float32 on AVX-512
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload


@intrinsic
def _fma(typingctx, a, b, c):
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ty, [ty, ty, ty]),
            "llvm.fma.f32" if a == types.float32 else "llvm.fma.f64")
        return builder.call(fn, args)

    return a(a, b, c), codegen


def fma(x, y, z):
    """``x * y + z`` rounded once: float32 when all three are float32, else float64; usable
    inside ``numba.njit`` code and from Python.

    >>> fma(0.1, 10.0, -1.0)
    5.551115123125783e-17
    """
    return _fma_call(x, y, z)


@overload(fma, inline="always")
def _fma_typed(x, y, z):
    if x == y == z == types.float32:
        return lambda x, y, z: _fma(x, y, z)
    if all(isinstance(a, (types.Float, types.Integer, types.Boolean)) for a in (x, y, z)):
        return lambda x, y, z: _fma(np.float64(x), np.float64(y), np.float64(z))
    return None


_fma_call = numba.njit(lambda x, y, z: fma(x, y, z))
