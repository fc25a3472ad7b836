"""pow for float32 (see the package's docstring)."""

from __future__ import annotations

import numpy as np

from tapegrad.backends.cpu.vmath.bits import _F, _INF64, _NAN64, _bits64, _sel
from tapegrad.backends.cpu.vmath.exp import _exp64
from tapegrad.backends.cpu.vmath.log import _log64
from tapegrad.backends.numba_cache import njit

# ---------------------------------------------------------------------------------------------
# pow (float32)

_TWO52 = 4503599627370496.0      # 2**52: adding and subtracting it rounds to an integer


@njit(forceinline=True)
def _pow32(x, y):
    """float32 ``x ** y`` as ``exp(y log|x|)`` in float64: the error, about ``|y log x|``
    float64 ulps with ``|y log x| < 104`` wherever the float32 result is finite and not zero,
    stays far below half a float32 ulp, so the result is rounded once.  Then the sign
    (negative ``x``, odd integer ``y``) and C99's special cases."""
    xd = np.float64(x)
    yd = np.float64(y)
    neg = _bits64(xd) < 0                      # the sign bit: -0.0 counts (pow(-0, -1) = -inf)
    ax = _sel(neg, -xd, xd)
    r = _exp64(yd * _log64(ax))
    ay = _sel(yd < 0.0, -yd, yd)
    finite_y = ay < _INF64
    big = ay >= _TWO52                         # every float from 2**52 on is an even integer
    whole = big | (((ay + _TWO52) - _TWO52) == ay)
    half = ay * 0.5
    odd = finite_y & ~big & whole & (((half + _TWO52) - _TWO52) != half)
    r = _sel(neg & odd, -r, r)
    # a negative finite base to a finite fractional power has no real value
    r = _sel(neg & (ax > 0.0) & (ax < _INF64) & finite_y & ~whole, _NAN64, r)
    # pow(x, +-0) = pow(1, y) = 1 (even for nan), pow(-1, +-inf) = 1
    one = (yd == 0.0) | (xd == 1.0) | ((ax == 1.0) & (ay == _INF64))
    return _F(_sel(one, 1.0, r))
