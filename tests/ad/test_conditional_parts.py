"""Derivatives of what Python evaluates only on a condition, and of a loop left by `break`.

Device functions are inlined before differentiation; a call in a branch of `x if c else y`,
after the first operand of `and`/`or`, or after the first comparison of a chain runs (and is
differentiated) only where Python would run it: inlined unconditionally, sqrt of the branch
not taken gave NaN gradients, a write in it wrong primal and derivative values.  A loop left
by `break` keeps running empty in the differentiated code: its variable must still be the
one it broke at.  Each case: reverse mode against float64 central differences, forward mode
against them too, and the forward run's primal outputs against a plain launch."""

from __future__ import annotations

import math

import numpy as np

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error


@tg.func
def root(x):
    return math.sqrt(x)


@tg.func
def squared_into(C, j, v):
    C[j] = v * v
    return v


@tg.kernel
def branches(B, C, A):
    i = tg.index()
    x = A[i]
    b = root(x) if x > 0.0 else 2.0 * x
    if x > 0.0 and root(x) < 0.8:
        b += 3.0 * x
    if x < 0.0 or root(x) > 0.6:
        b += x * x
    if 0.0 < x < root(x) + 0.5:          # (the chain's second link only where 0 < x)
        b += 5.0 * x
    B[i] = b + (squared_into(C, i, x) if x > 0.5 else x)


@tg.kernel
def broke_at(B, A, n):
    i = tg.index()
    k = 0
    x = A[i]
    for k in range(n):  # noqa: B007  (read after the loop)
        x = x * 2.0
        if x > 1.0:
            break
    m = 0
    for m in range(n):  # noqa: B007  (run to its end: m is n - 1 afterwards, as in Python)
        x = x + 0.0
    B[i] = x * k + m


def _plain(kern, backend, args, n):
    values = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    kern(backend, 4)(*values, ndrange=n)
    return values


def _forward_matches(kern, backend, args, n, wrt, outputs, h=1e-6):
    """Forward mode's tangents against central differences along a random direction, and
    its primal outputs against a plain launch."""
    rng = np.random.default_rng(3)
    direction = {k: rng.standard_normal(args[k].shape) for k in wrt}
    values = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    tangents = {k: np.zeros_like(values[k]) for k in outputs}
    annotated = [tg.Duplicated(v, direction[k].copy()) if k in wrt else
                 tg.Duplicated(v, tangents[k]) if k in outputs else v
                 for k, v in enumerate(values)]
    tg.autodiff(tg.Forward, kern(backend, 4), tg.Const, *annotated, ndrange=n)
    plain = _plain(kern, backend, args, n)
    for k in outputs:
        np.testing.assert_allclose(values[k], plain[k], rtol=1e-15)
    shifted = []
    for sign in (1.0, -1.0):
        moved = [a + sign * h * direction[k] if k in direction else a
                 for k, a in enumerate(args)]
        shifted.append(_plain(kern, backend, moved, n))
    for k in outputs:
        np.testing.assert_allclose(tangents[k], (shifted[0][k] - shifted[1][k]) / (2 * h),
                                   rtol=1e-6, atol=1e-8)


def test_calls_on_a_condition_are_differentiated_only_where_they_run(backend):
    A = np.array([0.25, -0.5, 0.7, 0.4, -0.1, 0.9])
    C = np.ones(6)
    err, _, shadows = kernel_vjp_error(branches(backend, 4), [np.zeros(6), C, A], 6,
                                       wrt=(2,), outputs=(0, 1))
    assert np.isfinite(shadows[2]).all()
    assert err < 1e-6
    # C[i] written only where x > 0.5: its shadow consumed there and kept elsewhere
    c_bar = shadows[1]
    rng = np.random.default_rng(0)
    rng.standard_normal(6)
    weights = rng.standard_normal(6)
    np.testing.assert_array_equal(c_bar, np.where(A > 0.5, 0.0, weights))
    _forward_matches(branches, backend, [np.zeros(6), C, A], 6, wrt=(2,), outputs=(0, 1))


def test_a_loop_left_by_break_keeps_the_variable_it_broke_at(backend):
    A = np.array([0.3, 0.6, 0.01, 0.2])
    plain = _plain(broke_at, backend, [np.zeros(4), A, 10], 4)
    k_at = [1, 0, 6, 2]                       # 2**(k+1) * a > 1 first at k
    np.testing.assert_allclose(plain[0], [a * 2.0 ** (k + 1) * k + 9
                                          for a, k in zip(A.tolist(), k_at)])
    err, _, _ = kernel_vjp_error(broke_at(backend, 4), [np.zeros(4), A, 10], 4, wrt=(1,),
                                 outputs=(0,))
    assert err < 1e-6
    _forward_matches(broke_at, backend, [np.zeros(4), A, 10], 4, wrt=(1,), outputs=(0,))
