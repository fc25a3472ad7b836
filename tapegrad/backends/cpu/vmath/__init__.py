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
  and ``tanh`` (``|x| < 0.5625``) use odd minimax polynomials near 0.  ``expm1`` reduces
  ``exp``'s argument (clamped alike), and ``sinh`` and ``cosh`` the same ``|x|``, so that a
  tangent, which computes a function and its derivative of one argument, reduces and
  evaluates the polynomial once (LLVM merges the same operations on the same value).
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
from numba import types
from numba.extending import overload

from tapegrad.backends.cpu.vmath.atan import _atan32, _atan64
from tapegrad.backends.cpu.vmath.exp import (
    _cosh32,
    _cosh64,
    _exp32,
    _exp64,
    _expm1_32,
    _expm1_64,
    _sinh32,
    _sinh64,
    _tanh32,
    _tanh64,
)
from tapegrad.backends.cpu.vmath.log import _log1p32, _log1p64, _log32, _log64
from tapegrad.backends.cpu.vmath.power import _pow32
from tapegrad.backends.cpu.vmath.trig import _cos32, _cos64, _sin32, _sin64

__all__ = ["exp", "expm1", "log", "log1p", "sin", "cos", "tanh", "sinh", "cosh", "atan",
           "pow"]

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
