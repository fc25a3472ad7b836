"""Barriers the CPU drops (tapegrad/backends/cpu/phases.py): two segments that pass data only
through each work-item's own elements run as one loop over the work-items.  Each rule is
checked on the kernel IR, and whole kernels against NumPy."""

from __future__ import annotations

import ast
import textwrap

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.phases import merged_phases
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul  # the plain tiled product

CPU = tg.CPU()


def barriers_left(code: str, aliases: str = "") -> int:
    """How many barriers ``merged_phases`` keeps of the kernel body ``code``."""
    body = ast.parse(textwrap.dedent(code)).body
    merged = merged_phases(body, {"S", "T", "X", "Y", "Z"}, set(aliases.split()))
    return sum(isinstance(n, ast.Attribute) and n.attr == "synchronize"
               for n in ast.walk(ast.Module(body=merged, type_ignores=[])))


def loop(middle: str, last: str) -> str:
    """A loop whose body holds two barriers: the first guards a transposed read of ``S`` and
    stays; whether the second goes depends on ``middle`` and ``last``."""
    return f"""
li, lj = tg.local_indices()
i, j = tg.global_indices()
for t in range(n):
    S[li, lj] = X[i, t]
    tg.synchronize()
    {middle}
    tg.synchronize()
    {last}
"""


UPDATE = "T[li, lj] = T[li, lj] + S[lj, li]"


def test_segments_sharing_only_their_own_elements_merge():
    assert barriers_left(loop(UPDATE, "Y[i, t] = T[li, lj]\n    T[li, lj] = 0.0")) == 1


@pytest.mark.parametrize("last", [
    "Y[i, t] = T[lj, li]",              # the element across the diagonal
    "Y[i, t] = T[li, 0]",               # an element another work-item writes
    "Y[i, t] = T[li + 1, lj]",
    "T[0, 0] = 1.0",                    # a write into another work-item's element
    "S[li, lj] = 0.0",                  # a write another work-item's read must precede
    "Y[i, t] = T[i, j]",                # other index names: maybe another element
    "Y[i, t] = f(T)",                   # the whole array
    "Y[i, t] = tg.atomic_add(T, (li, lj), 1.0)",   # an atomic's old value
])
def test_another_work_items_element_keeps_the_barrier(last):
    assert barriers_left(loop(UPDATE, last)) == 2


def test_reads_on_both_sides_need_no_barrier():
    assert barriers_left(loop("Y[i, j] = S[lj, li] + X[i, 0] + T[lj, li]",
                              "Z[i, j] = T[0, lj] + X[0, j]")) == 1


def test_global_arrays_follow_the_same_rules():
    assert barriers_left(loop("Y[i, j] = S[lj, li]", "Y[i, j] = Y[i, j] + 1.0")) == 1
    assert barriers_left(loop("Y[i, j] = S[lj, li]", "Y[i, j] = Y[i, j + 1]")) == 2


def test_additions_commute_but_not_with_reads():
    add = "tg.atomic_add(Y, (i, t), S[lj, li])"
    assert barriers_left(loop(add, "tg.atomic_sub(Y, (j, t), 1.0)")) == 1
    assert barriers_left(loop(add, "Z[i, j] = Y[i, t]")) == 2


def test_an_early_return_keeps_the_barrier():
    assert barriers_left(loop("if S[lj, li] > 0.5:\n        return", "Y[i, t] = 1.0")) == 2


def test_a_lists_last_barrier_stays():
    """Without a barrier the loop would be one work-item's loop: its iterations would no
    longer run in step across the group."""
    assert barriers_left("""
li, lj = tg.local_indices()
i, j = tg.global_indices()
for t in range(n):
    T[li, lj] = X[i, t]
    tg.synchronize()
    Y[i, t] = T[li, lj]
""") == 1


@pytest.mark.parametrize("setup, use, left", [
    ("li, lj = tg.local_indices()", "T[li, lj]", 1),               # followed: it goes
    ("li, lj = tg.local_indices()\nli = lj", "T[li, lj]", 2),      # reassigned
    ("li, lj = tg.local_indices()", "V[li, lj]", 2),               # V may alias T
    ("li, lj = tg.local_indices()", "T[li][lj]", 2),               # a view's element
])
def test_what_the_pass_cannot_follow_keeps_the_barrier(setup, use, left):
    code = f"""
{setup}
i, j = tg.global_indices()
for t in range(n):
    T[li, lj] = X[i, t]
    tg.synchronize()
    Y[i, j] = {use}
    for k in range(2):
        tg.synchronize()
"""
    assert barriers_left(code, aliases="V") == left


@tg.kernel
def scaled_then_neighbour(Y, X, s):
    """Each loop step passes its work-item's own element through one barrier (removable) and
    a neighbour's through the other (needed)."""
    i = tg.index(tg.Global)
    li = tg.index(tg.Local)
    n = tg.groupsize()[0]
    tile = tg.localmem(X.dtype, (8,))
    for t in range(X.shape[1]):
        tile[li] = X[i, t]
        tg.synchronize()
        tile[li] = tile[li] * s
        tg.synchronize()
        Y[i, t] = tile[li] + tile[(li + 1) % n]
        tg.synchronize()


def test_merged_and_kept_barriers_compute_what_numpy_does():
    rng = np.random.default_rng(1)
    X = rng.random((16, 5))
    Y = np.zeros_like(X)
    scaled_then_neighbour(CPU, (8,))(Y, X, 3.0, ndrange=16)
    neighbour = X.reshape(2, 8, 5)[:, [1, 2, 3, 4, 5, 6, 7, 0]].reshape(16, 5)
    np.testing.assert_allclose(Y, 3.0 * X + 3.0 * neighbour, rtol=1e-14)
    # the scaling runs in the loop that loads (one barrier went); the neighbour read does not
    source = scaled_then_neighbour.source(backend=CPU)
    load, scale = source.index("tile[np.uint64(li)] = X["), source.index("* s")
    assert "for _l0" not in source[load:scale]
    assert "for _l0" in source[scale:source.index("Y[np.uint64(i)")]


def tiled_product_gradients(m, k, n):
    rng = np.random.default_rng(m + k + n)
    A, B, W = rng.random((m, k)), rng.random((k, n)), rng.random((m, n))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, tiled_matmul(CPU, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.zeros((m, n)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(m, n))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)


@pytest.mark.parametrize("m, k, n", [
    (16, 16, 16),        # per-thread copies of the shadows pay: the loop without atomics
    (4, 64, 4),          # they do not (16 work-items, 256-element shadows): atomics
])
def test_the_tiled_product_adjoint_flushes_its_tile_shadows_in_the_loop_that_updates_them(
        m, k, n):
    tiled_product_gradients(m, k, n)
    source = tiled_matmul.source(mode="reverse", backend=CPU)
    update = source.index("tile_a_bar[np.uint64(li), np.uint64(lj)] = tile_a_bar[")
    flush = source.index("A_bar__priv[_c, ", update)
    assert "for _l0" not in source[update:flush]      # one loop: no barrier between
    assert "if _private_A_bar:" not in source[update:flush]   # decided outside the loop


def test_shapes_and_declarations_are_not_contents():
    assert barriers_left(loop(UPDATE + " + X.shape[0] + tg.groupsize()[0]",
                              "Y[i, t] = T[li, lj]")) == 1
    assert barriers_left("""
li = tg.local_index()
T = tg.localmem(X.dtype, (8,))
T[li] = X[li]
tg.synchronize()
Y[li] = T[li]
for t in range(n):
    tg.synchronize()
""") == 1


@tg.kernel
def counter_after_a_dropped_barrier(Y, X, m):
    """The loop's first barrier goes (nothing before it in the body): ``q = t`` must not turn
    into a once-per-group statement that splits the last segment around the return."""
    i = tg.index()
    q = 0
    for t in range(m):
        tg.synchronize()
        q = t
        tg.synchronize()
    if X[i] > 1.5:
        return
    q = q + 1
    Y[i] = q


def test_dropping_a_barrier_leaves_what_runs_once_per_group_alone():
    X = np.arange(8.0) % 3
    Y = np.zeros(8)
    counter_after_a_dropped_barrier(CPU, (4,))(Y, X, 2, ndrange=8)
    np.testing.assert_array_equal(Y, np.where(X > 1.5, 0.0, 2.0))


@tg.kernel
def scatter_after_a_shared_load(Y, X, idx):
    """One array adds into per-thread copies after a barrier: in the loop with atomics the
    choice is already made (no dead branch in the source)."""
    i = tg.index()
    li = tg.index(tg.Local)
    tile = tg.localmem(X.dtype, (4,))
    tile[li] = X[i]
    tg.synchronize()
    tg.atomic_add(Y, idx[i], tile[3 - li])


@pytest.mark.parametrize("size", [2, 64])     # copies pay (2 elements) or not (64)
def test_a_scatter_adds_the_same_with_copies_or_atomics(size):
    rng = np.random.default_rng(size)
    X = rng.random(16)
    idx = rng.integers(0, size, 16)
    Y = np.zeros(size)
    scatter_after_a_shared_load(CPU, (4,))(Y, X, idx, ndrange=16)
    expected = np.zeros(size)
    np.add.at(expected, idx, X.reshape(4, 4)[:, ::-1].ravel())
    np.testing.assert_allclose(Y, expected, rtol=1e-14)
    source = scatter_after_a_shared_load.source(backend=CPU)
    assert source.count("if _private_Y:") == 2       # the loop's choice and the merge
    code = [line.strip() for line in source.splitlines()]
    assert sum(c.startswith("Y__priv[_c, ") for c in code) == 1
    assert sum(c.startswith("atomic_add(Y, ") for c in code) == 1
