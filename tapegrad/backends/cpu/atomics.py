"""Real atomic read-modify-write operations for Numba CPU code.

Numba has no CPU atomics, so each operation is an ``@intrinsic`` that emits one LLVM
``atomicrmw`` on the element's address.  Every function returns the element's old value.
Indices are ints (1-D) or tuples of ints; as everywhere in kernels, they never wrap around.
"""

from __future__ import annotations

import numba
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
            op = float_op if isinstance(dtype, types.Float) else int_op
            return builder.atomic_rmw(op, ptr, value_v, "monotonic")

        return sig, codegen

    atomic.__name__ = name
    return atomic


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
