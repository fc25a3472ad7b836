"""log, log1p: x = 2**k m, log(1 + f) through atanh (see the package's docstring)."""

from __future__ import annotations

import numpy as np

from tapegrad.backends.cpu.vmath.bits import (
    _F,
    _HALF_F,
    _INF32,
    _INF64,
    _LN2_HI,
    _LN2_HI_F,
    _LN2_LO,
    _LN2_LO_F,
    _NAN32,
    _NAN64,
    _ONE_F,
    _P2_25,
    _P2_54,
    _P2M25,
    _P2M54,
    _TWO_F,
    _ZERO_F,
    _bits32,
    _bits64,
    _div,
    _from32,
    _from64,
    _h,
    _mad,
    _sel,
)
from tapegrad.backends.numba_cache import njit

# ---------------------------------------------------------------------------------------------
# log family: x = 2**k * m, sqrt(1/2) <= m < sqrt(2), f = m - 1, s = f/(2+f),
# log(1+f) = 2 atanh(s) = f - f^2/2 + s * (f^2/2 + R(s^2))

_L64_0, _L64_1, _L64_2, _L64_3, _L64_4, _L64_5, _L64_6 = (_h(s) for s in (
    "0x1.5555555555558p-1", "0x1.99999999951b9p-2", "0x1.2492492e11421p-2",
    "0x1.c71c62bd98378p-3", "0x1.7462bfd3502b7p-3", "0x1.39fcf310e5e28p-3",
    "0x1.2b69b4be750c0p-3"))
_L32_0, _L32_1, _L32_2 = (_F(_h(s)) for s in (
    "0x1.55555b8f06dadp-1", "0x1.997c048062a6bp-2", "0x1.2eed55da74187p-2"))

_SQRTH_BITS64 = 0x3FE6A09E667F3BCD
_SQRTH_BITS32 = 0x3F3504F3
_MIN_NORMAL64 = _h("0x1p-1022")
_MIN_NORMAL32 = _F(_h("0x1p-126"))


@njit(forceinline=True)
def _log_kernel64(x, kadd, extra):
    """``log(x) + kadd*ln2 + extra`` for normal positive finite ``x`` and small ``extra``."""
    ix = _bits64(x)
    tmp = ix - _SQRTH_BITS64
    k = tmp >> 52
    m = _from64(ix - (k << 52))            # in [sqrt(1/2), sqrt(2))
    kf = np.float64(k + kadd)
    f = m - 1.0
    s = _div(f, 2.0 + f)
    z = s * s
    r = _mad(_L64_6, z, _L64_5)
    r = _mad(r, z, _L64_4)
    r = _mad(r, z, _L64_3)
    r = _mad(r, z, _L64_2)
    r = _mad(r, z, _L64_1)
    r = _mad(r, z, _L64_0)
    r = r * z
    hfsq = 0.5 * f * f
    return kf * _LN2_HI - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO + extra))) - f)


@njit(forceinline=True)
def _log_kernel32(x, kadd, extra):
    ix = _bits32(x)
    tmp = ix - _SQRTH_BITS32
    k = tmp >> 23
    m = _from32(ix - (k << 23))
    kf = np.float32(k + kadd)
    f = m - _ONE_F
    s = _div(f, _TWO_F + f)
    z = s * s
    r = _mad(_L32_2, z, _L32_1)
    r = _mad(r, z, _L32_0)
    r = r * z
    hfsq = _HALF_F * f * f
    return kf * _LN2_HI_F - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO_F + extra))) - f)


@njit(forceinline=True)
def _log64(x):
    ok = (x > 0.0) & (x < _INF64)
    xs = _sel(ok, x, 1.0)
    sub = xs < _MIN_NORMAL64
    xs = _sel(sub, xs * _P2_54, xs)
    y = _log_kernel64(xs, _sel(sub, -54, 0), 0.0)
    special = _sel(x == 0.0, -_INF64, _sel(x > 0.0, x, _NAN64))
    return _sel(ok, y, special)


@njit(forceinline=True)
def _log32(x):
    ok = (x > _ZERO_F) & (x < _INF32)
    xs = _sel(ok, x, _ONE_F)
    sub = xs < _MIN_NORMAL32
    xs = _sel(sub, xs * _F(_P2_25), xs)
    y = _log_kernel32(xs, _sel(sub, -25, 0), _ZERO_F)
    special = _sel(x == _ZERO_F, -_INF32, _sel(x > _ZERO_F, x, _NAN32))
    return _sel(ok, y, special)


@njit(forceinline=True)
def _log1p64(x):
    u = 1.0 + x
    ok = (u > 0.0) & (u < _INF64)
    us = _sel(ok, u, 2.0)
    # 1 + x = u + c exactly
    c = _sel(us >= 2.0, 1.0 - (us - x), x - (us - 1.0))
    y = _log_kernel64(us, 0, _div(c, us))
    special = _sel(x == -1.0, -_INF64, _sel(x > 0.0, x, _NAN64))
    y = _sel(ok, y, special)
    return _sel(not abs(x) >= _P2M54, x, y)


@njit(forceinline=True)
def _log1p32(x):
    u = _ONE_F + x
    ok = (u > _ZERO_F) & (u < _INF32)
    us = _sel(ok, u, _TWO_F)
    c = _sel(us >= _TWO_F, _ONE_F - (us - x), x - (us - _ONE_F))
    y = _log_kernel32(us, 0, _div(c, us))
    special = _sel(x == _F(-1.0), -_INF32, _sel(x > _ZERO_F, x, _NAN32))
    y = _sel(ok, y, special)
    return _sel(not abs(x) >= _F(_P2M25), x, y)
