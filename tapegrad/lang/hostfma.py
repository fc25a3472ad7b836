"""``tg.fma(x, y, z)`` on the host: ``x * y + z`` rounded once, as C's ``fma`` and every
device's fused multiply-add instruction round it, for scalars and NumPy arrays.

NumPy has no fma, and Python's ``math.fma`` arrives with Python 3.13, so the host computes it
here, exactly:

- float32 (every argument float32): the product of two float32 numbers is exact in float64; the
  sum is rounded to float64 *to odd* (rounded to nearest, then, when that was inexact and the
  result's last bit is even, moved one ulp towards the exact sum, which a TwoSum gives), and
  that rounds to float32 correctly (Boldo and Melquiond, "Emulation of FMA and correctly
  rounded sums: proved algorithms using rounding to odd", 2008: a format two or more bits wider
  than the target).  Vectorised.
- float64: Python's ``math.fma`` where it exists (for finite arguments and results: it raises
  where IEEE gives inf or nan), else the exact sum of fractions, rounded once by Python's
  correctly rounded integer division: one element at a time (slow, but exact).

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
        with np.errstate(all="ignore"):      # (inf * 0 is nan, as in a kernel: no warning)
            result = _FMA64(x, y, z)
        result = result.astype(np.float64) if isinstance(result, np.ndarray) else float(result)
    return result[()] if isinstance(result, np.ndarray) and result.ndim == 0 else result


def _in_float32(*args: Any) -> bool:
    floats = [np.asarray(a).dtype for a in args if type(a) is not float]
    floats = [d for d in floats if d.kind == "f"]
    return bool(floats) and all(d == np.float32 for d in floats)


def _fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        p = x.astype(np.float64) * y.astype(np.float64)      # exact: 24 + 24 bits < 53
        c = z.astype(np.float64)
        s = p + c
        b = s - p                                            # TwoSum: s + e == p + c exactly
        e = (p - (s - b)) + (c - b)
        even = (s.view(np.int64) & 1) == 0
        to_odd = np.isfinite(s) & (e != 0.0) & even
        s = np.where(to_odd, np.nextafter(s, np.copysign(np.inf, e)), s)
        return s.astype(np.float32)


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
