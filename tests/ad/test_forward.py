"""Forward mode: tangents against finite differences, closed forms, and reverse mode
(the dot-product test <J v, w> = <v, J^T w>)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tapegrad.lang.intrinsics import BINARY_MATH, TERNARY_MATH, UNARY_MATH
from tests.ad.gradcheck import tangent_adjoint_products
from tests.ad.test_random_kernels import kernels, load_kernel
from tests.ad.test_reverse import TILE, all_binary, all_unary, loops, matmul, mul, square

rng = np.random.default_rng(3)
CPU = tg.CPU()


def r(*shape, lo=0.1, hi=0.9):
    return rng.uniform(lo, hi, shape)


def forward_vs_fd(cfg, args, ndrange, wrt, outputs, eps=1e-6):
    """Tangents of the outputs along a random direction against central differences."""
    dirs = {k: rng.standard_normal(np.shape(args[k])) for k in wrt}
    values = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    tangents = {k: np.zeros_like(args[k]) for k in outputs}
    annotated = []
    for k, x in enumerate(values):
        if k in wrt:
            annotated.append(tg.Duplicated(x, dirs[k].copy()))
        elif k in outputs:
            annotated.append(tg.Duplicated(x, tangents[k]))
        else:
            annotated.append(x)
    assert tg.autodiff(tg.Forward, cfg, tg.Const, *annotated, ndrange=ndrange) == ()

    def run(step):
        vals = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        for k in wrt:
            vals[k] = vals[k] + step * dirs[k]
        cfg(*vals, ndrange=ndrange)
        return vals

    plus, minus = run(eps), run(-eps)
    for k in outputs:
        fd = (plus[k] - minus[k]) / (2 * eps)
        np.testing.assert_allclose(tangents[k], fd, rtol=1e-5, atol=1e-7)


def test_every_unary_rule_forward():
    forward_vs_fd(all_unary(CPU, 4), [np.zeros((6, 25)), r(6)], 6, wrt=[1], outputs=[0])


def test_every_binary_rule_forward():
    forward_vs_fd(all_binary(CPU, 4), [np.zeros((7, 9)), r(7), r(7)], 7, wrt=[1, 2],
                  outputs=[0])


def test_loops_and_branches_forward():
    forward_vs_fd(loops(CPU, 4), [np.zeros(6), r(6), 5], 6, wrt=[1], outputs=[0])


def test_tiled_matmul_forward_closed_form():
    A, B = r(8, 8), r(8, 4)
    dA, dB = r(8, 8), r(8, 4)
    C, dC = np.zeros((8, 4)), np.zeros((8, 4))
    tg.autodiff(tg.Forward, matmul(CPU, (TILE, TILE)), tg.Const, tg.Duplicated(C, dC),
                tg.Duplicated(A, dA), tg.Duplicated(B, dB), ndrange=(8, 4))
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)
    np.testing.assert_allclose(dC, dA @ B + A @ dB, rtol=1e-12)


def test_square_in_place_forward():
    # KernelAbstractions' square! in forward mode: dA <- 2 A dA, using A before the overwrite
    A = np.arange(1.0, 65.0)
    dA = np.ones(64)
    tg.autodiff(tg.Forward, square(CPU, 16), tg.Const, tg.Duplicated(A, dA), ndrange=64)
    np.testing.assert_allclose(dA, 2 * np.arange(1.0, 65.0))
    assert "A_dot[i] =" in square.source(mode="forward").replace("  ", " ")


def test_batched_seeds_one_and_three():
    # CUDA.jl's batched forward test: seeds 1 and 3 in one launch
    A = np.zeros(64)
    B = np.arange(1.0, 65.0)
    dA1, dA3 = np.zeros(64), np.zeros(64)
    tg.autodiff(tg.Forward, mul(CPU, 8), tg.Const, tg.BatchDuplicated(A, (dA1, dA3)), B,
                tg.BatchDuplicated(2.0, (1.0, 3.0)), ndrange=64)
    np.testing.assert_allclose(A, 2 * B)
    np.testing.assert_allclose(dA1, B)
    np.testing.assert_allclose(dA3, 3 * B)
    src = mul.source(mode="forward")
    assert "A_dot0" in src and "A_dot1" in src and "s_dot1" in src


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(kernels(), st.integers(0, 2 ** 32 - 1))
def test_random_kernels_dot_product_test(tmp_path, kernel, seed):
    """<J v, w> == <v, J^T w> on generated kernels: forward and reverse checked together."""
    source, trips = kernel
    k = load_kernel(source, tmp_path)
    g = np.random.default_rng(seed)
    A, B = g.uniform(-1, 1, 5), g.uniform(-1, 1, 5)
    lhs, rhs = tangent_adjoint_products(k(CPU, 4), A, B, trips, seed + 1)
    assert lhs == pytest.approx(rhs, rel=1e-9, abs=1e-11), source


# -- host functions ------------------------------------------------------------------------

@tg.kernel
def sin_times(B, A, s):
    i = tg.index()
    B[i] = math.sin(A[i]) * s


def program(A, s):
    B = np.zeros_like(A)
    sin_times(CPU)(B, A, s, ndrange=A.size)
    C = np.zeros_like(A)
    sin_times(CPU)(C, B, 2.0, ndrange=A.size)
    return tg.dot(C, B) + tg.norm(A) * s


def test_jvp_matches_reverse_gradient():
    A, v = r(7), rng.standard_normal(7)
    y, y_dot = tg.jvp(lambda a: program(a, 1.3), A, v)
    (g,) = tg.gradient(lambda a: program(a, 1.3), A)
    assert y == pytest.approx(float(program(A, 1.3)))
    assert y_dot == pytest.approx(float(g @ v), rel=1e-10)


def test_forward_with_scalar_direction():
    A = r(5)
    (ds,) = tg.autodiff(tg.Forward, program, tg.Duplicated, A, tg.Duplicated(0.7, 1.0))
    (derivs,) = tg.autodiff(tg.Reverse, program, tg.Active, A, tg.Active(0.7))
    assert ds == pytest.approx(derivs[1], rel=1e-10)


def test_forward_jacobian_equals_reverse_jacobian():
    x = r(11)

    def f(x):
        y = np.zeros_like(x)
        sin_times(CPU)(y, x, 1.5, ndrange=x.size)
        return y

    Jf = tg.jacobian(f, x, mode=tg.Forward)        # in chunks of 8 directions
    Jr = tg.jacobian(f, x, mode=tg.Reverse)
    assert Jf.shape == (11, 11)
    np.testing.assert_allclose(Jf, Jr, rtol=1e-12)
    np.testing.assert_allclose(np.diag(Jf), 1.5 * np.cos(x), rtol=1e-12)


def test_forward_with_primal_returns_the_value():
    A = r(4)
    tangent, value = tg.autodiff(tg.ForwardWithPrimal, program, tg.Duplicated,
                                 tg.Duplicated(A, np.ones(4)), 0.5)
    assert value == pytest.approx(float(program(A, 0.5)))


def test_active_in_forward_mode_says_to_use_duplicated():
    with pytest.raises(tg.TapegradError, match="tg.Duplicated"):
        tg.autodiff(tg.Forward, program, tg.Duplicated, r(3), tg.Active(0.5))


@tg.kernel
def histogram_weights(H, bins, w):
    i = tg.index()
    tg.atomic_add(H, bins[i], w[i] * w[i])


def test_atomics_and_local_memory_reductions_forward():
    from tests.ad.test_reverse import block_sum_of_squares
    forward_vs_fd(block_sum_of_squares(CPU, 8), [np.zeros(4), r(32)], 32, wrt=[1], outputs=[0])
    bins = rng.integers(0, 3, 40).astype(np.int64)
    w = r(40)
    H, dH = np.zeros(3), np.zeros(3)
    dw = rng.standard_normal(40)
    tg.autodiff(tg.Forward, histogram_weights(CPU, 8), tg.Const, tg.Duplicated(H, dH), bins,
                tg.Duplicated(w, dw), ndrange=40)
    np.testing.assert_allclose(dH, np.bincount(bins, 2 * w * dw, minlength=3), rtol=1e-12)
    assert "atomic_add(H_dot" in histogram_weights.source(mode="forward", backend=CPU)


@tg.kernel
def compacted_squares(B, count, A):
    i = tg.index()
    slot = tg.atomic_add(count, 0, 1)        # a counter without a derivative: a constant
    B[slot] = A[i] * A[i]


@tg.kernel
def reads_the_old_element(B, out, c):
    i = tg.index()
    old = tg.atomic_add(out, i, c[i])
    B[i] = old * old


def test_the_value_an_atomic_returns_from_a_differentiated_array_is_refused(backend):
    """(Forward mode gave it a zero tangent: dB was 0 for 2 out dout; reverse mode refused it.)"""
    A = np.array([0.3, 0.5, 0.7, 0.9])
    count, B, dB = np.zeros(1, np.int64), np.zeros(4), np.zeros(4)
    tg.autodiff(tg.Forward, compacted_squares(backend, 2), tg.Const, tg.Duplicated(B, dB),
                count, tg.Duplicated(A, np.ones(4)), ndrange=4)
    np.testing.assert_allclose(np.sort(B), A * A, rtol=1e-15)      # (slots in any order)
    np.testing.assert_allclose(dB, 2 * np.sqrt(B), rtol=1e-12)     # d(a^2) = 2a at da = 1
    out, dout, B = np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4), np.zeros(4)
    with pytest.raises(tg.KernelError, match="value returned by an atomic") as info:
        tg.autodiff(tg.Forward, reads_the_old_element(backend, 2), tg.Const,
                    tg.Duplicated(B, np.zeros(4)), tg.Duplicated(out, dout), np.full(4, 0.5),
                    ndrange=4)
    assert info.value.text.strip() == "old = tg.atomic_add(out, i, c[i])"     # (the user's line)
    assert (out == [1.0, 2.0, 3.0, 4.0]).all() and not B.any()


@tg.kernel
def left_neighbours_sine(B, A):
    i = tg.index()
    B[i] = tg.where(i > 0, math.sin(A[i - 1]), 0.0)


def test_a_load_in_a_branch_of_where_stays_in_its_branch(backend):
    """(Forward mode loaded A[i - 1] before the where, so at i = 0 it read before A: the
    memory before the buffer on a GPU.)"""
    A, B, dB = np.linspace(0.0, 1.0, 6), np.zeros(6), np.zeros(6)
    dA = rng.standard_normal(6)
    tg.autodiff(tg.Forward, left_neighbours_sine(backend, 2), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=6)
    np.testing.assert_allclose(dB, np.r_[0.0, np.cos(A[:-1]) * dA[:-1]], rtol=1e-12)
    source = left_neighbours_sine.source(mode="forward", backend=tg.CPU())
    reads = [line for line in source.splitlines()
             if "A[" in line and "i - 1" in line and not line.lstrip().startswith("#")]
    assert reads and all("if i > 0 else" in line for line in reads), reads


def test_numpy_functions_and_numpy_scalars_on_host_scalars_in_both_modes():
    """np.exp(tg.mean(x)) keeps its tangent in forward mode (it was dropped); NumPy numbers
    meeting a scalar that carries a derivative are refused in both modes, on either side of
    an operator (one computed from a differentiated array, np.sum(x), would lose its
    derivative: forward mode gave half the tangent of tg.sum(x) * np.sum(x); on the left it
    recursed without end before), and the same constants as Python floats work."""
    x, v = r(4) + 0.5, rng.standard_normal(4)
    w = r(4)

    def f(x, number=np.float64):
        m = tg.mean(x)
        return (np.exp(m) + np.sin(m) * np.sqrt(m) + np.abs(-m) + np.log(m)
                + number(1.5) - tg.sum(x) + number(np.sum(w)) * tg.dot(x, x)
                + number(2.0) / tg.dot(x, x) + number(0.5) ** m)

    for call in (lambda: tg.jvp(f, x, v), lambda: tg.gradient(f, x),
                 lambda: tg.jvp(lambda x: tg.sum(x) * np.sum(x), x, v),
                 lambda: tg.hvp(lambda x: tg.sum(x) * np.sum(x), x, v)):
        with pytest.raises(tg.TapegradError, match="NumPy number"):
            call()
    _both_modes_match_differences(lambda x: f(x, float), x, v, rel=1e-7)


def _both_modes_match_differences(f, x, v, rel):
    """Forward mode's directional derivative of the scalar ``f`` at ``x`` along ``v`` and the
    tape's gradient dotted with ``v`` both match float64 central differences."""
    y, y_dot = tg.jvp(f, x, v)
    (g,) = tg.gradient(f, x)
    h = 1e-6
    fd = (float(f(x + h * v)) - float(f(x - h * v))) / (2 * h)
    assert y == pytest.approx(float(f(x)))
    assert y_dot == pytest.approx(fd, rel=rel)
    assert float(g @ v) == pytest.approx(fd, rel=rel)


@pytest.mark.parametrize("f", [
    np.sqrt, np.exp, np.log, np.log2, np.log10, np.sin, np.cos, np.tan, np.arcsin, np.arccos,
    np.arctan, np.sinh, np.cosh, np.tanh, np.arcsinh, np.arctanh, np.expm1, np.log1p,
    np.absolute, np.fabs, lambda m: np.arccosh(1.0 + m), lambda m: np.hypot(m, 0.3),
    lambda m: np.hypot(0.3, m), lambda m: np.arctan2(m, 0.7), lambda m: np.arctan2(0.7, m),
    lambda m: np.copysign(m, -1.0), lambda m: np.fmod(3.0, m), lambda m: np.hypot(m, m * m),
    np.cbrt, np.exp2, lambda m: np.logaddexp(m, 0.2), lambda m: np.logaddexp(0.2, m),
    lambda m: m + np.floor(2.0 * m) + np.isnan(m)],
    ids=lambda f: getattr(f, "__name__", "f"))
def test_numpy_ufuncs_of_host_scalars_in_both_modes(f):
    """Every NumPy ufunc with a derivative rule, on a scalar from tg.mean: forward mode and
    the tape against float64 central differences (np.hypot and np.arctan2 were refused)."""
    x, v = r(4) * 0.1 + 0.5, rng.standard_normal(4)

    _both_modes_match_differences(lambda x: f(tg.mean(x)), x, v, rel=1e-6)


@pytest.mark.parametrize("expr", [lambda s: np.zeros(3) + s, lambda s: s + np.ones(3),
                                  lambda s: s * np.ones(3), lambda s: np.ones(3) / s,
                                  lambda s: s - np.ones(3), lambda s: np.ones(3) ** s])
def test_numpy_arithmetic_of_an_array_and_a_host_scalar_is_refused_in_both_modes(expr):
    """The result is an array NumPy computed, which no tape or tangent follows: refused with
    what to do (np.zeros(3) + s recursed without end; s + np.ones(3) raised a bare TypeError)."""
    x = r(3)
    with pytest.raises(tg.TapegradError, match="NumPy arithmetic on arrays is not recorded"):
        tg.gradient(lambda x: tg.sum(expr(tg.sum(x))), x)
    with pytest.raises(tg.TapegradError, match="NumPy arithmetic on arrays is not recorded"):
        tg.jvp(lambda x: expr(tg.sum(x)), x, np.ones(3))


@tg.kernel
def polynomial(B, A, C):
    i = tg.index()
    acc = 0.0
    for k in range(3):
        acc += C[k] * A[i] ** k          # the k = 0 term at A = 0: 0 ** -1 in the plain rule
    B[i] = acc


@tg.kernel
def power_of(C, A, E):
    i = tg.index()
    C[i] = A[i] ** E[i]


def test_power_derivatives_are_finite_where_the_derivative_is():
    """x ** k with an integer k running from 0, and x ** y at x <= 0: both modes agree with
    the closed form (they gave NaN, which tg.pow's rule already avoided)."""
    a, c = np.array([0.0, 0.5, -1.0]), np.array([1.0, 2.0, 3.0])
    expected = c[1] + 2.0 * c[2] * a
    db = np.zeros(3)
    tg.autodiff(tg.Forward, polynomial(CPU), tg.Const, tg.Duplicated(np.zeros(3), db),
                tg.Duplicated(a, np.ones(3)), c, ndrange=3)
    da = np.zeros(3)
    tg.autodiff(tg.Reverse, polynomial(CPU), tg.Const, tg.Duplicated(np.zeros(3), np.ones(3)),
                tg.Duplicated(a, da), c, ndrange=3)
    np.testing.assert_allclose(db, expected, rtol=1e-12)
    np.testing.assert_allclose(da, expected, rtol=1e-12)
    a, e = np.array([-2.0, 0.0, 1.5]), np.array([2.0, 2.0, 2.0])
    dc = np.zeros(3)
    tg.autodiff(tg.Forward, power_of(CPU), tg.Const, tg.Duplicated(np.zeros(3), dc),
                tg.Duplicated(a, np.ones(3)), tg.Duplicated(e, np.zeros(3)), ndrange=3)
    np.testing.assert_allclose(dc, e * a ** (e - 1), rtol=1e-12)
    da, de = np.zeros(3), np.zeros(3)
    tg.autodiff(tg.Reverse, power_of(CPU), tg.Const, tg.Duplicated(np.zeros(3), np.ones(3)),
                tg.Duplicated(a, da), tg.Duplicated(e, de), ndrange=3)
    np.testing.assert_allclose(da, e * a ** (e - 1), rtol=1e-12)
    assert np.isfinite(de).all() and de[2] == pytest.approx(1.5 ** 2 * np.log(1.5))


@tg.kernel
def half_square_in_place(X):
    i = tg.index()
    X[i] = X[i] * X[i] * 0.5


def test_forward_jacobian_and_jvp_of_a_function_that_changes_its_input():
    """The forward Jacobian runs f once per 8 directions: each run starts from the input as
    given (the later ones ran on the changed x); jvp leaves the caller's v alone."""
    def f(x):
        half_square_in_place(CPU)(x, ndrange=x.size)
        return x

    x0 = np.linspace(0.1, 1.0, 12)
    x = x0.copy()
    J = tg.jacobian(f, x, mode=tg.Forward)
    np.testing.assert_allclose(J, np.diag(x0), rtol=1e-12)
    np.testing.assert_allclose(x, 0.5 * x0 * x0, rtol=1e-12)   # changed once, as in reverse
    v = np.ones(4)
    y, y_dot = tg.jvp(f, np.linspace(0.1, 1.0, 4), v)
    np.testing.assert_array_equal(v, 1.0)
    np.testing.assert_allclose(y_dot, np.linspace(0.1, 1.0, 4), rtol=1e-12)


def test_remainder_of_host_scalars_keeps_its_derivative_in_both_modes():
    """(float's own % returned a plain float: the derivative was dropped silently)"""
    x, v = r(3) + 1.0, rng.standard_normal(3)

    def f(x):
        s, d = tg.sum(x), tg.dot(x, x)
        return s % 1.5 + 7.25 % s + d % s

    y, y_dot = tg.jvp(f, x, v)
    (g,) = tg.gradient(f, x)
    h = 1e-7
    fd = (float(f(x + h * v)) - float(f(x - h * v))) / (2 * h)
    assert y_dot == pytest.approx(fd, rel=1e-6)
    assert float(g @ v) == pytest.approx(fd, rel=1e-6)


@tg.kernel
def copy_kernel(B, A):
    i = tg.index()
    B[i] = A[i]


def test_a_view_of_an_array_with_a_tangent_is_refused_in_forward_mode():
    """(the view carried no tangent: a kernel given x[1:] got a zero derivative silently)"""
    def f(x):
        b = np.zeros(x.size - 1)
        copy_kernel(CPU)(b, x[1:], ndrange=b.size)
        return tg.sum(b)

    with pytest.raises(tg.TapegradError, match="shares memory with an array of shape"):
        tg.jvp(f, r(5), np.ones(5))
    with pytest.raises(tg.TapegradError, match="forward mode follows whole arrays"):
        tg.jvp(lambda x: tg.sum(x.T), r(2, 3), np.ones((2, 3)))
    # arrays that merely exist next to it are fine
    y, y_dot = tg.jvp(lambda x: tg.sum(x) + tg.sum(np.ones(3)), r(4), np.ones(4))
    assert y_dot == pytest.approx(4.0)


@tg.kernel
def scaled(B, A, s):
    i = tg.index()
    B[i] = A[i] * s


def test_float_of_a_host_scalar_is_refused_while_differentiating_in_both_modes():
    """float(tg.sum(x)) passed to a kernel dropped the tangent: jvp gave half the derivative
    silently. The scalar itself passed to the kernel keeps it; float() of a reduction of
    arrays without tangents (a constant) and of the result after the run still work."""
    def through_float(x):
        B = np.zeros_like(x)
        scaled(CPU)(B, x, float(tg.sum(x)), ndrange=x.size)
        return tg.sum(B)

    def kept(x):
        B = np.zeros_like(x)
        scaled(CPU)(B, x, tg.sum(x) * float(tg.sum(np.ones(2))), ndrange=x.size)
        return tg.sum(B)

    x, v = r(3), rng.standard_normal(3)
    for run in (lambda: tg.jvp(through_float, x, v),
                lambda: tg.autodiff(tg.Forward, through_float, tg.Duplicated,
                                    tg.Duplicated(x, v.copy())),
                lambda: tg.jacobian(through_float, x, mode=tg.Forward)):
        with pytest.raises(tg.TapegradError, match=r"float\(\) of a forward-mode scalar .* "
                                                   r"would drop its tangent.*compute it outside"):
            run()
    with pytest.raises(tg.TapegradError, match=r"float\(\) of a tape scalar .* would drop its "
                                               r"derivative.*after the recording ends"):
        tg.gradient(through_float, x)       # reverse mode: the same, while the tape records
    with tg.Tape():
        s = tg.sum(x)
    assert float(s) == pytest.approx(x.sum())      # after the recording: its value
    y, y_dot = tg.jvp(kept, x, v)
    h = 1e-6
    fd = (float(kept(x + h * v)) - float(kept(x - h * v))) / (2 * h)   # 2 (sum x)^2
    assert y == pytest.approx(2.0 * x.sum() ** 2, rel=1e-12)
    assert y_dot == pytest.approx(fd, rel=1e-7)
    def kept_reverse(x):     # a tape cannot tell a constant reduction while it records
        B = np.zeros_like(x)
        scaled(CPU)(B, x, tg.sum(x) * float(np.sum(np.ones(2))), ndrange=x.size)
        return tg.sum(B)

    assert y_dot == pytest.approx(float(tg.gradient(kept_reverse, x)[0] @ v), rel=1e-10)
    assert type(y) is float
    kept_scalars = []
    tg.jvp(lambda x: kept_scalars.append(tg.sum(x)) or kept_scalars[0], x, v)
    assert float(kept_scalars[0]) == pytest.approx(x.sum())   # forward mode has ended


def _host_math_case(name):
    """``x -> tg.<name>(...)`` of scalars computed from x, inside each function's domain
    (u in (0.1, 0.9), w in (0.03, 2.5)), plus the derivative the piecewise-constant ones have
    (zero): f adds u, so its derivative is u's."""
    if name in ("floor", "ceil", "trunc", "isnan", "isinf", "isfinite"):
        return lambda x: tg.mean(x) + getattr(tg, name)(3.0 * tg.mean(x))
    unary_arg = {"acosh": lambda u, w: 1.5 + u, "log": lambda u, w: w}
    binary_args = {"pow": lambda u, w: (w, u), "fmod": lambda u, w: (1.0 + w, u),
                   "copysign": lambda u, w: (u, -w)}
    fn = getattr(tg, name)

    def f(x):
        u, w = tg.mean(x), tg.dot(x, x)
        if name in BINARY_MATH:
            return fn(*binary_args.get(name, lambda u, w: (u, w))(u, w))
        if name in TERNARY_MATH:
            return fn(u, w, u * w)
        return fn(unary_arg.get(name, lambda u, w: u)(u, w))

    return f



@pytest.mark.parametrize("name", UNARY_MATH + BINARY_MATH + TERNARY_MATH)
def test_every_host_math_function_of_scalars_in_both_modes(name):
    """Forward mode had no rule for tg.hypot, atan2, copysign, fmod, asinh, acosh, atanh, erfc
    (an error), reverse mode none for most of those; checked against float64 central
    differences and each mode against the other."""
    f = _host_math_case(name)
    x, v = r(3), rng.standard_normal(3)
    y, y_dot = tg.jvp(f, x, v)
    (g,) = tg.gradient(f, x)
    h = 1e-6
    fd = (float(f(x + h * v)) - float(f(x - h * v))) / (2 * h)
    assert y == pytest.approx(float(f(x)), rel=1e-14)
    assert y_dot == pytest.approx(fd, rel=1e-6, abs=1e-9)
    assert float(g @ v) == pytest.approx(y_dot, rel=1e-10, abs=1e-12)


def test_hypot_of_host_scalars_with_a_constant_and_in_batches():
    """tangent of hypot(a, b) = (a da + b db) / hypot(a, b), a constant on either side; the
    forward Jacobian (8 directions per run) against the reverse one and the closed form."""
    def f(x):
        s, d = tg.sum(x), tg.dot(x, x)
        return tg.hypot(s, d) + tg.hypot(2.0, s) + 3.0 * tg.hypot(d, 0.5)

    x = r(10)
    s, d = x.sum(), x @ x
    ds, dd = np.ones(10), 2 * x
    expected = ((s * ds + d * dd) / math.hypot(s, d) + s * ds / math.hypot(2.0, s)
                + 3.0 * d * dd / math.hypot(d, 0.5))
    Jf = tg.jacobian(f, x, mode=tg.Forward)
    np.testing.assert_allclose(Jf, tg.jacobian(f, x, mode=tg.Reverse), rtol=1e-12)
    np.testing.assert_allclose(Jf[0], expected, rtol=1e-12)
    # at hypot(0, 0) there is no derivative: 0 in both modes (reverse mode divided by zero)
    g = lambda x: tg.hypot(0.0 * tg.sum(x), 0.0 * tg.sum(x)) + tg.sum(x)   # noqa: E731
    v = rng.standard_normal(10)
    assert tg.jvp(g, x, v)[1] == pytest.approx(v.sum(), rel=1e-12)
    np.testing.assert_allclose(tg.gradient(g, x)[0], np.ones(10), rtol=1e-12)


def test_nested_forward_mode_is_refused_with_what_to_do():
    """tg.jvp inside tg.jvp said 'cannot run inside a recording tg.Tape' (there was none); a
    kernel's tg.autodiff(tg.Forward, ...) inside tg.jvp gave a zero derivative silently."""
    x, v = r(3), np.ones(3)

    def kernel_forward(x):
        B, dB = np.zeros_like(x), np.zeros_like(x)
        tg.autodiff(tg.Forward, sin_times(CPU), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(x, np.ones_like(x)), 2.0, ndrange=x.size)
        return tg.sum(B)

    nested = [lambda x: tg.jvp(lambda y: tg.dot(y, y), x, v)[1] * tg.sum(x),
              lambda x: tg.jvp(lambda s: s * s, tg.sum(x), 1.0)[1],     # an outer dual scalar
              lambda x: tg.sum(tg.jacobian(lambda y: y, x, mode=tg.Forward)) * tg.sum(x),
              kernel_forward]
    for f in nested:
        with pytest.raises(tg.TapegradError, match="nested forward mode is not supported") as e:
            tg.jvp(f, x, v)
        assert "tg.jacobian" in str(e.value) and "tape" not in str(e.value)
    # the refusal leaves forward mode off: the next run works
    y, y_dot = tg.jvp(lambda x: tg.dot(x, x), x, v)
    assert y_dot == pytest.approx(2 * x.sum())


def test_host_scalars_reach_kernel_level_autodiff_and_the_apis_inside_a_recording():
    """A scalar from tg.sum passed to a kernel-level tg.autodiff while its tape records (or
    inside tg.jvp) is used by value: the library's own conversions do not count as the
    user's float() (they raised a bare TypeError or the float() refusal). Inside tg.jvp the
    primal launch still carries its tangent."""
    x = np.array([1.0, 2.0, 3.0])
    A = np.array([1.0, 2.0])
    for mode in (tg.Reverse, tg.Forward):
        dA, B, dB = (np.ones(2), np.zeros(2), np.zeros(2)) if mode is tg.Forward else \
            (np.zeros(2), np.zeros(2), np.ones(2))
        with tg.Tape():
            s = tg.sum(x)
            tg.autodiff(mode, scaled(CPU), tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA),
                        s, ndrange=2)
        np.testing.assert_allclose(dB if mode is tg.Forward else dA, [6.0, 6.0], rtol=1e-12)

    def through_kernel_autodiff(x):
        B, dB = np.zeros(2), np.ones(2)
        tg.autodiff(tg.Reverse, scaled(CPU), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(A.copy(), np.zeros(2)), tg.sum(x), ndrange=2)
        return tg.sum(B)             # B = A * sum(x)

    y, y_dot = tg.jvp(through_kernel_autodiff, x, np.ones(3))
    assert (y, y_dot) == pytest.approx((18.0, 9.0), rel=1e-12)

    def f(s):
        B = np.zeros(2)
        scaled(CPU)(B, A, s, ndrange=2)
        return tg.sum(B)

    # a host function's reverse mode inside a recording is refused: its result would be a
    # constant to the recording tape (a gradient penalty lost its second-order terms)
    for call in (lambda s: tg.autodiff(tg.Reverse, f, tg.Active, tg.Active(s)),
                 lambda s: tg.vjp(lambda y: tg.dot(y, y), x, s),
                 lambda s: tg.gradient(lambda y: tg.dot(y, y) * s, x)):
        with tg.Tape(), pytest.raises(tg.TapegradError, match="while a tape records"):
            call(tg.sum(x))
    assert tg.autodiff(tg.Reverse, f, tg.Active, tg.Active(6.0)) == ((3.0,),)
    y, x_bar = tg.vjp(lambda y: tg.dot(y, y), x, 6.0)      # (outside: the weight by value)
    assert y == pytest.approx(14.0)
    np.testing.assert_allclose(x_bar, 2 * x * 6.0, rtol=1e-12)


@tg.kernel
def squared(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


def test_a_registered_function_that_launches_kernels_counts_once_in_both_modes():
    """The rule runs outside the caller's forward mode (it gets plain values and tangents), so
    nested forward mode is not refused there."""
    def fn(A):
        B = np.zeros_like(A)
        squared(CPU)(B, A, ndrange=A.size)
        return B

    def forward(A, dA):
        B, dB = np.zeros_like(A), np.zeros_like(A)
        tg.autodiff(tg.Forward, squared(CPU), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(A, dA.copy()), ndrange=A.size)
        return dB

    op = tg.register_adjoint(fn, reverse=lambda B_bar, A: 2 * A * B_bar, forward=forward)
    x, v = np.array([1.0, 2.0, 3.0]), np.array([1.0, 0.5, 0.25])
    y, y_dot = tg.jvp(lambda x: tg.sum(op(x)), x, v)
    assert (y, y_dot) == pytest.approx(((x * x).sum(), (2 * x * v).sum()), rel=1e-12)
    # fn's own launch is not recorded as well: the rule stands for it (it counted twice: 4 x)
    np.testing.assert_allclose(tg.gradient(lambda x: tg.sum(op(x)), x)[0], 2 * x, rtol=1e-12)


@pytest.mark.parametrize("f, value, derivative", [
    (lambda s: tg.acosh(s), 0.0, math.inf), (lambda s: np.arcsin(s), math.pi / 2, math.inf),
    (lambda s: np.arccos(s), 0.0, -math.inf), (lambda s: np.arctanh(s), math.inf, math.inf),
    (lambda s: np.log10(s - 1.0), -math.inf, math.inf),
    (lambda s: np.fmod(s, 0.0), math.nan, 1.0)])
def test_host_math_at_the_edge_of_its_domain_gives_ieee_values_in_both_modes(f, value,
                                                                          derivative):
    """At s = 1: inf and nan as NumPy and the kernels give them (a ZeroDivisionError or a
    math domain error before)."""
    x = np.array([0.25, 0.75])
    y, y_dot = tg.jvp(lambda x: f(tg.sum(x)), x, np.array([1.0, 0.0]))
    (g,) = tg.gradient(lambda x: f(tg.sum(x)), x)
    np.testing.assert_equal([y, y_dot, g[0]], [value, derivative, derivative])


@pytest.mark.parametrize("expr", [
    lambda s: np.float64(0.25) < s, lambda s: np.float32(2.0) > s, lambda s: np.float64(0.5) == s])
def test_numpy_scalar_comparisons_with_host_scalars(expr):
    x = np.array([0.25, 0.25])
    with tg.Tape():
        assert expr(tg.sum(x))
    # (a float of a comparison carries no tangent: returned alone, refused, as tg.gradient)
    assert tg.jvp(lambda x: tg.sum(x) * float(expr(tg.sum(x))), x, np.ones(2)) == (0.5, 2.0)


@pytest.mark.parametrize("f, numpy_operand", [
    (lambda s: np.float64(2.0) % s, True), (lambda s: np.square(s), False),
    (lambda s: np.array(2.0) + s * np.array(3.0), True), (lambda s: np.array(2.0) ** s, True)])
def test_numpy_operators_of_host_scalars_with_numpy_scalars_and_0d_arrays(f, numpy_operand):
    """NumPy's ufuncs of a scalar alone are differentiated in both modes (against central
    differences); NumPy numbers in arithmetic are refused in both (docs/tape.md: one computed
    from a differentiated array would lose its derivative), on either side of the operator
    (on the left it recursed without end in forward mode)."""
    x, v = np.array([0.3, 0.4]), np.array([1.0, -0.5])
    if numpy_operand:
        for call in (tg.gradient, lambda f, x: tg.jvp(f, x, v)):
            with pytest.raises(tg.TapegradError, match="NumPy number"):
                call(lambda x: f(tg.sum(x)), x)
    else:
        _both_modes_match_differences(lambda x: f(tg.sum(x)), x, v, rel=1e-6)


@tg.kernel
def sine_and_pick(Y, X, Z, idx, c):
    i = tg.index()
    Y[i] = math.sin(X[i]) + (Z[idx[i]] if c > 0.0 else X[i])


def test_a_store_and_its_tangent_read_each_element_once():
    """(forward.py, shared_loads: cos(X[i]) beside sin(X[i]) reads X[i] once, and sin and cos
    are computed before the tangent's store, so that the compiler computes their shared
    argument reduction once; a load in one branch of an ``if`` expression stays there, where
    its index may be out of range on the other)"""
    n = 64
    X, dX = r(n), rng.standard_normal(n)
    Z, dZ = r(4), rng.standard_normal(4)
    for c, idx in ((1.0, rng.integers(0, 4, n)), (-1.0, np.full(n, 10**6))):
        Y, dY = np.empty(n), np.empty(n)
        tg.autodiff(tg.Forward, sine_and_pick(CPU), tg.Const, tg.Duplicated(Y, dY),
                    tg.Duplicated(X, dX),
                    tg.Duplicated(Z, dZ), idx, c, ndrange=n)
        picked = (Z[idx], dZ[idx]) if c > 0 else (X, dX)
        np.testing.assert_allclose(Y, np.sin(X) + picked[0], rtol=1e-15)
        np.testing.assert_allclose(dY, np.cos(X) * dX + picked[1], rtol=1e-14)
    source = sine_and_pick.source("forward")
    assert source.count("X[i]") == 1, source      # (the branch reads the shared one too)
    assert "Z[idx[i]] if" in source, source


@tg.kernel
def squares_gathered(Y, X, idx):
    i = tg.index()
    Y[i] = X[idx[i]] * X[idx[i]]


def test_a_gathered_element_and_its_index_are_read_once():
    """(the inner load first: idx[i] becomes a local, then X[that local])"""
    X, dX, idx = r(5), rng.standard_normal(5), rng.integers(0, 5, 30)
    Y, dY = np.empty(30), np.empty(30)
    tg.autodiff(tg.Forward, squares_gathered(CPU), tg.Const, tg.Duplicated(Y, dY),
                tg.Duplicated(X, dX), idx, ndrange=30)
    np.testing.assert_allclose(dY, 2 * X[idx] * dX[idx], rtol=1e-14)
    source = squares_gathered.source("forward")
    assert source.count("idx[i]") == 1 and source.count("X[_ld") == 1, source
