"""``floor``, ``ceil`` and ``trunc`` of a float as a float, on CUDA.

In kernels they keep the argument's float type, as NumPy's ufuncs and CUDA's own functions do
(``floor(nan)`` is nan, ``floor(1e20)`` is 1e20).  numba-cuda's ``math.floor`` follows Python
and returns an int64, which has no nan or inf and wraps beyond 2**63, and the CUDA simulator
has no libdevice; so each goes through int64 only where that is exact: below 2**52 in
magnitude (every float from there on is an integer already, as are inf and nan, which fail the
test).  ``copysign`` keeps the sign of a zero result (``ceil(-0.5)`` is ``-0.0``).
"""

from __future__ import annotations

import math

from numba import cuda

_EXACT = 4503599627370496.0     # 2**52


@cuda.jit(device=True)
def floor_float(x):  # noqa: ANN001, ANN201 (a device function: Numba types it)
    if abs(x) < _EXACT:
        return math.copysign(float(math.floor(float(x))), x)
    return float(x)


@cuda.jit(device=True)
def ceil_float(x):  # noqa: ANN001, ANN201
    if abs(x) < _EXACT:
        return math.copysign(float(math.ceil(float(x))), x)
    return float(x)


@cuda.jit(device=True)
def trunc_float(x):  # noqa: ANN001, ANN201
    if abs(x) < _EXACT:
        return math.copysign(float(math.trunc(float(x))), x)
    return float(x)
