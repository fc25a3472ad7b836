"""vmath's building blocks: LLVM instructions as Numba intrinsics (no branches, no
error checks), bit views of floats, and the constants the functions share."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

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
