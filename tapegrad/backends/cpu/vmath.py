"""Vectorisable transcendental functions for the Numba CPU backend.

Numba lowers ``math.sin`` and friends to calls into libm, and a loop with a call in it does not
vectorise (LLVM turns it into ``llvm.sin.v8f64`` and splits that back into eight libm calls).
The functions here are straight-line arithmetic on the float and on its bit pattern: no
calls, no data-dependent branches that LLVM cannot turn into selects, and table lookups
only through gathers.  A loop such as ::

    for i in range(n):
        B[i] = vmath.sin(A[i])

therefore becomes SIMD code (AVX-512 ``zmm`` on this machine) with no calls in it.

Each public function is a plain Python function with a Numba ``overload``: inside
``numba.njit`` code it is specialised per argument type (``float32`` arguments compute in
``float32`` where that is accurate enough, ``float64`` and integers in ``float64``); called
from Python it runs the same compiled code on a scalar.

Methods (all written for this module; see each function for details):

* ``exp``/``expm1``/``sinh``/``cosh``/``tanh``: Cody-Waite reduction ``x = k ln2 + r``,
  ``|r| <= ln2/2``, with ``ln2`` split in two so that ``k*ln2_hi`` is exact; a minimax
  polynomial for ``expm1(r)``; scaling by ``2**k`` in two steps so that results in the
  subnormal range are rounded only once.
* ``log``/``log1p``: exponent/mantissa split through the bit pattern, mantissa centred on
  ``[sqrt(1/2), sqrt(2))``, ``log(1+f) = 2 atanh(f/(2+f))`` with a minimax polynomial.
* ``sin``/``cos``: ``x = n pi/2 + r``, ``|r| <= pi/4``; for ``|x| > pi/4`` the reduction is
  an exact Payne-Hanek one in 64-bit integer arithmetic on every lane: ``x * 2/pi`` mod 4
  from the mantissa of ``x`` times a 192-bit (96-bit for float32) window of the bits of
  ``2/pi`` chosen by the exponent of ``x`` (a gather from a table built at import from
  ``pi`` computed with Machin's formula).  It is exact for every finite argument, so there
  is no separate path for huge arguments.  float32 arguments are reduced and evaluated in
  float64 and rounded once.
* ``atan``: the argument is mapped to ``|t| <= 7/16`` around one of 0, 1/2, 1, 3/2, inf and
  a minimax polynomial is used there.

Accuracy (max error over all inputs measured, in ulps of the result; see
``tests/backends/test_vmath.py``) is below 2 ulp for every function and type, special values
(``inf``, ``nan``, signed zeros, subnormals, overflow and underflow) follow C99 Annex F.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic, overload

__all__ = ["exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sinh", "cosh", "atan"]

_h = float.fromhex
_F = np.float32
_U = np.uint64
_I = np.int64

# ---------------------------------------------------------------------------------------------
# bit views

@numba.njit(inline="always")
def _bits64(x):
    return np.float64(x).view(np.int64)


@numba.njit(inline="always")
def _from64(i):
    return np.int64(i).view(np.float64)


@numba.njit(inline="always")
def _ubits64(x):
    return np.float64(x).view(np.uint64)


@numba.njit(inline="always")
def _ufrom64(u):
    return np.uint64(u).view(np.float64)


@numba.njit(inline="always")
def _bits32(x):
    return np.int64(np.float32(x).view(np.int32))


@numba.njit(inline="always")
def _from32(i):
    return np.int32(i).view(np.float32)


_P2M12 = _h("0x1p-12")
_P2M25 = _h("0x1p-25")
_P2M28 = _h("0x1p-28")
_P2M53 = _h("0x1p-53")
_P2M54 = _h("0x1p-54")
_P2M62 = _h("0x1p-62")
_P2_25 = _h("0x1p25")
_P2_54 = _h("0x1p54")


@intrinsic
def _div(typingctx, a, b):
    """``a / b`` as a bare IEEE division: no zero-divisor check (Numba's ``error_model='python'``
    adds one, and its exception path stops LLVM from vectorising the loop)."""
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(args[0], args[1])

    return a(a, b), codegen


_SIGN64 = _U(1 << 63)
_S63 = _U(63)


@numba.njit(inline="always")
def _sign_of64(x):
    """The sign bit of ``x`` as a uint64 mask."""
    return _ubits64(x) & _SIGN64


@numba.njit(inline="always")
def _xorsign64(y, m):
    return _ufrom64(_ubits64(y) ^ m)


_SIGN32 = -(1 << 31)


@numba.njit(inline="always")
def _xorsign32(y, x):
    """``y`` with its sign flipped where ``x`` has its sign bit set."""
    return _from32(_bits32(y) ^ (_bits32(x) & _SIGN32))


# ---------------------------------------------------------------------------------------------
# shared constants

_INF64 = np.inf
_INF32 = _F(np.inf)
_NAN64 = np.nan
_NAN32 = _F(np.nan)

_LOG2E = _h("0x1.71547652b82fep+0")
_LN2_HI = _h("0x1.62e42ff000000p-1")       # 29 significant bits: k * _LN2_HI is exact
_LN2_LO = _h("-0x1.718432a1b0e26p-35")
_SHIFT = _h("0x1.8p52")                    # adding it rounds to an integer

_LOG2E_F = _F(_LOG2E)
_LN2_HI_F = _F(_h("0x1.62e4p-1"))          # 16 significant bits
_LN2_LO_F = _F(_h("0x1.7f7d1cf79abcap-20"))
_SHIFT_F = _F(_h("0x1.8p23"))
_ZERO_F = _F(0.0)
_HALF_F = _F(0.5)
_QUARTER_F = _F(0.25)
_ONE_F = _F(1.0)
_TWO_F = _F(2.0)

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


@numba.njit(inline="always")
def _em_core64(x):
    """For finite ``|x| < 1100``: ``(k, eh, el)`` with ``exp(x) = 2**k * (1 + eh + el)``, ``k``
    an integer-valued float and ``eh + el`` accurate to a few units of 2**-60 relative."""
    kf = (x * _LOG2E + _SHIFT) - _SHIFT
    hi = x - kf * _LN2_HI                  # exact (Sterbenz)
    lo = kf * _LN2_LO
    r = hi - lo
    c = (hi - r) - lo                      # r + c = hi - lo to twice working precision
    z = r * r
    q = _Q64_9 * r + _Q64_8
    q = q * r + _Q64_7
    q = q * r + _Q64_6
    q = q * r + _Q64_5
    q = q * r + _Q64_4
    q = q * r + _Q64_3
    q = q * r + _Q64_2
    q = q * r + _Q64_1
    q = q * r + _Q64_0
    # expm1(r + c) = r + r^2/2 + r^3 Q(r) + c (1 + r)
    p = z * 0.5 + (z * r * q + (c + c * r))
    eh = r + p
    el = (r - eh) + p
    return kf, eh, el


@numba.njit(inline="always")
def _em_core32(x):
    kf = (x * _LOG2E_F + _SHIFT_F) - _SHIFT_F
    hi = x - kf * _LN2_HI_F
    lo = kf * _LN2_LO_F
    r = hi - lo
    c = (hi - r) - lo
    z = r * r
    q = _Q32_4 * r + _Q32_3
    q = q * r + _Q32_2
    q = q * r + _Q32_1
    q = q * r + _Q32_0
    p = z * _HALF_F + (z * r * q + (c + c * r))
    eh = r + p
    el = (r - eh) + p
    return kf, eh, el


@numba.njit(inline="always")
def _one_plus64(eh, el):
    """``1 + eh + el`` with one rounding (``|eh| < 1/2``)."""
    s = 1.0 + eh
    return s + (((1.0 - s) + eh) + el)


@numba.njit(inline="always")
def _one_plus32(eh, el):
    s = _ONE_F + eh
    return s + (((_ONE_F - s) + eh) + el)


@numba.njit(inline="always")
def _pow2_64(k):
    """``2**k`` for an integer ``-1022 <= k <= 1023``."""
    return _from64((k + 1023) << 52)


@numba.njit(inline="always")
def _pow2_32(k):
    return _from32((k + 127) << 23)


@numba.njit(inline="always")
def _scale64(y, kf):
    """``y * 2**k`` for integer-valued ``-1100 < kf < 1100`` and ``0.5 < y < 2``: two exact
    steps and one rounding, also when the result is subnormal or overflows."""
    k = np.int64(kf)
    k1 = k >> 1
    return (y * _pow2_64(k1)) * _pow2_64(k - k1)


@numba.njit(inline="always")
def _scale32(y, kf):
    k = np.int64(kf)
    k1 = k >> 1
    return (y * _pow2_32(k1)) * _pow2_32(k - k1)


@numba.njit(inline="always")
def _expm1_from64(kf, eh, el):
    """``2**k * (1 + eh + el) - 1`` for ``-60 <= k <= 1024``."""
    t = _pow2_64(np.int64(kf if kf < 60.0 else 60.0))
    a = t - 1.0                            # exact for k <= 53
    b = t * eh                             # exact
    s = a + b                              # two-sum: s + e = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    small = s + (e + t * el)
    big = _scale64(_one_plus64(eh, el), kf) - 1.0
    return small if kf <= 53.0 else big


@numba.njit(inline="always")
def _expm1_from32(kf, eh, el):
    t = _pow2_32(np.int64(kf if kf < _F(30.0) else _F(30.0)))
    a = t - _ONE_F
    b = t * eh
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    small = s + (e + t * el)
    big = _scale32(_one_plus32(eh, el), kf) - _ONE_F
    return small if kf <= _F(24.0) else big


@numba.njit(inline="always")
def _exp64(x):
    xc = x if x > -746.0 else -746.0
    xc = xc if xc < 710.0 else 710.0
    kf, eh, el = _em_core64(xc)
    y = _scale64(_one_plus64(eh, el), kf)
    return y if x == x else x


@numba.njit(inline="always")
def _exp32(x):
    xc = x if x > _F(-104.0) else _F(-104.0)
    xc = xc if xc < _F(89.0) else _F(89.0)
    kf, eh, el = _em_core32(xc)
    y = _scale32(_one_plus32(eh, el), kf)
    return y if x == x else x


@numba.njit(inline="always")
def _expm1_64(x):
    xc = x if x > -45.0 else -45.0
    xc = xc if xc < 710.0 else 710.0
    kf, eh, el = _em_core64(xc)
    y = _expm1_from64(kf, eh, el)
    return x if not (abs(x) >= _P2M54) else y    # tiny, +-0, subnormal and nan: x


@numba.njit(inline="always")
def _expm1_32(x):
    xc = x if x > _F(-20.0) else _F(-20.0)
    xc = xc if xc < _F(89.0) else _F(89.0)
    kf, eh, el = _em_core32(xc)
    y = _expm1_from32(kf, eh, el)
    return x if not (abs(x) >= _F(_P2M25)) else y


@numba.njit(inline="always")
def _cosh64(x):
    a = abs(x)
    ac = a if a < 711.0 else 711.0
    kf, eh, el = _em_core64(ac)
    h = _scale64(_one_plus64(eh, el), kf - 1.0)    # exp(a) / 2, overflows only when cosh does
    y = h + _div(0.25, h)
    return y if x == x else x


@numba.njit(inline="always")
def _cosh32(x):
    a = abs(x)
    ac = a if a < _F(90.0) else _F(90.0)
    kf, eh, el = _em_core32(ac)
    h = _scale32(_one_plus32(eh, el), kf - _ONE_F)
    y = h + _div(_QUARTER_F, h)
    return y if x == x else x


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


@numba.njit(inline="always")
def _sinh64(x):
    a = abs(x)
    ac = a if a < 711.0 else 711.0
    kf, eh, el = _em_core64(ac)
    h = _scale64(_one_plus64(eh, el), kf - 1.0)     # exp(|x|) / 2
    big = h - _div(0.25, h)
    z = a * a
    p = _H64_6 * z + _H64_5
    p = p * z + _H64_4
    p = p * z + _H64_3
    p = p * z + _H64_2
    p = p * z + _H64_1
    p = p * z + _H64_0
    small = a + a * z * p
    y = small if a < 1.0 else big
    y = _xorsign64(y, _sign_of64(x))
    return y if x == x else x


@numba.njit(inline="always")
def _sinh32(x):
    a = abs(x)
    ac = a if a < _F(90.0) else _F(90.0)
    kf, eh, el = _em_core32(ac)
    h = _scale32(_one_plus32(eh, el), kf - _ONE_F)
    big = h - _div(_QUARTER_F, h)
    z = a * a
    p = _H32_3 * z + _H32_2
    p = p * z + _H32_1
    p = p * z + _H32_0
    small = a + a * z * p
    y = small if a < _ONE_F else big
    y = _xorsign32(y, x)
    return y if x == x else x


@numba.njit(inline="always")
def _tanh64(x):
    a = abs(x)
    ac = a if a < 40.0 else 40.0
    kf, eh, el = _em_core64(ac + ac)
    e = _expm1_from64(kf, eh, el)          # expm1(2|x|)
    big = _div(e, e + 2.0)
    z = a * a
    p = _T64_10 * z + _T64_9
    p = p * z + _T64_8
    p = p * z + _T64_7
    p = p * z + _T64_6
    p = p * z + _T64_5
    p = p * z + _T64_4
    p = p * z + _T64_3
    p = p * z + _T64_2
    p = p * z + _T64_1
    p = p * z + _T64_0
    small = a + a * z * p
    y = small if a < 0.5625 else big
    y = _xorsign64(y, _sign_of64(x))
    return y if x == x else x


@numba.njit(inline="always")
def _tanh32(x):
    a = abs(x)
    ac = a if a < _F(20.0) else _F(20.0)
    kf, eh, el = _em_core32(ac + ac)
    e = _expm1_from32(kf, eh, el)
    big = _div(e, e + _TWO_F)
    z = a * a
    p = _T32_5 * z + _T32_4
    p = p * z + _T32_3
    p = p * z + _T32_2
    p = p * z + _T32_1
    p = p * z + _T32_0
    small = a + a * z * p
    y = small if a < _F(0.5625) else big
    y = _xorsign32(y, x)
    return y if x == x else x


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


@numba.njit(inline="always")
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
    r = _L64_6 * z + _L64_5
    r = r * z + _L64_4
    r = r * z + _L64_3
    r = r * z + _L64_2
    r = r * z + _L64_1
    r = r * z + _L64_0
    r = r * z
    hfsq = 0.5 * f * f
    return kf * _LN2_HI - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO + extra))) - f)


@numba.njit(inline="always")
def _log_kernel32(x, kadd, extra):
    ix = _bits32(x)
    tmp = ix - _SQRTH_BITS32
    k = tmp >> 23
    m = _from32(ix - (k << 23))
    kf = np.float32(k + kadd)
    f = m - _ONE_F
    s = _div(f, _TWO_F + f)
    z = s * s
    r = _L32_2 * z + _L32_1
    r = r * z + _L32_0
    r = r * z
    hfsq = _HALF_F * f * f
    return kf * _LN2_HI_F - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO_F + extra))) - f)


@numba.njit(inline="always")
def _log64(x):
    ok = (x > 0.0) & (x < _INF64)
    xs = x if ok else 1.0
    sub = xs < _MIN_NORMAL64
    xs = xs * _P2_54 if sub else xs
    y = _log_kernel64(xs, -54 if sub else 0, 0.0)
    special = -_INF64 if x == 0.0 else (x if x > 0.0 else _NAN64)
    return y if ok else special


@numba.njit(inline="always")
def _log32(x):
    ok = (x > _ZERO_F) & (x < _INF32)
    xs = x if ok else _ONE_F
    sub = xs < _MIN_NORMAL32
    xs = xs * _F(_P2_25) if sub else xs
    y = _log_kernel32(xs, -25 if sub else 0, _ZERO_F)
    special = -_INF32 if x == _ZERO_F else (x if x > _ZERO_F else _NAN32)
    return y if ok else special


@numba.njit(inline="always")
def _log1p64(x):
    u = 1.0 + x
    ok = (u > 0.0) & (u < _INF64)
    us = u if ok else 2.0
    # 1 + x = u + c exactly
    c = (1.0 - (us - x)) if us >= 2.0 else (x - (us - 1.0))
    y = _log_kernel64(us, 0, _div(c, us))
    special = -_INF64 if x == -1.0 else (x if x > 0.0 else _NAN64)
    y = y if ok else special
    return x if not (abs(x) >= _P2M54) else y


@numba.njit(inline="always")
def _log1p32(x):
    u = _ONE_F + x
    ok = (u > _ZERO_F) & (u < _INF32)
    us = u if ok else _TWO_F
    c = (_ONE_F - (us - x)) if us >= _TWO_F else (x - (us - _ONE_F))
    y = _log_kernel32(us, 0, _div(c, us))
    special = -_INF32 if x == _F(-1.0) else (x if x > _ZERO_F else _NAN32)
    y = y if ok else special
    return x if not (abs(x) >= _F(_P2M25)) else y


# ---------------------------------------------------------------------------------------------
# sin/cos: x = n*pi/2 + r, |r| <= pi/4

def _pi_scaled(bits: int) -> int:
    """``floor(pi * 2**bits)`` (to within a few units) by Machin's formula."""
    def arctan_inv(n: int, scale: int) -> int:
        total, power, k, n2 = 0, scale // n, 0, n * n
        while power:
            term = power // (2 * k + 1)
            total += -term if k & 1 else term
            power //= n2
            k += 1
        return total
    scale = 1 << bits
    return 16 * arctan_inv(5, scale) - 4 * arctan_inv(239, scale)


def _two_over_pi_bits(nbits: int) -> int:
    """``floor(2/pi * 2**nbits)``: the first ``nbits`` bits of the binary expansion of 2/pi."""
    guard = 64
    return (1 << (2 * nbits + guard + 1)) // _pi_scaled(nbits + guard)


_TWO_OVER_PI_BITS = 1200
_TOP = _two_over_pi_bits(_TWO_OVER_PI_BITS)


def _window(shift: int, width: int) -> int:
    """``floor(2/pi * 2**shift) mod 2**width``."""
    if shift < 0:
        return 0
    return (_TOP >> (_TWO_OVER_PI_BITS - shift)) & ((1 << width) - 1)


# float64: for x = M * 2**(E-52), M < 2**53, the bits of 2/pi with weights 2**-(E-53) ...
# 2**-(E+138) (192 bits, those above give multiples of 4) as W; then
# x * 2/pi = M * W * 2**-190 (mod 4).  Rows for biased exponents 1022 (|x| >= 0.5) .. 2046.
_ROW0_64 = 1022
_W64 = [_window(be - 1023 + 138, 192) for be in range(_ROW0_64, 2047)]
_W64_HI = np.array([w >> 128 for w in _W64], dtype=np.uint64)
_W64_MID = np.array([(w >> 64) & ((1 << 64) - 1) for w in _W64], dtype=np.uint64)
_W64_LO = np.array([w & ((1 << 64) - 1) for w in _W64], dtype=np.uint64)
# float32: x = M * 2**(E-23), M < 2**24, a 96-bit window (weights 2**-(E-24) ... 2**-(E+71))
# as three 32-bit limbs; x * 2/pi = M * W * 2**-94 (mod 4).  Rows for biased exponents 126..254.
_ROW0_32 = 126
_W32 = [_window(be - 127 + 71, 96) for be in range(_ROW0_32, 255)]
_W32_2 = np.array([w >> 64 for w in _W32], dtype=np.uint64)
_W32_1 = np.array([(w >> 32) & 0xFFFFFFFF for w in _W32], dtype=np.uint64)
_W32_0 = np.array([w & 0xFFFFFFFF for w in _W32], dtype=np.uint64)

_U11 = _U(11)
_U23 = _U(23)
_U32 = _U(32)
_U52 = _U(52)
_U62 = _U(62)
_M32 = _U(0xFFFFFFFF)
_MANT64 = _U((1 << 52) - 1)
_IMPL64 = _U(1 << 52)
_MANT32 = _U((1 << 23) - 1)
_IMPL32 = _U(1 << 23)
_HALF62 = _U(1 << 61)
_MASK62 = _U((1 << 62) - 1)
_HALF62_I = _I(1 << 61)
_ROW0_64_U = _U(_ROW0_64)
_ROWN_64_U = _U(2046)
_ROW0_32_U = _U(_ROW0_32)
_ROWN_32_U = _U(254)
_ONE_U = _U(1)
_TWO_U = _U(2)
_THREE_U = _U(3)

_PIO4 = _h("0x1.921fb54442d18p-1")        # just below pi/4
_PIO2 = _h("0x1.921fb54442d18p+0")
_PIO2_A = _h("0x1.921fb54000000p+0")      # 27 bits
_PIO2_B = _h("0x1.10b4611a62633p-30")     # pi/2 - _PIO2_A
_SPLIT = 134217729.0                      # 2**27 + 1


@numba.njit(inline="always")
def _fixed_to_frac(w0):
    """``w0`` holds ``x*2/pi mod 4`` in fixed point with 62 fraction bits; returns
    ``(n, fr)``: the nearest integer mod 4 and the signed remainder in units of 2**-62."""
    t = w0 + _HALF62
    n = t >> _U62
    fr = np.int64(t & _MASK62) - _HALF62_I
    return n, fr


@numba.njit(inline="always")
def _reduce_big64(a):
    """``a = n*pi/2 + (rh + rl)`` for finite ``a >= 0.5``: exact Payne-Hanek reduction."""
    ix = _ubits64(a)
    be = ix >> _U52
    be = be if be > _ROW0_64_U else _ROW0_64_U
    be = be if be < _ROWN_64_U else _ROWN_64_U
    row = be - _ROW0_64_U
    wh = _W64_HI[row]
    wm = _W64_MID[row]
    wl = _W64_LO[row]
    d5 = wh >> _U32
    d4 = wh & _M32
    d3 = wm >> _U32
    d2 = wm & _M32
    d1 = wl >> _U32
    d0 = wl & _M32
    mant = (ix & _MANT64) | _IMPL64
    m1 = mant >> _U32
    m0 = mant & _M32
    p00 = m0 * d0
    p01 = m0 * d1
    p02 = m0 * d2
    p03 = m0 * d3
    p04 = m0 * d4
    p05 = m0 * d5
    p10 = m1 * d0
    p11 = m1 * d1
    p12 = m1 * d2
    p13 = m1 * d3
    p14 = m1 * d4
    # 32-bit columns of the product, bits 32..191 (bits 192 and up are multiples of 4)
    c1 = (p00 >> _U32) + (p01 & _M32) + (p10 & _M32)
    c2 = (p01 >> _U32) + (p10 >> _U32) + (p02 & _M32) + (p11 & _M32) + (c1 >> _U32)
    c3 = (p02 >> _U32) + (p11 >> _U32) + (p03 & _M32) + (p12 & _M32) + (c2 >> _U32)
    c4 = (p03 >> _U32) + (p12 >> _U32) + (p04 & _M32) + (p13 & _M32) + (c3 >> _U32)
    c5 = (p04 >> _U32) + (p13 >> _U32) + (p05 & _M32) + (p14 & _M32) + (c4 >> _U32)
    w0 = (c5 << _U32) | (c4 & _M32)       # value bits 2**1 .. 2**-62
    w1 = (c3 << _U32) | (c2 & _M32)       # 2**-63 .. 2**-126
    n, fr = _fixed_to_frac(w0)
    # fraction as a double-double in units of 2**-62
    hi = np.float64(fr)
    lo = np.float64(fr - np.int64(hi)) + np.float64(np.int64(w1 >> _U11)) * _P2M53
    fh = hi * _P2M62
    fl = lo * _P2M62
    s = fh + fl
    fl = fl - (s - fh)
    fh = s
    # (fh + fl) * pi/2, the leading product exact by splitting fh
    t = fh * _SPLIT
    h = t - (t - fh)
    el = fh - h
    p1 = h * _PIO2_A
    p2 = el * _PIO2_A
    s = p1 + p2
    e = p2 - (s - p1)
    rl = e + (fh * _PIO2_B + fl * _PIO2_A)
    rh = s + rl
    rl = rl - (rh - s)
    return n, rh, rl


@numba.njit(inline="always")
def _reduce_big32(a):
    """``a = n*pi/2 + r`` for a float32 ``a >= 0.5`` (finite), ``r`` as a float64."""
    ix = _U(np.float32(a).view(np.uint32))
    be = ix >> _U23
    be = be if be > _ROW0_32_U else _ROW0_32_U
    be = be if be < _ROWN_32_U else _ROWN_32_U
    row = be - _ROW0_32_U
    mant = (ix & _MANT32) | _IMPL32
    p2 = mant * _W32_2[row]
    p1 = mant * _W32_1[row]
    p0 = mant * _W32_0[row]
    w0 = (p2 << _U32) + p1 + (p0 >> _U32)     # product bits 32..95: 2**1 .. 2**-62
    n, fr = _fixed_to_frac(w0)
    return n, np.float64(fr) * (_P2M62 * _PIO2)


# minimax sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4
_S64_0, _S64_1, _S64_2, _S64_3, _S64_4, _S64_5 = (_h(s) for s in (
    "-0x1.5555555555555p-3", "0x1.1111111110ba3p-7", "-0x1.a01a019e8091ep-13",
    "0x1.71de3792f9dcbp-19", "-0x1.ae6007aa12aecp-26", "0x1.5e0a0069402a9p-33"))
_C64_0, _C64_1, _C64_2, _C64_3, _C64_4, _C64_5 = (_h(s) for s in (
    "0x1.5555555555555p-5", "-0x1.6c16c16c16962p-10", "0x1.a01a019f4da06p-16",
    "-0x1.27e4fa169f466p-22", "0x1.1eeb67bf9de41p-29", "-0x1.907cde7be338ap-37"))
# shorter ones for float32 arguments (evaluated in float64)
_S32_0, _S32_1, _S32_2, _S32_3 = (_h(s) for s in (
    "-0x1.555555545a7f2p-3", "0x1.11110de89ea86p-7", "-0x1.a013a05f525b1p-13",
    "0x1.6dbc0d95c7c65p-19"))
_C32_0, _C32_1, _C32_2, _C32_3 = (_h(s) for s in (
    "0x1.5555555502086p-5", "-0x1.6c16bf51ff390p-10", "0x1.a015c1449e538p-16",
    "-0x1.2523697940ce0p-22"))


@numba.njit(inline="always")
def _sincos_kernel64(r, rl):
    """``(sin(r + rl), cos(r + rl))`` for ``|r| <= pi/4``, ``|rl| <= ulp(r)``."""
    z = r * r
    sp = _S64_5 * z + _S64_4
    sp = sp * z + _S64_3
    sp = sp * z + _S64_2
    sp = sp * z + _S64_1
    sp = sp * z + _S64_0
    hz = 0.5 * z
    sn = r + (r * z * sp + rl * (1.0 - hz))
    cp = _C64_5 * z + _C64_4
    cp = cp * z + _C64_3
    cp = cp * z + _C64_2
    cp = cp * z + _C64_1
    cp = cp * z + _C64_0
    w = 1.0 - hz
    cs = w + (((1.0 - w) - hz) + (z * z * cp - r * rl))
    return sn, cs


@numba.njit(inline="always")
def _sincos_kernel32(r):
    z = r * r
    sp = _S32_3 * z + _S32_2
    sp = sp * z + _S32_1
    sp = sp * z + _S32_0
    sn = r + r * z * sp
    cp = _C32_3 * z + _C32_2
    cp = cp * z + _C32_1
    cp = cp * z + _C32_0
    cs = (1.0 - 0.5 * z) + z * z * cp
    return sn, cs


@numba.njit(inline="always")
def _reduce64(a):
    """``(n, rh, rl)`` with ``a = n*pi/2 + rh + rl`` for finite ``a >= 0``."""
    n, rh, rl = _reduce_big64(a)
    small = a <= _PIO4
    return (_U(0) if small else n), (a if small else rh), (0.0 if small else rl)


@numba.njit(inline="always")
def _quadrant64(n, sn, cs):
    """``sin(n*pi/2 + r)`` from ``sin(r)``, ``cos(r)``."""
    y = cs if (n & _ONE_U) != _U(0) else sn
    return _xorsign64(y, (n & _TWO_U) << _U62)


@numba.njit(inline="always")
def _sin64(x):
    a = abs(x)
    n, rh, rl = _reduce64(a if a < _INF64 else 0.0)
    sn, cs = _sincos_kernel64(rh, rl)
    y = _quadrant64(n, sn, cs)
    y = _xorsign64(y, _sign_of64(x))
    return y if a < _INF64 else x - x


@numba.njit(inline="always")
def _cos64(x):
    a = abs(x)
    n, rh, rl = _reduce64(a if a < _INF64 else 0.0)
    sn, cs = _sincos_kernel64(rh, rl)
    y = _quadrant64(n + _ONE_U, sn, cs)
    return y if a < _INF64 else x - x


@numba.njit(inline="always")
def _reduce32(x):
    a = abs(x)
    a = a if a < _INF32 else _ZERO_F
    n, r = _reduce_big32(a)
    small = a <= _F(0.78125)     # pi/4 rounds up to 0.785398185 > pi/4; the kernel is fine there
    return (_U(0) if small else n), (np.float64(a) if small else r)


@numba.njit(inline="always")
def _sin32(x):
    n, r = _reduce32(x)
    sn, cs = _sincos_kernel32(r)
    y = _quadrant64(n, sn, cs)
    y = np.float32(_xorsign64(y, _sign_of64(np.float64(x))))
    return y if abs(x) < _INF32 else x - x


@numba.njit(inline="always")
def _cos32(x):
    n, r = _reduce32(x)
    sn, cs = _sincos_kernel32(r)
    y = np.float32(_quadrant64(n + _ONE_U, sn, cs))
    return y if abs(x) < _INF32 else x - x


# ---------------------------------------------------------------------------------------------
# atan: atan(|x|) = atan(c) + atan(t), t = (|x| - c) / (1 + c|x|), c in {0, 1/2, 1, 3/2, inf}

_A64 = tuple(_h(s) for s in (
    "-0x1.5555555555554p-2", "0x1.99999999988bcp-3", "-0x1.24924923b44f3p-3",
    "0x1.c71c71385342bp-4", "-0x1.745cffa4b03a8p-4", "0x1.3b116689cab8bp-4",
    "-0x1.10ed58e713870p-4", "0x1.df0edb433d901p-5", "-0x1.9c6f6212347ddp-5",
    "0x1.35ff1fbca6de0p-5", "-0x1.1fc46f02d8144p-6"))
_A64_0, _A64_1, _A64_2, _A64_3, _A64_4, _A64_5, _A64_6, _A64_7, _A64_8, _A64_9, _A64_10 = _A64
_A32_0, _A32_1, _A32_2, _A32_3, _A32_4 = (_F(_h(s)) for s in (
    "-0x1.5555539da334ep-2", "0x1.99960dd1263cep-3", "-0x1.23fab5be49b4dp-3",
    "0x1.b50dc16088537p-4", "-0x1.fd97b88640935p-5"))

_ATAN_HALF_HI, _ATAN_HALF_LO = _h("0x1.dac670561bb4fp-2"), _h("0x1.a2b7f222f65e2p-56")
_ATAN_ONE_HI, _ATAN_ONE_LO = _h("0x1.921fb54442d18p-1"), _h("0x1.1a62633145c07p-55")
_ATAN_3H_HI, _ATAN_3H_LO = _h("0x1.f730bd281f69bp-1"), _h("0x1.007887af0cbbdp-56")
_ATAN_INF_HI, _ATAN_INF_LO = _h("0x1.921fb54442d18p+0"), _h("0x1.1a62633145c07p-54")
_ATAN_HALF_HI_F, _ATAN_HALF_LO_F = _F(_h("0x1.dac67p-2")), _F(_h("0x1.586ed4p-28"))
_ATAN_ONE_HI_F, _ATAN_ONE_LO_F = _F(_h("0x1.921fb6p-1")), _F(_h("-0x1.777a5cp-26"))
_ATAN_3H_HI_F, _ATAN_3H_LO_F = _F(_h("0x1.f730bep-1")), _F(_h("-0x1.afc12cp-26"))
_ATAN_INF_HI_F, _ATAN_INF_LO_F = _F(_h("0x1.921fb6p+0")), _F(_h("-0x1.777a5cp-25"))


@numba.njit(inline="always")
def _atan64(x):
    a = abs(x)
    r1 = a < 0.4375
    r2 = a < 0.6875
    r3 = a < 1.1875
    r4 = a < 2.4375
    num = a if r1 else (2.0 * a - 1.0 if r2 else (a - 1.0 if r3 else (a - 1.5 if r4 else -1.0)))
    den = 1.0 if r1 else (2.0 + a if r2 else (a + 1.0 if r3 else (1.0 + 1.5 * a if r4 else a)))
    bh = 0.0 if r1 else (_ATAN_HALF_HI if r2 else (
        _ATAN_ONE_HI if r3 else (_ATAN_3H_HI if r4 else _ATAN_INF_HI)))
    bl = 0.0 if r1 else (_ATAN_HALF_LO if r2 else (
        _ATAN_ONE_LO if r3 else (_ATAN_3H_LO if r4 else _ATAN_INF_LO)))
    t = _div(num, den)
    z = t * t
    p = _A64_10 * z + _A64_9
    p = p * z + _A64_8
    p = p * z + _A64_7
    p = p * z + _A64_6
    p = p * z + _A64_5
    p = p * z + _A64_4
    p = p * z + _A64_3
    p = p * z + _A64_2
    p = p * z + _A64_1
    p = p * z + _A64_0
    y = bh + (t + (t * z * p + bl))
    return _xorsign64(y, _sign_of64(x))     # nan propagates through t


@numba.njit(inline="always")
def _atan32(x):
    a = abs(x)
    r1 = a < _F(0.4375)
    r2 = a < _F(0.6875)
    r3 = a < _F(1.1875)
    r4 = a < _F(2.4375)
    num = a if r1 else (_TWO_F * a - _ONE_F if r2 else (
        a - _ONE_F if r3 else (a - _F(1.5) if r4 else _F(-1.0))))
    den = _ONE_F if r1 else (_TWO_F + a if r2 else (
        a + _ONE_F if r3 else (_ONE_F + _F(1.5) * a if r4 else a)))
    bh = _ZERO_F if r1 else (_ATAN_HALF_HI_F if r2 else (
        _ATAN_ONE_HI_F if r3 else (_ATAN_3H_HI_F if r4 else _ATAN_INF_HI_F)))
    bl = _ZERO_F if r1 else (_ATAN_HALF_LO_F if r2 else (
        _ATAN_ONE_LO_F if r3 else (_ATAN_3H_LO_F if r4 else _ATAN_INF_LO_F)))
    t = _div(num, den)
    z = t * t
    p = _A32_4 * z + _A32_3
    p = p * z + _A32_2
    p = p * z + _A32_1
    p = p * z + _A32_0
    y = bh + (t + (t * z * p + bl))
    return _xorsign32(y, x)


# ---------------------------------------------------------------------------------------------
# public entry points

def _make(name: str, impl64, impl32):
    def stub(x):
        return call(x)

    stub.__name__ = stub.__qualname__ = name
    stub.__doc__ = (f"Vectorisable ``{name}`` for float32/float64 (and integer) scalars; usable "
                    f"inside ``numba.njit`` code and from Python.")

    @overload(stub, inline="always")
    def _typed(x):
        if x == types.float32:
            return lambda x: impl32(x)
        if isinstance(x, (types.Float, types.Integer, types.Boolean)):
            return lambda x: impl64(np.float64(x))
        return None

    call = numba.njit(lambda x: stub(x))
    return stub


exp = _make("exp", _exp64, _exp32)
expm1 = _make("expm1", _expm1_64, _expm1_32)
log = _make("log", _log64, _log32)
log1p = _make("log1p", _log1p64, _log1p32)
sin = _make("sin", _sin64, _sin32)
cos = _make("cos", _cos64, _cos32)
tanh = _make("tanh", _tanh64, _tanh32)
sinh = _make("sinh", _sinh64, _sinh32)
cosh = _make("cosh", _cosh64, _cosh32)
atan = _make("atan", _atan64, _atan32)
