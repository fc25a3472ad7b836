"""Tiled 2-D kernels that add into per-thread copies (a tiled product's adjoint) run their
workgroups in bands of rows on the CPU (lower.py's ``open_group_loop``): every group must
still run once, also in a last band of fewer rows, and a tiled product's gradient must come
out as NumPy's (the primal, without copies, keeps the row order)."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.lower import BAND
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul
from tests.backends.test_cpu_phases import tiled_product_gradients

CPU = tg.CPU()


@tg.kernel
def group_ids(Y, count):
    """Each work-item writes its group's position (through local memory, which makes the
    kernel a tiled one) and counts its visits (atomically: per-thread copies)."""
    gi, gj = tg.index(tg.Group, tg.NTuple)
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile = tg.localmem(Y.dtype, (2, 3))
    tile[li, lj] = gi * 1000.0 + gj
    tg.synchronize()
    Y[i, j] = tile[li, lj]
    tg.atomic_add(count, (i, j), 1)


@pytest.mark.parametrize("groups", [(1, 5), (BAND, 1), (BAND + 3, 3), (2 * BAND + 1, 2)])
def test_every_group_runs_once_in_bands(groups):
    rows, cols = groups[0] * 2 - 1, groups[1] * 3 - 2       # the last groups are cut
    Y, count = np.full((rows, cols), -1.0), np.zeros((rows, cols), np.int64)
    group_ids(CPU, (2, 3))(Y, count, ndrange=(rows, cols))
    gi, gj = np.meshgrid(np.arange(rows) // 2, np.arange(cols) // 3, indexing="ij")
    np.testing.assert_array_equal(Y, gi * 1000.0 + gj)
    np.testing.assert_array_equal(count, 1)
    assert "_gband = _g // " in group_ids.source(backend=CPU)


def test_a_tiled_products_gradient_over_a_partial_band():
    tiled_product_gradients(TILE * (BAND + 3), 3 * TILE, TILE * 5)
    assert "_gband = _g // " in tiled_matmul.source(mode="reverse", backend=CPU)
