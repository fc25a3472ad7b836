"""``tape.vjp(outputs, cotangents, sources)``: several outputs (arrays and tracked scalars),
several sources, one sweep; checked against closed forms and float64 finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def scaled_square(B, A, s):
    i = tg.index()
    B[i] = s * A[i] * A[i]


@tg.kernel
def triple_in_place(A):
    i = tg.index()
    A[i] = 3.0 * A[i]


def _record(A, s0):
    B = np.zeros_like(A)
    with tg.Tape() as tape:
        s = tape.watch(s0)
        scaled_square(CPU)(B, A, s, ndrange=A.size)
        total = tg.sum(B)
    return tape, B, total, s


def test_two_outputs_two_sources_against_closed_form_and_differences():
    rng = np.random.default_rng(3)
    A, s0 = rng.standard_normal(9), 0.7
    u, c = rng.standard_normal(9), -1.3
    tape, B, total, s = _record(A, s0)
    gA, gs = tape.vjp([B, total], [u, c], [A, s])
    np.testing.assert_allclose(gA, (u + c) * 2 * s0 * A, rtol=1e-13)
    assert gs == pytest.approx(float(np.sum((u + c) * A * A)), rel=1e-13)

    def phi(A, s):            # u . B + c * sum(B), in plain NumPy
        B = s * A * A
        return u @ B + c * B.sum()
    h = 1e-6
    fd_s = (phi(A, s0 + h) - phi(A, s0 - h)) / (2 * h)
    fd_A = np.array([(phi(A + h * e, s0) - phi(A - h * e, s0)) / (2 * h) for e in np.eye(9)])
    assert gs == pytest.approx(fd_s, rel=1e-7)
    np.testing.assert_allclose(gA, fd_A, rtol=1e-7)


def test_a_tape_answers_again_and_agrees_with_gradient():
    A = np.linspace(-1.0, 1.0, 7)
    tape, B, total, s = _record(A, 2.0)
    first = tape.vjp([total], [1.0], [A, s])
    again = tape.vjp([total], [1.0], [A, s])
    grad = tape.gradient(total, [A, s])
    for x, y, z in zip(first, again, grad):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)


def test_a_number_cotangent_weights_every_element():
    A = np.linspace(0.5, 1.5, 5)
    tape, B, total, s = _record(A, 1.0)
    (g_number,) = tape.vjp([B], [2.5], [A])
    (g_array,) = tape.vjp([B], [np.full(5, 2.5)], [A])
    np.testing.assert_array_equal(g_number, g_array)
    np.testing.assert_allclose(g_number, 2.5 * 2 * A, rtol=1e-14)


def test_an_output_that_is_its_own_source():
    """A kernel that changes its input in place: the source's gradient is with respect to its
    value before the launch, the cotangent with respect to its value after."""
    A0 = np.array([1.0, -2.0, 4.0])
    A = A0.copy()
    with tg.Tape() as tape:
        triple_in_place(CPU)(A, ndrange=3)
    w = np.array([0.5, 1.0, -2.0])
    (gA,) = tape.vjp([A], [w], [A])
    np.testing.assert_allclose(gA, 3.0 * w, rtol=1e-15)


def test_bad_requests_are_refused_with_what_to_do():
    A = np.linspace(0.5, 1.5, 5)
    tape, B, total, s = _record(A, 1.0)
    with pytest.raises(tg.TapegradError, match="one cotangent per output"):
        tape.vjp([B, total], [1.0], [A])
    with pytest.raises(tg.TapegradError, match=r"cotangent has shape \(4,\).*shape \(5,\)"):
        tape.vjp([B], [np.ones(4)], [A])
    with pytest.raises(tg.TapegradError, match="scalar output's cotangent is a number"):
        tape.vjp([total], [np.ones(3)], [A])
    with pytest.raises(tg.TapegradError, match="no recorded operation used"):
        tape.vjp([np.zeros(5)], [1.0], [A])
    with pytest.raises(tg.TapegradError, match="float arrays"):
        tape.vjp([B], [1.0], [np.arange(5)])
