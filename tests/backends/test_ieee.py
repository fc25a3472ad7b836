"""IEEE arithmetic in every generated function, on every backend: ``1/0`` is ``inf``,
``0/0`` is ``nan``, ``sqrt``'s and ``log``'s derivatives at 0 are infinite, and every element
of a launch is computed (a division by zero on the CPU used to stop the rest of its thread's
work without a word)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

SPECIAL = np.array([4.0, 0.0, -0.0, 2.5, np.nan, np.inf, -np.inf, -1.0, 5e-324, 1e300])


def _inputs(n: int = 1000) -> np.ndarray:
    """Mostly 4.0, with every special value somewhere in the middle of a thread's chunk."""
    x = np.full(n, 4.0)
    x[n // 2:n // 2 + SPECIAL.size] = SPECIAL
    return x


def assert_ieee_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Element by element: the same nan, the same signed inf, finite values to rounding."""
    got, want = np.asarray(got), np.asarray(want)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (got, want)
    finite = np.isfinite(want)
    assert np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    assert np.allclose(got[finite], want[finite], rtol=1e-14, atol=0), (got, want)


@tg.kernel
def inverse(B, A):
    i = tg.index()
    B[i] = 1.0 / A[i]


@tg.kernel
def root(B, A):
    i = tg.index()
    B[i] = math.sqrt(A[i])


@tg.kernel
def logarithm(B, A):
    i = tg.index()
    B[i] = math.log(A[i])


@tg.kernel
def floor_mod(B, A, d):
    i = tg.index()
    B[i] = A[i] // d + A[i] % d


KERNELS = {  # kernel -> (value, derivative) in NumPy
    "inverse": (inverse, lambda x: 1.0 / x, lambda x: -1.0 / (x * x)),
    "sqrt": (root, np.sqrt, lambda x: 0.5 / np.sqrt(x)),
    "log": (logarithm, np.log, lambda x: 1.0 / x),
}


@pytest.mark.parametrize("groupsize", [None, 1])
def test_a_division_by_zero_leaves_no_element_unwritten(backend, groupsize):
    """The issue's case, with the default workgroups and with one work-item per group (a bare
    SystemError from Numba's dispatcher before)."""
    x = np.full(1000, 4.0)
    x[500] = 0.0
    B = np.zeros(1000)
    inverse(backend, groupsize)(B, x, ndrange=1000)
    with np.errstate(divide="ignore"):
        assert_ieee_equal(B, 1.0 / x)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_primal_adjoint_and_tangent_at_special_values(backend, name):
    kernel, value, derivative = KERNELS[name]
    x = _inputs()
    with np.errstate(all="ignore"):
        want, slope = value(x), derivative(x)
    B = np.zeros_like(x)
    kernel(backend)(B, x, ndrange=x.size)
    assert_ieee_equal(B, want)

    w = np.linspace(0.5, 1.5, x.size)        # a seed with no zeros: inf * w stays inf
    dB, dA = w.copy(), np.zeros_like(x)
    tg.autodiff(tg.Reverse, kernel(backend), tg.Const, tg.Duplicated(np.zeros_like(x), dB),
                tg.Duplicated(x, dA), ndrange=x.size)
    with np.errstate(all="ignore"):
        assert_ieee_equal(dA, slope * w)

    dB, v = np.zeros_like(x), np.linspace(0.5, 1.5, x.size)
    tg.autodiff(tg.Forward, kernel(backend), tg.Const, tg.Duplicated(np.zeros_like(x), dB),
                tg.Duplicated(x, v), ndrange=x.size)
    with np.errstate(all="ignore"):
        assert_ieee_equal(dB, slope * v)


def test_gradient_through_a_division_by_zero_is_computed_everywhere(backend):
    """``tg.gradient`` of sum(1/x) with one zero: -inf there, -1/x^2 everywhere else (half
    the gradient was zero, and some of it memory never written)."""
    x = np.full(1000, 2.0)
    x[500] = 0.0

    def f(A):
        B = tg.zeros(tg.get_backend(A), np.float64, A.shape)
        inverse(backend)(B, A, ndrange=A.size)
        return tg.sum(B)

    (g,) = tg.gradient(f, x)
    with np.errstate(divide="ignore"):
        assert_ieee_equal(g, -1.0 / (x * x))


def test_floor_division_and_remainder_by_zero_follow_numpy(backend):
    x = _inputs(64)
    B = np.zeros_like(x)
    floor_mod(backend)(B, x, 0.0, ndrange=x.size)
    with np.errstate(all="ignore"):
        assert_ieee_equal(B, x // 0.0 + x % 0.0)


@tg.kernel
def int_floor_mod(B, K, d):
    i = tg.index()
    B[i] = K[i] // d + K[i] % d


def test_integer_division_by_zero_gives_zero_as_numpy(backend):
    """(C leaves it undefined: PoCL traps, a GPU gives -1)"""
    K, B = np.arange(-3, 5), np.full(8, 7)
    int_floor_mod(backend)(B, K, 0, ndrange=8)
    with np.errstate(all="ignore"):
        assert np.array_equal(B, K // 0 + K % 0)
