"""``tg.autodiff(..., accumulate=False)``: the functional vector-Jacobian product of a launch.

The seeds (shadows of the arrays the kernel writes) are read and left as they were; the
shadows of the arrays it only reads are overwritten with the derivatives, whatever they held
(the tests fill them with NaN).  Every derivative is checked against central finite
differences in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.runtime.adjoint import adjoint_of

CPU = tg.CPU()
rng = np.random.default_rng(5)


@tg.kernel
def axpy(Z, a, X, Y):
    i = tg.index()
    Z[i] = a * X[i] + Y[i]


@tg.kernel
def scaled_square(Y, X, s):
    i, j = tg.index(tg.Global, tg.NTuple)
    Y[i, j] = X[i, j] * X[i, j] * s          # two updates of X_bar: the first one stores


@tg.kernel
def smooth(Y, X):
    i = tg.index()
    if i > 0 and i < X.size - 1:
        Y[i] = X[i - 1] - 2.0 * X[i] + X[i + 1]
    else:
        Y[i] = 0.5 * X[i]


@tg.kernel
def even_only(Y, X):
    i = tg.index()
    if i % 2 == 0:
        Y[i] = X[i] * X[i]                   # X_bar updated under a test: zeroed, then added
    else:
        Y[i] = 1.0


@tg.kernel
def stored_twice(Y, X, c):
    i = tg.index()
    if c > 0.0:
        Y[i] = X[i]
    Y[i] = 3.0 * X[i]                        # two stores: the adjoint zeroes Y_bar in between


@tg.kernel
def in_place(X):
    i = tg.index()
    X[i] = X[i] * X[i]


def fd(cfg, args: list, ndrange, out: int, w: np.ndarray, wrt: int, eps: float = 1e-6):
    """<w, d args[out] / d args[wrt]> by central differences (args[wrt] an array or scalar)."""
    def loss(values: list) -> float:
        values = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
        cfg(*values, ndrange=ndrange)
        return float(np.sum(w * values[out]))

    def shifted(idx, h):
        values = [v.copy() if isinstance(v, np.ndarray) else v for v in args]
        if idx is None:
            values[wrt] = values[wrt] + h
        else:
            values[wrt][idx] += h
        return values

    if not isinstance(args[wrt], np.ndarray):
        return (loss(shifted(None, eps)) - loss(shifted(None, -eps))) / (2 * eps)
    g = np.zeros(args[wrt].shape)
    for idx in np.ndindex(g.shape):
        g[idx] = (loss(shifted(idx, eps)) - loss(shifted(idx, -eps))) / (2 * eps)
    return g


def nans(like: np.ndarray) -> np.ndarray:
    return np.full_like(like, np.nan)


def test_elementwise_gradients_overwrite_and_the_seed_stays():
    n = 37
    x, y, z, w = rng.random(n), rng.random(n), np.zeros(n), rng.standard_normal(n)
    w0, dx, dy = w.copy(), nans(x), nans(y)
    cfg = axpy(CPU, 8)
    ((_, a_bar, _, _),) = tg.autodiff(
        tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(z, w), tg.Active(1.5),
        tg.Duplicated(x, dx), tg.Duplicated(y, dy), ndrange=n, accumulate=False)
    args = [z, 1.5, x, y]
    np.testing.assert_allclose(dx, fd(cfg, args, n, 0, w, 2), atol=1e-8)
    np.testing.assert_allclose(dy, fd(cfg, args, n, 0, w, 3), atol=1e-8)
    assert a_bar == pytest.approx(fd(cfg, args, n, 0, w, 1), abs=1e-7)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(z, 0.0)            # DuplicatedNoNeed: no primal launch
    # the shadows were stored into, not zeroed first (the storing variant ran)
    compiled = adjoint_of(cfg, (z, 1.5, x, y), ("dup", "active", "dup", "dup"), (n,),
                          frozenset({"Z"}))[0]
    assert set(compiled.storing.compiled) == {frozenset({"X_bar", "Y_bar"})}
    # calling again gives the same gradient: nothing accumulates
    first = dx.copy()
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(z, w), tg.Active(1.5),
                tg.Duplicated(x, dx), tg.Duplicated(y, dy), ndrange=n, accumulate=False)
    np.testing.assert_array_equal(dx, first)


def test_two_updates_of_one_shadow_in_two_dimensions():
    x, y, w = rng.random((6, 10)), np.zeros((6, 10)), rng.standard_normal((6, 10))
    cfg = scaled_square(CPU, (2, 4))              # the ndrange cuts groups: still stored
    dx = nans(x)
    ((_, _, s_bar),) = tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(y, w.copy()),
                                   tg.Duplicated(x, dx), tg.Active(0.7), ndrange=x.shape,
                                   accumulate=False)
    np.testing.assert_allclose(dx, fd(cfg, [y, x, 0.7], x.shape, 0, w, 1), atol=1e-8)
    assert s_bar == pytest.approx(fd(cfg, [y, x, 0.7], x.shape, 0, w, 2), abs=1e-7)


def test_stencil_gather_stores_into_the_gradient():
    n = 29
    x, y, w = rng.random(n), np.zeros(n), rng.standard_normal(n)
    cfg = smooth(CPU, 8)
    dx, w0 = nans(x), w.copy()
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(y, w), tg.Duplicated(x, dx),
                ndrange=n, accumulate=False)
    np.testing.assert_allclose(dx, fd(cfg, [y, x], n, 0, w, 1), atol=1e-8)
    np.testing.assert_array_equal(w, w0)


@pytest.mark.parametrize("kernel, ndrange", [(even_only, 21), (axpy, 17)])
def test_updates_that_do_not_cover_the_shadow_zero_it_first(kernel, ndrange):
    """A shadow updated under a test, or by a launch smaller than it, still ends up holding
    exactly the derivative (zeros where nothing depends on the element)."""
    n = 21
    x, y, w = rng.random(n), np.zeros(n), rng.standard_normal(n)
    cfg = kernel(CPU, 4)
    dx = nans(x)
    if kernel is axpy:
        args = [y, 2.0, x, rng.random(n)]
        annotated = [tg.DuplicatedNoNeed(y, w.copy()), 2.0, tg.Duplicated(x, dx), args[3]]
        wrt = 2
    else:
        args = [y, x]
        annotated = [tg.DuplicatedNoNeed(y, w.copy()), tg.Duplicated(x, dx)]
        wrt = 1
    tg.autodiff(tg.Reverse, cfg, tg.Const, *annotated, ndrange=ndrange, accumulate=False)
    np.testing.assert_allclose(dx, fd(cfg, args, ndrange, 0, w, wrt), atol=1e-8)


def test_full_and_short_launches_of_one_kernel_alternate():
    """How a launch treats its new gradients is worked out once per kind of launch and
    remembered: a short launch after a full one (same compiled adjoint) must still zero the
    elements it does not reach, and the full one after it store again."""
    n = 19
    x, y, w = rng.random(n), rng.random(n), rng.standard_normal(n)
    cfg = axpy(CPU, 4)
    for ndrange in (n, n - 5, n):
        dx, z = nans(x), np.zeros(n)
        tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(z, w.copy()), 2.0,
                    tg.Duplicated(x, dx), y, ndrange=ndrange, accumulate=False)
        np.testing.assert_allclose(dx, fd(cfg, [z, 2.0, x, y], ndrange, 0, w, 2), atol=1e-8)
    compiled = adjoint_of(cfg, (z, 2.0, x, y), ("dup", "const", "dup", "const"), (n,),
                          frozenset({"Z"}))[0]
    assert len(compiled.fresh_plans) == 2        # stored into (full) and zeroed (short)


def test_a_seed_the_adjoint_must_write_is_copied_not_changed():
    n = 13
    x, y, w = rng.random(n), np.zeros(n), rng.standard_normal(n)
    cfg = stored_twice(CPU, 4)
    dx, w0 = nans(x), w.copy()
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(y, w), tg.Duplicated(x, dx), 1.0,
                ndrange=n, accumulate=False)
    np.testing.assert_allclose(dx, fd(cfg, [y, x, 1.0], n, 0, w, 1), atol=1e-8)
    np.testing.assert_array_equal(w, w0)


def test_a_duplicated_output_gets_its_primal_value():
    n = 9
    x, y, w = rng.random(n), np.zeros(n), rng.standard_normal(n)
    dx, w0 = nans(x), w.copy()
    tg.autodiff(tg.Reverse, smooth(CPU, 4), tg.Const, tg.Duplicated(y, w), tg.Duplicated(x, dx),
                ndrange=n, accumulate=False)
    ref = np.zeros(n)
    smooth(CPU, 4)(ref, x, ndrange=n)
    np.testing.assert_allclose(y, ref)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_allclose(dx, fd(smooth(CPU, 4), [np.zeros(n), x], n, 0, w, 1), atol=1e-8)


def test_misuse_is_a_clear_error_and_changes_nothing():
    x, dx = rng.random(8), np.ones(8)
    x0 = x.copy()
    with pytest.raises(tg.TapegradError, match="reads and writes X.*accumulate=True"):
        tg.autodiff(tg.Reverse, in_place(CPU), tg.Const, tg.Duplicated(x, dx), ndrange=8,
                    accumulate=False)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dx, 1.0)
    w, dw = rng.random(8), rng.random(8)
    w0, dw0 = w.copy(), dw.copy()
    with pytest.raises(tg.TapegradError, match="shadows of X and Y share memory"):
        tg.autodiff(tg.Reverse, smooth(CPU, 4), tg.Const, tg.DuplicatedNoNeed(dw, w),
                    tg.Duplicated(rng.random(8), w[::-1]), ndrange=8, accumulate=False)
    np.testing.assert_array_equal(w, w0)
    np.testing.assert_array_equal(dw, dw0)
    with pytest.raises(tg.TapegradError, match="reverse mode"):
        tg.autodiff(tg.Forward, in_place(CPU), tg.Const, tg.Duplicated(x, dx), ndrange=8,
                    accumulate=False)
    with pytest.raises(tg.TapegradError, match="tg.gradient"):
        tg.autodiff(tg.Reverse, lambda v: tg.sum(v), tg.Active, tg.Duplicated(x, dx),
                    accumulate=False)


def test_backends_agree(backend, size):
    """The same functional VJP on every backend."""
    n = size(40, 12)
    x, y, w = rng.random(n), np.zeros(n), rng.standard_normal(n)
    xs, ys, ws = (tg.asarray(backend, v) for v in (x, y, w))
    dxs, dys = (tg.asarray(backend, nans(x)) for _ in range(2))
    ((_, a_bar, _, _),) = tg.autodiff(
        tg.Reverse, axpy(backend, 4), tg.Const, tg.DuplicatedNoNeed(tg.asarray(backend, y), ws),
        tg.Active(0.5), tg.Duplicated(xs, dxs), tg.Duplicated(ys, dys), ndrange=n,
        accumulate=False)
    np.testing.assert_allclose(tg.to_numpy(dxs), 0.5 * w)
    np.testing.assert_allclose(tg.to_numpy(dys), w)
    assert a_bar == pytest.approx(float(w @ x))
    dxs = tg.asarray(backend, nans(x))
    tg.autodiff(tg.Reverse, smooth(backend, 4), tg.Const, tg.DuplicatedNoNeed(ys, ws),
                tg.Duplicated(xs, dxs), ndrange=n, accumulate=False)
    np.testing.assert_allclose(tg.to_numpy(dxs), fd(smooth(CPU, 4), [y, x], n, 0, w, 1),
                               atol=1e-8)
    np.testing.assert_array_equal(tg.to_numpy(ws), w)
