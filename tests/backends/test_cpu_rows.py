"""The CPU runs large launches of kernels that cannot tell their workgroups apart in rows of
its own choosing (tapegrad/backends/cpu/rows.py): the results must not change, and kernels
that can tell (or whose accesses prefer square tiles) keep the launch's groupsize, as do
small launches."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.testing import check_grad

CPU = tg.CPU()
rng = np.random.default_rng(11)


def _stencil(Y, X, a):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        Y[i, j] = X[i, j] + a * (X[i - 1, j] + X[i + 1, j] + X[i, j - 1] + X[i, j + 1]
                                 - 4.0 * X[i, j])
    else:
        Y[i, j] = X[i, j]


stencil = tg.kernel(_stencil)
small_stencil = tg.kernel(_stencil)     # launched small only: kern.source() shows what ran


@tg.kernel
def transpose(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[j, i] = A[i, j]


@tg.kernel
def row_offsets(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    Y[i, j] = X[i, j] + li * 100 + lj


@tg.kernel
def linear_index(B, A):
    k = tg.index()                      # the row-major position: it mixes the dimensions
    i, j = tg.index(tg.Global, tg.NTuple)
    n = B.shape[0]
    B[k % n, k // n] = A[i, j]          # column-major order: another transpose


@tg.kernel
def transpose_by_part(B, A):
    j = tg.index(tg.Global, tg.NTuple)[1]      # the last index, taken out of the tuple
    i = tg.index(tg.Global, tg.NTuple)[0]
    B[j, i] = A[i, j]


@tg.kernel
def transpose_atomically(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    tg.atomic_add(B, (j, i), A[i, j])


@tg.func
def cube(v):
    return v * v * v


@tg.kernel
def cube_gathered(Y, X, idx):
    i, j = tg.index(tg.Global, tg.NTuple)
    Y[i, j] = cube(X[idx[i, j], 0])          # loaded values index, not the work-item's j


@tg.kernel
def scale1d(Y, X, a):
    i = tg.index()
    Y[i] = a * X[i] * X[i]


def _stencil_reference(x, a):
    y = x.copy()
    y[1:-1, 1:-1] = x[1:-1, 1:-1] + a * (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2]
                                         + x[1:-1, 2:] - 4 * x[1:-1, 1:-1])
    return y


def _groupsize_run(kern, mode: str = "primal") -> str:
    header = kern.source(mode=mode, backend=CPU).splitlines()[:3]
    return next(line for line in header if "groupsize" in line and "for the CPU" in line)


LARGE = 16384       # work-items from which a launch runs in the CPU's rows


@pytest.mark.parametrize("shape", [(37, 450), (70, 256), (1, 20000), (65, 257)])
@pytest.mark.parametrize("groupsize", [(16, 16), (8, 64), (3, 5)])
def test_a_kernel_in_short_rows_runs_in_longer_ones_with_the_same_results(shape, groupsize):
    x = rng.random(shape)
    y = np.full(shape, np.nan)
    stencil(CPU, groupsize)(y, x, 0.1, ndrange=shape)
    np.testing.assert_allclose(y, _stencil_reference(x, 0.1), rtol=1e-14)
    assert "groupsize (1, 1024)" in _groupsize_run(stencil)
    assert f"Launched with groupsize {groupsize}" in stencil.source(backend=CPU)


@pytest.mark.parametrize("shape", [(37, 300), (8200, 2), (100, 255)])
def test_small_or_narrow_launches_keep_the_launch_groupsize(shape):
    """(few work-items: the grouping costs little; short rows: a row of 1024 would be mostly
    empty, and an Active scalar's per-group sum would run over all of it)"""
    x = rng.random(shape)
    y = np.full(x.shape, np.nan)
    small_stencil(CPU, (16, 16))(y, x, 0.1, ndrange=x.shape)
    np.testing.assert_allclose(y, _stencil_reference(x, 0.1), rtol=1e-14)
    assert "groupsize (16, 16)" in _groupsize_run(small_stencil)


def test_its_gradient_too():
    x, w, a = rng.random((64, 260)), rng.random((64, 260)), 0.2

    def f(x):
        y = np.empty_like(x)
        stencil(CPU, (16, 16))(y, x, a, ndrange=x.shape)
        return tg.dot(y, y)

    assert check_grad(f, x)               # the tape's sweep: the gather stores the gradient
    dx = np.ones_like(x)                  # Enzyme's form: the gather adds into dx
    tg.autodiff(tg.Reverse, stencil(CPU, (16, 16)), tg.Const,
                tg.Duplicated(np.empty_like(x), w.copy()), tg.Duplicated(x, dx), a,
                ndrange=x.shape)
    inner = np.zeros_like(w)              # the transposed stencil, by hand
    inner[1:-1, 1:-1] = w[1:-1, 1:-1]
    expected = 1 + w - 4 * a * inner
    expected[:-1] += a * inner[1:]
    expected[1:] += a * inner[:-1]
    expected[:, :-1] += a * inner[:, 1:]
    expected[:, 1:] += a * inner[:, :-1]
    np.testing.assert_allclose(dx, expected, rtol=1e-13)
    assert "groupsize (1, 1024)" in _groupsize_run(stencil, "reverse")


def test_one_dimensional_groups_grow_to_1024():
    x = rng.random(LARGE + 3)
    y = np.empty_like(x)
    scale1d(CPU, 64)(y, x, 1.5, ndrange=x.size)
    np.testing.assert_allclose(y, 1.5 * x * x, rtol=1e-15)
    assert "groupsize (1024,)" in _groupsize_run(scale1d)


@pytest.mark.parametrize("kern, make", [
    (transpose, lambda x: (np.empty(x.shape[::-1]), x)),     # writes B[j, i]: square tiles pay
    (row_offsets, lambda x: (np.empty_like(x), x)),           # reads its local index
    (linear_index, lambda x: (np.empty_like(x), x)),          # the linear index mixes dims
    (transpose_by_part, lambda x: (np.empty(x.shape[::-1]), x)),
    (transpose_atomically, lambda x: (np.zeros(x.shape[::-1]), x)),
])
def test_kernels_that_can_tell_or_prefer_tiles_keep_the_launch_groupsize(kern, make):
    x = rng.random((160, 120))
    out, arg = make(x)
    kern(CPU, (4, 8))(out, arg, ndrange=x.shape)
    assert "groupsize (4, 8)" in _groupsize_run(kern)
    assert "Launched with" not in kern.source(backend=CPU)
    if kern in (transpose, transpose_by_part, transpose_atomically):
        np.testing.assert_array_equal(out, x.T)
    elif kern is row_offsets:
        i, j = np.indices(x.shape)
        np.testing.assert_allclose(out, x + (i % 4) * 100 + j % 8)
    else:
        np.testing.assert_array_equal(out, x.reshape(x.shape[::-1]).T)


def test_a_cpu_minded_groupsize_is_kept():
    x = rng.random((40, 512))
    y = np.empty_like(x)
    stencil(CPU, (4, 256))(y, x, 0.1, ndrange=x.shape)
    np.testing.assert_allclose(y, _stencil_reference(x, 0.1), rtol=1e-14)
    assert "groupsize (4, 256)" in _groupsize_run(stencil)


def test_values_loaded_from_arrays_do_not_count_as_the_work_items_index():
    x = rng.random((300, 3))
    idx = rng.integers(0, 300, (60, 300))
    y = np.empty((60, 300))
    cube_gathered(CPU, (16, 16))(y, x, idx, ndrange=y.shape)
    np.testing.assert_allclose(y, x[idx, 0] ** 3, rtol=1e-15)
    assert "groupsize (1, 1024)" in _groupsize_run(cube_gathered)


@tg.kernel
def scaled_where_positive(Y, X, a):
    i, j = tg.index(tg.Global, tg.NTuple)
    Y[i, j] = X[i, j]
    if X[i, j] <= 0.0:                # (a return: the work-items' slots are added into)
        return
    Y[i, j] = a * X[i, j]


@pytest.mark.parametrize("shape", [(13, 37), (70, 256), (300, 250)])
@pytest.mark.parametrize("kern", [stencil, scaled_where_positive])
def test_an_active_scalars_sum_over_groups_the_ndrange_cuts(shape, kern):
    # (each work-item's share goes into its slot of the group's sum: a group cut by the
    # ndrange, or a row of 1024 over a shorter array, sums the slots of the work-items that
    # ran; the kernel that returns early adds into its slots, the stencil stores into them)
    x, w = rng.uniform(-1, 1, shape), rng.random(shape)
    y = np.empty_like(x)
    ((_, _, da),) = tg.autodiff(tg.Reverse, kern(CPU, (8, 16)), tg.Const,
                                tg.DuplicatedNoNeed(y, w.copy()), tg.Const(x),
                                tg.Active(0.3), ndrange=shape)
    if kern is stencil:
        lap = np.zeros_like(x)
        lap[1:-1, 1:-1] = (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:]
                           - 4 * x[1:-1, 1:-1])
        expected = float(np.sum(w * lap))
    else:
        expected = float(np.sum(np.where(x > 0, w * x, 0.0)))
    assert da == pytest.approx(expected, rel=1e-12)
