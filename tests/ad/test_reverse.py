"""Reverse mode: every adjoint is checked against float64 central finite differences."""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import matmul_fma_k
from tests.ad.gradcheck import kernel_vjp_error

rng = np.random.default_rng(42)


def r(*shape, lo=0.1, hi=0.9):
    return rng.uniform(lo, hi, shape)


# -- every math rule, in one kernel per arity ----------------------------------------------

UNARY = ["sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "atanh",
         "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "erf", "erfc", "fabs"]


@tg.kernel
def all_unary(B, A):
    i = tg.index()
    x = A[i]
    B[i, 0] = math.sin(x)
    B[i, 1] = math.cos(x)
    B[i, 2] = math.tan(x)
    B[i, 3] = math.asin(x)
    B[i, 4] = math.acos(x)
    B[i, 5] = math.atan(x)
    B[i, 6] = math.sinh(x)
    B[i, 7] = math.cosh(x)
    B[i, 8] = math.tanh(x)
    B[i, 9] = math.asinh(x)
    B[i, 10] = math.atanh(x)
    B[i, 11] = math.exp(x)
    B[i, 12] = math.expm1(x)
    B[i, 13] = math.log(x)
    B[i, 14] = math.log1p(x)
    B[i, 15] = math.log2(x)
    B[i, 16] = math.log10(x)
    B[i, 17] = math.sqrt(x)
    B[i, 18] = math.erf(x)
    B[i, 19] = math.erfc(x)
    B[i, 20] = math.fabs(x - 0.5)
    B[i, 21] = math.acosh(x + 1.5)
    B[i, 22] = abs(0.5 - x) + tg.floor(x * 7.0) + tg.ceil(x) + tg.trunc(x)
    B[i, 23] = float(int(x * 10.0)) + x * x * x + x ** 2 + x ** 3.5 + 2.0 ** x
    B[i, 24] = -x / (x + 1.0) + (x % 0.3) + (x // 0.25)


@tg.kernel
def all_binary(C, A, B):
    i = tg.index()
    x = A[i]
    y = B[i]
    C[i, 0] = math.atan2(x, y)
    C[i, 1] = math.hypot(x, y)
    C[i, 2] = math.pow(x, y)
    C[i, 3] = math.fmod(x, y)
    C[i, 4] = max(x, y) + min(x, y, 0.5)
    C[i, 5] = tg.where(x > y, x * y, x - y)
    C[i, 6] = x * y if x < 0.5 else x / y
    C[i, 7] = x ** y
    C[i, 8] = math.copysign(x, y - 0.5)


def test_every_unary_rule_matches_finite_differences():
    A = r(6)
    B = np.zeros((6, 25))
    kernel_vjp_error(all_unary(tg.CPU(), 4), [B, A], 6, wrt=[1], outputs=[0])


def test_every_binary_rule_matches_finite_differences():
    A, B = r(7), r(7)
    C = np.zeros((7, 9))
    kernel_vjp_error(all_binary(tg.CPU(), 4), [C, A, B], 7, wrt=[1, 2], outputs=[0])


# -- the seed's kernel and Enzyme's semantics ---------------------------------------------

@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def test_seed_kernel_gives_cos_and_consumes_the_output_shadow(backend):
    A = r(100)
    B = np.zeros(100)
    dA, dB = tg.make_zero(A), np.ones(100)
    out = tg.autodiff(tg.Reverse, sin_kernel(backend), tg.Const, tg.Duplicated(B, dB),
                      tg.Duplicated(A, dA), ndrange=100)
    assert out == ((None, None),)
    np.testing.assert_allclose(dA, np.cos(A), rtol=1e-14)
    np.testing.assert_allclose(B, np.sin(A))            # the primal ran too
    assert not dB.any()                                  # B was overwritten: its shadow consumed


def test_shadows_accumulate_and_make_zero_resets():
    A = r(10)
    B = np.zeros(10)
    dA = tg.make_zero(A)
    for _ in range(2):
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const,
                    tg.DuplicatedNoNeed(B, np.ones(10)), tg.Duplicated(A, dA), ndrange=10)
    np.testing.assert_allclose(dA, 2 * np.cos(A))
    tg.make_zero_(dA)
    assert not dA.any()


def test_float32_adjoint_stays_float32():
    A = r(16).astype(np.float32)
    B = np.zeros(16, np.float32)
    dA, dB = tg.make_zero(A), np.ones(16, np.float32)
    tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=16)
    assert dA.dtype == np.float32
    np.testing.assert_allclose(dA, np.cos(A), rtol=1e-6)
    src = sin_kernel.source(mode="reverse", backend=tg.CPU())
    assert "np.float64(" not in src


@tg.kernel
def accumulate(B, A):
    i = tg.index()
    B[i] += 3.0 * A[i]


def test_plus_equals_does_not_consume_the_shadow():
    A, B = r(8), r(8)
    dA, dB = np.zeros(8), np.full(8, 2.0)
    tg.autodiff(tg.Reverse, accumulate(tg.CPU()), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=8)
    np.testing.assert_allclose(dB, 2.0)
    np.testing.assert_allclose(dA, 6.0)


@tg.kernel
def square(A):
    i = tg.index()
    A[i] = A[i] * A[i]


def test_in_place_square_uses_the_values_before_the_overwrite():
    # KernelAbstractions' square! test: d/dA sum(A .* A) with A = 1:64 -> 2A
    A = np.arange(1.0, 65.0)
    dA = np.ones(64)
    tg.autodiff(tg.Reverse, square(tg.CPU(), 16), tg.Const, tg.Duplicated(A, dA), ndrange=64)
    np.testing.assert_allclose(A, np.arange(1.0, 65.0) ** 2)
    np.testing.assert_allclose(dA, 2 * np.arange(1.0, 65.0))


@tg.kernel
def mul(A, B, s):
    i = tg.index()
    A[i] = B[i] * s


def test_active_scalar_gets_the_sum_over_work_items():
    # KernelAbstractions' mul! test: A = B * s, B = 1:64, d sum(A) / ds = sum(B) = 2080
    B = np.arange(1.0, 65.0)
    A = np.zeros(64)
    (derivs,) = tg.autodiff(tg.Reverse, mul(tg.CPU(), 8), tg.Const,
                            tg.Duplicated(A, np.ones(64)), tg.Const(B), tg.Active(3.0),
                            ndrange=64)
    assert derivs == (None, None, 2080.0)


def test_active_scalar_with_ndrange_not_a_multiple_of_the_workgroup():
    B = np.arange(1.0, 70.0)
    A = np.zeros(69)
    (derivs,) = tg.autodiff(tg.Reverse, mul(tg.CPU(), 16), tg.Const,
                            tg.Duplicated(A, np.ones(69)), B, tg.Active(np.float32(2.0)),
                            ndrange=69)
    assert derivs[2] == pytest.approx(B.sum())
    assert isinstance(derivs[2], np.float32)


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


def test_saxpy_all_inputs():
    kernel_vjp_error(saxpy(tg.CPU(), 4), [r(10), 1.7, r(10)], 10, wrt=[0, 2], outputs=[0],
                     active=[1])


# -- memory access patterns ------------------------------------------------------------------

@tg.kernel
def stencil(B, A):
    i = tg.index()
    if i > 0 and i < A.size - 1:
        B[i] = A[i - 1] * A[i] + math.exp(A[i + 1])
    else:
        B[i] = A[i]


def test_stencil_neighbour_reads_are_gathered_and_right():
    """Neighbour reads make the adjoint scatter; tapegrad/ad/gather.py turns that into one
    gather kernel per shadow (no atomics), checked here against finite differences."""
    kernel_vjp_error(stencil(tg.CPU(), 4), [np.zeros(9), r(9)], 9, wrt=[1], outputs=[0])
    source = stencil.source(mode="reverse").replace("tg.", "")
    assert "def stencil_adjoint_gather_A_bar(" in source and "atomic_add(A_bar" not in source


def test_own_index_reads_need_no_atomics():
    A, B = r(8), np.zeros(8)
    tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.Duplicated(B, np.ones(8)),
                tg.Duplicated(A, np.zeros(8)), ndrange=8)
    assert "atomic" not in sin_kernel.source(mode="reverse")
    assert "atomic" not in sin_kernel.source(mode="reverse", backend=tg.CPU()).split(
        "def sin_kernel_adjoint")[1]


@tg.kernel
def gather(B, A, idx):
    i = tg.index()
    B[i] = A[idx[i]] * A[idx[i]]


def test_gather_with_repeated_indices_under_contention():
    n = 4096
    idx = rng.integers(0, 3, n).astype(np.int64)
    A = r(3)
    B = np.zeros(n)
    dA = np.zeros(3)
    tg.autodiff(tg.Reverse, gather(tg.CPU(), 64), tg.Const, tg.Duplicated(B, np.ones(n)),
                tg.Duplicated(A, dA), idx, ndrange=n)
    expected = np.bincount(idx, minlength=3) * 2 * A
    np.testing.assert_allclose(dA, expected, rtol=1e-12)


@tg.kernel
def scatter_2d(C, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    C[j, i] = A[i, j] * A[i, j] + tg.sin(A[i, j])


def test_two_dimensional_own_index_and_transposed_store():
    kernel_vjp_error(scatter_2d(tg.CPU(), (2, 4)), [np.zeros((5, 3)), r(3, 5)], (3, 5),
                     wrt=[1], outputs=[0])
    assert "atomic" not in scatter_2d.source(mode="reverse")


# -- control flow ----------------------------------------------------------------------------

@tg.kernel
def loops(B, A, n):
    i = tg.index()
    s = 0.0
    x = A[i]
    for k in range(n):
        if k % 2 == 0:
            s = s + math.sin(x * s + k)
        else:
            s = s * x
    j = 0
    while j < 3:
        s = s * 0.5 + x
        j += 1
        if s > 10.0:
            break
    B[i] = s


def test_loops_branches_and_break():
    kernel_vjp_error(loops(tg.CPU(), 4), [np.zeros(6), r(6), 5], 6, wrt=[1], outputs=[0])


@tg.kernel
def fibonacci(B, A, n):
    i = tg.index()
    a = A[i]
    b = A[i] * 0.5
    for _ in range(n):
        a, b = b, a + b
    B[i] = b


def test_fibonacci_swaps():
    # Taichi's loop test: b_n = F(n) a + F(n+1) b  ->  d b_n / dA = F(n) + F(n+1) / 2
    A = r(5)
    dA = np.zeros(5)
    tg.autodiff(tg.Reverse, fibonacci(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(5), np.ones(5)),
                tg.Duplicated(A, dA), 10, ndrange=5)
    np.testing.assert_allclose(dA, 55 + 89 / 2)
    kernel_vjp_error(fibonacci(tg.CPU()), [np.zeros(5), r(5), 7], 5, wrt=[1], outputs=[0])


@tg.kernel
def nested_dynamic(B, A, M):
    i = tg.index()
    s = 0.0
    for k in range(M[i]):
        t = A[i]
        for m in range(k, 2 * k + 1):
            t = t * 0.9 + math.cos(t * m)
        s += t
    B[i] = s


def test_nested_loops_with_per_work_item_trip_counts():
    M = np.array([0, 1, 2, 3, 4, 2], dtype=np.int64)
    kernel_vjp_error(nested_dynamic(tg.CPU(), 4), [np.zeros(6), r(6), M], 6, wrt=[1],
                     outputs=[0])


@tg.kernel
def newton_sqrt(B, A):
    i = tg.index()
    x = A[i]
    y = 1.0
    while abs(y * y - x) > 1e-12:
        y = 0.5 * (y + x / y)
    B[i] = y


def test_data_dependent_while_loop():
    A = r(6, lo=0.5, hi=4.0)
    dA = np.zeros(6)
    tg.autodiff(tg.Reverse, newton_sqrt(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(6), np.ones(6)),
                tg.Duplicated(A, dA), ndrange=6)
    np.testing.assert_allclose(dA, 0.5 / np.sqrt(A), rtol=1e-8)


@tg.kernel
def early_exit(B, A):
    i = tg.index()
    if A[i] < 0.3:
        B[i] = 0.0
        return
    s = A[i]
    for k in range(5):
        if s > 2.0:
            continue
        s = s * (1.0 + A[i])
        if k == 3:
            return
    B[i] = s


def test_early_return_and_continue():
    A = np.array([0.1, 0.2, 0.5, 0.7, 0.9, 0.35, 0.6])
    kernel_vjp_error(early_exit(tg.CPU(), 4), [np.full(7, -1.0), A], 7, wrt=[1], outputs=[0])


# -- device functions ------------------------------------------------------------------------

@tg.func
def smooth_clamp(x, lo):
    if x < lo:
        return lo + 0.1 * (x - lo)
    return x


@tg.func
def polar(x, y):
    return math.hypot(x, y), math.atan2(y, x)


@tg.kernel
def uses_funcs(C, A, B):
    i = tg.index()
    rad, ang = polar(A[i], B[i])
    C[i] = smooth_clamp(rad * ang, 0.2) + smooth_clamp(A[i], 0.5)


def test_device_functions_are_differentiated():
    kernel_vjp_error(uses_funcs(tg.CPU(), 4), [np.zeros(8), r(8), r(8)], 8, wrt=[1, 2],
                     outputs=[0])


@tg.func
def softplus(x):
    return math.log1p(math.exp(x))


@softplus.reverse
def softplus_reverse(x, r_bar):
    return r_bar / (1.0 + math.exp(-x))


@tg.func
def square_with_wrong_rule(x):
    return x * x


@square_with_wrong_rule.reverse
def wrong_reverse(x, r_bar):
    return r_bar * x            # deliberately wrong: the right rule is 2 x r_bar


@tg.kernel
def uses_softplus(B, A):
    i = tg.index()
    B[i] = 2.0 * softplus(A[i])


@tg.kernel
def uses_wrong_rule(B, A):
    i = tg.index()
    B[i] = square_with_wrong_rule(A[i])


def test_hand_written_rule_replaces_the_generated_one():
    kernel_vjp_error(uses_softplus(tg.CPU(), 4), [np.zeros(6), r(6, lo=-2, hi=2)], 6, wrt=[1],
                     outputs=[0])
    assert "softplus_reverse(" in uses_softplus.source(mode="reverse")
    with pytest.raises(AssertionError, match="finite differences"):
        kernel_vjp_error(uses_wrong_rule(tg.CPU(), 4), [np.zeros(6), r(6)], 6, wrt=[1],
                         outputs=[0])


# -- local memory and barriers ---------------------------------------------------------------

TILE = 4


@tg.kernel
def matmul(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[li, k] * tile_b[k, lj]
        tg.synchronize()
    C[i, j] = acc


def test_tiled_matmul_in_local_memory(backend):
    A, B = r(8, 12), r(12, 4)
    kernel_vjp_error(matmul(backend, (TILE, TILE)), [np.zeros((8, 4)), A, B], (8, 4),
                     wrt=[1, 2], outputs=[0])
    # the closed form: with C_bar = W, A_bar = W B^T and B_bar = A^T W
    W = r(8, 4)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul(backend, (TILE, TILE)), tg.Const,
                tg.Duplicated(np.zeros((8, 4)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(8, 4))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)


@tg.kernel
def repeated_tiled_product(C, A, B):
    """A tiled product inside an outer loop: the adjoint's inner reverse loop runs at group
    level with a trip count restored per work-item (its counter once came from an
    uninitialised per-item slot on the CPU: a wrong gradient, then a crash)."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    total = 0.0
    for rep in range(2):
        acc = 0.0
        for t in range(A.shape[1] // TILE):
            tile_a[li, lj] = A[i, t * TILE + lj]
            tile_b[li, lj] = B[t * TILE + li, j]
            tg.synchronize()
            for k in range(TILE):
                acc += tile_a[li, k] * tile_b[k, lj]
            tg.synchronize()
        total += acc * acc * (rep + 1)
    C[i, j] = total


def test_tiled_product_inside_an_outer_loop(backend):
    kernel_vjp_error(repeated_tiled_product(backend, (TILE, TILE)),
                     [np.zeros((8, 8)), r(8, 8), r(8, 8)], (8, 8), wrt=[1, 2], outputs=[0])


@tg.kernel
def block_sum_of_squares(out, x):
    li = tg.index(tg.Local)
    gi = tg.index()
    part = tg.localmem(x.dtype, tg.groupsize())
    part[li] = x[gi] * x[gi]
    tg.synchronize()
    stride = tg.groupsize()[0] // 2
    while stride > 0:
        if li < stride:
            part[li] += part[li + stride]
        tg.synchronize()
        stride //= 2
    if li == 0:
        out[tg.index(tg.Group)] = part[0]


def test_tree_reduction_in_local_memory(backend):
    x = r(32)
    kernel_vjp_error(block_sum_of_squares(backend, 8), [np.zeros(4), x], 32, wrt=[1],
                     outputs=[0])


# -- peers' cases ----------------------------------------------------------------------------

@tg.kernel
def dense_tanh(Y, W, X, b):
    i = tg.index()
    s = b[i]
    for k in range(X.size):
        s += W[i, k] * X[k]
    Y[i] = math.tanh(s)


def test_dense_layer():
    # Enzyme.jl's CUDA dense-layer test, in tapegrad
    kernel_vjp_error(dense_tanh(tg.CPU(), 4), [np.zeros(5), r(5, 3), r(3), r(5)], 5,
                     wrt=[1, 2, 3], outputs=[0])


@tg.kernel
def exp_cos(B, A):
    i = tg.index()
    B[i] = math.exp(A[i]) * math.cos(A[i])


def test_enzyme_exp_cos():
    A = r(9)
    dA = np.zeros(9)
    tg.autodiff(tg.Reverse, exp_cos(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(9), np.ones(9)),
                tg.Duplicated(A, dA), ndrange=9)
    np.testing.assert_allclose(dA, np.exp(A) * (np.cos(A) - np.sin(A)), rtol=1e-13)


@tg.kernel
def overwrite_in_loop(A, n):
    i = tg.index()
    for _ in range(n):
        A[i] = math.sin(A[i]) * 1.5


def test_warp_style_overwrite_in_a_loop():
    # NVIDIA Warp returns wrong gradients for this pattern; we must not
    A0 = r(5)
    dA = np.ones(5)
    A = A0.copy()
    tg.autodiff(tg.Reverse, overwrite_in_loop(tg.CPU()), tg.Const, tg.Duplicated(A, dA), 3,
                ndrange=5)
    x, d = A0.copy(), np.ones(5)
    for _ in range(3):
        d = d * 1.5 * np.cos(x)
        x = np.sin(x) * 1.5
    np.testing.assert_allclose(dA, d, rtol=1e-13)


@tg.kernel
def long_loop(B, A, n):
    i = tg.index()
    s = A[i]
    for k in range(n):
        s = math.sin(s) + 0.01 * k
    B[i] = s


@tg.kernel
def slow_drift(B, A, n):
    i = tg.index()
    s = A[i]
    for k in range(n):
        s = s + 0.0005 * math.cos(s + k)  # a derivative of order one after thousands of steps
    B[i] = s


@tg.kernel
def guarded_drift(B, A, n):
    i = tg.index()
    B[i] = 0.0
    if A[i] > -5.0:                       # A_bar updated under a test: zeroed, then added to
        s = A[i]
        for k in range(n):
            s = s + 0.0005 * math.cos(s + k)
        B[i] = s


def test_stack_grows_for_long_loops():
    A = r(4)
    kernel_vjp_error(long_loop(tg.CPU()), [np.zeros(4), A, 1000], 4, wrt=[1], outputs=[0])
    for kernel in (slow_drift, guarded_drift):      # the functional form zeroes or stores anew
        kernel_vjp_error(kernel(tg.CPU()), [np.zeros(4), A, 1000], 4, wrt=[1], outputs=[0],
                         functional=True)


def test_a_grown_stack_leaves_accumulated_shadows_right():
    """The launch whose stack overflowed is undone before the deeper one runs: the shadow
    ends as what it held plus the gradient (not plus twice a partial one), the output's
    shadow consumed."""
    A, W, start = r(4), r(4), r(4)
    dA, dB = start.copy(), W.copy()
    tg.autodiff(tg.Reverse, slow_drift(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(4), dB),
                tg.Duplicated(A, dA), 3000, ndrange=4)
    eps, fd = 1e-6, np.zeros(4)
    for k in range(4):
        values = []
        for h in (eps, -eps):
            X, B = A.copy(), np.zeros(4)
            X[k] += h
            slow_drift(tg.CPU())(B, X, 3000, ndrange=4)
            values.append(float(W @ B))
        fd[k] = (values[0] - values[1]) / (2 * eps)
    assert np.abs(fd).min() > 0.1                   # a gradient a wrong sum would change
    np.testing.assert_allclose(dA, start + fd, atol=1e-6)
    np.testing.assert_array_equal(dB, 0.0)


@tg.kernel
def reassigns_its_argument(Y, X, a):
    i = tg.index()
    a = a * X[i]
    Y[i] = a * a


def test_assigned_active_argument_is_per_work_item():
    kernel_vjp_error(reassigns_its_argument(tg.CPU(), 4), [np.zeros(9), r(9), 0.7], 9, wrt=[1],
                     outputs=[0], active=[2])


@pytest.mark.parametrize("kernel, tile", [(matmul, TILE), (matmul_fma_k, 16)],
                         ids=["plus", "fma"])
def test_tiled_matmul_adjoint_gathers_its_tile_shadows(backend, kernel, tile):
    """tapegrad/ad/localgather.py: the k loop's updates of the tile shadows become one dot
    product per work-item for its own element (no atomics); the values are the closed form.
    With ``acc = tg.fma(a, b, acc)`` the adjoint carries ``acc_bar`` past the updates."""
    n = 2 * tile
    A, B, W = r(n, n), r(n, n), r(n, n)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, kernel(backend, (tile, tile)), tg.Const,
                tg.Duplicated(np.zeros((n, n)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(n, n))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)
    source = kernel.source(mode="reverse")
    assert "_share_acc_bar[li, lj] = acc_bar" in source
    assert "atomic_add(tile_a_bar" not in source and "atomic_add(tile_b_bar" not in source
    assert "tile_b__t[_f, lj]" in source       # a row read across work-items, transposed


def test_a_gathered_sum_fuses_its_products_the_same_on_every_backend(backend):
    """The gathers add ``tg.fma(_share_acc_bar[li, _f], tile_b__t[_f, lj], _sum)`` where the
    device has an FMA instruction: one rounding per term, so the adjoint of a one-tile float32
    product is, bit for bit, the host's fused chain ``s = fma(W[i, f], B[j, f], s)`` over f
    (else the chain of products and sums)."""
    rng = np.random.default_rng(11)
    A, B, W = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul_fma_k(backend, (16, 16)), tg.Const,
                tg.Duplicated(np.zeros_like(A), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(16, 16))
    fused_a, unfused_a, fused_b, unfused_b = (np.zeros_like(A) for _ in range(4))
    for f in range(16):
        fused_a = tg.fma(W[:, f:f + 1], B[:, f][None, :], fused_a)      # (W B^T)[i, j]
        unfused_a = unfused_a + W[:, f:f + 1] * B[:, f][None, :]
        fused_b = tg.fma(W[f][None, :], A[f][:, None], fused_b)         # (A^T W)[i, j]
        unfused_b = unfused_b + W[f][None, :] * A[f][:, None]
    assert (fused_a != unfused_a).any()
    expected = (fused_a, fused_b) if backend.fast_fma else (unfused_a, unfused_b)
    np.testing.assert_array_equal(dA, expected[0])
    np.testing.assert_array_equal(dB, expected[1])


class _NoFMA(tg.CPU):
    """A CPU whose instruction set has no fused multiply-add (as Numba would see one)."""
    fast_fma = False


def test_without_an_fma_instruction_the_gathered_sums_multiply_and_add():
    """(tg.fma there is a call into libm per element: a float32 512² tiled matmul's gradient
    took 175 ms instead of 17 with NUMBA_CPU_FEATURES="")"""
    A, B, W = r(8, 8), r(8, 8), r(8, 8)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    backend = _NoFMA()
    tg.autodiff(tg.Reverse, matmul(backend, (TILE, TILE)), tg.Const,
                tg.Duplicated(np.zeros((8, 8)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(8, 8))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)
    source = matmul.source("reverse", backend)
    assert "_sum = _sum + _share_acc_bar" in source and "fma(" not in source


def test_a_carry_is_recognised_only_where_nothing_between_touches_its_scalar():
    """localgather's carry ``_a = s; s = 0.0; ...; s = s + _a`` keeps ``s`` unchanged only if
    nothing between its parts reads or writes ``s`` or rebinds ``_a``."""
    from tapegrad.ad.localgather import _without_carries

    def body(*between):
        return ast.parse("\n".join(["_a = s", "s = 0.0", *between, "s = s + _a"])).body

    rest, aliases = _without_carries(body("u = _a * t"))
    assert aliases == {"_a": "s"} and [ast.unparse(x) for x in rest] == ["u = _a * t"]
    for between in ("u = s * t", "s = t", "_a = t"):
        rest, aliases = _without_carries(body(between))
        assert aliases == {} and len(rest) == 4, between


@tg.kernel
def matmul_transposed_tile(C, A, B):
    """tile_a holds A's tile transposed: its shadow is read at (lj, li), not at the work-item's
    own element, so the updates keep their atomics."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[lj, li] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[k, li] * tile_b[k, lj]
        tg.synchronize()
    C[i, j] = acc


def test_a_tile_shadow_read_elsewhere_keeps_its_atomics(backend):
    A, B, W = r(8, 8), r(8, 4), r(8, 4)
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul_transposed_tile(backend, (TILE, TILE)), tg.Const,
                tg.Duplicated(np.zeros((8, 4)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(8, 4))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)
    assert "atomic_add(tile_a_bar" in matmul_transposed_tile.source(mode="reverse")


def test_tile_shadows_keep_their_atomics_when_the_ndrange_cuts_a_group():
    A, B = r(8, 8), r(8, 6)
    with np.errstate(all="ignore"):       # the cut group's tiles hold no data: values unused
        tg.autodiff(tg.Reverse, matmul(tg.CPU(), (TILE, TILE)), tg.Const,
                    tg.Duplicated(np.zeros((8, 6)), r(8, 6)), tg.Duplicated(A, np.zeros_like(A)),
                    tg.Duplicated(B, np.zeros_like(B)), ndrange=(8, 6))
    assert "atomic_add(tile_a_bar" in matmul.source(mode="reverse")


@tg.kernel
def scaled_exp_3d(Y, X, a):
    i, j, k = tg.index(tg.Global, tg.NTuple)
    Y[i, j, k] = a * tg.exp(X[i, j, k])


@pytest.mark.parametrize("shape", [(8, 8, 8), (5, 9, 300)])
def test_3d_adjoint_temporaries_do_not_clobber_the_group_index(backend, size, shape):
    """The adjoint's temporaries once shared the lowering's names for the group index
    (`_g2`): a 3-D gradient came out wrong, or wrote out of bounds."""
    shape = size(shape, shape[:2] + (min(shape[2], 36),))   # (still 9 groups along k)
    x, w, a = rng.random(shape), rng.random(shape), 1.3
    X, dX = tg.asarray(backend, x), tg.asarray(backend, np.zeros(shape))
    Y, seed = tg.asarray(backend, np.zeros(shape)), tg.asarray(backend, w)
    ((_, _, a_bar),) = tg.autodiff(tg.Reverse, scaled_exp_3d(backend, (4, 4, 4)), tg.Const,
                                   tg.Duplicated(Y, seed), tg.Duplicated(X, dX), tg.Active(a),
                                   ndrange=shape)
    np.testing.assert_allclose(a_bar, (np.exp(x) * w).sum(), rtol=1e-12)
    np.testing.assert_allclose(tg.to_numpy(dX), a * np.exp(x) * w, rtol=1e-12)


@tg.kernel
def local_named_like_a_shadow(B, A):
    i = tg.index()
    A_bar = A[i] * 2.0                    # the adjoint's name for A's shadow
    acc_bar = A_bar * A[i]                # and for the adjoint of a local acc
    acc = acc_bar
    B[i] = acc


def test_locals_named_like_adjoints_keep_their_own_meaning():
    x, w = rng.random(16), rng.random(16)
    dx = np.zeros(16)
    tg.autodiff(tg.Reverse, local_named_like_a_shadow(tg.CPU(), 4), tg.Const,
                tg.Duplicated(np.zeros(16), w.copy()), tg.Duplicated(x, dx), ndrange=16)
    np.testing.assert_allclose(dx, 4 * x * w, rtol=1e-14)     # d(2 x^2)/dx


@tg.kernel
def product_with_a_bar(B, A, A_bar):
    i = tg.index()
    B[i] = A[i] * A_bar[i]


def test_a_parameter_named_like_a_shadow_is_differentiated_too():
    """(its adjoint's shadow of A would have taken the name A_bar twice: a SyntaxError in
    the generated code)"""
    x, y, w = rng.random(16), rng.random(16), rng.random(16)
    dx, dy = np.zeros(16), np.zeros(16)
    tg.autodiff(tg.Reverse, product_with_a_bar(tg.CPU(), 4), tg.Const,
                tg.Duplicated(np.zeros(16), w.copy()), tg.Duplicated(x, dx),
                tg.Duplicated(y, dy), ndrange=16)
    np.testing.assert_allclose(dx, y * w, rtol=1e-14)
    np.testing.assert_allclose(dy, x * w, rtol=1e-14)


@tg.kernel
def tile_times_argument(C, A, M):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    ta = tg.localmem(A.dtype, (TILE, TILE))
    ta[li, lj] = A[i, j]
    tg.synchronize()
    acc = 0.0
    for k in range(TILE):
        acc += ta[li, k] * M[k, j]       # the other operand an argument, not local memory
    C[i, j] = acc


def test_a_tile_loop_with_an_argument_array_operand_differentiates():
    """(its tile shadow's update cannot be gathered with the argument shared as a scalar:
    it failed to compile; now the atomic form)"""
    rng_ = np.random.default_rng(21)
    a, m, w = rng_.random((8, 8)), rng_.random((4, 8)), rng_.random((8, 8))

    def loss(a):
        c = np.zeros((8, 8))
        tile_times_argument(tg.CPU(), (TILE, TILE))(c, a, m, ndrange=(8, 8))
        return tg.dot(c, w)

    (g,) = tg.gradient(loss, a)
    expected = np.zeros((8, 8))     # C block = A block @ M block, per 4 x 4 group
    for bi in range(2):
        for bj in range(2):
            rows, cols = slice(4 * bi, 4 * bi + 4), slice(4 * bj, 4 * bj + 4)
            expected[rows, cols] = w[rows, cols] @ m[:, cols].T
    np.testing.assert_allclose(g, expected, rtol=1e-12)
