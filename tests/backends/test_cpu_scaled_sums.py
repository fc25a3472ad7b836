"""Per-thread sums scaled by the element added to (tapegrad/backends/cpu/scaledsums.py): which
adds qualify, and the same sums, with per-thread copies or atomics, as computed independently."""

from __future__ import annotations

import ast
import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.scaledsums import scaled_sums
from tapegrad.frontend.ir import KernelIR

CPU = tg.CPU()

GATHER_ADJOINT = """
v_bar = 0.0
i = tg.global_index()
v = X[idx[i]]
_a2 = Y_bar[i]
Y_bar[i] = 0.0
v_bar = v_bar + _a2 * v
v_bar = v_bar + _a2 * v
_a1 = v_bar
tg.atomic_add(X_bar, idx[i], _a1)
"""


def _found(source: str) -> dict:
    params = ["Y", "X", "idx", "C", "Y_bar", "X_bar"]
    ir = KernelIR("k", params, ast.parse(source).body, "<test>", 1, True)
    return scaled_sums(ir, {"X_bar": 1}, set(params))


def test_a_gathers_adjoint_scales_its_sum_by_the_gathered_value():
    (sums,) = _found(GATHER_ADJOINT).values()
    assert (sums.array, sums.factor, sums.source) == ("X_bar", "v", "X")


@pytest.mark.parametrize("change", [
    ("v_bar = v_bar + _a2 * v\n_a1", "v_bar = v_bar + _a2 * v * v\n_a1"),   # v squared
    ("_a1 = v_bar", "_a1 = v_bar + 1.0"),                # a term without v
    ("_a1 = v_bar", "_a1 = v_bar / v"),                  # divided by v: degree 0
    ("_a1 = v_bar", "_a1 = math.cos(v_bar)"),            # not linear
    ("_a1 = v_bar", "_a1 = v_bar\nY_bar[i] = v"),        # v used elsewhere
    ("_a1 = v_bar", "_a1 = v_bar\nif v > 0.0:\n    _a1 = 0.0"),   # a branch on v
    ("tg.atomic_add(X_bar, idx[i], _a1)", "tg.atomic_add(X_bar, idx[i] + 1, _a1)"),  # another
    ("_a1 = v_bar", "_a1 = v_bar\nX[i] = 0.0"),          # the scale's array changes
    ("_a1 = v_bar", "_a1 = v_bar\nidx[i] = 0"),          # so does the index
    ("_a1 = v_bar", "_a1 = v_bar\ni = i + 1"),           # the index's local changes
    ("_a1 = v_bar", "_a1 = v_bar\nv = 2.0"),             # v assigned twice
    ("tg.atomic_add(X_bar, idx[i], _a1)",                # two adds into the array
     "tg.atomic_add(X_bar, idx[i], _a1)\ntg.atomic_add(X_bar, i, _a2)"),
    ("v_bar = 0.0\n", "v_bar = 1.0\n"),                  # starts from a nonzero term
])
def test_sums_that_are_not_linear_in_the_gathered_value_are_left_alone(change):
    old, new = change
    assert old in GATHER_ADJOINT
    assert _found(GATHER_ADJOINT.replace(old, new)) == {}


def test_a_zero_start_inside_a_branch_does_not_count_as_zero():
    source = GATHER_ADJOINT.replace("v_bar = 0.0\n", "v_bar = 0.0\nif i > 3:\n    v_bar = 1.0\n")
    assert _found(source) == {}


@tg.kernel
def squares_of_gathered(Y, X, idx, s):
    i = tg.index()
    v = X[idx[i]]
    Y[i] = s * v * v


@tg.kernel
def sines_of_gathered(Y, X, idx):
    i = tg.index()
    Y[i] = math.sin(X[idx[i]])


@pytest.mark.parametrize("n, m", [(4096, 64), (20, 4096)])   # per-thread copies pay, or not
def test_the_gradient_of_a_squared_gather_with_scaled_sums(n, m):
    rng = np.random.default_rng(n)
    X, idx, W = rng.random(m), rng.integers(0, m, n), rng.random(n)
    dX = rng.random(m)                 # shadows accumulate: the sums add to what is there
    expected = dX.copy()
    np.add.at(expected, idx, 2 * 0.7 * X[idx] * W)
    Y = np.empty(n)
    tg.autodiff(tg.Reverse, squares_of_gathered(CPU), tg.Const, tg.DuplicatedNoNeed(Y, W.copy()),
                tg.Duplicated(X, dX), idx, 0.7, ndrange=n)
    np.testing.assert_allclose(dX, expected, rtol=1e-12)
    source = squares_of_gathered.source(mode="reverse", backend=CPU)
    assert "X_bar[_m0] += (X[_m0] * _p if _scaled and _p != 0 else _p)" in source
    assert source.count("= np.float64(1.0)") + source.count("v = 1.0") == 1


def test_a_gather_of_a_nonlinear_function_keeps_its_terms():
    rng = np.random.default_rng(3)
    X, idx, W = rng.random(64), rng.integers(0, 64, 4096), rng.random(4096)
    dX = np.zeros(64)
    tg.autodiff(tg.Reverse, sines_of_gathered(CPU), tg.Const,
                tg.DuplicatedNoNeed(np.empty(4096), W.copy()), tg.Duplicated(X, dX), idx,
                ndrange=4096)
    expected = np.zeros(64)
    np.add.at(expected, idx, np.cos(X[idx]) * W)
    np.testing.assert_allclose(dX, expected, rtol=1e-12)
    assert "_scaled = " not in sines_of_gathered.source(mode="reverse", backend=CPU)


@tg.kernel
def weighted_histogram(H, weight, X, idx):
    """A primal scatter whose terms scale by the bin's own weight."""
    i = tg.index()
    w = weight[idx[i]]
    tg.atomic_add(H, idx[i], X[i] * w)


@pytest.mark.parametrize("n, m", [(4096, 32), (16, 4096)])
def test_a_primal_scatter_scaled_by_its_bin(n, m):
    rng = np.random.default_rng(m)
    weight, X, idx = rng.random(m), rng.random(n), rng.integers(0, m, n)
    H = rng.random(m)
    expected = H + weight * np.bincount(idx, X, minlength=m)
    weighted_histogram(CPU)(H, weight, X, idx, ndrange=n)
    np.testing.assert_allclose(H, expected, rtol=1e-12)
    assert "_scaled = _private_H and weight.shape == H.shape" in weighted_histogram.source(
        backend=CPU)


def test_a_scale_of_another_shape_falls_back_to_the_terms_as_written():
    """The merge reads the scale at every element of the sum: only when the shapes agree."""
    rng = np.random.default_rng(5)
    weight, X, idx = rng.random(64), rng.random(4096), rng.integers(0, 32, 4096)
    H = np.zeros(32)
    weighted_histogram(CPU)(H, weight, X, idx, ndrange=4096)
    np.testing.assert_allclose(H, weight[:32] * np.bincount(idx, X, minlength=32), rtol=1e-12)


@tg.kernel
def weighted_debits(H, weight, X, idx):
    i = tg.index()
    w = weight[idx[i]]
    tg.atomic_sub(H, idx[i], w * X[i])


def test_a_scaled_subtraction():
    rng = np.random.default_rng(7)
    weight, X, idx = rng.random(32), rng.random(4096), rng.integers(0, 32, 4096)
    H = np.ones(32)
    weighted_debits(CPU)(H, weight, X, idx, ndrange=4096)
    np.testing.assert_allclose(H, 1.0 - weight * np.bincount(idx, X, minlength=32), rtol=1e-12)
    assert "_scaled = " in weighted_debits.source(backend=CPU)


def test_elements_no_term_went_to_keep_their_gradient_even_where_the_scale_is_not_finite():
    """0 * inf is nan: an element nobody gathered must not get it from the merge."""
    rng = np.random.default_rng(11)
    X = rng.random(64)
    X[[3, 40]] = np.inf, np.nan
    idx = rng.integers(0, 64, 4096)
    idx[np.isin(idx, (3, 40))] = 5
    W = rng.random(4096)
    dX = np.zeros(64)
    tg.autodiff(tg.Reverse, squares_of_gathered(CPU), tg.Const,
                tg.DuplicatedNoNeed(np.empty(4096), W.copy()), tg.Duplicated(X, dX), idx, 1.0,
                ndrange=4096)
    expected = np.zeros(64)
    np.add.at(expected, idx, 2 * X[idx] * W)
    np.testing.assert_allclose(dX, expected, rtol=1e-12)
    assert dX[3] == 0.0 and dX[40] == 0.0


# found in review: a device function may store into the arrays it is given


@tg.func
def put(A, k, value):
    A[k] = value


@tg.kernel
def histogram_then_clear(H, weight, X, idx):
    i = tg.index()
    w = weight[idx[i]]
    tg.atomic_add(H, idx[i], X[i] * w)
    put(weight, idx[i], 0.0)       # the scale changes: the merge must not read it


@tg.kernel
def histogram_then_move(H, weight, X, idx):
    i = tg.index()
    w = weight[idx[i]]
    put(idx, i, (idx[i] + 1) % H.size)      # the index changes between the read and the add
    tg.atomic_add(H, idx[i], X[i] * w)


@pytest.mark.parametrize("n", [4096, 16])
def test_arrays_a_device_function_is_given_are_not_scales_or_indices(n):
    rng = np.random.default_rng(n)
    idx = rng.permutation(n).astype(np.int64)
    weight, X = rng.random(n), rng.random(n)
    H = np.zeros(n)
    histogram_then_clear(CPU)(H, weight.copy(), X, idx, ndrange=n)
    expected = np.zeros(n)
    np.add.at(expected, idx, X * weight[idx])
    np.testing.assert_allclose(H, expected, rtol=1e-14)
    H, moved = np.zeros(n), idx.copy()
    histogram_then_move(CPU)(H, weight, X, moved, ndrange=n)
    expected = np.zeros(n)
    np.add.at(expected, (idx + 1) % n, X * weight[idx])
    np.testing.assert_allclose(H, expected, rtol=1e-14)
    for kern in (histogram_then_clear, histogram_then_move):
        assert "_scaled = " not in kern.source(backend=CPU)
