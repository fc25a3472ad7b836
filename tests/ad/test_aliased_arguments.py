"""One array passed for several arguments of a launch.

Numba compiles a parallel loop taking distinct array arguments to be distinct memory, so a
store through one parameter was not seen by a load through another (a primal read its old
value, an adjoint lost updates).  A launch that passes one array object for several
parameters now runs the kernel with them merged into one
(``runtime.launch.one_parameter_per_array``), and one shadow given for several read-only
arrays is split and summed after (``runtime.adjoint.run_adjoint``).  Every gradient is checked against central finite differences in
float64, every primal against a sequential reading of the kernel.
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


@tg.kernel
def write_then_read(Y, Z, X):
    i = tg.index()
    a = X[i]
    Z[i] = 2.0 * a
    b = X[i]                                 # through another parameter: Z's new value
    Y[i] = b * b


@tg.kernel
def square(Z, X):
    i = tg.index()
    Z[i] = X[i] * X[i]


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


def written_then_read_through_another_parameter(x):
    z, y = tg.copy(x), np.zeros(N)
    write_then_read(CPU, 4)(y, z, z, ndrange=N)
    return tg.dot(y, W) + tg.dot(z, W)


def squared_in_place_through_two_parameters(x):
    z = tg.copy(x)
    for _ in range(2):
        square(CPU, 4)(z, z, ndrange=N)
    return tg.dot(z, W)


def test_a_primal_launch_sees_its_own_stores_through_another_parameter():
    z, y = np.arange(N, dtype=np.float64), np.zeros(N)
    write_then_read(CPU, 4)(y, z, z, ndrange=N)
    np.testing.assert_array_equal(z, 2.0 * np.arange(N))
    np.testing.assert_array_equal(y, (2.0 * np.arange(N)) ** 2)


@pytest.mark.parametrize("f", [inputs_alias, everything_aliases, output_and_input_alias,
                               stencil_inputs_alias, written_then_read_through_another_parameter,
                               squared_in_place_through_two_parameters])
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


def test_one_array_with_two_different_shadows_is_refused():
    x, z = rng.random(N), np.zeros(N)
    with pytest.raises(tg.TapegradError, match="with different shadows"):
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, W.copy()), 0.5,
                    tg.Duplicated(x, np.zeros(N)), tg.Duplicated(x, np.zeros(N)), ndrange=N)
    np.testing.assert_array_equal(z, 0.0)


def test_shadows_that_overlap_in_part_are_refused_before_anything_runs():
    x, y, z = rng.random(N), rng.random(N), np.zeros(N)
    buf = np.zeros(N + 2)
    seed = W.copy()
    with pytest.raises(tg.LaunchError, match="share some of their elements"):
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, seed), 0.5,
                    tg.Duplicated(x, buf[:N]), tg.Duplicated(y, buf[2:]), ndrange=N)
    np.testing.assert_array_equal(buf, 0.0)
    np.testing.assert_array_equal(seed, W)
    np.testing.assert_array_equal(z, 0.0)               # not even the primal launch ran


def test_kernel_autodiff_of_an_in_place_launch_through_two_parameters():
    x0 = np.array([2.0, 3.0, -1.5, 0.5])
    x, dx = x0.copy(), np.ones(4)
    tg.autodiff(tg.Reverse, square(CPU, 4), tg.Const, tg.Duplicated(x, dx),
                tg.Duplicated(x, dx), ndrange=4)
    np.testing.assert_allclose(dx, 2.0 * x0)         # d(x^2)/dx at the old values
    np.testing.assert_allclose(x, x0 ** 2)
    x, t = x0.copy(), np.ones(4)                      # forward: the tangent is updated too
    tg.autodiff(tg.Forward, square(CPU, 4), tg.Const, tg.Duplicated(x, t),
                tg.Duplicated(x, t), ndrange=4)
    np.testing.assert_allclose(t, 2.0 * x0)


def test_one_shadow_for_two_read_arrays_sums_their_gradients():
    x, y, z = rng.random(N), rng.random(N), np.empty(N)
    d = np.full(N, 0.5)
    tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, W.copy()), 0.25,
                tg.Duplicated(x, d), tg.Duplicated(y, d), ndrange=N)
    np.testing.assert_allclose(d, 0.5 + 0.25 * W + W)


def test_the_seed_of_a_written_array_cannot_be_another_arrays_gradient():
    x, y, z = rng.random(N), rng.random(N), np.empty(N)
    d = W.copy()
    with pytest.raises(tg.LaunchError, match="own shadow"):
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.Duplicated(z, d), 0.25,
                    tg.Duplicated(x, d), y, ndrange=N)


def test_vjp_of_a_function_that_changes_its_input_in_place_and_returns_it():
    def f(x):
        axpy(CPU, 4)(x, 0.5, x, x, ndrange=N)        # x <- 1.5 x
        return x

    y, x_bar = tg.vjp(f, rng.random(N), W)
    np.testing.assert_allclose(x_bar, 1.5 * W, rtol=1e-12)
    J = tg.jacobian(f, rng.random(N))
    np.testing.assert_allclose(J, 1.5 * np.eye(N), rtol=1e-12)


def test_one_array_with_two_shadows_in_a_host_function_is_refused_before_it_runs():
    ran = []

    def g(a, b):
        ran.append(True)
        return tg.dot(a, b)

    x = rng.random(N)
    with pytest.raises(tg.TapegradError, match="one shadow"):
        tg.autodiff(tg.Reverse, g, tg.Active, tg.Duplicated(x, np.zeros(N)),
                    tg.Duplicated(x, np.zeros(N)))
    assert not ran


def test_the_source_of_a_merged_launch_is_shown_for_the_kernel():
    z, y = np.arange(4.0), np.zeros(4)
    write_then_read(CPU, 4)(y, z, z, ndrange=4)
    source = write_then_read.source("primal", CPU)
    assert "def write_then_read(Y, Z, _n0" in source and "X[np.uint64" not in source
    merged, plain = "def write_then_read(Y, Z, _n0", "def write_then_read(Y, Z, X, _n0"
    write_then_read(CPU, 4)(y, z, z.copy(), ndrange=4)       # the last launch is shown
    assert plain in write_then_read.source("primal", CPU)
    write_then_read(CPU, 4)(y, z, z, ndrange=4)              # (compiled before: cached)
    assert merged in write_then_read.source("primal", CPU)
    for _ in range(2):   # a tape finds two views of one memory after looking the kernel up
        with tg.Tape():
            write_then_read(CPU, 4)(y, z, z[:], ndrange=4)
        assert merged in write_then_read.source("primal", CPU)


def test_two_views_of_one_array_on_a_tape_are_one_array():
    def f(x):
        z, y = tg.copy(x), np.zeros(N)
        write_then_read(CPU, 4)(y, z, z[:], ndrange=N)   # z[:] is another object, same memory
        return tg.dot(y, W) + tg.dot(z, W)

    x = rng.random(N)
    (g,) = tg.gradient(f, x.copy())
    np.testing.assert_allclose(g, fd(written_then_read_through_another_parameter, x),
                               rtol=1e-7, atol=1e-9)


@tg.kernel
def double_then_add_square(Z, X):
    i = tg.index()
    Z[i] = 2.0 * X[i]
    b = X[i]                                 # through the other parameter: Z's new value
    Z[i] = Z[i] + b * b


def test_two_views_as_the_only_two_arrays_on_a_tape_are_one_array():
    """(a launch of two array parameters takes the tape's short way to the same check)"""
    def f(x):
        z = tg.copy(x)
        double_then_add_square(CPU, 4)(z, z[:], ndrange=N)     # z = 2x + (2x)^2
        return tg.dot(z, W)

    x = rng.random(N)
    (g,) = tg.gradient(f, x.copy())
    np.testing.assert_allclose(g, (2 + 8 * x) * W, rtol=1e-12)


def test_backends_agree(backend, size):
    """Merging one array's parameters on every backend."""
    n = size(N, 8)
    x0, w = rng.random(n), rng.standard_normal(n)
    z, y = tg.asarray(backend, np.arange(n, dtype=np.float64)), tg.asarray(backend, np.zeros(n))
    write_then_read(backend, 4)(y, z, z, ndrange=n)
    np.testing.assert_array_equal(tg.to_numpy(y), (2.0 * np.arange(n)) ** 2)
    x, out = tg.asarray(backend, x0), tg.asarray(backend, np.zeros(n))
    dx, seed = tg.asarray(backend, np.zeros(n)), tg.asarray(backend, w)
    tg.autodiff(tg.Reverse, axpy(backend, 4), tg.Const, tg.Duplicated(out, seed), 0.5,
                tg.Duplicated(x, dx), tg.Duplicated(x, dx), ndrange=n)
    np.testing.assert_allclose(tg.to_numpy(dx), 1.5 * w, rtol=1e-12)
    np.testing.assert_allclose(tg.to_numpy(out), 1.5 * x0, rtol=1e-12)


def test_kernel_autodiff_of_two_views_of_one_array():
    z0 = np.arange(N, dtype=np.float64)
    z, y, dz, dy = z0.copy(), np.zeros(N), np.zeros(N), W.copy()
    tg.autodiff(tg.Reverse, write_then_read(CPU, 4), tg.Const, tg.Duplicated(y, dy),
                tg.Duplicated(z, dz), tg.Duplicated(z[:], dz), ndrange=N)
    np.testing.assert_array_equal(y, (2.0 * z0) ** 2)      # the primal saw one array
    np.testing.assert_allclose(dz, 8.0 * z0 * W, rtol=1e-12)   # d(4 z0^2)/dz0 . W


def test_interleaved_shadows_share_no_element_and_are_accepted():
    x, y, z = rng.random(N), rng.random(N), np.empty(N)
    buf = np.zeros(2 * N)
    for accumulate in (True, False):
        buf[:] = 0.0
        tg.autodiff(tg.Reverse, axpy(CPU, 4), tg.Const, tg.DuplicatedNoNeed(z, W.copy()), 0.25,
                    tg.Duplicated(x, buf[0::2]), tg.Duplicated(y, buf[1::2]), ndrange=N,
                    accumulate=accumulate)
        np.testing.assert_allclose(buf[0::2], 0.25 * W, rtol=1e-12)
        np.testing.assert_allclose(buf[1::2], W, rtol=1e-12)
