"""Arrays a CPU kernel makes for itself: its local memory and per-work-item slots, on 64-byte
boundaries (on the heap, or small tiles on the stack: ``scratch.py`` chooses), and transposed
copies of inputs (see ``transposed.py``).  Generated modules carry a digest of this file:
its code is compiled into every kernel."""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.core.imputils import impl_ret_new_ref
from numba.extending import intrinsic

from tapegrad.backends.numba_cache import njit

try:            # Numba's own array allocation (internal: a Numba without it aligns as it does)
    from numba.np.arrayobj import _empty_nd_impl
except ImportError:  # pragma: no cover
    _empty_nd_impl = None
try:            # (internal too: a Numba without them has no arrays on the stack)
    from numba.np.arrayobj import make_array, populate_array
    STACK_ARRAYS = True
except ImportError:  # pragma: no cover
    STACK_ARRAYS = False

ALIGN = 64      # one AVX-512 vector, one cache line


@intrinsic
def _aligned_empty(typingctx, shape, dtype):  # noqa: ANN001, ANN201, ARG001 (Numba's form)
    """``np.empty(shape, dtype)`` starting on a 64-byte boundary, for a kernel's scratch
    arrays.  Numba aligns arrays to 32 bytes, so a 16 x 16 float32 tile (one vector per row)
    was 64-byte aligned or not by chance, and a tiled product's speed changed from one
    process to the next.  The array is allocated as ``np.empty`` allocates it (a new array,
    which LLVM knows aliases nothing), with the alignment asked for."""
    rank = len(shape)
    array = types.Array(dtype.dtype, rank, "C")

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        sizes = [builder.extract_value(args[0], k) for k in range(rank)]
        context.get_preferred_array_alignment = lambda ty: ALIGN   # this allocation only
        try:
            made = _empty_nd_impl(context, builder, array, sizes)
        finally:
            del context.get_preferred_array_alignment
        return impl_ret_new_ref(context, builder, array, made._getvalue())

    return array(shape, dtype), codegen


if _empty_nd_impl is not None:
    aligned_empty = _aligned_empty
else:  # pragma: no cover
    @numba.njit(inline="always")
    def aligned_empty(shape, dtype):  # noqa: ANN001, ANN201
        return np.empty(shape, dtype)

@intrinsic
def stack_empty(typingctx, dtype, *dims):  # noqa: ANN001, ANN002, ANN201, ARG001
    """An uninitialised C-contiguous array of constant shape ``dims`` on the stack of the
    function that makes it, 64-byte aligned (for ``scratch.Scratch``).  LLVM then knows that it
    aliases no argument, so the copy of a row of an input into a tile of local memory is one
    vector load and store, where it was a scalar loop (heap) or a call to memcpy per row.
    Unlike ``np.empty``: each call site has one buffer, the same on every run of it (a
    generated task makes its tiles once, before its loops), and it must not outlive the
    function (a task never returns its local memory)."""
    if not all(isinstance(d, types.IntegerLiteral) and d.literal_value > 0 for d in dims):
        return None
    sizes = [d.literal_value for d in dims]
    array = types.Array(dtype.dtype, len(sizes), "C")

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        element = context.get_data_type(array.dtype)
        itemsize = context.get_abi_sizeof(element)
        intp = context.get_value_type(types.intp)
        total, strides = 1, []
        for d in reversed(sizes):
            strides.insert(0, ir.Constant(intp, total * itemsize))
            total *= d
        with builder.goto_entry_block():     # (a static alloca: one per call site, reused)
            buffer = builder.alloca(ir.ArrayType(element, total))
            buffer.align = ALIGN
        made = make_array(array)(context, builder)
        populate_array(made, data=builder.bitcast(buffer, element.as_pointer()),
                       shape=[ir.Constant(intp, d) for d in sizes], strides=strides,
                       itemsize=ir.Constant(intp, itemsize), meminfo=None)
        return made._getvalue()

    return array(dtype, types.StarArgTuple.from_types(dims)), codegen


_BLOCK = 32     # a 32 x 32 block of float32 is 4 KiB: both sides stay in L1 while it moves


@njit(parallel=True, nogil=True)
def transposed(a):  # noqa: ANN001, ANN201 (a Numba function)
    """A C-contiguous copy of ``a.T`` for a 2-D ``a``, moved in square blocks, each written
    along its rows: contiguous stores, where writing along the columns (as ``a.T.copy()``)
    scatters them (measured: CHANGELOG.md, 'the figures that moved')."""
    n, m = a.shape
    out = np.empty((m, n), a.dtype)
    for c in numba.prange((m + _BLOCK - 1) // _BLOCK):
        for b in range(0, n, _BLOCK):
            for y in range(c * _BLOCK, min(c * _BLOCK + _BLOCK, m)):
                for x in range(b, min(b + _BLOCK, n)):
                    out[y, x] = a[x, y]
    return out
