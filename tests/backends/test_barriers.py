"""Workgroup barriers (``tg.synchronize()``), local memory and private memory.

On the CPU, a barrier splits each workgroup's work-item loop in two; locals that live across a
barrier get one slot per work-item.  These tests check the results, not the mechanism.
"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

TILE = 4
SENTINEL = -7.0


# -- tiled matrix multiplication: barriers inside a for loop ----------------------------------

@tg.kernel
def tiled_matmul(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    As = tg.localmem(A.dtype, (TILE, TILE))
    Bs = tg.localmem(B.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(0, A.shape[1], TILE):
        As[li, lj] = A[i, t + lj]
        Bs[li, lj] = B[t + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += As[li, k] * Bs[k, lj]
        tg.synchronize()
    C[i, j] = acc


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
@pytest.mark.parametrize("m, k, n", [(8, 12, 16), (4, 4, 8), (12, 4, 4), (16, 8, 12)])
def test_tiled_matmul(backend, dtype, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    A = rng.standard_normal((m, k)).astype(dtype)
    B = rng.standard_normal((k, n)).astype(dtype)
    C = np.full((m, n), SENTINEL, dtype)
    tiled_matmul(backend, (TILE, TILE))(C, A, B, ndrange=C.shape)
    assert C.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(C, A @ B, **tol)


# -- tree reduction: a barrier inside a while loop --------------------------------------------

@tg.kernel
def group_sums(out, A):
    i = tg.index()
    li = tg.index(tg.Local)
    g = tg.index(tg.Group)
    W = tg.groupsize()[0]
    valid = min(W, tg.ndrange()[0] - g * W)     # items of this group inside the ndrange
    tmp = tg.localmem(A.dtype, tg.groupsize())
    tmp[li] = A[i]
    tg.synchronize()
    s = W // 2
    while s > 0:
        if li < s and li + s < valid:
            tmp[li] += tmp[li + s]
        tg.synchronize()
        s = s // 2
    if li == 0:
        out[g] = tmp[0]


@pytest.mark.parametrize("wgs", [8, 16])
@pytest.mark.parametrize("n", [64, 61, 5, 17])
def test_tree_reduction_while_loop_barrier(backend, wgs, n):
    A = np.arange(1.0, n + 1) ** 2
    groups = -(-n // wgs)
    out = np.full(groups + 2, SENTINEL)
    group_sums(backend, wgs)(out, A, ndrange=n)
    padded = np.concatenate([A, np.zeros(groups * wgs - n)])
    np.testing.assert_array_equal(out[:groups], padded.reshape(groups, wgs).sum(1))
    assert (out[groups:] == SENTINEL).all()


# -- ndrange not a multiple of the workgroup size -------------------------------------------------

@tg.kernel
def reverse_in_group(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    g = tg.index(tg.Group)
    W = tg.groupsize()[0]
    valid = min(W, tg.ndrange()[0] - g * W)
    tmp = tg.localmem(A.dtype, tg.groupsize())
    tmp[li] = A[i]
    tg.synchronize()
    B[i] = tmp[valid - 1 - li]


@pytest.mark.parametrize("n", [8, 13, 3, 1])
def test_partial_last_group_with_barrier(backend, n):
    A = np.arange(n, dtype=np.float64)
    B = np.full(n + 5, SENTINEL)
    reverse_in_group(backend, 4)(B, A, ndrange=n)
    expected = np.concatenate([A[s:s + 4][::-1] for s in range(0, n, 4)])
    np.testing.assert_array_equal(B[:n], expected)
    assert (B[n:] == SENTINEL).all()


@tg.kernel
def add_group_origin(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile = tg.localmem(A.dtype, tg.groupsize())
    tile[li, lj] = A[i, j]
    tg.synchronize()
    if j > i + 3:
        return
    B[i, j] = A[i, j] + tile[0, 0]


def test_partial_groups_2d_with_barrier_and_late_return(backend):
    nd = (7, 10)
    A = np.arange(70.0).reshape(nd)
    B = np.full((8, 12), SENTINEL)
    add_group_origin(backend, (4, 4))(B, A, ndrange=nd)
    ii, jj = np.indices(nd)
    origin = A[(ii // 4) * 4, (jj // 4) * 4]
    expected = np.where(jj > ii + 3, SENTINEL, A + origin)
    np.testing.assert_array_equal(B[:7, :10], expected)
    assert (B[7:, :] == SENTINEL).all() and (B[:, 10:] == SENTINEL).all()


# -- private memory ---------------------------------------------------------------------------

@tg.kernel
def private_no_barrier(B, A):
    i = tg.index()
    p = tg.private(A.dtype, 4)
    q = tg.private(np.int64, (2, 3))
    for k in range(4):
        p[k] = A[i] * (k + 1)
    for r in range(2):
        for c in range(3):
            q[r, c] = i * r + c
    s = 0.0
    for k in range(4):
        s += p[3 - k] * k
    B[i] = s + q[1, 2]


def test_private_arrays_without_barrier(backend):
    A = np.arange(1.0, 11.0)
    B = np.zeros(10)
    private_no_barrier(backend, 4)(B, A, ndrange=10)
    # p[3-k] = A*(4-k): s = A * (4*0 + 3*1 + 2*2 + 1*3) = 10 A;  q[1, 2] = i + 2
    np.testing.assert_array_equal(B, 10 * A + np.arange(10) + 2)


@tg.kernel
def private_before_barrier(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    p = tg.private(A.dtype, 2)
    tmp = tg.localmem(A.dtype, tg.groupsize())
    p[0] = A[i]
    p[1] = 3.0 * A[i]
    tmp[li] = p[0] + p[1]
    tg.synchronize()
    B[i] = tmp[tg.groupsize()[0] - 1 - li]


def test_private_array_in_a_kernel_with_barriers(backend):
    A = np.arange(8.0)
    B = np.zeros(8)
    private_before_barrier(backend, 4)(B, A, ndrange=8)
    np.testing.assert_array_equal(B, (4 * A).reshape(2, 4)[:, ::-1].ravel())


@tg.kernel
def private_across_barrier(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    p = tg.private(A.dtype, 3)
    tmp = tg.localmem(A.dtype, tg.groupsize())
    p[0] = A[i]
    p[1] = 2.0 * A[i]
    p[2] = li
    tmp[li] = A[i]
    tg.synchronize()
    W = tg.groupsize()[0]
    B[i] = p[0] + p[1] * 10.0 + p[2] * 100.0 + tmp[W - 1 - li] * 1000.0


def test_private_values_live_across_barrier(backend):
    A = np.arange(1.0, 9.0)
    B = np.zeros(8)
    private_across_barrier(backend, 4)(B, A, ndrange=8)
    li = np.arange(8) % 4
    mirrored = A.reshape(2, 4)[:, ::-1].ravel()
    np.testing.assert_array_equal(B, A + 20 * A + 100 * li + 1000 * mirrored)


# -- locals living across barriers --------------------------------------------------------------

@tg.kernel
def promoted_locals(F, N, H, Bo, S, A):
    i = tg.index()
    li = tg.index(tg.Local)
    W = tg.groupsize()[0]
    tmp = tg.localmem(A.dtype, tg.groupsize())
    x = A[i] * 2.0
    n = int(A[i]) * 3 + i
    m = np.int32(n - 1)
    h = np.float32(A[i]) / 4.0
    flag = A[i] > 2.0
    a, b = A[i], -A[i]
    tmp[li] = A[i]
    tg.synchronize()
    x += tmp[W - 1 - li]
    n += 1
    a, b = b, a
    tg.synchronize()
    tmp[li] = x
    tg.synchronize()
    F[i] = x + tmp[(li + 1) % W]
    N[i] = n + m
    H[i] = h
    Bo[i] = flag
    S[i] = a - 10.0 * b


def test_int_float_bool_locals_live_across_barriers(backend):
    A = np.array([0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5])
    n = A.size
    F, S = np.zeros(n), np.zeros(n)
    N = np.zeros(n, np.int64)
    H = np.zeros(n, np.float32)
    Bo = np.zeros(n, bool)
    promoted_locals(backend, 4)(F, N, H, Bo, S, A, ndrange=n)
    i = np.arange(n)
    mirrored = A.reshape(2, 4)[:, ::-1].ravel()
    x = 2 * A + mirrored
    nxt = x.reshape(2, 4)[:, [1, 2, 3, 0]].ravel()
    np.testing.assert_array_equal(F, x + nxt)
    n0 = A.astype(np.int64) * 3 + i
    np.testing.assert_array_equal(N, (n0 + 1) + (n0 - 1))
    np.testing.assert_array_equal(H, A.astype(np.float32) / np.float32(4))
    np.testing.assert_array_equal(Bo, A > 2)
    np.testing.assert_array_equal(S, -A - 10 * A)


@tg.kernel
def loop_variable_across_barrier(X, A):
    i = tg.index()
    li = tg.index(tg.Local)
    W = tg.groupsize()[0]
    tmp = tg.localmem(A.dtype, tg.groupsize())
    for t in range(3):
        tmp[li] = A[i] + t
        tg.synchronize()
        X[i] += tmp[W - 1 - li] * t
        tg.synchronize()


def test_loop_variable_of_barrier_loop_used_in_two_segments(backend):
    A = np.arange(8.0)
    X = np.zeros(8)
    loop_variable_across_barrier(backend, 4)(X, A, ndrange=8)
    mirrored = A.reshape(2, 4)[:, ::-1].ravel()
    np.testing.assert_array_equal(X, sum((mirrored + t) * t for t in range(3)))


@tg.kernel
def index_local_after_uniform_change(X, Y):
    stride = 1
    i = tg.index()
    j = i * stride
    X[i] = j
    tg.synchronize()
    stride = 2
    Y[i] = j + stride


def test_index_derived_local_keeps_its_value_across_barrier(backend):
    X = np.zeros(8, np.int64)
    Y = np.zeros(8, np.int64)
    index_local_after_uniform_change(backend, 4)(X, Y, ndrange=8)
    np.testing.assert_array_equal(X, np.arange(8))
    np.testing.assert_array_equal(Y, np.arange(8) + 2)   # j was computed while stride was 1


@tg.kernel
def index_derived_after_barrier(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    tmp = tg.localmem(A.dtype, tg.groupsize())
    j = A.shape[0] - 1 - i
    tg.synchronize()
    tmp[li] = A[j]
    tg.synchronize()
    B[i] = tmp[li]


def test_index_derived_local_used_in_later_segment(backend):
    A = np.arange(8.0) * 10
    B = np.zeros(8)
    index_derived_after_barrier(backend, 4)(B, A, ndrange=8)
    np.testing.assert_array_equal(B, A[::-1])


@tg.kernel
def index_derived_with_shrinking_stride(B, C):
    s = 4
    i = tg.index()
    li = tg.index(tg.Local)
    tmp = tg.localmem(np.int64, tg.groupsize())
    j = i * s
    while s > 1:
        tmp[li] = j
        tg.synchronize()
        s = s // 2
    B[i] = j
    C[i] = tmp[li]


def test_index_derived_local_keeps_value_when_loop_control_changes(backend):
    B = np.zeros(8, np.int64)
    C = np.zeros(8, np.int64)
    index_derived_with_shrinking_stride(backend, 4)(B, C, ndrange=8)
    np.testing.assert_array_equal(C, 4 * np.arange(8))
    np.testing.assert_array_equal(B, 4 * np.arange(8))   # j was computed while s was 4


@tg.kernel
def loop_carried_in_barrier_loop(X, A):
    i = tg.index()
    li = tg.index(tg.Local)
    W = tg.groupsize()[0]
    tmp = tg.localmem(A.dtype, tg.groupsize())
    for t in range(3):
        tmp[li] = A[i] * t
        tg.synchronize()
        if t == 0:
            s = 0.0
        s += tmp[W - 1 - li]
        X[i] = s
        tg.synchronize()


def test_local_carried_across_iterations_of_a_barrier_loop(backend):
    A = np.arange(8.0)
    X = np.zeros(8)
    loop_carried_in_barrier_loop(backend, 4)(X, A, ndrange=8)
    mirrored = A.reshape(2, 4)[:, ::-1].ravel()
    np.testing.assert_array_equal(X, 3 * mirrored)     # each item's own running sum


# -- a barrier inside an if whose condition is uniform ------------------------------------------

@tg.kernel
def maybe_reverse(B, A, flag):
    i = tg.index()
    li = tg.index(tg.Local)
    W = tg.groupsize()[0]
    tmp = tg.localmem(A.dtype, tg.groupsize())
    if flag and A.shape[0] > 4:
        tmp[li] = A[i]
        tg.synchronize()
        B[i] = tmp[W - 1 - li]
    else:
        B[i] = -A[i]


@pytest.mark.parametrize("flag", [True, False])
def test_barrier_inside_uniform_if(backend, flag):
    A = np.arange(1.0, 13.0)
    B = np.zeros(12)
    maybe_reverse(backend, 4)(B, A, flag, ndrange=12)
    expected = A.reshape(3, 4)[:, ::-1].ravel() if flag else -A
    np.testing.assert_array_equal(B, expected)


@tg.func
def weighted_total(p, n):
    s = 0.0
    for k in range(n):
        s += p[k] * (k + 1)
    return s


@tg.kernel
def private_passed_whole(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    p = tg.private(A.dtype, 3)
    tmp = tg.localmem(A.dtype, tg.groupsize())
    for k in range(3):
        p[k] = A[i] + k
    tmp[li] = A[i]
    tg.synchronize()
    B[i] = weighted_total(p, 3) + 1000.0 * tmp[tg.groupsize()[0] - 1 - li]


def test_private_array_passed_whole_after_a_barrier(backend):
    A = np.arange(1.0, 9.0)
    B = np.zeros(8)
    private_passed_whole(backend, 4)(B, A, ndrange=8)
    mirrored = A.reshape(2, 4)[:, ::-1].ravel()
    # sum_k (A + k)(k + 1) = 6 A + 8
    np.testing.assert_array_equal(B, 6 * A + 8 + 1000 * mirrored)
    if backend.name == "cpu":      # the work-item's slots, a view across the others
        assert "p = p__items[..., _li]" in private_passed_whole.source(backend=backend)


# -- uniform values that reach a barrier loop or branch through a tuple ----------------------------
# docs/language.md: bounds and conditions around a barrier may use shapes, tg.groupsize(),
# group indices and locals computed from them, also when they come unpacked from a tuple.

@tg.kernel
def tiled_matmul_unpacked_shape(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    As = tg.localmem(A.dtype, (TILE, TILE))
    Bs = tg.localmem(B.dtype, (TILE, TILE))
    _, k = A.shape                        # the loop bound comes from the unpacked shape
    acc = 0.0
    for t in range(k // TILE):
        As[li, lj] = A[i, t * TILE + lj]
        Bs[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for s in range(TILE):
            acc += As[li, s] * Bs[s, lj]
        tg.synchronize()
    C[i, j] = acc


def test_tiled_matmul_with_bound_from_unpacked_shape(backend):
    rng = np.random.default_rng(5)
    A, B = rng.standard_normal((8, 12)), rng.standard_normal((12, 4))
    C = np.full((8, 4), SENTINEL)
    tiled_matmul_unpacked_shape(backend, (TILE, TILE))(C, A, B, ndrange=C.shape)
    np.testing.assert_allclose(C, A @ B, rtol=1e-12, atol=1e-12)


def test_adjoint_of_tiled_matmul_with_bound_from_unpacked_shape(backend):
    # the adjoint kernel goes through the same uniformity analysis as the user's
    rng = np.random.default_rng(6)
    A, B, W = rng.random((8, 8)), rng.random((8, 4)), rng.random((8, 4))
    C, dA, dB = np.zeros((8, 4)), np.zeros((8, 8)), np.zeros((8, 4))
    tg.autodiff(tg.Reverse, tiled_matmul_unpacked_shape(backend, (TILE, TILE)), tg.Const,
                tg.Duplicated(C, W.copy()), tg.Duplicated(A, dA), tg.Duplicated(B, dB),
                ndrange=(8, 4))
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)


@tg.kernel
def tiled_row_sums(out, A):
    i = tg.index()
    li = tg.index(tg.Local)
    tile = tg.localmem(A.dtype, (TILE, TILE))
    n, m = A.shape
    steps, row = (m // TILE, i)           # a display: each name judged by its own element
    acc = 0.0
    for t in range(steps):
        for s in range(TILE):
            tile[li, s] = A[row, t * TILE + s]
        tg.synchronize()
        for s in range(TILE):
            acc += tile[li, s]
        tg.synchronize()
    out[row] = acc


@pytest.mark.parametrize("n", [8, 6])
def test_tiled_row_sums_with_bound_from_unpacked_shape(backend, n):
    # n = 6: the last group is partial; its idle work-items still need the loop's bound
    A = np.arange(n * 8.0).reshape(n, 8)
    out = np.full(n + 2, SENTINEL)
    tiled_row_sums(backend, TILE)(out, A, ndrange=n)
    np.testing.assert_array_equal(out[:n], A.sum(1))
    assert (out[n:] == SENTINEL).all()


@tg.kernel
def mirrored_by_group(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    gi, gj = tg.index(tg.Group, tg.NTuple)
    tile = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for r in range(gi + 1):               # bound from a group index
        tile[li, lj] = A[i, j] * (r + 1)
        tg.synchronize()
        acc += tile[TILE - 1 - li, lj]
        tg.synchronize()
    if gj % 2 == 1:                       # condition from a group index
        tile[li, lj] = acc
        tg.synchronize()
        acc = tile[li, TILE - 1 - lj]
    B[i, j] = acc


def test_group_indices_from_a_tuple_in_bound_and_condition(backend):
    A = np.arange(64.0).reshape(8, 8)
    B = np.full((8, 8), SENTINEL)
    mirrored_by_group(backend, (TILE, TILE))(B, A, ndrange=(8, 8))
    ii, jj = np.indices((8, 8))
    gi, gj = ii // TILE, jj // TILE
    rows = gi * TILE + TILE - 1 - ii % TILE               # mirrored within the tile
    expected = A[rows, jj] * (gi + 1) * (gi + 2) / 2      # sum of (r + 1) for r <= gi
    cols = np.where(gj % 2 == 1, gj * TILE + TILE - 1 - jj % TILE, jj)
    np.testing.assert_array_equal(B, expected[ii, cols])


@tg.kernel
def rotate_in_group(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    gs = tg.groupsize()
    ring = tg.localmem(A.dtype, tg.groupsize())
    value = A[i]
    acc = 0.0
    for k in range(gs[0]):                # a constant index into the uniform tuple gs
        ring[li] = value
        tg.synchronize()
        value = ring[(li + 1) % gs[0]]
        acc += value * (k + 1)
        tg.synchronize()
    B[i] = acc


def test_groupsize_tuple_element_as_loop_bound(backend):
    A = np.arange(1.0, 13.0)
    B = np.zeros(12)
    rotate_in_group(backend, 4)(B, A, ndrange=12)
    groups = A.reshape(3, 4)
    expected = [sum((k + 1) * g[(li + k + 1) % 4] for k in range(4)) for g in groups
                for li in range(4)]
    np.testing.assert_array_equal(B, expected)
