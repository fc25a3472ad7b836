"""``tg.hvp``: Hessian-vector products checked against central differences of ``tg.gradient``
(float64), against closed forms, and for symmetry, on every backend."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tapegrad.bench.problems import stencil2d_k as heat_step
from tests.ad.test_random_kernels import load_kernel

W = 8        # the workgroup size of the local-memory kernel


@tg.kernel
def nonlinear_local(Y, X):
    """A nonlinear stencil through local memory: each group reads its neighbours' sines."""
    i = tg.index()
    li = tg.index(tg.Local)
    tile = tg.localmem(X.dtype, W)
    tile[li] = tg.sin(X[i])
    tg.synchronize()
    left = tile[li - 1] if li > 0 else 0.0
    right = tile[li + 1] if li < W - 1 else 0.0
    Y[i] = tile[li] * tile[li] + left * right * X[i] + tg.exp(0.5 * left)


@tg.kernel
def gather_cubes(Y, X, idx):
    i = tg.index()
    v = X[idx[i]]
    Y[i] = v * v * v


@tg.kernel
def scaled_tanh(Y, X, s):
    i = tg.index()
    Y[i] = tg.tanh(s * X[i])


def relative_error(got, want):
    return float(np.linalg.norm(np.ravel(got - want)) / max(np.linalg.norm(np.ravel(want)),
                                                              1e-300))


def differences_of_gradient(f, x, v, h=1e-3):
    """The derivative of ``grad f`` along ``v`` by central differences of the gradient
    (float64), Richardson-extrapolated: ``(4 D(h/2) - D(h)) / 3``, accurate to O(h^4)."""
    def central(h):
        (up,) = tg.gradient(f, x + h * v)
        (down,) = tg.gradient(f, x - h * v)
        return (up - down) / (2 * h)
    return (4 * central(h / 2) - central(h)) / 3


def heat_loss(backend, steps=12):
    cfg = heat_step(backend, (4, 4))

    def loss(T0):
        T = tg.copy(T0)
        for _ in range(steps):
            T_new = np.empty_like(T)
            cfg(T_new, T, 0.2, ndrange=T.shape)
            T = T_new
        return tg.dot(T, T) + 0.1 * tg.sin(tg.sum(T))
    return loss


def local_loss(backend):
    cfg = nonlinear_local(backend, W)

    def loss(x):
        y = np.empty_like(x)
        cfg(y, x, ndrange=x.size)
        z = np.empty_like(x)
        cfg(z, y, ndrange=x.size)          # twice: the second launch reads the first's output
        return tg.norm(z) * tg.mean(y)
    return loss


def gather_loss(backend, idx):
    cfg = gather_cubes(backend)

    def loss(x):
        y = np.empty(idx.size)
        cfg(y, x, idx, ndrange=idx.size)
        return tg.sum(y)
    return loss


@pytest.mark.parametrize("problem", ["heat", "local", "gather"])
def test_hvp_matches_central_differences_of_the_gradient(backend, problem):
    rng = np.random.default_rng(1)
    if problem == "heat":
        f, x = heat_loss(backend), rng.random((8, 8))
    elif problem == "local":
        f, x = local_loss(backend), rng.standard_normal(4 * W)
    else:
        idx = rng.integers(0, 10, 40)
        f, x = gather_loss(backend, idx), rng.standard_normal(10)
    v = rng.standard_normal(x.shape)
    x_before, v_before = x.copy(), v.copy()
    hv = tg.hvp(f, x, v)
    assert np.array_equal(x, x_before) and np.array_equal(v, v_before)
    assert relative_error(hv, differences_of_gradient(f, x, v)) < 1e-6


def test_hvp_of_a_quadratic_heat_loss_is_its_closed_form(backend):
    """``loss = |A^n T0|^2`` has the Hessian ``2 (A^n)^T A^n``: A^n as a matrix from NumPy."""
    n = 6
    cfg = heat_step(backend, (3, 3))

    def simulate_numpy(T):
        T = T.copy()
        for _ in range(5):
            U = T.copy()
            U[1:-1, 1:-1] = T[1:-1, 1:-1] + 0.2 * (T[:-2, 1:-1] + T[2:, 1:-1] + T[1:-1, :-2]
                                                    + T[1:-1, 2:] - 4.0 * T[1:-1, 1:-1])
            T = U
        return T

    def loss(T0):
        T = T0
        for _ in range(5):
            T_new = np.empty_like(T)
            cfg(T_new, T, 0.2, ndrange=T.shape)
            T = T_new
        return tg.dot(T, T)

    A = np.stack([simulate_numpy(e.reshape(n, n)).ravel() for e in np.eye(n * n)], axis=1)
    v = np.random.default_rng(2).standard_normal((n, n))
    hv = tg.hvp(loss, np.random.default_rng(3).random((n, n)), v)
    np.testing.assert_allclose(hv.ravel(), 2 * A.T @ (A @ v.ravel()), rtol=1e-12, atol=1e-12)


def test_hvp_of_a_gather_is_its_closed_form(backend):
    """``sum_i x[idx[i]]^3``: the Hessian is diagonal, ``6 x count``; a zero in x and a NaN
    and an infinity in v stay where they are (the other elements finite and exact)."""
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 7, 50)
    x, v = rng.standard_normal(7), rng.standard_normal(7)
    x[0], v[1], v[2] = 0.0, np.nan, np.inf
    with np.errstate(invalid="ignore"):
        want = 6 * x * np.bincount(idx, minlength=7) * v
    hv = tg.hvp(gather_loss(backend, idx), x, v)
    assert np.isnan(hv[1]) and np.isinf(hv[2]) and hv[0] == 0.0
    np.testing.assert_allclose(hv[3:], want[3:], rtol=1e-12)


def test_hvp_through_scalars_passed_to_kernels_and_host_arithmetic(backend):
    """A scalar computed from x reaches a kernel (an Active argument of the tangent kernel),
    and the loss mixes reductions with host math."""
    cfg = scaled_tanh(backend)

    def f(x):
        s = tg.sqrt(1.0 + tg.dot(x, x)) / 3.0
        y = np.empty_like(x)
        cfg(y, x, s, ndrange=x.size)
        total = tg.sum(y)
        return tg.exp(-total * total) + s ** 2.5 - tg.hypot(total, s) + abs(total) % 0.7
    rng = np.random.default_rng(5)
    x, v = rng.standard_normal(12), rng.standard_normal(12)
    assert relative_error(tg.hvp(f, x, v), differences_of_gradient(f, x, v)) < 1e-6


def test_hvp_of_a_number():
    def f(c):
        return tg.sum(np.arange(3.0)) * tg.sin(c) * c ** 3
    c, dv = 0.7, 1.5
    want = 3.0 * (-np.sin(c) * c ** 3 + 6 * np.cos(c) * c ** 2 + 6 * np.sin(c) * c) * dv
    assert abs(tg.hvp(f, c, dv) - want) < 1e-12


def test_hvp_through_copy_reshape_and_scale():
    cfg = scaled_tanh(tg.CPU())

    def f(x):
        y = np.empty_like(x)
        cfg(y, x, 1.3, ndrange=x.size)
        z = tg.scale(tg.reshape(tg.copy(y), (3, 4)), tg.sum(x))   # a factor that varies too
        return tg.dot(z, z)
    rng = np.random.default_rng(6)
    x, v = rng.standard_normal(12), rng.standard_normal(12)
    assert relative_error(tg.hvp(f, x, v), differences_of_gradient(f, x, v)) < 1e-6


def test_hvp_of_a_linear_function_is_zero_and_symmetric_products_agree():
    x = np.random.default_rng(7).random(5)
    assert np.array_equal(tg.hvp(lambda x: 3.0 * tg.sum(x), x, np.ones(5)), np.zeros(5))
    f = local_loss(tg.CPU())
    rng = np.random.default_rng(8)
    x, u, w = (rng.standard_normal(2 * W) for _ in range(3))
    assert abs(np.dot(u, tg.hvp(f, x, w)) - np.dot(w, tg.hvp(f, x, u))) < 1e-10


@pytest.mark.parametrize("how", ["checkpoint_loop", "capture"])
def test_hvp_through_checkpoint_loop_and_capture(how):
    cfg = heat_step(tg.CPU(), (4, 4))

    def step(T):
        T_new = np.empty_like(T)
        cfg(T_new, T, 0.2, ndrange=T.shape)
        return T_new

    def loop(T0):
        return tg.checkpoint_loop(step, tg.copy(T0), 10, snapshots=3)

    def captured(T0):
        T = tg.copy(T0)
        for _ in range(10):
            T = step(T)
        return T
    simulate = loop if how == "checkpoint_loop" else tg.capture(captured)

    def f(T0):
        T = simulate(T0)
        return tg.dot(T, T) * tg.sum(T)
    rng = np.random.default_rng(9)
    x, v = rng.random((6, 6)), rng.standard_normal((6, 6))
    want = differences_of_gradient(f, x, v)       # (the capture's replays among them)
    assert relative_error(tg.hvp(f, x, v), want) < 1e-6


@tg.kernel
def react(out, u, k, c):
    i = tg.index()
    out[i] = u[i] + k * tg.sin(u[i]) * (1.0 + 0.01 * c)


def test_hvp_through_checkpoint_loop_keeps_few_snapshots_and_recomputes(monkeypatch):
    """States and tangents are checkpointed together: 3 snapshots of 20 steps, the steps
    between them run again in the reverse sweep; a parameter that varies with x, and a step
    that takes its index."""
    from tapegrad.checkpointing.loop import Loop

    loops, calls, primal = [], [], Loop.primal
    monkeypatch.setattr(Loop, "primal", lambda self, states: loops.append(self) or
                        primal(self, states))

    def step(u, k, j):
        calls.append(j)
        out = np.empty_like(u)
        react(tg.CPU())(out, u, k, float(j), ndrange=u.size)
        return out

    def f(x):
        k = 0.3 * tg.mean(x)
        return tg.norm(tg.checkpoint_loop(step, tg.copy(x), 20, params=(k,), snapshots=3))
    rng = np.random.default_rng(10)
    x, v = rng.random(16), rng.standard_normal(16)
    hv = tg.hvp(f, x, v)
    (loop,) = loops
    assert loop.most_stored <= 3 and loop.forward_steps > 0 and len(calls) > 20
    assert relative_error(hv, differences_of_gradient(f, x, v)) < 1e-6


@tg.kernel
def times(out, u, w):
    i = tg.index()
    out[i] = u[i] * w[i]


W_OUTSIDE = []


def _times_outside(u):
    out = np.empty_like(u)
    times(tg.CPU())(out, u, W_OUTSIDE[0], ndrange=u.size)
    return out


@pytest.mark.parametrize("how", ["params", "closure"])
def test_checkpoint_loop_arrays_from_outside_carry_their_tangents(how):
    """A loop's step reading an array that depends on x, given in params= or read from a
    closure: its tangent reaches the step (it was zero: [2, 4, 6] for 6 x v)."""
    def step(u, w):
        out = np.empty_like(u)
        times(tg.CPU())(out, u, w, ndrange=u.size)
        return out

    def f(x):
        w = tg.copy(x)
        if how == "params":
            u = tg.checkpoint_loop(step, tg.copy(x), 2, params=(w,), snapshots=2)
        else:
            W_OUTSIDE[:] = [w]
            u = tg.checkpoint_loop(_times_outside, tg.copy(x), 2, snapshots=2)
        return tg.sum(u)                      # sum x^3
    x, v = np.array([1.0, 2.0, 3.0]), np.ones(3)
    np.testing.assert_allclose(tg.hvp(f, x, v), 6 * x * v, rtol=1e-12)


@pytest.mark.parametrize("g", [lambda s, d: 2.0 ** s * d, lambda s, d: tg.pow(1.5, s) + d,
                               lambda s, d: tg.copysign(d, -1.0) * s,
                               lambda s, d: tg.copysign(2.0, s) * d * tg.atan2(1.0, s)],
                         ids=["2 ** s", "tg.pow(1.5, s)", "copysign(d, -1)", "atan2(1, s)"])
def test_host_math_with_a_plain_number_among_its_arguments(g):
    """Partials that evaluate the template on a plain number (tg.log(2.0)) stay tape
    scalars (they were refused as NumPy numbers)."""
    def f(x):
        return g(tg.sum(x) * 0.3, tg.dot(x, x))
    rng = np.random.default_rng(11)
    x, v = rng.uniform(0.2, 0.8, 5), rng.standard_normal(5)
    assert relative_error(tg.hvp(f, x, v), differences_of_gradient(f, x, v)) < 1e-6


def test_derivatives_of_kernel_level_reverse_autodiff_inside_hvp_are_refused_when_used():
    """(its shadows carried no tangents: the Hessian through them was silently zero)"""
    def f(x):
        y, dx = np.empty_like(x), np.zeros_like(x)
        tg.autodiff(tg.Reverse, scaled_tanh(tg.CPU()), tg.Const,
                    tg.Duplicated(y, np.ones_like(x)), tg.Duplicated(x, dx), 1.0,
                    ndrange=x.size)
        return tg.dot(dx, x)
    for run in (lambda: tg.hvp(f, np.ones(3), np.ones(3)),
                lambda: tg.jvp(f, np.ones(3), np.ones(3))):
        with pytest.raises(tg.TapegradError, match=r"holds derivatives tg.autodiff\(tg.Reverse, "
                                                   r"...\) computed inside a function"):
            run()


SMOOTH = ["tg.sin({})", "tg.tanh({})", "tg.exp(0.3 * {})", "tg.sqrt(1.0 + {} * {})",
          "({} * {})", "({} / (1.0 + {} * {}))"]


@st.composite
def smooth_kernels(draw):
    expr = "x"
    for _ in range(draw(st.integers(1, 3))):
        template = draw(st.sampled_from(SMOOTH))
        expr = template.format(*([expr] * template.count("{}")))
        if draw(st.booleans()):
            expr = f"({expr} + {draw(st.sampled_from(['y', '0.5 * y', 'x * y']))})"
    return ("def k(C, A, B):\n    i = tg.index()\n    x = A[i]\n    y = B[i]\n"
            f"    C[i] = {expr}\n")


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(smooth_kernels(), st.integers(0, 2 ** 32 - 1), st.sampled_from(["sum", "dot", "norm"]))
def test_random_kernels_hvp_match_central_differences(tmp_path, source, seed, reduction):
    k = load_kernel(source, tmp_path)
    cfg = k(tg.CPU())
    rng = np.random.default_rng(seed)
    b = rng.uniform(-1, 1, 9)

    def f(a):
        c = np.empty_like(a)
        cfg(c, a, b, ndrange=a.size)
        d = np.empty_like(a)
        cfg(d, c, a, ndrange=a.size)                    # the output fed back in
        r = getattr(tg, reduction)(d) if reduction != "dot" else tg.dot(d, c)
        return tg.log(1.0 + r * r)
    a, v = rng.uniform(-1, 1, 9), rng.standard_normal(9)
    hv = tg.hvp(f, a, v)
    want = differences_of_gradient(f, a, v)
    assert relative_error(hv, want) < 1e-6 or np.abs(hv - want).max() < 1e-8


def _launch_tanh(x):
    y = np.empty_like(x)
    scaled_tanh(tg.CPU())(y, x, 1.0, ndrange=x.size)
    return y


@pytest.mark.parametrize("case, match", [
    ("registered", "cannot differentiate twice through square"),
    ("float", r"float\(\) of a scalar inside a function tg.hvp differentiates"),
    ("tape", "a tg.Tape cannot record inside forward mode"),
    ("jvp", "nested forward mode is not supported"),
    ("inside a tape", "tg.hvp inside a recording tg.Tape"),
    ("shape", r"v must be an array like x \(shape \(4,\)"),
    ("ints", "x must be a float array"),
])
def test_what_hvp_cannot_do_is_an_error_before_a_wrong_number(case, match):
    square = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar)
    x, v = np.linspace(0.1, 0.4, 4), np.ones(4)
    fs = {"registered": lambda x: tg.sum(square(_launch_tanh(x))),
          "float": lambda x: tg.sum(_launch_tanh(x)) * float(tg.sum(x)),
          "tape": lambda x: _tape_inside(x),
          "jvp": lambda x: tg.jvp(lambda y: tg.sum(_launch_tanh(y)), x, v)[0]}
    with pytest.raises(tg.TapegradError, match=match):
        if case == "inside a tape":
            with tg.Tape():
                tg.hvp(fs["jvp"], x, v)
        elif case == "shape":
            tg.hvp(fs["jvp"], x, np.ones(5))
        elif case == "ints":
            tg.hvp(fs["jvp"], np.arange(4), np.arange(4))
        else:
            tg.hvp(fs[case], x, v)


def _tape_inside(x):
    with tg.Tape():
        return tg.sum(_launch_tanh(x))
