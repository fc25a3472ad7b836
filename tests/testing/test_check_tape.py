"""tapegrad.testing.check_tape: each launch (and registered adjoint) of a program checked alone
against central finite differences; a planted wrong rule among 100 launches is found and
named with its line, on every backend, through capture and checkpointing."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.testing import check_tape
from tests.capture.test_capture import diffuse


@tg.func
def softplus(x):
    return math.log1p(math.exp(x))


@softplus.reverse
def softplus_reverse(x, r_bar):
    return -r_bar / (1.0 + math.exp(-x))         # the planted mistake: a wrong sign


@softplus.forward
def softplus_forward(x, x_dot):
    return x_dot / (1.0 + math.exp(-x))          # right


@tg.kernel
def activate(out, u):
    i = tg.index()
    out[i] = softplus(u[i])


def simulate(backend, u, kappa, steps=100, bad_at=None):
    for k in range(steps):
        out = np.empty_like(u)
        if k == bad_at:
            activate(backend)(out, u, ndrange=u.size)          # (BAD_LINE)
        else:
            diffuse(backend)(out, u, kappa, ndrange=u.size)
        u = out
    return tg.sum(u)


BAD_LINE = simulate.__code__.co_firstlineno + 4


def test_a_planted_wrong_adjoint_among_100_launches_is_named(backend):
    u = np.random.default_rng(1).random(16)
    with pytest.raises(AssertionError) as info:
        check_tape(lambda u: simulate(backend, u, 0.2, bad_at=56), u)
    message = str(info.value)
    assert message.startswith("check_tape, launch 57 of 100: the launch of kernel activate at "
                              f"test_check_tape.py:{BAD_LINE}: its adjoint (reverse mode)")
    assert "central finite differences of that launch alone" in message


def test_a_right_program_passes_and_counts_its_launches(backend):
    u = np.random.default_rng(2).random(16)
    assert check_tape(lambda u, k: simulate(backend, u, k, steps=30), u, 0.2) == 30


@tg.kernel
def largest(m, c):
    i = tg.index()
    tg.atomic_max(m, 0, c[i])


@tg.kernel
def scaled_squares(y, x, m):
    i = tg.index()
    y[i] = x[i] * x[i] * m[0]


def test_a_launch_without_a_derivative_the_program_never_needs_is_named_not_failed(backend):
    """(An atomic_max over data the program keeps constant failed check_tape, 'its adjoint
    cannot run', though the program's gradient is right.)"""
    c = np.array([0.3, 2.0, 1.0, 0.5])

    def f(x):
        m = np.zeros(1)
        largest(backend, 4)(m, c, ndrange=4)
        y = np.empty_like(x)
        scaled_squares(backend, 4)(y, x, m, ndrange=x.size)
        return tg.sum(y)

    x = np.linspace(0.1, 1.0, 4)
    np.testing.assert_allclose(tg.gradient(f, x)[0], 4.0 * x, rtol=1e-12)   # 2 x max(c)
    with pytest.warns(UserWarning, match=r"launch 1 of 2: the launch of kernel largest at .*"
                                         r"not checked: .*tg.atomic_max"):
        assert check_tape(f, x) == 1                       # (the one checked)


@tg.func
def table_scaled(T, x):
    return T[0] * x * x


@table_scaled.reverse
def table_scaled_reverse(T, x, r_bar):
    return 3.0 * T[0] * x * r_bar                # wrong: 2 T0 x


@tg.kernel
def through_a_table(y, x, T):
    i = tg.index()
    y[i] = table_scaled(T, x[i])


def test_a_launch_refused_for_another_reason_still_fails():
    """(A rule reading an array fails with every float argument varying: that is not an
    extreme's refusal, and the rule here is wrong.)"""
    def f(x):
        y = np.empty_like(x)
        through_a_table(tg.CPU(), 4)(y, x, np.array([1.5]), ndrange=x.size)
        return tg.sum(y)

    with pytest.raises(AssertionError, match="its adjoint cannot run: .*hand-written"):
        check_tape(f, np.linspace(0.1, 1.0, 4))


def test_a_wrong_forward_rule_is_named():
    @tg.func
    def twice(x):
        return 2.0 * x

    @twice.forward
    def twice_forward(x, x_dot):
        return 3.0 * x_dot                           # wrong: 2

    @tg.kernel
    def apply_twice(out, u):
        i = tg.index()
        out[i] = twice(u[i])

    def program(u):
        out = np.empty_like(u)
        apply_twice(tg.CPU())(out, u, ndrange=u.size)
        return out

    with pytest.raises(AssertionError, match="apply_twice .*its tangent \\(forward mode\\)"):
        check_tape(program, np.ones(4))
    assert check_tape(program, np.ones(4), forward=False) == 1


def test_a_registered_adjoint_with_a_wrong_sign_is_named():
    square = tg.register_adjoint(np.square, reverse=lambda y_bar, x: -2 * x * y_bar)

    def program(x):
        return tg.sum(square(x))                     # (LINE)

    line = program.__code__.co_firstlineno + 1
    with pytest.raises(AssertionError) as info:
        check_tape(program, np.array([1.0, 2.0]))
    assert f"the registered adjoint square called at test_check_tape.py:{line}: its reverse " \
           "rule" in str(info.value)
    right = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar,
                                forward=lambda x, x_dot: 2 * x * x_dot)
    assert check_tape(lambda x: tg.sum(right(x)), np.array([1.0, 2.0])) == 1


def test_captured_and_checkpointed_launches_are_checked(backend):
    u = np.random.default_rng(3).random(8)
    captured = tg.capture(lambda u: simulate(backend, u, 0.1, steps=5, bad_at=3))
    captured(u)
    captured(u)                                      # (a replay: its launches not seen)
    with pytest.raises(AssertionError, match="launch 4 of 5: the launch of kernel activate"):
        check_tape(captured, u)

    def step(u, k):
        out = np.empty_like(u)
        if k == 7:
            activate(backend)(out, u, ndrange=u.size)
        else:
            diffuse(backend)(out, u, 0.1, ndrange=u.size)
        return out

    with pytest.raises(AssertionError, match="launch 8 of 10: the launch of kernel activate"):
        check_tape(lambda u: tg.sum(tg.checkpoint_loop(step, u, 10, snapshots=3)), u)


def test_float32_launches_are_checked_in_float64():
    u = np.random.default_rng(4).random(16).astype(np.float32)
    assert check_tape(lambda u: simulate(tg.CPU(), u, np.float32(0.2), steps=3), u) == 3


@tg.kernel
def clip(out, X, M):
    i = tg.index()
    out[i] = min(X[i], M[i])


@tg.kernel
def scaled(out, a, X):
    i = tg.index()
    out[i] = a * X[i]


def test_no_false_alarms_at_infinities_large_values_and_tape_scalars():
    """(an infinite bound, values near 1e8 and a tape scalar as the kernel's number: the right
    derivatives pass; the finite-difference step follows the values' size)"""
    M = np.array([np.inf, 0.5, np.inf, 0.2])

    def clipped(X):
        out = np.empty(4)
        clip(tg.CPU())(out, X, M, ndrange=4)
        return tg.sum(out)

    assert check_tape(clipped, np.random.default_rng(5).random(4)) == 1

    def big(X):
        out = np.empty_like(X)
        scaled(tg.CPU())(out, 2.0, X, ndrange=X.size)
        return tg.sum(out)

    assert check_tape(big, 1e8 * (1 + np.random.default_rng(6).random(8))) == 1

    def loss(a):
        out = np.empty(4)
        scaled(tg.CPU())(out, a, np.arange(4.0), ndrange=4)
        return tg.dot(out, out)

    assert check_tape(lambda a: tg.gradient(loss, a), 0.5) == 1


def test_a_registered_function_is_checked_by_its_rules_not_its_kernels():
    """(its kernels are not checked alone: its rules stand for them, and a kernel there may
    have no adjoint at all); None for a constant is the rules' own convention (a cotangent
    has its argument's shape: a scalar for an array is refused, as the tape refuses it)"""
    @tg.kernel
    def ranks(out, X):                        # no derivative (an integer result cast back)
        i = tg.index()
        out[i] = 2.0 * X[i]

    def twice(X):
        out = np.empty_like(X)
        ranks(tg.CPU())(out, X, ndrange=X.size)
        return out

    doubled = tg.register_adjoint(twice, reverse=lambda yb, X: 2.0 * yb)
    mean = tg.register_adjoint(np.mean, reverse=lambda yb, x: np.full_like(x, yb / x.size))
    weigh = tg.register_adjoint(lambda x, w: x * w, reverse=lambda yb, x, w: (yb * w, None))
    X, w = np.random.default_rng(7).random(4), np.arange(1.0, 5.0)
    assert check_tape(lambda X: mean(doubled(X)) + tg.sum(weigh(X, w)), X) == 3
