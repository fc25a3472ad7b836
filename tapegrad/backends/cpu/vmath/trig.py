"""sin, cos: x = n pi/2 + r, with Payne-Hanek reduction for large arguments (see the
package's docstring)."""

from __future__ import annotations

import numpy as np

from tapegrad.backends.cpu.vmath.bits import (
    _HALF_F,
    _I,
    _INF32,
    _INF64,
    _P2M53,
    _P2M62,
    _U,
    _ZERO_F,
    _h,
    _mad,
    _sel,
    _sign_of64,
    _ubits64,
    _xorsign64,
)
from tapegrad.backends.numba_cache import njit

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
# as three 32-bit limbs; x * 2/pi = M * W * 2**-94 (mod 4), for biased exponents 126..254.
# The windows all lie in the first 256 bits of 2/pi, so they are cut out of four constant
# words with shifts instead of loaded from a table (gathers are slow).
_D32 = [_window(64 * (i + 1), 64) for i in range(4)]     # bits 64i+1 .. 64i+64
_D32_0, _D32_1, _D32_2, _D32_3 = (_U(d) for d in _D32)
_U1 = _U(1)
_U6 = _U(6)
_U63 = _U(63)
_ZERO_U = _U(0)

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
_ROW0_32_U = _U(126)
_ROWN_32_U = _U(254)
_ONE_U = _U(1)
_TWO_U = _U(2)

_PIO4 = _h("0x1.921fb54442d18p-1")        # just below pi/4
_PIO2_A = _h("0x1.921fb54000000p+0")      # 27 bits
_PIO2_B = _h("0x1.10b4611a62633p-30")     # pi/2 - _PIO2_A
_SPLIT = 134217729.0                      # 2**27 + 1


@njit(forceinline=True)
def _fixed_to_frac(w0):
    """``w0`` holds ``x*2/pi mod 4`` in fixed point with 62 fraction bits; returns
    ``(n, fr)``: the nearest integer mod 4 and the signed remainder in units of 2**-62."""
    t = w0 + _HALF62
    n = t >> _U62
    fr = np.int64(t & _MASK62) - _HALF62_I
    return n, fr


@njit(forceinline=True)
def _reduce_big64(a):
    """``a = n*pi/2 + (rh + rl)`` for finite ``a >= 0.5``: exact Payne-Hanek reduction."""
    ix = _ubits64(a)
    be = ix >> _U52
    be = _sel(be > _ROW0_64_U, be, _ROW0_64_U)
    be = _sel(be < _ROWN_64_U, be, _ROWN_64_U)
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


@njit(forceinline=True)
def _reduce_big32(a):
    """``a * 2/pi mod 4`` for a float32 ``a >= 0.5`` (finite), exactly to 2**-62, as a
    uint64 in fixed point with 62 fraction bits."""
    ix = _U(np.float32(a).view(np.uint32))
    be = ix >> _U23
    be = _sel(be > _ROW0_32_U, be, _ROW0_32_U)
    be = _sel(be < _ROWN_32_U, be, _ROWN_32_U)
    # the window starts at bit j0 = E - 24 of 2/pi; t = j0 - 1 + 64 = 64 (w + 1) + sh
    t = be - _U(88)                           # E + 39 with E = be - 127
    w = t >> _U6                              # 0, 1 or 2: word holding bit j0 (0: before 2/pi)
    sh = t & _U63
    a0 = _sel(w == _ZERO_U, _ZERO_U, _sel(w == _U1, _D32_0, _D32_1))
    a1 = _sel(w == _ZERO_U, _D32_0, _sel(w == _U1, _D32_1, _D32_2))
    a2 = _sel(w == _ZERO_U, _D32_1, _sel(w == _U1, _D32_2, _D32_3))
    hi = (a0 << sh) | ((a1 >> _U1) >> (_U63 - sh))       # window bits 95..32
    mid = (a1 << sh) | ((a2 >> _U1) >> (_U63 - sh))      # window bits 31..0 on top
    mant = (ix & _MANT32) | _IMPL32
    p2 = mant * (hi >> _U32)
    p1 = mant * (hi & _M32)
    p0 = mant * (mid >> _U32)
    return (p2 << _U32) + p1 + (p0 >> _U32)   # product bits 32..95: 2**1 .. 2**-62


# minimax sin(r) = r + r^3 S(r^2), cos(r) = 1 - r^2/2 + r^4 C(r^2) on |r| <= pi/4
_S64_0, _S64_1, _S64_2, _S64_3, _S64_4, _S64_5 = (_h(s) for s in (
    "-0x1.5555555555555p-3", "0x1.1111111110ba3p-7", "-0x1.a01a019e8091ep-13",
    "0x1.71de3792f9dcbp-19", "-0x1.ae6007aa12aecp-26", "0x1.5e0a0069402a9p-33"))
_C64_0, _C64_1, _C64_2, _C64_3, _C64_4, _C64_5 = (_h(s) for s in (
    "0x1.5555555555555p-5", "-0x1.6c16c16c16962p-10", "0x1.a01a019f4da06p-16",
    "-0x1.27e4fa169f466p-22", "0x1.1eeb67bf9de41p-29", "-0x1.907cde7be338ap-37"))
# float32 arguments: sin(v pi/2) = v P(v^2) on |v| <= 1 (relative error 2**-35, in float64)
_SP_0, _SP_1, _SP_2, _SP_3, _SP_4, _SP_5 = (_h(s) for s in (
    "0x1.921fb5441e441p+0", "-0x1.4abbce4f17a93p-1", "0x1.466bbfc19d00ep-4",
    "-0x1.32d111df548dap-8", "0x1.500ff296039bep-13", "-0x1.cc33c59042819p-19"))


@njit(forceinline=True)
def _sincos_kernel64(r, rl):
    """``(sin(r + rl), cos(r + rl))`` for ``|r| <= pi/4``, ``|rl| <= ulp(r)``."""
    z = r * r
    sp = _mad(_S64_5, z, _S64_4)
    sp = _mad(sp, z, _S64_3)
    sp = _mad(sp, z, _S64_2)
    sp = _mad(sp, z, _S64_1)
    sp = _mad(sp, z, _S64_0)
    hz = 0.5 * z
    sn = r + (r * z * sp + rl * (1.0 - hz))
    cp = _mad(_C64_5, z, _C64_4)
    cp = _mad(cp, z, _C64_3)
    cp = _mad(cp, z, _C64_2)
    cp = _mad(cp, z, _C64_1)
    cp = _mad(cp, z, _C64_0)
    w = 1.0 - hz
    cs = w + (((1.0 - w) - hz) + (z * z * cp - r * rl))
    return sn, cs


@njit(forceinline=True)
def _sin_halfpi(v):
    """``sin(v * pi/2)`` for float64 ``|v| <= 1``."""
    z = v * v
    p = _mad(_SP_5, z, _SP_4)
    p = _mad(p, z, _SP_3)
    p = _mad(p, z, _SP_2)
    p = _mad(p, z, _SP_1)
    p = _mad(p, z, _SP_0)
    return v * p


@njit(forceinline=True)
def _reduce64(a):
    """``(n, rh, rl)`` with ``a = n*pi/2 + rh + rl`` for finite ``a >= 0``."""
    n, rh, rl = _reduce_big64(a)
    small = a <= _PIO4
    return (_sel(small, _U(0), n), _sel(small, a, rh), _sel(small, 0.0, rl))


@njit(forceinline=True)
def _quadrant64(n, sn, cs):
    """``sin(n*pi/2 + r)`` from ``sin(r)``, ``cos(r)``."""
    y = _sel(n & _ONE_U != _U(0), cs, sn)
    return _xorsign64(y, (n & _TWO_U) << _U62)


@njit(forceinline=True)
def _sin64(x):
    a = abs(x)
    n, rh, rl = _reduce64(_sel(a < _INF64, a, 0.0))
    sn, cs = _sincos_kernel64(rh, rl)
    y = _quadrant64(n, sn, cs)
    y = _xorsign64(y, _sign_of64(x))
    return _sel(a < _INF64, y, x - x)


@njit(forceinline=True)
def _cos64(x):
    a = abs(x)
    n, rh, rl = _reduce64(_sel(a < _INF64, a, 0.0))
    sn, cs = _sincos_kernel64(rh, rl)
    y = _quadrant64(n + _ONE_U, sn, cs)
    return _sel(a < _INF64, y, x - x)


_TWO_OVER_PI = _h("0x1.45f306dc9c883p-1")
_HALF62_U = _U(1 << 62)
_MASK63 = _U((1 << 63) - 1)
_U62_I = _I(1 << 62)


@njit(forceinline=True)
def _sincos32(x, shift):
    """``sin(x + shift*pi/2)`` for float32 ``x`` and ``shift`` 0 or 1, computed in float64.

    With ``u = x*2/pi + shift`` (mod 4), ``v = u - 2m`` with ``m`` the nearest integer to
    ``u/2``: ``sin(x + shift*pi/2) = (-1)**m sin(v pi/2)``, ``|v| <= 1``."""
    a = abs(x)
    a = _sel(a < _INF32, a, _ZERO_F)
    big = a >= _HALF_F
    # |x| >= 1/2: exact reduction in fixed point (wrapping uint64 arithmetic is mod 4)
    w0 = _reduce_big32(_sel(big, a, _HALF_F))
    neg = _sign_of64(np.float64(x)) != _ZERO_U
    # u = +-|x| * 2/pi: fold the sign of x in before adding the shift (sin is odd)
    w0 = _sel(neg, _ZERO_U - w0, w0)
    t = w0 + _HALF62_U + (shift << _U62)
    m = t >> _U63
    vb = np.float64(np.int64(t & _MASK63) - _U62_I) * _P2M62
    # |x| < 1/2: u = x*2/pi in float64; shift 1 (cos, even): v = |u| - 1, m = 1
    us = np.float64(_sel(shift != _ZERO_U, a, x)) * _TWO_OVER_PI
    vs = _sel(shift != _ZERO_U, us - 1.0, us)
    v = _sel(big, vb, vs)
    m = _sel(big, m, shift)
    y = _sin_halfpi(v)
    y = _xorsign64(y, m << _U63)
    return np.float32(y)


@njit(forceinline=True)
def _sin32(x):
    y = _sincos32(x, _ZERO_U)
    return _sel(abs(x) < _INF32, y, x - x)


@njit(forceinline=True)
def _cos32(x):
    y = _sincos32(x, _ONE_U)
    return _sel(abs(x) < _INF32, y, x - x)
