"""``tg.fma(x, y, z)`` on the host: ``x * y + z`` rounded once, as C's ``fma`` and every
device's fused multiply-add instruction round it, for scalars and NumPy arrays.

NumPy has no fma, and Python's ``math.fma`` arrives with Python 3.13, so the host computes it
here, exactly, with NumPy's rounded operations and rounding *to odd* (rounded to nearest, then,
where that was inexact and the result's last bit is even, one ulp towards the exact value,
which a TwoSum gives): a sum rounded to odd in a format two or more bits wider than the
target, or added last to a larger number, rounds correctly (Boldo and Melquiond, "Emulation
of FMA and correctly rounded sums: proved algorithms using rounding to odd", 2008).

- float32: the product of two float32 numbers is exact in float64; the sum, rounded to
  float64 to odd, then rounds to float32 correctly.
- float64: the product as ``uh + ul`` (Dekker's exact product), ``z + uh`` as ``th + tl``
  (TwoSum), ``tl + ul`` rounded to odd, added to ``th``.  Elements where a step would overflow
  or underflow (huge or tiny nonzero products, inf and nan) go one at a time through Python's
  ``math.fma`` (3.13 and later, finite values) or the exact sum of fractions, rounded once by
  Python's correctly rounded integer division.

>>> fma(0.1, 10.0, -1.0)     # 0.1 * 10.0 rounds to 1.0; the exact product does not
5.551115123125783e-17
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np


def fma(x: Any, y: Any, z: Any) -> Any:
    """``x * y + z`` rounded once, in float32 when the floats among the arguments are all
    float32 (integers, and Python floats as a kernel's literals, take their type), else in
    float64; a scalar for scalars, an array for arrays."""
    if _in_float32(x, y, z):
        result = _fma32(*(np.asarray(a, np.float32) for a in (x, y, z)))
    else:
        result = _fma64(*(np.asarray(a, np.float64) for a in (x, y, z)))
        if result.ndim == 0:
            return float(result)
    return result[()] if result.ndim == 0 else result


def _in_float32(*args: Any) -> bool:
    floats = [np.asarray(a).dtype for a in args if type(a) is not float]
    floats = [d for d in floats if d.kind == "f"]
    return bool(floats) and all(d == np.float32 for d in floats)


def _fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        p = x.astype(np.float64) * y.astype(np.float64)      # exact: 24 + 24 bits < 53
        return _to_odd(*_two_sum(p, z.astype(np.float64))).astype(np.float32)


def _fma64(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Boldo and Melquiond's emulation where each step is exact (no overflow, no underflow):
    the product as ``uh + ul`` (Dekker), ``z + uh`` as ``th + tl`` (TwoSum), ``tl + ul``
    rounded to odd, and ``th`` plus that rounded to nearest; a zero product as ``x * y + z``.
    The other elements (huge and tiny products, inf and nan) one at a time, exactly."""
    x, y, z = np.broadcast_arrays(x, y, z)
    with np.errstate(all="ignore"):
        uh = x * y
        ul = _product_error(x, y, uh)
        th, tl = _two_sum(z, uh)
        result = th + _to_odd(*_two_sum(tl, ul))
        big, small = 2.0 ** 990, 2.0 ** -900
        exact_steps = (np.abs(x) < big) & (np.abs(y) < big) & (np.abs(z) < big) \
            & (np.abs(uh) < big) & (np.abs(uh) >= small) & ((th == 0) | (np.abs(th) >= small))
        # a zero product: x * y + z is exact (and its zero's sign IEEE's)
        zero_product = ((x == 0) | (y == 0)) & np.isfinite(x) & np.isfinite(y) & np.isfinite(z)
        result = np.where(zero_product, uh + z, result)
        exact_steps |= zero_product
    if not exact_steps.all():
        result = np.array(result)            # (writable, where a broadcast view is not)
        others = ~exact_steps
        with np.errstate(all="ignore"):      # (inf * 0 is nan, as in a kernel: no warning)
            result[others] = _FMA64(x[others], y[others], z[others])
    return result


def _two_sum(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``a + b`` rounded, and its error: their sum is ``a + b`` exactly (Knuth)."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _product_error(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    """``a * b - p`` exactly, for ``p = fl(a * b)`` (Dekker, halves split by Veltkamp)."""
    ah, al = _halves(a)
    bh, bl = _halves(b)
    return ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _halves(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = 134217729.0 * a                      # 2**27 + 1
    high = c - (c - a)
    return high, a - high


def _to_odd(s: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``s``, the sum rounded to nearest whose error is ``e``, rounded to odd instead: moved
    one ulp towards the exact sum where it was inexact and its last bit is even."""
    even = (s.view(np.int64) & 1) == 0
    return np.where(np.isfinite(s) & (e != 0.0) & even, np.nextafter(s, np.copysign(np.inf, e)),
                    s)


def _fma64_scalar(x: Any, y: Any, z: Any) -> float:
    x, y, z = float(x), float(y), float(z)
    if not (math.isfinite(x) and math.isfinite(y)):
        return x * y + z             # an infinite or nan product: as the rounded operations
    if not math.isfinite(z):
        return z                     # a finite product and an infinite or nan z
    if _MATH_FMA is not None:
        try:
            return _MATH_FMA(x, y, z)
        except OverflowError:        # (Python's math.fma raises where IEEE gives +-inf)
            pass
    exact = Fraction(x) * Fraction(y) + Fraction(z)
    if exact == 0:
        return x * y + z             # exact, so rounding keeps it: only its sign is at stake
    try:
        return float(exact)          # (a / b of integers: correctly rounded)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


_MATH_FMA = getattr(math, "fma", None)
_FMA64 = np.frompyfunc(_fma64_scalar, 3, 1)
