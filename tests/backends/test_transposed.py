"""The CPU's transposed tiles (tapegrad/backends/cpu/transposed.py): a tiled product's adjoint
reads its transposed tile from a transposed copy of the input made once per launch, instead
of scattering each tile into local memory.  Gradients against NumPy's products."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.copies import transposed
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul  # the plain tiled product

CPU = tg.CPU()


@tg.kernel
def transposed_tile_read_back(C, A, B):
    """tile_a holds A's tile transposed, and each work-item reads back the element it stored
    before the barrier: there the store must stay as it is (after the rewrite another
    work-item would store that element, maybe later)."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[lj, li] = A[i, t * TILE + lj]
        own = tile_a[lj, li]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[k, li] * tile_b[k, lj]
        acc += 0.5 * own * own
        tg.synchronize()
    C[i, j] = acc


@tg.kernel
def tiled_matmul_shifted_rows(C, A, B):
    """The tile of B starts one row further down for odd work-item rows: a load index that
    differs between work-items beyond their own indices, so the work-item across the
    diagonal cannot compute it."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    shift = li % 2
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE - 1):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li + shift, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[li, k] * tile_b[k, lj]
        tg.synchronize()
    C[i, j] = acc


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
@pytest.mark.parametrize("m, k, n", [(8, 12, 16), (4, 4, 4), (12, 8, 4)])
def test_the_tiled_product_adjoint_reads_a_transposed_copy(dtype, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    A, B, W = (rng.random(s).astype(dtype) for s in ((m, k), (k, n), (m, n)))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, tiled_matmul(CPU, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.zeros((m, n), dtype), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(m, n))
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(dA, W @ B.T, rtol=tol)
    np.testing.assert_allclose(dB, A.T @ W, rtol=tol)
    source = tiled_matmul.source(mode="reverse", backend=CPU)
    assert "B__T = transposed(B)" in source
    assert "tile_b__t[np.uint64(li), np.uint64(lj)] = B__T[" in source
    assert "tile_b__t[np.uint64(lj), np.uint64(li)]" not in source      # no scatter left


def test_a_tile_read_back_before_the_barrier_keeps_its_transposed_store():
    rng = np.random.default_rng(3)
    A, B, W = rng.random((8, 8)), rng.random((8, 8)), rng.random((8, 8))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, transposed_tile_read_back(CPU, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.zeros((8, 8)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(8, 8))
    # C[i, j] = (A @ B)[i, j] + 0.5 * sum over t of A[i, t * TILE + j % TILE] ** 2
    expected_dA = W @ B.T
    for j in range(8):
        for t in range(8 // TILE):
            col = t * TILE + j % TILE
            expected_dA[:, col] += W[:, j] * A[:, col]
    np.testing.assert_allclose(dA, expected_dA, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)
    assert "A__T" not in transposed_tile_read_back.source(mode="reverse", backend=CPU)


@pytest.mark.parametrize("shape", [(1, 1), (3, 70), (64, 33), (96, 96)])
def test_the_transposed_copy(shape):
    a = np.random.default_rng(0).random(shape)
    np.testing.assert_array_equal(transposed(a), a.T)
    np.testing.assert_array_equal(transposed(a[:, ::2]), a[:, ::2].T)
    assert transposed(a).flags.c_contiguous


def test_a_load_index_that_differs_between_work_items_is_left_alone():
    rng = np.random.default_rng(5)
    A, B, W = rng.random((8, 12)), rng.random((12, 8)), rng.random((8, 8))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, tiled_matmul_shifted_rows(CPU, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.zeros((8, 8)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(8, 8))
    # tile_b[k, lj] = B[t * TILE + k + k % 2, j]: C = sum over t of A_t @ B_t
    rows = [t * TILE + k + k % 2 for t in range(12 // TILE - 1) for k in range(TILE)]
    cols = [t * TILE + k for t in range(12 // TILE - 1) for k in range(TILE)]
    expected_dA, expected_dB = np.zeros_like(A), np.zeros_like(B)
    expected_dA[:, cols] = W @ B[rows].T
    np.add.at(expected_dB, rows, A[:, cols].T @ W)
    np.testing.assert_allclose(dA, expected_dA, rtol=1e-12)
    np.testing.assert_allclose(dB, expected_dB, rtol=1e-12)
    assert "B__T" not in tiled_matmul_shifted_rows.source(mode="reverse", backend=CPU)
