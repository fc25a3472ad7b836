"""tapegrad.testing at its edges (a review of the debugging tools): a NaN or an infinity
against a finite reference fails check_grad and check_tape; check_tape refuses registered
rules that the tape refuses (too few cotangents, cotangents and tangents of another shape, a
function returning its argument); a right kernel whose inputs have different scales (a
frequency of 1000 and x in [0, 1)) passes, each input stepped by its own size."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.testing import check_grad, check_tape

# -- NaN and infinities fail the comparisons -------------------------------------------------


def test_check_grad_fails_a_nan_gradient():
    nan_rule = tg.register_adjoint(np.square, reverse=lambda y_bar, x: np.full_like(x, np.nan))
    x = np.array([1.0, 2.0, 3.0])
    assert np.isnan(tg.gradient(lambda x: tg.sum(nan_rule(x)), x.copy())[0]).all()
    with pytest.raises(AssertionError, match="reverse mode gives nan, central finite "
                                             "differences 2.0"):
        check_grad(lambda x: tg.sum(nan_rule(x)), x)


def test_check_grad_fails_an_infinity_against_a_finite_reference_and_the_reverse():
    """(d/dx x^2 is 2x: an infinite rule at one element fails; and a function that becomes
    infinite within the step has an infinite finite difference, which a finite gradient does
    not match)"""
    inf_rule = tg.register_adjoint(
        np.square, reverse=lambda y_bar, x: np.where(x == 2.0, np.inf, 2 * x * y_bar))
    x = np.array([1.0, 2.0, 3.0])
    with pytest.raises(AssertionError, match=r"index \(1,\): reverse mode gives inf"):
        check_grad(lambda x: tg.sum(inf_rule(x)), x)

    wall = tg.register_adjoint(lambda x: np.where(x > 1.0, np.inf, x),
                               reverse=lambda y_bar, x: np.ones_like(x) * y_bar)
    with pytest.raises(AssertionError, match="reverse mode gives 1.0, central finite "
                                             "differences inf"):
        check_grad(lambda x: tg.sum(wall(x)), np.array([0.5, 1.0]))
    assert check_grad(lambda x: tg.sum(wall(x)), np.array([0.5, 0.9]))


def test_check_tape_fails_an_infinity_against_a_finite_reference_and_the_reverse():
    inf_rule = tg.register_adjoint(
        np.square, reverse=lambda y_bar, x: np.where(x == 2.0, np.inf, 2 * x * y_bar))
    with pytest.raises(AssertionError, match="its reverse rule gives <J\\^T w, v> = -?inf"):
        check_tape(lambda x: tg.sum(inf_rule(x)), np.array([1.0, 2.0, 3.0]))

    wall = tg.register_adjoint(lambda x: np.where(x > 1.0, np.inf, x),
                               reverse=lambda y_bar, x: np.ones_like(x) * y_bar)
    with pytest.raises(AssertionError, match="central finite differences of that launch "
                                             "alone -?inf"):
        check_tape(lambda x: tg.sum(wall(x)), np.array([1.0]))
    assert check_tape(lambda x: tg.sum(wall(x)), np.array([0.5])) == 1


# -- registered rules the tape refuses ---------------------------------------------------------


def _refused_by_the_tape(program, *args):
    with pytest.raises(tg.TapegradError) as info:
        tg.gradient(program, *args)
    return str(info.value)


def test_check_tape_refuses_a_rule_with_too_few_cotangents():
    short = tg.register_adjoint(np.multiply, reverse=lambda y_bar, x, y: (y * y_bar,))

    def program(x, y):
        return tg.sum(short(x, y))                      # (LINE)

    x, y = np.array([1.0, 2.0, 3.0]), np.array([0.5, -1.0, 2.0])
    tape_says = _refused_by_the_tape(program, x, y)
    assert "returned 1 cotangent(s) for 2 argument(s)" in tape_says
    with pytest.raises(AssertionError) as info:
        check_tape(program, x, y)
    line = program.__code__.co_firstlineno + 1
    assert str(info.value) == ("check_tape, launch 1 of 1: the registered adjoint multiply "
                               f"called at test_tool_edges.py:{line}: {tape_says}")


def test_check_tape_refuses_cotangents_and_tangents_that_numpy_would_broadcast():
    """(each rule gives the right numbers once NumPy broadcasts or flattens its result: only
    its shape is wrong, and the tape refuses it)"""
    total = tg.register_adjoint(np.sum, reverse=lambda y_bar, x: np.array([y_bar]))
    x = np.array([1.0, 2.0, 3.0])
    tape_says = _refused_by_the_tape(lambda x: total(x), x)
    assert "is an array of shape (1,), but it must have the shape (3,)" in tape_says
    with pytest.raises(AssertionError, match="launch 1 of 1: the registered adjoint sum called "
                                             "at test_tool_edges.py:.*shape \\(1,\\)"):
        check_tape(lambda x: total(x), x)

    flat = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar,
                               forward=lambda x, x_dot: (2 * x * x_dot).reshape(1, -1))
    with pytest.raises(tg.TapegradError, match="forward rule's tangent"):
        tg.jvp(lambda x: flat(x), x, np.ones(3))
    with pytest.raises(AssertionError, match="launch 1 of 1: .*the forward rule's tangent of "
                                             "square .* shape \\(1, 3\\)"):
        check_tape(lambda x: tg.sum(flat(x)), x)
    assert check_tape(lambda x: tg.sum(flat(x)), x, forward=False) == 1


def test_check_tape_refuses_a_function_returning_its_argument():
    same = tg.register_adjoint(lambda x: x, reverse=lambda y_bar, x: y_bar)
    x = np.array([1.0, 2.0])
    assert "sharing memory" in _refused_by_the_tape(lambda x: tg.sum(same(x)), x)
    with pytest.raises(AssertionError, match="launch 1 of 1: .*sharing memory with its "
                                             "argument 0"):
        check_tape(lambda x: tg.sum(same(x)), x)


# -- inputs of different scales ------------------------------------------------------------


@tg.kernel
def wave(out, x, t):
    i = tg.index()
    out[i] = math.sin(t * x[i])


def test_a_right_kernel_with_inputs_of_different_scales_passes():
    """(a step of 1e-3, the largest input's, for x in [0, 1) moves sin(1000 x) by a radian)"""
    def program(x):
        out = np.empty_like(x)
        wave(tg.CPU())(out, x, 1000.0, ndrange=x.size)
        return tg.sum(out)

    x = np.random.default_rng(0).random(8)
    np.testing.assert_allclose(tg.gradient(program, x)[0], 1000.0 * np.cos(1000.0 * x))
    assert check_tape(program, x) == 1

    def with_time(x, t):
        out = np.empty_like(x)
        wave(tg.CPU())(out, x, t, ndrange=x.size)
        return tg.sum(out)

    assert check_tape(with_time, x, 1000.0) == 1


def test_registered_rules_with_inputs_of_different_scales():
    """(the right rules pass; a wrong cotangent for the large input is still found: each
    input's part of the direction is scaled by its own step, consistently)"""
    def wave_fn(x, t):
        return np.sin(t * x)

    right = tg.register_adjoint(
        wave_fn, reverse=lambda y_bar, x, t: (t * np.cos(t * x) * y_bar,
                                              float(np.sum(x * np.cos(t * x) * y_bar))),
        forward=lambda x, t, x_dot, t_dot: np.cos(t * x) * (
            t * (0.0 if x_dot is None else x_dot) + (0.0 if t_dot is None else t_dot * x)))
    x = np.random.default_rng(1).random(8)
    assert check_tape(lambda x, t: tg.sum(right(x, t)), x, 1000.0) == 1
    assert check_tape(lambda x: tg.sum(right(x, 1000.0)), x) == 1

    wrong_t = tg.register_adjoint(
        wave_fn, reverse=lambda y_bar, x, t: (t * np.cos(t * x) * y_bar,
                                              float(np.sum(np.cos(t * x) * y_bar))))
    with pytest.raises(AssertionError, match="its reverse rule gives"):
        check_tape(lambda x, t: tg.sum(wrong_t(x, t)), x, 1000.0)


def test_check_tape_sees_its_own_threads_launches_only():
    # its collector was the process's: another thread's wrong rule was blamed on this
    # program, two check_tapes at once raised "check_tape inside check_tape", and a
    # registered call in another thread could leave a collector installed for good
    import threading

    from tapegrad.runtime.nans import NANS
    square = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar)
    wrong = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 3 * x * y_bar)
    x = np.linspace(0.5, 1.5, 5)
    stop, errors = threading.Event(), []

    def busy():
        while not stop.is_set():
            wrong(x)

    def checking():
        try:
            for _ in range(50):
                assert check_tape(lambda x: tg.sum(square(x)), x) == 1
        except BaseException as e:          # (reported by the main thread)
            errors.append(e)

    others = [threading.Thread(target=busy)] + [threading.Thread(target=checking)
                                                for _ in range(2)]
    for t in others:
        t.start()
    for t in others[1:]:
        t.join()
    stop.set()
    others[0].join()
    assert not errors, errors[0]
    assert NANS.collectors == 0 and not NANS.slow
    with pytest.raises(AssertionError, match="wrong|disagree|adjoint"):
        check_tape(lambda x: tg.sum(wrong(x)), x)
