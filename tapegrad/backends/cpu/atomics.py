"""Real atomic read-modify-write operations for Numba CPU code.

Numba has no CPU atomics, so each operation is an ``@intrinsic`` that emits one LLVM
``atomicrmw`` on the element's address.  Every function returns the element's old value.
Indices are ints (1-D) or tuples of ints; as everywhere in kernels, they never wrap around.
"""

from __future__ import annotations

from typing import Any

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _make(name: str, float_op: str, int_op: str):
    @intrinsic
    def atomic(typingctx, arr, idx, value):
        if not isinstance(arr, types.Array):
            return None
        n_idx = len(idx) if isinstance(idx, types.BaseTuple) else 1
        if n_idx != arr.ndim:
            return None
        dtype = arr.dtype
        if isinstance(dtype, types.Boolean):
            return None
        sig = dtype(arr, idx, dtype)

        def codegen(context, builder, signature, args):
            arr_t, idx_t, _ = signature.args
            arr_v, idx_v, value_v = args
            ary = context.make_array(arr_t)(context, builder, arr_v)
            if isinstance(idx_t, types.BaseTuple):
                idx_vals = cgutils.unpack_tuple(builder, idx_v, len(idx_t))
                idx_tys = list(idx_t)
            else:
                idx_vals, idx_tys = [idx_v], [idx_t]
            idx_vals = [context.cast(builder, v, t, types.intp) for v, t in zip(idx_vals, idx_tys)]
            ptr = cgutils.get_item_pointer(context, builder, arr_t, ary, idx_vals, wraparound=False)
            if isinstance(dtype, types.Float) and float_op in _FLOAT_COMPARES:
                return _exchange_if(builder, ptr, value_v, _FLOAT_COMPARES[float_op])
            op = float_op if isinstance(dtype, types.Float) else int_op
            return builder.atomic_rmw(op, ptr, value_v, "monotonic")

        return sig, codegen

    atomic.__name__ = name
    return atomic


# A float min/max keeps Python's (and the GPUs') rule: the element becomes ``value`` only
# where ``value < old`` (min) or ``value > old`` (max), so a NaN already there stays and a NaN
# value changes nothing.  LLVM's fmin/fmax (IEEE minNum/maxNum) would replace a stored NaN.
_FLOAT_COMPARES = {"fmin": "<", "fmax": ">"}


def _exchange_if(builder: Any, ptr: Any, value: Any, compare: str) -> Any:
    """``old = *ptr; if value <compare> old: *ptr = value`` as one atomic operation (a
    compare-and-swap loop on the element's bits); returns ``old``."""
    bits = ir.IntType(64 if isinstance(value.type, ir.DoubleType) else 32)
    iptr = builder.bitcast(ptr, bits.as_pointer())
    first = builder.load_atomic(iptr, "monotonic", bits.width // 8)
    start = builder.block
    loop = builder.append_basic_block("exchange_if.loop")
    swap = builder.append_basic_block("exchange_if.swap")
    done = builder.append_basic_block("exchange_if.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    old_bits = builder.phi(bits)
    old_bits.add_incoming(first, start)
    old = builder.bitcast(old_bits, value.type)
    builder.cbranch(builder.fcmp_ordered(compare, value, old), swap, done)
    builder.position_at_end(swap)
    pair = builder.cmpxchg(iptr, old_bits, builder.bitcast(value, bits), "monotonic",
                           "monotonic")
    old_bits.add_incoming(builder.extract_value(pair, 0), swap)
    builder.cbranch(builder.extract_value(pair, 1), done, loop)
    builder.position_at_end(done)
    return old


atomic_add = _make("atomic_add", "fadd", "add")
atomic_sub = _make("atomic_sub", "fsub", "sub")
atomic_min = _make("atomic_min", "fmin", "min")
atomic_max = _make("atomic_max", "fmax", "max")


# Local and private memory belong to one workgroup, and one CPU thread runs a whole workgroup,
# so their read-modify-writes need no atomic instruction.

@numba.njit(inline="always")
def plain_add(arr, idx, value):
    old = arr[idx]
    arr[idx] = old + value
    return old


@numba.njit(inline="always")
def plain_sub(arr, idx, value):
    old = arr[idx]
    arr[idx] = old - value
    return old


@numba.njit(inline="always")
def plain_min(arr, idx, value):
    old = arr[idx]
    arr[idx] = min(old, value)
    return old


@numba.njit(inline="always")
def plain_max(arr, idx, value):
    old = arr[idx]
    arr[idx] = max(old, value)
    return old
