"""Vectorisable transcendental functions for the Numba CPU backend.

Numba lowers ``math.sin`` and friends to calls into libm, and a loop with a call in it does not
vectorise (LLVM turns it into ``llvm.sin.v8f64`` and splits that back into eight libm calls).
The functions here are straight-line arithmetic on the float and on its bit pattern: no
calls, no data-dependent branches (every alternative is computed and one is selected), and
table lookups only through gathers.  A loop such as ::

    for i in range(n):
        B[i] = vmath.sin(A[i])

therefore becomes SIMD code (AVX-512 ``zmm`` on an AVX-512 host) with no calls in it.

Each public function is a plain Python function with a Numba ``overload(inline="always")``:
inside ``numba.njit`` code it is inlined at the call site and specialised per argument type
(``float32`` arguments compute in ``float32``, except ``sin``/``cos`` which reduce and
evaluate them in float64; ``float64`` and integers in ``float64``); called from Python it
runs the same code, compiled, on a scalar.  Inlining is needed: a loop with a call in it
does not vectorise, and LLVM's inliner leaves bodies this large alone.  The implementations
are therefore compiled once each (``forceinline=True``: LLVM's ``alwaysinline``, and cached on
disk) and LLVM inlines them into every caller.  Numba's own IR-level inlining
(``inline="always"``) would give the same machine code but re-types the whole body at every
call site, so compile time would grow with every call (measured: docs/performance.md,
'Measurements behind the code').  Divisions go through ``_div`` (no zero-divisor check: with
Numba's default ``error_model='python'`` that check's exception path also blocks
vectorisation) and polynomial steps through ``_mad`` (``llvm.fmuladd``: an FMA where the
CPU has one).

Methods (all written for this module):

* ``exp``/``expm1``/``sinh``/``cosh``/``tanh``: Cody-Waite reduction ``x = k ln2 + r``,
  ``|r| <= ln2/2``, ``ln2`` split so that ``k*ln2_hi`` is exact; a minimax polynomial for
  ``expm1(r)`` returned as a double-word ``eh + el``; scaling by ``2**k`` in two exact
  steps so that results in the subnormal range are rounded once.  ``sinh`` (``|x| < 1``)
  and ``tanh`` (``|x| < 0.5625``) use odd minimax polynomials near 0.
* ``log``/``log1p``: exponent/mantissa split through the bit pattern, mantissa centred on
  ``[sqrt(1/2), sqrt(2))``, ``log(1+f) = 2 atanh(f/(2+f))`` with a minimax polynomial;
  ``log1p`` adds the rounding error of ``1 + x`` as ``c/(1+x)``.
* ``sin``/``cos``: ``x = n pi/2 + r``, ``|r| <= pi/4``, ``sin r`` and ``cos r`` by minimax
  polynomials and one selected by ``n``.  For ``|x| > pi/4`` the reduction is an exact
  Payne-Hanek one in 64-bit integer arithmetic on every lane: ``x * 2/pi`` mod 4 is the
  mantissa of ``x`` times a 192-bit window (96-bit for float32) of the bits of ``2/pi``
  picked by the exponent of ``x``, the bits coming from ``pi`` computed at import by
  Machin's formula (float64: a table of windows per exponent, read by gathers; float32:
  cut out of four constant words by shifts).  It is exact for every finite argument, so
  there is no separate path for huge arguments; it is also where most of the time goes
  (the polynomials are a small part of it).
  float32: ``sin(x) = +-sin(v pi/2)``, ``|v| <= 1``, one polynomial in float64, rounded once.
* ``atan``: the argument is mapped to ``|t| <= 7/16`` around one of 0, 1/2, 1, 3/2, inf
  (one division) and an odd minimax polynomial is used there.
* ``pow`` (float32 only; float64 calls libm's ``pow``): ``exp(y log|x|)`` with the float64
  ``log`` and ``exp`` above, whose error (about ``|y log x| < 104`` float64 ulps wherever
  the float32 result is finite and nonzero) is far below half a float32 ulp, so the result
  is rounded once; the sign for a negative base and an odd integer exponent, and C99's
  special cases, by selects.  This beats calling libm per element but not NumPy's float32
  power (a float32 algorithm of its own), so a cheaper float64 ``log`` and ``exp`` (only
  ~31 bits are needed here) would be the next step (measured: docs/performance.md,
  'Measurements behind the code').

Accuracy, max error in ulps of the result type (float32: exhaustive over all 2**32 inputs;
float64: 10**7 random bit patterns and uniform samples per function, against long double):

    function   exp   expm1  log   log1p  sin   cos   tanh  sinh  cosh  atan  pow
    float32    0.75  1.08   0.85  0.88   0.51  0.51  1.50  1.59  1.07  0.86  0.50*
    float64    0.75  1.05   0.83  0.86   0.87  0.86  1.50  1.58  1.05  0.81

(* ``pow``: 2**18 random pairs of bit patterns and exponents, at most 0.501 ulp.)

Special values follow C99 Annex F: ``inf``/``nan`` propagation, ``exp(-inf) = 0``,
``log(0) = -inf``, ``log(x < 0) = nan``, ``sin(inf) = nan``, signed zeros preserved by odd
functions, subnormal arguments and results, overflow to ``inf`` and underflow to 0 at the
correctly rounded thresholds.
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from tapegrad.backends.numba_cache import njit

__all__ = ["exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sinh", "cosh", "atan",
           "pow"]

_h = float.fromhex
_F = np.float32
_U = np.uint64
_I = np.int64

# ---------------------------------------------------------------------------------------------
# primitives: intrinsics emit their LLVM instruction directly (no Numba-level inlining to pay
# for, no branches, no error checks)

@intrinsic
def _sel(typingctx, c, a, b):
    """``a if c else b`` as an LLVM ``select`` (both sides are evaluated).  A Python
    conditional expression becomes a branch; LLVM usually flattens it, but not always (in
    ``parallel=True`` loops some stayed branches, and the loop ran several times slower)."""
    if not isinstance(c, types.Boolean):
        return None
    if isinstance(a, types.Float) or isinstance(b, types.Float):
        if a != b:
            return None                  # no silent float32 -> float64 promotion
        t = a
    else:
        t = typingctx.unify_types(types.unliteral(a), types.unliteral(b))
        if t is None:
            return None

    def codegen(context, builder, sig, args):
        av = context.cast(builder, args[1], sig.args[1], t)
        bv = context.cast(builder, args[2], sig.args[2], t)
        return builder.select(args[0], av, bv)

    return t(c, a, b), codegen


# bit views

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def _is_int64(t):
    return isinstance(t, types.Integer) and t.bitwidth == 64


@intrinsic
def _bits64(typingctx, x):
    """The bits of a float64 as an int64."""
    if x != types.float64:
        return None
    return types.int64(x), lambda context, builder, sig, args: builder.bitcast(args[0], _I64)


@intrinsic
def _ubits64(typingctx, x):
    """The bits of a float64 as a uint64."""
    if x != types.float64:
        return None
    return types.uint64(x), lambda context, builder, sig, args: builder.bitcast(args[0], _I64)


@intrinsic
def _from64(typingctx, i):
    """The float64 with the bits of a 64-bit integer."""
    if not _is_int64(i):
        return None
    return types.float64(i), lambda context, builder, sig, args: builder.bitcast(
        args[0], ir.DoubleType())


_ufrom64 = _from64


@intrinsic
def _bits32(typingctx, x):
    """The bits of a float32 as an int32, sign-extended to int64."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.sext(builder.bitcast(args[0], _I32), _I64)

    return types.int64(x), codegen


@intrinsic
def _from32(typingctx, i):
    """The float32 with the low 32 bits of an integer."""
    if not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, _I32)
        return builder.bitcast(v, ir.FloatType())

    return types.float32(i), codegen


_P2M25 = _h("0x1p-25")
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


@intrinsic
def _mad(typingctx, a, b, c):
    """``a * b + c`` through ``llvm.fmuladd``: one FMA where the CPU has it, a multiply and an
    add otherwise (never a libm call).  Only used in polynomial evaluation, where either is
    accurate enough; the exact steps (reductions, two-sums, splits) use plain operations."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        ty = args[0].type
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ty, [ty, ty, ty]),
            "llvm.fmuladd.f32" if a == types.float32 else "llvm.fmuladd.f64")
        return builder.call(fn, args)

    return a(a, b, c), codegen


@intrinsic
def _sign_of64(typingctx, x):
    """The sign bit of a float64 as a uint64 mask."""
    if x != types.float64:
        return None

    def codegen(context, builder, sig, args):
        return builder.and_(builder.bitcast(args[0], _I64), ir.Constant(_I64, 1 << 63))

    return types.uint64(x), codegen


@intrinsic
def _xorsign64(typingctx, y, m):
    """float64 ``y`` with its bits xor-ed with the uint64 ``m`` (a sign mask)."""
    if y != types.float64 or not _is_int64(m):
        return None

    def codegen(context, builder, sig, args):
        bits = builder.xor(builder.bitcast(args[0], _I64), args[1])
        return builder.bitcast(bits, ir.DoubleType())

    return types.float64(y, m), codegen


@intrinsic
def _xorsign32(typingctx, y, x):
    """float32 ``y`` with its sign flipped where float32 ``x`` has its sign bit set."""
    if y != types.float32 or x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        sign = builder.and_(builder.bitcast(args[1], _I32), ir.Constant(_I32, 1 << 31))
        bits = builder.xor(builder.bitcast(args[0], _I32), sign)
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(y, x), codegen


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
def _exp64(x):
    xc = _sel(x > -746.0, x, -746.0)
    xc = _sel(xc < 710.0, xc, 710.0)
    kf, eh, el = _em_core64(xc)
    y = _scale64(_one_plus64(eh, el), kf)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _exp32(x):
    xc = _sel(x > _F(-104.0), x, _F(-104.0))
    xc = _sel(xc < _F(89.0), xc, _F(89.0))
    kf, eh, el = _em_core32(xc)
    y = _scale32(_one_plus32(eh, el), kf)
    return _sel(x == x, y, x)


@njit(forceinline=True)
def _expm1_64(x):
    xc = _sel(x > -45.0, x, -45.0)
    xc = _sel(xc < 710.0, xc, 710.0)
    kf, eh, el = _em_core64(xc)
    y = _expm1_from64(kf, eh, el)
    return _sel(not abs(x) >= _P2M54, x, y)    # tiny, +-0, subnormal and nan: x


@njit(forceinline=True)
def _expm1_32(x):
    xc = _sel(x > _F(-20.0), x, _F(-20.0))
    xc = _sel(xc < _F(89.0), xc, _F(89.0))
    kf, eh, el = _em_core32(xc)
    y = _expm1_from32(kf, eh, el)
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


@njit(forceinline=True)
def _atan64(x):
    a = abs(x)
    r1 = a < 0.4375
    r2 = a < 0.6875
    r3 = a < 1.1875
    r4 = a < 2.4375
    # t = (a - c) / (1 + c a) for c = 0, 1/2, 1, 3/2; -1/a for c = inf
    num = _sel(r3, a - 1.0, _sel(r4, a - 1.5, -1.0))
    num = _sel(r1, a, _sel(r2, 2.0 * a - 1.0, num))
    den = _sel(r3, a + 1.0, _sel(r4, 1.0 + 1.5 * a, a))
    den = _sel(r1, 1.0, _sel(r2, 2.0 + a, den))
    bh = _sel(r3, _ATAN_ONE_HI, _sel(r4, _ATAN_3H_HI, _ATAN_INF_HI))
    bh = _sel(r1, 0.0, _sel(r2, _ATAN_HALF_HI, bh))
    bl = _sel(r3, _ATAN_ONE_LO, _sel(r4, _ATAN_3H_LO, _ATAN_INF_LO))
    bl = _sel(r1, 0.0, _sel(r2, _ATAN_HALF_LO, bl))
    t = _div(num, den)
    z = t * t
    p = _mad(_A64_10, z, _A64_9)
    p = _mad(p, z, _A64_8)
    p = _mad(p, z, _A64_7)
    p = _mad(p, z, _A64_6)
    p = _mad(p, z, _A64_5)
    p = _mad(p, z, _A64_4)
    p = _mad(p, z, _A64_3)
    p = _mad(p, z, _A64_2)
    p = _mad(p, z, _A64_1)
    p = _mad(p, z, _A64_0)
    y = bh + (t + (t * z * p + bl))
    return _xorsign64(y, _sign_of64(x))     # nan propagates through t


@njit(forceinline=True)
def _atan32(x):
    a = abs(x)
    r1 = a < _F(0.4375)
    r2 = a < _F(0.6875)
    r3 = a < _F(1.1875)
    r4 = a < _F(2.4375)
    num = _sel(r3, a - _ONE_F, _sel(r4, a - _F(1.5), _F(-1.0)))
    num = _sel(r1, a, _sel(r2, _TWO_F * a - _ONE_F, num))
    den = _sel(r3, a + _ONE_F, _sel(r4, _ONE_F + _F(1.5) * a, a))
    den = _sel(r1, _ONE_F, _sel(r2, _TWO_F + a, den))
    bh = _sel(r3, _ATAN_ONE_HI_F, _sel(r4, _ATAN_3H_HI_F, _ATAN_INF_HI_F))
    bh = _sel(r1, _ZERO_F, _sel(r2, _ATAN_HALF_HI_F, bh))
    bl = _sel(r3, _ATAN_ONE_LO_F, _sel(r4, _ATAN_3H_LO_F, _ATAN_INF_LO_F))
    bl = _sel(r1, _ZERO_F, _sel(r2, _ATAN_HALF_LO_F, bl))
    t = _div(num, den)
    z = t * t
    p = _mad(_A32_4, z, _A32_3)
    p = _mad(p, z, _A32_2)
    p = _mad(p, z, _A32_1)
    p = _mad(p, z, _A32_0)
    y = bh + (t + (t * z * p + bl))
    return _xorsign32(y, x)


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


def pow(x, y):  # noqa: A001 (the math module's name, as the others)
    """Vectorisable ``x ** y`` for two float32 scalars (other types: libm's ``pow`` in
    float64); usable inside ``numba.njit`` code and from Python."""
    return _pow_call(x, y)


@overload(pow, inline="always")
def _pow_typed(x, y):
    if x == types.float32 and y == types.float32:
        return lambda x, y: _pow32(x, y)
    if isinstance(x, (types.Float, types.Integer)) and isinstance(y, (types.Float, types.Integer)):
        return lambda x, y: math.pow(np.float64(x), np.float64(y))
    return None


_pow_call = numba.njit(lambda x, y: pow(x, y))
