"""The CPU kernels' scratch arrays (local memory, private memory, per-work-item slots) start on
64-byte boundaries: one AVX-512 vector per tile row (Numba's own arrays are 32-byte aligned,
which made a tiled product's speed a matter of chance)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from tapegrad.backends.cpu.copies import aligned_empty, stack_empty
from tapegrad.backends.cpu.jam import tile_copies
from tapegrad.backends.cpu.scratch import STACK_BYTES, STACK_TOTAL, Scratch


@numba.njit
def _misaligned(n):
    bad = 0
    first = 0
    for k in range(n):
        a = aligned_empty((16, 16), np.float32)
        b = aligned_empty((3, 7), np.int64)
        c = aligned_empty((k % 5 + 1,), np.float64)
        a[15, 15] = 1.0
        b[2, 6] = 7
        c[k % 5] = 2.0
        bad += (a.ctypes.data % 64 != 0) + (b.ctypes.data % 64 != 0) + (c.ctypes.data % 64 != 0)
        bad += (a.shape != (16, 16)) + (b.shape != (3, 7)) + (c.size != k % 5 + 1)
        d = stack_empty(np.float32, 16, 16)      # (on the stack: small tiles, jam.py)
        e = stack_empty(np.int64, 3, 7)
        d[15, 15] = 1.0
        e[2, 6] = 7
        bad += (d.ctypes.data % 64 != 0) + (e.ctypes.data % 64 != 0) + (d[15, 15] != 1.0)
        bad += (d.shape != (16, 16)) + (e.shape != (3, 7)) + (e.strides != (56, 8)) + (e[2, 6] != 7)
        if k == 0:
            first = d.ctypes.data
        bad += d.ctypes.data != first       # (one buffer per call site, made once)
    return bad


@pytest.mark.parametrize("n", [1, 200])
def test_scratch_arrays_start_on_64_byte_boundaries(n):
    assert _misaligned(n) == 0


def test_only_small_tiles_that_nothing_adds_into_go_on_the_stack():
    scratch = Scratch({"sums"})
    lines = [scratch.line(f"tile{k}", (16, STACK_BYTES // 64), "float32") for k in range(9)]
    assert [("stack_empty" in line) for line in lines] == [True] * (STACK_TOTAL // STACK_BYTES) + [False]
    assert scratch.line("sums", (4,), "float32") == "sums = aligned_empty((4,), np.float32)"
    assert "aligned_empty" in Scratch(set()).line("big", (STACK_BYTES + 1,), "int8")
    assert "aligned_empty" in Scratch(None).line("tile", (4,), "float32")     # (jam off)


NEST = ["for _l0 in range(_lim0):", "    for _l1 in range(_lim1):"]


def test_tile_copies_only_for_plain_copies_into_a_stack_tile():
    copy = NEST + ["        t[np.uint64(_l0), np.uint64(_l1)] = A[np.uint64(_l0), np.uint64(_l1)]"]
    full = tile_copies(copy, 2, (16, 16), {"t"})
    assert full[0] == "if _lim0 == 16 and _lim1 == 16:" and full[3].strip() == "for _l1 in range(16):"
    assert full[-4:] == ["else:", *("    " + line for line in copy)]     # (cut groups as written)
    assert tile_copies(copy, 2, (16, 16), set()) is None              # (a heap tile)
    branch = NEST + ["        if A[_l0, _l1] > 0:", "            t[_l0, _l1] = A[_l0, _l1]"]
    assert tile_copies(branch, 2, (16, 16), {"t"}) is None
    call = NEST + ["        t[_l0, _l1] = helper(A[_l0, _l1])"]
    assert tile_copies(call, 2, (16, 16), {"t"}) is None
    assert tile_copies(["for _l0 in range(_lim0):", "    t[_l0] = A[_l0]"], 1, (16,), {"t"}) is None
