"""Differentiation errors: each is a tapegrad error that says what to do, raised before any
array is touched."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def differentiates_inside(B, A):
    i = tg.index()  # noqa: F841
    tg.autodiff(tg.Reverse, sin_kernel, tg.Const, B, A)


def test_autodiff_inside_a_kernel_says_to_differentiate_the_host_function():
    A, B = np.ones(4), np.zeros(4)
    with pytest.raises(tg.KernelSyntaxError, match="differentiate that") as info:
        differentiates_inside(tg.CPU())(B, A, ndrange=4)
    assert info.value.lineno == differentiates_inside.pyfunc.__code__.co_firstlineno + 3
    assert not B.any()


def test_active_return_of_a_kernel_names_the_ways_out():
    A, B = np.ones(4), np.zeros(4)
    with pytest.raises(tg.TapegradError, match="tg.sum") as info:
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Active, tg.Duplicated(B, np.ones(4)),
                    tg.Duplicated(A, np.zeros(4)), ndrange=4)
    assert "tg.Const" in str(info.value)
    assert not B.any()


@pytest.mark.parametrize("bad, what", [
    (np.zeros(5), "shape"),
    (np.zeros(4, np.float32), "dtype"),
    ([0.0] * 4, "list"),
])
def test_shadow_mismatch_raises_before_running(bad, what):
    A, B = np.ones(4), np.zeros(4)
    with pytest.raises(tg.LaunchError, match="shadow of A must match"):
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.Duplicated(B, np.ones(4)),
                    tg.Duplicated(A, bad), ndrange=4)
    assert not B.any()


def test_active_array_and_duplicated_scalar_are_rejected():
    A, B = np.ones(4), np.zeros(4)
    with pytest.raises(tg.TapegradError, match="Duplicated"):
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.Duplicated(B, np.ones(4)),
                    tg.Active(A), ndrange=4)


@tg.kernel
def scale(B, A, s):
    i = tg.index()
    B[i] = A[i] * s


def test_active_integer_scalar_is_rejected():
    with pytest.raises(tg.TapegradError, match="float scalar"):
        tg.autodiff(tg.Reverse, scale(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(3), np.ones(3)),
                    np.ones(3), tg.Active(2), ndrange=3)


def test_active_value_stored_into_a_const_array_is_an_error():
    A, B = np.ones(4), np.zeros(4)
    with pytest.raises(tg.KernelError, match="Duplicated") as info:
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, B, tg.Duplicated(A, np.zeros(4)),
                    ndrange=4)
    assert "B" in str(info.value) and "Const" in str(info.value)
    assert not B.any()


@tg.kernel
def running_max(M, A):
    i = tg.index()
    tg.atomic_max(M, 0, A[i])


def test_atomic_max_derivative_is_refused_clearly():
    with pytest.raises(tg.KernelError, match="atomic_max"):
        tg.autodiff(tg.Reverse, running_max(tg.CPU()), tg.Const,
                    tg.Duplicated(np.zeros(1), np.ones(1)), tg.Duplicated(np.ones(4), np.zeros(4)),
                    ndrange=4)


@tg.kernel
def clamped_below(M, c):
    i = tg.index()
    tg.atomic_max(M, i, c)


@tg.kernel
def clamped_above(M, c):
    i = tg.index()
    tg.atomic_min(M, i, c)


@tg.kernel
def clamped_by_many(M, c):
    i = tg.index()
    tg.atomic_max(M, i % 2, c[i])


def test_a_constant_extreme_from_many_work_items_ends_the_derivative_in_any_order(backend):
    """Element 0: the constants' largest (0.3) beats 0.25; element 1: 0.9 ties 0.9."""
    c = np.array([0.1, 0.5, 0.2, 0.4, 0.3, 0.8, 0.2, 0.9])
    for mode in (tg.Forward, tg.Reverse):
        M, dM = np.array([0.25, 0.9]), np.array([3.0, 5.0])
        tg.autodiff(mode, clamped_by_many(backend, 4), tg.Const, tg.Duplicated(M, dM), c,
                    ndrange=8)
        np.testing.assert_array_equal(M, [0.3, 0.9])
        np.testing.assert_array_equal(dM, [0.0, 5.0])


def test_the_second_derivative_of_a_constant_extreme_is_refused_by_name():
    """(Before the extremes were differentiated tg.hvp of such a kernel was silently wrong;
    then its refusal spoke of a read the user did not write.)"""
    def f(x):
        y = tg.copy(x)
        clamped_below(tg.CPU(), 2)(y, 0.5, ndrange=y.size)
        return tg.dot(y, y)

    with pytest.raises(tg.KernelError, match="tg.atomic_max has no second derivative"):
        tg.hvp(f, np.linspace(0.0, 1.0, 6), np.ones(6))


@tg.kernel
def stored_then_clamped(M, X, c):
    i = tg.index()
    M[i] = 2.0 * X[i]
    tg.atomic_max(M, i, c)


@pytest.mark.parametrize("kernel, keeps", [(clamped_below, np.greater_equal),
                                           (clamped_above, np.less_equal)], ids=["max", "min"])
def test_a_constant_extreme_ends_the_derivative_where_it_wins_in_both_modes(backend, kernel,
                                                                            keeps):
    """(Both modes kept the element's old derivative where the constant won: tangent
    [1 1 1 1 1 1] for [0 0 0 1 1 1].)  At a tie the element keeps its own derivative, as
    Python's max(old, c) keeps old."""
    M0 = np.array([0.0, 0.2, 0.5, 0.6, 0.8, 1.0])
    kept = keeps(M0, 0.5).astype(float)                     # d max(m, c) / dm
    M, dM = M0.copy(), np.ones(6)
    tg.autodiff(tg.Forward, kernel(backend, 2), tg.Const, tg.Duplicated(M, dM), 0.5, ndrange=6)
    np.testing.assert_array_equal(dM, kept)
    M, bar = M0.copy(), np.arange(1.0, 7.0)
    tg.autodiff(tg.Reverse, kernel(backend, 2), tg.Const, tg.Duplicated(M, bar), 0.5, ndrange=6)
    np.testing.assert_array_equal(bar, kept * np.arange(1.0, 7.0))


def test_an_extreme_of_a_differentiated_value_or_over_other_writes_is_refused():
    for mode in (tg.Reverse, tg.Forward):
        with pytest.raises(tg.KernelError, match="whichever work-item won.*without atomics"):
            tg.autodiff(mode, running_max(tg.CPU()), tg.Const,
                        tg.Duplicated(np.zeros(1), np.ones(1)),
                        tg.Duplicated(np.ones(4), np.zeros(4)), ndrange=4)
    M = np.zeros(4)
    with pytest.raises(tg.KernelError, match="also changes otherwise.*without atomics"):
        tg.autodiff(tg.Reverse, stored_then_clamped(tg.CPU()), tg.Const,
                    tg.Duplicated(M, np.ones(4)), tg.Duplicated(np.ones(4), np.zeros(4)), 0.5,
                    ndrange=4)
    assert not M.any()


def test_kernel_must_be_configured():
    with pytest.raises(tg.TapegradError, match="configure the kernel"):
        tg.autodiff(tg.Reverse, sin_kernel, tg.Const, np.zeros(3), np.zeros(3), ndrange=3)


def test_reverse_source_needs_a_differentiation_first():
    @tg.kernel
    def fresh(B, A):
        i = tg.index()
        B[i] = A[i]
    with pytest.raises(tg.LaunchError, match="differentiate it once"):
        fresh.source(mode="reverse")


@tg.func
def _sum_and_product(x, y):
    return x + y, x * y


@tg.kernel
def tuple_held_whole(B, A):
    i = tg.index()
    t = (A[i], 2.0 * A[i])
    B[i] = t[0] + t[1]


@tg.kernel
def device_tuple_held_whole(B, A):
    i = tg.index()
    r = _sum_and_product(A[i], 3.0)
    B[i] = r[0] + r[1]


@tg.kernel
def device_tuple_unpacked(B, A):
    i = tg.index()
    s, p = _sum_and_product(A[i], 3.0)
    t = (i, i + 1)                   # a tuple of ints carries no derivative: fine
    B[i] = s + p + 0.0 * t[0]


@pytest.mark.parametrize("kern", [tuple_held_whole, device_tuple_held_whole])
@pytest.mark.parametrize("mode", [tg.Reverse, tg.Forward])
def test_a_tuple_of_active_floats_held_whole_is_refused_at_its_line(kern, mode):
    """(its elements' derivatives were silently zero)"""
    a = np.linspace(0.1, 1.0, 4)
    with pytest.raises(tg.KernelSyntaxError, match="unpack it into scalars") as info:
        tg.autodiff(mode, kern(tg.CPU(), 4), tg.Const, tg.Duplicated(np.zeros(4), np.ones(4)),
                    tg.Duplicated(a, np.zeros(4)), ndrange=4)
    lines, first = inspect.getsourcelines(kern.pyfunc)
    made = first + next(k for k, ln in enumerate(lines) if "= (" in ln or "= _sum" in ln)
    assert f"{__file__}:{made}:" in str(info.value)


def test_unpacked_tuples_differentiate():
    a = np.linspace(0.1, 1.0, 4)
    da = np.zeros(4)
    tg.autodiff(tg.Reverse, device_tuple_unpacked(tg.CPU(), 4), tg.Const,
                tg.Duplicated(np.zeros(4), np.ones(4)), tg.Duplicated(a, da), ndrange=4)
    np.testing.assert_allclose(da, 4.0, rtol=1e-12)      # d/da (a + 3 + 3a)


@tg.func
def _weighted_square(A, i, s):
    return A[i] * A[i] * s


@_weighted_square.forward
def _weighted_square_forward(A, i, s, i_dot, s_dot):
    return A[i] * A[i] * s_dot


@_weighted_square.reverse
def _weighted_square_reverse(A, i, s, r_bar):
    return 0, A[i] * A[i] * r_bar


@tg.kernel
def uses_a_rule_on_an_array(B, A, s):
    i = tg.index()
    B[i] = _weighted_square(A, i, s)


@pytest.mark.parametrize("mode", [tg.Reverse, tg.Forward])
def test_a_rule_cannot_carry_an_array_arguments_derivative(mode):
    """(the array's derivative was dropped silently)"""
    a = np.linspace(0.1, 1.0, 4)
    with pytest.raises(tg.KernelSyntaxError, match="covers its scalar arguments only"):
        tg.autodiff(mode, uses_a_rule_on_an_array(tg.CPU(), 4), tg.Const,
                    tg.Duplicated(np.zeros(4), np.ones(4)), tg.Duplicated(a, np.ones(4)), 0.5,
                    ndrange=4)
    # with the array constant, the rule is used as written
    db = np.zeros(4)
    tg.autodiff(tg.Forward, uses_a_rule_on_an_array(tg.CPU(), 4), tg.Const,
                tg.Duplicated(np.zeros(4), db), a, tg.Duplicated(0.5, 1.0), ndrange=4)
    np.testing.assert_allclose(db, a * a, rtol=1e-14)


def test_a_tape_inside_forward_mode_is_refused():
    """(it recorded launches without tangents, and turned forward mode off when it ended)"""
    def f(x):
        with tg.Tape():
            return tg.dot(x, x)

    with pytest.raises(tg.TapegradError, match="cannot record inside forward mode"):
        tg.jvp(f, np.ones(3), np.ones(3))


def test_batch_duplicated_in_reverse_mode_points_to_forward_mode():
    a = np.linspace(0.1, 1.0, 3)
    batch = tg.BatchDuplicated(a, (np.ones(3), np.zeros(3)))
    with pytest.raises(tg.TapegradError, match=r"is for forward mode: use tg.autodiff\(tg.Forward"):
        tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const,
                    tg.Duplicated(np.zeros(3), np.ones(3)), batch, ndrange=3)
    with pytest.raises(tg.TapegradError, match=r"is for forward mode: use tg.autodiff\(tg.Forward"):
        tg.autodiff(tg.Reverse, lambda x: tg.sum(x), tg.Active, batch)
    # and in forward mode it is what it is for
    dy = (np.zeros(3), np.zeros(3))
    tg.autodiff(tg.Forward, sin_kernel(tg.CPU()), tg.Const, tg.BatchDuplicated(np.zeros(3), dy),
                batch, ndrange=3)
    np.testing.assert_allclose(dy[0], np.cos(a), rtol=1e-14)
    np.testing.assert_array_equal(dy[1], 0.0)
