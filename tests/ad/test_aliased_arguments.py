"""One array passed for several arguments of a launch.

Numba compiles a parallel loop taking distinct array arguments to be distinct memory, so an
adjoint that got one shadow array for two parameters could lose an update (one parameter's
load moved across the other's store).  The launch gives the compiled kernel separate arrays
and adds them up after (``launch.run_adjoint``).  Every gradient here is checked against
central finite differences in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import saxpy_k as axpy  # Z[i] = a * X[i] + Y[i]

CPU = tg.CPU()
rng = np.random.default_rng(11)
N = 16
W = rng.standard_normal(N)


@tg.kernel
def shifted_sum(Z, X, Y):
    i = tg.index()
    if i > 0 and i < Z.size - 1:
        Z[i] = X[i - 1] * Y[i + 1]          # a stencil: its adjoint gathers
    else:
        Z[i] = X[i]


def fd(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    g = np.zeros_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e[k] = eps
        g[k] = (float(f(x + e)) - float(f(x - e))) / (2 * eps)
    return g


def inputs_alias(x):                 # z <- 0.5 z + z, a new array per step
    for _ in range(3):
        out = np.empty_like(x)
        axpy(CPU, 4)(out, 0.5, x, x, ndrange=N)
        x = out
    return tg.dot(x, W)


def everything_aliases(x):           # z <- 0.5 z + z, in place
    z = tg.copy(x)
    for _ in range(3):
        axpy(CPU, 4)(z, 0.5, z, z, ndrange=N)
    return tg.dot(z, W)


def output_and_input_alias(x):       # z <- 0.5 z + x, in place
    z = tg.copy(x)
    for _ in range(3):
        axpy(CPU, 4)(z, 0.5, z, x, ndrange=N)
    return tg.dot(z, W)


def stencil_inputs_alias(x):
    out = np.empty_like(x)
    shifted_sum(CPU, 4)(out, x, x, ndrange=N)
    return tg.dot(out, W)


@pytest.mark.parametrize("f", [inputs_alias, everything_aliases, output_and_input_alias,
                               stencil_inputs_alias])
def test_tape_gradients_with_one_array_in_several_arguments(f):
    x = rng.random(N)
    expected = fd(f, x)
    (g,) = tg.gradient(f, x.copy())                         # new gradients (stored into)
    np.testing.assert_allclose(g, expected, rtol=1e-7, atol=1e-9)
    dx = np.full(N, 0.25)                                   # Enzyme's form: added to
    tg.autodiff(tg.Reverse, f, tg.Active, tg.Duplicated(x.copy(), dx))
    np.testing.assert_allclose(dx, expected + 0.25, rtol=1e-7, atol=1e-9)


def test_kernel_autodiff_with_one_shadow_for_two_arguments():
    x, z = rng.random(N), np.empty(N)
    for shadows in ("same object", "same memory"):
        buf = np.zeros(N + 4)
        dx = buf[:N]
        second = dx if shadows == "same object" else buf[:N]
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, W.copy()), 0.5,
                    tg.Duplicated(x, dx), tg.Duplicated(x, second), ndrange=N)
        np.testing.assert_allclose(dx, fd(lambda v: np.dot(0.5 * v + v, W), x), rtol=1e-7)


def test_shadows_that_overlap_in_part_are_refused_before_anything_runs():
    x, z = rng.random(N), np.zeros(N)
    buf = np.zeros(N + 2)
    seed = W.copy()
    with pytest.raises(tg.LaunchError, match="overlap in part"):
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, seed), 0.5,
                    tg.Duplicated(x, buf[:N]), tg.Duplicated(x, buf[2:]), ndrange=N)
    np.testing.assert_array_equal(buf, 0.0)
    np.testing.assert_array_equal(seed, W)
    np.testing.assert_array_equal(z, 0.0)               # not even the primal launch ran
