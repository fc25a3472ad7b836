"""exp, expm1, sinh, cosh, tanh: x = k ln2 + r, expm1(r) as a double-word (see the
package's docstring for the method and accuracy)."""

from __future__ import annotations

import numpy as np

from tapegrad.backends.cpu.vmath.bits import (
    _F,
    _HALF_F,
    _LN2_HI,
    _LN2_HI_F,
    _LN2_LO,
    _LN2_LO_F,
    _LOG2E,
    _LOG2E_F,
    _ONE_F,
    _P2M25,
    _P2M54,
    _QUARTER_F,
    _SHIFT,
    _SHIFT_F,
    _TWO_F,
    _div,
    _from32,
    _from64,
    _h,
    _mad,
    _sel,
    _sign_of64,
    _xorsign32,
    _xorsign64,
)
from tapegrad.backends.numba_cache import njit

# ---------------------------------------------------------------------------------------------
# exp family: x = k*ln2 + r, |r| <= ln2/2, expm1(r) = r + r^2/2 + r^3 * Q(r)

# minimax Q for float64 (relative error of Q 2**-54 on |r| <= ln2/2)
_Q64 = tuple(_h(s) for s in (
    "0x1.5555555555556p-3", "0x1.5555555555554p-5", "0x1.11111111109b2p-7",
    "0x1.6c16c16c18130p-10", "0x1.a01a01a7c5ef6p-13", "0x1.a01a0198a3423p-16",
    "0x1.71de0da5b609ap-19", "0x1.27e502c9e7b40p-22", "0x1.af38c1316c934p-26",
    "0x1.1f2a315ad18efp-29"))
_Q64_0, _Q64_1, _Q64_2, _Q64_3, _Q64_4, _Q64_5, _Q64_6, _Q64_7, _Q64_8, _Q64_9 = _Q64

# minimax Q for float32 (relative error of Q 2**-24)
_Q32_0, _Q32_1, _Q32_2, _Q32_3, _Q32_4 = (_F(_h(s)) for s in (
    "0x1.5555554879d9dp-3", "0x1.5555192fb8cd6p-5", "0x1.11112bddaa748p-7",
    "0x1.6d111718750aep-10", "0x1.a08924b7aeaf1p-13"))


@njit(forceinline=True)
def _em_core64(x):
    """For finite ``|x| < 1100``: ``(k, eh, el)`` with ``exp(x) = 2**k * (1 + eh + el)``, ``k``
    an integer-valued float and ``eh + el`` accurate to a few units of 2**-60 relative."""
    kf = (x * _LOG2E + _SHIFT) - _SHIFT
    hi = x - kf * _LN2_HI                  # exact (Sterbenz)
    lo = kf * _LN2_LO
    r = hi - lo
    c = (hi - r) - lo                      # r + c = hi - lo to twice working precision
    z = r * r
    q = _mad(_Q64_9, r, _Q64_8)
    q = _mad(q, r, _Q64_7)
    q = _mad(q, r, _Q64_6)
    q = _mad(q, r, _Q64_5)
    q = _mad(q, r, _Q64_4)
    q = _mad(q, r, _Q64_3)
    q = _mad(q, r, _Q64_2)
    q = _mad(q, r, _Q64_1)
    q = _mad(q, r, _Q64_0)
    # expm1(r + c) = r + r^2/2 + r^3 Q(r) + c (1 + r)
    p = z * 0.5 + (z * r * q + (c + c * r))
    eh = r + p
    el = (r - eh) + p
    return kf, eh, el


@njit(forceinline=True)
def _em_core32(x):
    kf = (x * _LOG2E_F + _SHIFT_F) - _SHIFT_F
    hi = x - kf * _LN2_HI_F
    lo = kf * _LN2_LO_F
    r = hi - lo
    c = (hi - r) - lo
    z = r * r
    q = _mad(_Q32_4, r, _Q32_3)
    q = _mad(q, r, _Q32_2)
    q = _mad(q, r, _Q32_1)
    q = _mad(q, r, _Q32_0)
    p = z * _HALF_F + (z * r * q + (c + c * r))
    eh = r + p
    el = (r - eh) + p
    return kf, eh, el


@njit(forceinline=True)
def _one_plus64(eh, el):
    """``1 + eh + el`` with one rounding (``|eh| < 1/2``)."""
    s = 1.0 + eh
    return s + (((1.0 - s) + eh) + el)


@njit(forceinline=True)
def _one_plus32(eh, el):
    s = _ONE_F + eh
    return s + (((_ONE_F - s) + eh) + el)


@njit(forceinline=True)
def _pow2_64(k):
    """``2**k`` for an integer ``-1022 <= k <= 1023``."""
    return _from64((k + 1023) << 52)


@njit(forceinline=True)
def _pow2_32(k):
    return _from32((k + 127) << 23)


@njit(forceinline=True)
def _scale64(y, kf):
    """``y * 2**k`` for integer-valued ``-1100 < kf < 1100`` and ``0.5 < y < 2``: two exact
    steps and one rounding, also when the result is subnormal or overflows."""
    k = np.int64(kf)
    k1 = k >> 1
    return (y * _pow2_64(k1)) * _pow2_64(k - k1)


@njit(forceinline=True)
def _scale32(y, kf):
    k = np.int64(kf)
    k1 = k >> 1
    return (y * _pow2_32(k1)) * _pow2_32(k - k1)


@njit(forceinline=True)
def _expm1_from64(kf, eh, el):
    """``2**k * (1 + eh + el) - 1`` for ``-60 <= k <= 1024``."""
    t = _pow2_64(np.int64(_sel(kf < 60.0, kf, 60.0)))
    a = t - 1.0                            # exact for k <= 53
    b = t * eh                             # exact
    s = a + b                              # two-sum: s + e = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    small = s + (e + t * el)
    big = _scale64(_one_plus64(eh, el), kf) - 1.0
    return _sel(kf <= 53.0, small, big)


@njit(forceinline=True)
def _expm1_from32(kf, eh, el):
    t = _pow2_32(np.int64(_sel(kf < _F(30.0), kf, _F(30.0))))
    a = t - _ONE_F
    b = t * eh
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    small = s + (e + t * el)
    big = _scale32(_one_plus32(eh, el), kf) - _ONE_F
    return _sel(kf <= _F(24.0), small, big)


@njit(forceinline=True)
def _exp_reduced64(x):
    """``_em_core64`` of ``x`` clamped to exp's range (-746, 710: past them exp is 0 or
    inf).  exp and expm1 both reduce it, so that a loop computing both (a tangent:
    expm1' = exp) computes it once: LLVM merges the same operations on the same value."""
    xc = _sel(x > -746.0, x, -746.0)
    return _em_core64(_sel(xc < 710.0, xc, 710.0))


@njit(forceinline=True)
def _exp_reduced32(x):
    xc = _sel(x > _F(-104.0), x, _F(-104.0))
    return _em_core32(_sel(xc < _F(89.0), xc, _F(89.0)))


@njit(forceinline=True)
def _exp64(x):
    kf, eh, el = _exp_reduced64(x)
    y = _scale64(_one_plus64(eh, el), kf)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _exp32(x):
    kf, eh, el = _exp_reduced32(x)
    y = _scale32(_one_plus32(eh, el), kf)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _expm1_64(x):
    kf, eh, el = _exp_reduced64(x)
    # (kf clamped at -66, below about x = -46: -1 + 2**-66 (1 + eh + el) rounds to -1, as
    # every expm1 below -45 does)
    y = _expm1_from64(_sel(kf > -66.0, kf, -66.0), eh, el)
    return _sel(not abs(x) >= _P2M54, x, y)    # tiny, +-0, subnormal and nan: x


@njit(forceinline=True)
def _expm1_32(x):
    kf, eh, el = _exp_reduced32(x)
    y = _expm1_from32(_sel(kf > _F(-31.0), kf, _F(-31.0)), eh, el)
    return _sel(not abs(x) >= _F(_P2M25), x, y)


@njit(forceinline=True)
def _cosh64(x):
    a = abs(x)
    ac = _sel(a < 711.0, a, 711.0)
    kf, eh, el = _em_core64(ac)
    h = _scale64(_one_plus64(eh, el), kf - 1.0)    # exp(a) / 2, overflows only when cosh does
    y = h + _div(0.25, h)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _cosh32(x):
    a = abs(x)
    ac = _sel(a < _F(90.0), a, _F(90.0))
    kf, eh, el = _em_core32(ac)
    h = _scale32(_one_plus32(eh, el), kf - _ONE_F)
    y = h + _div(_QUARTER_F, h)
    return _sel(x == x, y, x)


# minimax sinh(x) = x + x^3 H(x^2) on |x| <= 1, tanh(x) = x + x^3 T(x^2) on |x| <= 0.5625
_H64_0, _H64_1, _H64_2, _H64_3, _H64_4, _H64_5, _H64_6 = (_h(s) for s in (
    "0x1.5555555555555p-3", "0x1.11111111110fep-7", "0x1.a01a01a01ed75p-13",
    "0x1.71de3a4e25c14p-19", "0x1.ae6460eaa9624p-26", "0x1.611cba694c838p-33",
    "0x1.b40fca013a9f0p-41"))
_H32_0, _H32_1, _H32_2, _H32_3 = (_F(_h(s)) for s in (
    "0x1.5555554eab2e5p-3", "0x1.11111e8552a90p-7", "0x1.a0091c3d6c9ffp-13",
    "0x1.78a24b881db25p-19"))
_T64 = tuple(_h(s) for s in (
    "-0x1.5555555555555p-2", "0x1.1111111110fbep-3", "-0x1.ba1ba1b9f19fdp-5",
    "0x1.664f48727d932p-6", "-0x1.226e32217a495p-7", "0x1.d6d30f9f4a769p-9",
    "-0x1.7d95464821852p-10", "0x1.34ad364c02fc9p-11", "-0x1.eaf4c18f887fep-13",
    "0x1.616ff0ea41529p-14", "-0x1.500055795686cp-16"))
_T64_0, _T64_1, _T64_2, _T64_3, _T64_4, _T64_5, _T64_6, _T64_7, _T64_8, _T64_9, _T64_10 = _T64
_T32_0, _T32_1, _T32_2, _T32_3, _T32_4, _T32_5 = (_F(_h(s)) for s in (
    "-0x1.5555554cdaa8cp-2", "0x1.111101f63cf1fp-3", "-0x1.ba12d8fec1358p-5",
    "0x1.655dcec1de1afp-6", "-0x1.168145395f2dcp-7", "0x1.461092cbec37cp-9"))


@njit(forceinline=True)
def _sinh64(x):
    a = abs(x)
    ac = _sel(a < 711.0, a, 711.0)
    kf, eh, el = _em_core64(ac)
    h = _scale64(_one_plus64(eh, el), kf - 1.0)     # exp(|x|) / 2
    big = h - _div(0.25, h)
    z = a * a
    p = _mad(_H64_6, z, _H64_5)
    p = _mad(p, z, _H64_4)
    p = _mad(p, z, _H64_3)
    p = _mad(p, z, _H64_2)
    p = _mad(p, z, _H64_1)
    p = _mad(p, z, _H64_0)
    small = a + a * z * p
    y = _sel(a < 1.0, small, big)
    y = _xorsign64(y, _sign_of64(x))
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _sinh32(x):
    a = abs(x)
    ac = _sel(a < _F(90.0), a, _F(90.0))
    kf, eh, el = _em_core32(ac)
    h = _scale32(_one_plus32(eh, el), kf - _ONE_F)
    big = h - _div(_QUARTER_F, h)
    z = a * a
    p = _mad(_H32_3, z, _H32_2)
    p = _mad(p, z, _H32_1)
    p = _mad(p, z, _H32_0)
    small = a + a * z * p
    y = _sel(a < _ONE_F, small, big)
    y = _xorsign32(y, x)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _tanh64(x):
    a = abs(x)
    ac = _sel(a < 40.0, a, 40.0)
    kf, eh, el = _em_core64(ac + ac)
    e = _expm1_from64(kf, eh, el)          # expm1(2|x|)
    big = _div(e, e + 2.0)
    z = a * a
    p = _mad(_T64_10, z, _T64_9)
    p = _mad(p, z, _T64_8)
    p = _mad(p, z, _T64_7)
    p = _mad(p, z, _T64_6)
    p = _mad(p, z, _T64_5)
    p = _mad(p, z, _T64_4)
    p = _mad(p, z, _T64_3)
    p = _mad(p, z, _T64_2)
    p = _mad(p, z, _T64_1)
    p = _mad(p, z, _T64_0)
    small = a + a * z * p
    y = _sel(a < 0.5625, small, big)
    y = _xorsign64(y, _sign_of64(x))
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _tanh32(x):
    a = abs(x)
    ac = _sel(a < _F(20.0), a, _F(20.0))
    kf, eh, el = _em_core32(ac + ac)
    e = _expm1_from32(kf, eh, el)
    big = _div(e, e + _TWO_F)
    z = a * a
    p = _mad(_T32_5, z, _T32_4)
    p = _mad(p, z, _T32_3)
    p = _mad(p, z, _T32_2)
    p = _mad(p, z, _T32_1)
    p = _mad(p, z, _T32_0)
    small = a + a * z * p
    y = _sel(a < _F(0.5625), small, big)
    y = _xorsign32(y, x)
    return _sel(x == x, y, x)
