"""Rows of a full workgroup jammed (tapegrad/backends/cpu/jam.py): a float32 tiled product's
work-items run four rows at a time in full groups, with the same bits as the loop as written
(which still runs the groups the ndrange cuts), and bodies that could tell the order of
work-items apart are left alone; the adjoint's loop adding into per-thread copies gets
constant bounds in full groups instead."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.jam import constant_bounds, jam_rows
from tapegrad.bench.problems import TILE, matmul_fma_k, matmul_k

CPU, NO_JAM = tg.CPU(), tg.CPU(without=["jam"])


def operands(shape: tuple[int, int, int], seed: int) -> list[np.ndarray]:
    """Random float32 A (n x k), B (k x m) and W (n x m) for a product of ``shape``."""
    n, k, m = shape
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in ((n, k), (k, m), (n, m))]


@pytest.mark.parametrize("kernel", [matmul_k, matmul_fma_k], ids=["plus", "fma"])
@pytest.mark.parametrize("shape", [(64, 48, 32), (32, 16, 48)])
def test_a_tiled_product_is_jammed_and_gives_the_same_bits(shape, kernel):
    n, _, m = shape
    A, B, _ = operands(shape, 4)
    jammed = np.full((n, m), np.nan, np.float32)
    kernel(CPU, (TILE, TILE))(jammed, A, B, ndrange=(n, m))
    assert "rows' work-items at a time" in kernel.source("primal", CPU)
    np.testing.assert_allclose(jammed, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    plain = np.full((n, m), np.nan, np.float32)
    kernel(NO_JAM, (TILE, TILE))(plain, A, B, ndrange=(n, m))
    assert "(jam.py)" not in kernel.source("primal", NO_JAM)
    assert np.array_equal(jammed, plain)


def test_a_float64_product_is_not_jammed():
    A = np.ones((32, 32))
    C = np.zeros((32, 32))
    matmul_k(CPU, (TILE, TILE))(C, A, A, ndrange=C.shape)
    assert (C == 32.0).all() and "(jam.py)" not in matmul_k.source("primal", CPU)


@tg.kernel
def smoothed(Out, X):
    """Loops of known length over tiles the group loads, between barriers (as a tiled
    product's): each work-item's value lives in its slot across them (a jammed phase)."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    mine = tg.localmem(X.dtype, (16, 16))
    s = X[i, j]
    for u in range(2):
        mine[li, lj] = X[i, j] * (u + 1)
        tg.synchronize()
        for t in range(5):       # (the rows of its block of four: there in every group here)
            s = s * 0.5 + mine[(li // 4) * 4 + (li + t) % 4, lj]
        tg.synchronize()
    Out[i, j] = s


@pytest.mark.parametrize("shape", [(48, 32), (40, 37)])
def test_a_phase_is_jammed_in_full_groups_and_cut_groups_run_as_written(shape):
    X = np.random.default_rng(5).random(shape).astype(np.float32)
    results = []
    for backend in (CPU, NO_JAM):
        out = np.full_like(X, np.nan)
        smoothed(backend, (16, 16))(out, X, ndrange=X.shape)
        assert ("(jam.py)" in smoothed.source("primal", backend)) == (backend is CPU)
        results.append(out)
    rows = np.arange(shape[0])
    expected = X.astype(np.float64)
    for u in range(2):
        for t in range(5):
            expected = expected * 0.5 + (u + 1) * X[rows // 4 * 4 + (rows + t) % 4]
    np.testing.assert_allclose(results[0], expected, rtol=1e-5)
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("shape", [(64, 48, 32), (32, 64, 48)])
def test_the_adjoint_adds_into_per_thread_copies_with_constant_bounds_and_the_same_bits(shape):
    # (full groups: where the ndrange cuts a group the adjoint keeps its tiles' atomics, and
    # the loop adding into the copies has no loop of known length)
    n, _, m = shape
    A, B, W = operands(shape, 6)
    grads = []
    for backend in (CPU, NO_JAM):
        dA, dB = np.zeros_like(A), np.zeros_like(B)
        tg.autodiff(tg.Reverse, matmul_k(backend, (TILE, TILE)), tg.Const,
                    tg.DuplicatedNoNeed(np.empty((n, m), np.float32), W.copy()),
                    tg.Duplicated(A, dA), tg.Duplicated(B, dB), ndrange=(n, m))
        source = matmul_k.source("reverse", backend)
        assert ("the loops' bounds constant" in source) == (backend is CPU)
        grads.append((dA, dB))
    (dA, dB), (plain_dA, plain_dB) = grads
    np.testing.assert_allclose(dA, W.astype(np.float64) @ B.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dB, A.T.astype(np.float64) @ W, rtol=1e-4, atol=1e-4)
    assert np.array_equal(dA, plain_dA) and np.array_equal(dB, plain_dB)


@tg.kernel
def staged(Out, X, S):
    """A tile copied from X (on the stack), one added into (heap), one too large for the
    stack (heap)."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile = tg.localmem(X.dtype, (16, 16))
    sums = tg.localmem(X.dtype, (16, 16))
    big = tg.localmem(X.dtype, (64, 64))       # (16 KiB)
    tile[li, lj] = X[i, j]
    sums[li, lj] = 0.0
    big[li, lj] = S[i, j]
    tg.synchronize()
    for k in range(16):
        sums[li, lj] = sums[li, lj] + tile[li, (lj + k) % 16]
    Out[i, j] = sums[li, lj] * big[li, lj]


@pytest.mark.parametrize("shape", [(48, 32), (40, 37)])
def test_tiles_copied_from_inputs_are_on_the_stack_with_the_same_bits(shape):
    rng = np.random.default_rng(7)
    X, S = (rng.random(shape).astype(np.float32) for _ in range(2))
    results = []
    for backend in (CPU, NO_JAM):
        out = np.full_like(X, np.nan)
        staged(backend, (16, 16))(out, X, S, ndrange=X.shape)
        source = staged.source("primal", backend)
        jammed = backend is CPU
        assert ("tile = stack_empty(np.float32, 16, 16)" in source) == jammed
        assert ("each row of a tile one vector" in source) == jammed
        assert "sums = aligned_empty((16, 16), np.float32)" in source
        assert "big = aligned_empty((64, 64), np.float32)" in source
        results.append(out)
    # each work-item sums its row of its group's tile: defined where no column is cut off
    cols = shape[1] // 16 * 16
    row_sums = X[:, :cols].astype(np.float64).reshape(shape[0], -1, 16).sum(axis=2)
    expected = np.repeat(row_sums, 16, axis=1) * S[:, :cols]
    np.testing.assert_allclose(results[0][:, :cols], expected, rtol=1e-5)
    assert np.array_equal(results[0][:, :cols], results[1][:, :cols])


def test_the_adjoint_keeps_its_shadow_tiles_on_the_heap():
    A, B, W = operands((32, 32, 32), 8)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul_k(CPU, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.empty((32, 32), np.float32), W.copy()),
                tg.Duplicated(A, dA), tg.Duplicated(B, dB), ndrange=(32, 32))
    source = matmul_k.source("reverse", CPU)
    assert "tile_a = stack_empty(np.float32, 16, 16)" in source
    assert "tile_a_bar = aligned_empty((16, 16), np.float32)" in source
    np.testing.assert_allclose(dA, W.astype(np.float64) @ B.T, rtol=1e-4, atol=1e-4)


def test_a_jammed_kernels_launch_of_one_group_runs_the_parallel_kernel():
    # (its task called on its own runs code LLVM optimised once, whose jammed rows are
    # scalar: 8.5x slower for a 16 x 16 product over k = 16384)
    A, B, _ = operands((16, 64, 16), 9)
    C = np.full((16, 16), np.nan, np.float32)
    matmul_k(CPU, (TILE, TILE))(C, A, B, ndrange=(16, 16))
    launcher = matmul_k.cache[("last", "primal", CPU)]
    launcher = launcher.variant((16, 16)) if hasattr(launcher, "variant") else launcher
    assert launcher.one_group is None
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)


BODY = ["for _l0 in range(_lim0):",
        "    for _l1 in range(_lim1):",
        "        _li = _l0 * 16 + _l1",
        "        acc = acc__items[_li]",
        "        for k in range(16):",
        "            acc = acc + A[np.uint64(_l0), np.uint64(k)] * B[np.uint64(k), np.uint64(_l1)]",
        "        acc__items[_li] = acc"]


def test_what_it_jams_and_what_it_leaves():
    lines = jam_rows(BODY, 2, (16, 16))
    assert lines is not None and lines[0] == "if _lim0 == 16 and _lim1 == 16:"
    assert lines[lines.index("else:") + 1:] == ["    " + line for line in BODY]
    left_alone = {
        "a store another work-item may read": BODY[:-1] + ["        A[_l0, _l1] = acc"],
        "a value carried from the work-item before": BODY[:3] + [
            "        acc = acc + 1.0"] + BODY[4:],
        "an atomic": BODY + ["        atomic_add(A, _l0, acc)"],
        "a branch": BODY[:3] + ["        if _l1 > 2:", "            acc = 1.0"] + BODY[3:],
        "a loop of unknown length": [line.replace("range(16)", "range(n)") for line in BODY],
        "no loop": BODY[:4] + ["        acc__items[_li] = acc"],
    }
    for why, body in left_alone.items():
        assert jam_rows(body, 2, (16, 16)) is None, why
    assert jam_rows(BODY, 2, (6, 16)) is None          # rows not a multiple of four


def test_constant_bounds_change_only_the_nest_headers_of_full_groups():
    stores = BODY[:-1] + ["        A[_l0, _l1] = acc"]        # (not jammed: a store)
    lines = constant_bounds(stores, 2, (16, 16))
    assert lines[0] == "if _lim0 == 16 and _lim1 == 16:"
    copy = [line for line in lines[2:lines.index("else:")]]
    assert copy[:2] == ["    for _l0 in range(16):", "        for _l1 in range(16):"]
    assert copy[2:] == ["    " + line for line in stores[2:]]
    assert lines[lines.index("else:") + 1:] == ["    " + line for line in stores]
    assert constant_bounds(BODY[:4] + ["        A[_l0, _l1] = acc"], 2, (16, 16)) is None
    assert constant_bounds(BODY, 1, (16,)) is None
