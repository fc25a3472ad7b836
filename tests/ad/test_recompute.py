"""Stores the reverse sweep redoes instead of saving on the stack (tapegrad/ad/recompute.py).

A tile loaded from an input that nothing changes is loaded again in each reverse iteration;
anything else (an input the kernel writes, a value from a local that changes) keeps the stack.
Each case is checked against central finite differences or a closed form, and by what the
generated adjoint contains.
"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error
from tests.ad.test_reverse import TILE, matmul

rng = np.random.default_rng(17)


def r(*shape: int) -> np.ndarray:
    return rng.uniform(-1, 1, shape)


@tg.kernel
def scaled_tiles(C, A, s0):
    """The tile's value depends on ``s``, which changes every iteration: not recomputable."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    s = s0
    for t in range(A.shape[1] // TILE):
        tile[li, lj] = A[i, t * TILE + lj] * s
        tg.synchronize()
        acc += tile[lj, li] * tile[li, lj]
        s = s * 0.5
        tg.synchronize()
    C[i, j] = acc


@tg.kernel
def tiles_of_an_overwritten_input(A):
    """Loads tiles of A and then overwrites A: the reverse sweep cannot load them again."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(2):
        tile[li, lj] = A[i, j] + t
        tg.synchronize()
        acc += tile[lj, li] * tile[li, lj]
        tg.synchronize()
    A[i, j] = acc


@tg.kernel
def private_window(Y, X):
    i = tg.index()
    p = tg.private(X.dtype, (1,))
    acc = 0.0
    for k in range(3):
        p[0] = X[i + k]
        acc += p[0] * p[0]
    Y[i] = acc


def test_tiles_of_unchanged_inputs_are_loaded_again_not_stacked(backend, size):
    n = size(8, 4)
    A, B, W = r(n, 12), r(12, n), r(n, n)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    As, Bs, dAs, dBs = (tg.asarray(backend, v) for v in (A, B, dA, dB))
    tg.autodiff(tg.Reverse, matmul(backend, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(tg.asarray(backend, np.zeros((n, n))),
                                    tg.asarray(backend, W)),
                tg.Duplicated(As, dAs), tg.Duplicated(Bs, dBs), ndrange=(n, n))
    np.testing.assert_allclose(tg.to_numpy(dAs), W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(tg.to_numpy(dBs), A.T @ W, rtol=1e-12)
    source = matmul.source(mode="reverse")
    assert "_fstack" not in source and "_status" not in source      # no stack at all
    reverse_loop = source[source.index("for _r"):]
    assert "tile_a[li, lj] = A[i, t * 4 + lj]" in reverse_loop      # loaded again
    assert "tile_a[li, lj] = A[" not in source[:source.index("for _r")]  # not in forward


def test_a_tile_that_depends_on_a_changing_local_stays_on_the_stack():
    A = r(8, 8)
    kernel_vjp_error(scaled_tiles(tg.CPU(), (TILE, TILE)), [np.zeros((8, 8)), A, 0.9], (8, 8),
                     wrt=[1], outputs=[0], active=[2])
    assert "_fstack" in scaled_tiles.source(mode="reverse")


def test_a_tile_of_an_input_the_kernel_overwrites_stays_on_the_stack():
    kernel_vjp_error(tiles_of_an_overwritten_input(tg.CPU(), (TILE, TILE)), [r(8, 8)], (8, 8),
                     wrt=[0], outputs=[0])
    source = tiles_of_an_overwritten_input.source(mode="reverse")
    assert "_fstack" in source


def test_private_memory_loaded_in_a_loop_is_recomputed():
    kernel_vjp_error(private_window(tg.CPU(), 4), [np.zeros(9), r(11)], 9, wrt=[1],
                     outputs=[0])
    assert "_fstack" not in private_window.source(mode="reverse")


# -- what must not be recomputed or simplified (found in review; each gave a wrong gradient)

@tg.kernel
def per_item_trip_counts(Y, X, n):
    i = tg.index()
    acc = 0.0
    for _a in range(i % 4):         # work-items run the outer loop a different number of times
        for _t in range(n):         # the inner forward loop is idle: only its count is left
            acc += X[i] * X[i]
    Y[i] = acc


@tg.kernel
def counter_read_after_the_loop(Y, X, n):
    i = tg.index()
    acc = 0.0
    for t in range(n):  # noqa: B007 - t is read after the loop
        acc += X[i] * X[i]
    s = 0.0
    for u in range(t):              # the loop's last t bounds another loop
        s += X[u]
    Y[i] = acc + s * X[i]


@tg.kernel
def two_slot_ring(Y, X):
    i = tg.index()
    p = tg.private(X.dtype, (2,))
    acc = 0.0
    for t in range(4):
        p[t % 2] = X[i + t]         # one slot per iteration: the other is from before
        if t > 0:
            acc += p[0] * p[1]
    Y[i] = acc


@tg.kernel
def reassigns_the_loop_variable(Y, X):
    i = tg.index()
    acc = 0.0
    for t in range(3):
        t = t * 2
        acc += X[i] * t
    Y[i] = acc


def test_an_idle_loop_keeps_each_work_items_trip_count():
    kernel_vjp_error(per_item_trip_counts(tg.CPU(), 4), [np.zeros(8), r(8), 2], 8, wrt=[1],
                     outputs=[0])
    assert "synchronize" not in per_item_trip_counts.source(mode="reverse")


def test_a_loop_whose_counter_is_read_afterwards_stays():
    kernel_vjp_error(counter_read_after_the_loop(tg.CPU(), 4), [np.zeros(8), r(8), 5], 8,
                     wrt=[1], outputs=[0])


def test_memory_partly_rewritten_per_iteration_stays_on_the_stack():
    kernel_vjp_error(two_slot_ring(tg.CPU(), 4), [np.zeros(7), r(10)], 7, wrt=[1], outputs=[0])
    assert "_fstack" in two_slot_ring.source(mode="reverse")


def test_assigning_the_loop_variable_is_a_clear_error():
    with pytest.raises(tg.KernelSyntaxError, match="loop variable t is assigned inside"):
        tg.autodiff(tg.Reverse, reassigns_the_loop_variable(tg.CPU(), 4), tg.Const,
                    tg.Duplicated(np.zeros(4), np.ones(4)), tg.Duplicated(r(4), np.zeros(4)),
                    ndrange=4)
