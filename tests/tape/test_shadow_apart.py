"""A shadow that is, or overlaps, its own primal, another argument or another argument's shadow
is refused before anything runs, and the arrays are left as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def run(B, A):
    sin_k(CPU)(B, A, ndrange=A.size)
    return tg.sum(B)


def _cases():
    A, B = np.linspace(0.1, 1.0, 6), np.zeros(6)
    dA, dB = np.zeros(6), np.ones(6)
    big = np.zeros(12)
    return [
        ("its own array", (tg.Duplicated(B, dB), tg.Duplicated(A, A))),
        ("its own array", (tg.Duplicated(B, B), tg.Duplicated(A, dA))),
        ("argument 1's array", (tg.Duplicated(B, A), tg.Duplicated(A, dA))),
        ("its own array", (tg.Duplicated(B, dB), tg.Duplicated(A, A[::-1]))),
        ("share some of their elements", (tg.Duplicated(B, big[:6]),
                                          tg.Duplicated(A, big[3:9]))),
    ]


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("where", ["kernel", "host"])
def test_overlapping_shadows_are_refused_and_nothing_changes(case, where):
    message, args = _cases()[case]
    before = [(a.val.copy(), a.dval.copy()) for a in args]
    with pytest.raises(tg.TapegradError, match=message):
        if where == "kernel":
            tg.autodiff(tg.Reverse, sin_k(CPU), tg.Const, *args, ndrange=6)
        else:
            tg.autodiff(tg.Reverse, run, tg.Active, *args)
    for a, (val, dval) in zip(args, before):
        assert np.array_equal(a.val, val) and np.array_equal(a.dval, dval)


def test_forward_mode_refuses_a_tangent_that_is_its_primal():
    A, B = np.linspace(0.1, 1.0, 4), np.zeros(4)
    with pytest.raises(tg.TapegradError, match="its own array"):
        tg.autodiff(tg.Forward, sin_k(CPU), tg.Const, tg.Duplicated(B, np.zeros(4)),
                    tg.Duplicated(A, A), ndrange=4)


def test_one_array_passed_twice_with_its_one_shadow_is_accepted():
    @tg.kernel
    def add_sq(C, A, B):
        i = tg.index()
        C[i] = A[i] * B[i]

    A, C = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    dA, dC = np.zeros(3), np.ones(3)
    tg.autodiff(tg.Reverse, add_sq(CPU), tg.Const, tg.Duplicated(C, dC),
                tg.Duplicated(A, dA), tg.Duplicated(A, dA), ndrange=3)
    assert np.allclose(dA, 2 * A)            # d(A*A)/dA


@tg.kernel
def stencil(B, A, s):
    i = tg.index()
    n = A.shape[0]
    if 0 < i and i < n - 1:
        B[i] = s * (A[i - 1] - 2.0 * A[i] + A[i + 1]) + A[i] * A[i]


def _tangent_cases():
    """(B's tangent, A's tangent, what is shared) where B's, which the kernel writes, shares
    elements with A's: one object, and views of one array two elements apart."""
    T, X = np.random.default_rng(1).random(16), np.random.default_rng(2).random(18)
    return [(T, T), (X[2:], X[:16])]


@pytest.mark.parametrize("case", [0, 1])
@pytest.mark.parametrize("where", ["kernel", "host"])
def test_forward_mode_refuses_a_written_tangent_that_shares_another_ones_elements(
        backend, case, where):
    """(The tangent kernel would write B's tangent while reading A's: a wrong tangent.)"""
    TB, TA = _tangent_cases()[case]
    A, B = np.linspace(0.1, 1.0, 16), np.zeros(16)
    before = (A.copy(), B.copy(), TB.copy(), TA.copy())

    def host(B, A, s):
        stencil(backend, 4)(B, A, s, ndrange=16)
        return tg.sum(B)
    # (a host function's entry refuses partly shared tangents before any launch)
    with pytest.raises(tg.LaunchError, match="tangent of B shares elements with the tangent "
                       "of A, and the kernel writes B|shadows given for arguments 0 and 1 share"):
        if where == "kernel":
            tg.autodiff(tg.Forward, stencil(backend, 4), tg.Const, tg.Duplicated(B, TB),
                        tg.Duplicated(A, TA), tg.Duplicated(0.3, 0.5), ndrange=16)
        else:
            tg.autodiff(tg.Forward, host, tg.Active, tg.Duplicated(B, TB),
                        tg.Duplicated(A, TA), 0.3)
    for x, x0 in zip((A, B, TB, TA), before):
        np.testing.assert_array_equal(x, x0)


def test_forward_mode_lets_two_read_arrays_share_one_direction(backend):
    """A tangent the kernel only reads may be another's: the same direction for both."""
    @tg.kernel
    def product(C, A, B):
        i = tg.index()
        C[i] = A[i] * B[i]

    A, B = np.linspace(0.5, 2.0, 8), np.linspace(-1.0, 1.0, 8)
    T, TC = np.linspace(1.0, 3.0, 8), np.zeros(8)
    tg.autodiff(tg.Forward, product(backend, 4), tg.Const, tg.Duplicated(np.zeros(8), TC),
                tg.Duplicated(A, T), tg.Duplicated(B, T), ndrange=8)
    np.testing.assert_allclose(TC, T * B + A * T, rtol=1e-15)     # d(AB) along (T, T)
