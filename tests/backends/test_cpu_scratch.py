"""The CPU kernels' scratch arrays (local memory, private memory, per-work-item slots) start on
64-byte boundaries: one AVX-512 vector per tile row (Numba's own arrays are 32-byte aligned,
which made a tiled product's speed a matter of chance)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from tapegrad.backends.cpu.copies import aligned_empty


@numba.njit
def _misaligned(n):
    bad = 0
    for k in range(n):
        a = aligned_empty((16, 16), np.float32)
        b = aligned_empty((3, 7), np.int64)
        c = aligned_empty((k % 5 + 1,), np.float64)
        a[15, 15] = 1.0
        b[2, 6] = 7
        c[k % 5] = 2.0
        bad += (a.ctypes.data % 64 != 0) + (b.ctypes.data % 64 != 0) + (c.ctypes.data % 64 != 0)
        bad += (a.shape != (16, 16)) + (b.shape != (3, 7)) + (c.size != k % 5 + 1)
    return bad


@pytest.mark.parametrize("n", [1, 200])
def test_scratch_arrays_start_on_64_byte_boundaries(n):
    assert _misaligned(n) == 0
