"""Stencil adjoints in gather form (tapegrad/ad/gather.py): no atomics, same derivatives."""

import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import stencil1d_k as laplace1d  # the benchmark's kernels
from tapegrad.bench.problems import stencil2d_k as heat2d
from tests.ad.gradcheck import kernel_vjp_error


@tg.kernel
def shifted_window(Y, X, w):
    """ndrange smaller than X: work-item i reads X[i .. i + 2] (non-linear in X)."""
    i = tg.index()
    a = X[i]
    b = X[i + 2]
    Y[i] = w * math.sin(a) * b + X[i + 1] * X[i + 1]


@tg.kernel
def seven_point(Y, X):
    i, j, k = tg.index(tg.Global, tg.NTuple)
    n, m, p = X.shape
    if 0 < i < n - 1 and 0 < j < m - 1 and 0 < k < p - 1:
        Y[i, j, k] = (X[i - 1, j, k] + X[i + 1, j, k] + X[i, j - 1, k] + X[i, j + 1, k]
                      + X[i, j, k - 1] + X[i, j, k + 1]) * X[i, j, k]


@tg.kernel
def gather_by_index(Y, X, idx):
    i = tg.index()
    Y[i] = X[idx[i]] * X[i]


@pytest.mark.parametrize("n", [1, 2, 3, 37])
def test_laplace1d_matches_finite_differences(backend, n):
    rng = np.random.default_rng(n)
    args = [np.zeros(n), rng.standard_normal(n)]
    kernel_vjp_error(laplace1d(backend, 8), args, n, wrt=(1,), outputs=(0,))
    source = laplace1d.source(mode="reverse")
    assert "_gather_X_bar" in source and "atomic_add" not in source


def test_heat2d_with_active_alpha(backend, size):
    s = size(13, 7)
    rng = np.random.default_rng(1)
    args = [np.zeros((s, s + 2)), rng.standard_normal((s, s + 2)), 0.15]
    kernel_vjp_error(heat2d(backend, (4, 4)), args, (s, s + 2), wrt=(1,), outputs=(0,),
                     active=(2,))
    assert "atomic_add(T_bar" not in heat2d.source(mode="reverse")


def test_ndrange_smaller_than_the_array(backend, size):
    n = size(30, 9)
    rng = np.random.default_rng(2)
    args = [np.zeros(n - 2), rng.standard_normal(n), 0.7]
    kernel_vjp_error(shifted_window(backend, 4), args, n - 2, wrt=(1,), outputs=(0,),
                     active=(2,))
    assert "_gather_X_bar" in shifted_window.source(mode="reverse")


def test_three_dimensions():
    rng = np.random.default_rng(3)
    args = [np.zeros((5, 6, 7)), rng.standard_normal((5, 6, 7))]
    kernel_vjp_error(seven_point(tg.CPU(), (2, 2, 4)), args, (5, 6, 7), wrt=(1,), outputs=(0,))
    assert "_gather_X_bar" in seven_point.source(mode="reverse")


def test_data_dependent_index_keeps_atomics():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(16)
    idx = rng.integers(0, 16, 16).astype(np.int64)
    kernel_vjp_error(gather_by_index(tg.CPU(), 4), [np.zeros(16), x, idx], 16, wrt=(1,),
                     outputs=(0,))
    source = gather_by_index.source(mode="reverse")
    assert "_gather_" not in source and "atomic_add(X_bar" in source


def test_shadows_accumulate_and_outputs_are_consumed():
    rng = np.random.default_rng(5)
    n = 50
    x, w, dx0 = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    y, dy, dx = np.zeros(n), w.copy(), dx0.copy()
    tg.autodiff(tg.Reverse, laplace1d(tg.CPU(), 16), tg.Const, tg.Duplicated(y, dy),
                tg.Duplicated(x, dx), ndrange=n)
    scatter = dx0.copy()    # the adjoint written by hand in scatter form
    for i in range(1, n - 1):
        scatter[i - 1] += w[i]
        scatter[i] -= 2 * w[i]
        scatter[i + 1] += w[i]
    np.testing.assert_allclose(dx, scatter, rtol=1e-13, atol=1e-13)
    assert not dy.any()


def test_no_need_skips_the_primal_launch():
    """With every written array DuplicatedNoNeed, only the adjoint runs: Y keeps its contents."""
    rng = np.random.default_rng(6)
    n = 40
    x, w = rng.standard_normal(n), rng.standard_normal(n)
    y = np.full(n, 7.0)
    dx_need, dx_noneed = np.zeros(n), np.zeros(n)
    cfg = laplace1d(tg.CPU(), 16)
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(y, w.copy()),
                tg.Duplicated(x, dx_noneed), ndrange=n)
    assert (y == 7.0).all()
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(y, w.copy()),
                tg.Duplicated(x, dx_need), ndrange=n)
    assert not (y == 7.0).all()
    np.testing.assert_array_equal(dx_need, dx_noneed)


@tg.kernel
def scale_in_place(Y, X):
    i = tg.index()
    Y[i] = Y[i] * X[i] + math.sin(X[i])


def test_no_need_in_place_kernel_keeps_contents_and_derivatives():
    rng = np.random.default_rng(7)
    n = 20
    x, y0, w = rng.standard_normal(n), rng.standard_normal(n), rng.standard_normal(n)
    cfg = scale_in_place(tg.CPU(), 8)
    grads = []
    for annotation in (tg.Duplicated, tg.DuplicatedNoNeed):
        y, dy, dx = y0.copy(), w.copy(), np.zeros(n)
        tg.autodiff(tg.Reverse, cfg, tg.Const, annotation(y, dy), tg.Duplicated(x, dx), ndrange=n)
        grads.append((dx, dy))
        if annotation is tg.DuplicatedNoNeed:
            np.testing.assert_array_equal(y, y0)          # the primal launch was skipped
    (dx1, dy1), (dx2, dy2) = grads
    np.testing.assert_allclose(dx1, w * y0 + w * np.cos(x), rtol=1e-12)   # closed form
    np.testing.assert_array_equal(dx1, dx2)
    np.testing.assert_allclose(dy1, w * x, rtol=1e-12)
    np.testing.assert_array_equal(dy1, dy2)


@tg.kernel
def one_sided(Y, X):
    """Asymmetric offsets (0 and +2) and tight boundary tests: a group whose work-items all
    have their neighbours may still hold one whose neighbour fails the test."""
    i = tg.index()
    if i >= 1 and i + 2 < X.size:
        Y[i] = X[i + 2] * X[i + 2] - 3.0 * X[i]
    else:
        Y[i] = X[i]


@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_boundary_tests_folded_per_group_at_the_right_indices(group):
    n = 29
    X = np.random.default_rng(group).uniform(-1, 1, n)
    err, *_ = kernel_vjp_error(one_sided(tg.CPU(), group), [np.zeros(n), X], n, wrt=[1],
                               outputs=[0])
    assert err < 1e-7
    source = one_sided.source(mode="reverse")
    assert "_gather_X_bar" in source and "_branch" not in source.split("else:")[0]
