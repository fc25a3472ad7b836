"""Host NumPy code inside a recorded program: every program gets the right gradient or a
tapegrad error that says what to write instead (the rule is at the top of docs/tape.md).
Gradients are checked against closed forms; ``sq`` writes ``B = A * A``."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
A0 = np.linspace(0.5, 1.5, 7)


@tg.kernel
def sq(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def base(A):
    B = np.zeros_like(A)
    sq(CPU)(B, A, ndrange=A.size)
    return B


@pytest.mark.parametrize("f, message", [
    (lambda A: tg.sum(base(A) * 2.0), "no recorded operation wrote.*tg.scale"),
    (lambda A: tg.sum(base(A).copy()), "no recorded operation wrote.*tg.copy"),
    (lambda A: tg.sum(np.exp(base(A))), "no recorded operation wrote"),
    (lambda A: tg.sum(base(A).reshape(7, 1).copy()), "tg.reshape"),
])
def test_a_loss_computed_by_numpy_from_recorded_arrays_is_refused(f, message):
    with pytest.raises(tg.TapegradError, match=message):
        tg.gradient(f, A0.copy())


@pytest.mark.parametrize("f", [
    lambda A: tg.sum(base(A)) + np.sum(base(A)),
    lambda A: tg.sum(base(A)) * base(A)[0],
    lambda A: np.float64(2.0) * tg.sum(base(A)),
    lambda A: tg.sum(base(A)) - base(A).max(),
    lambda A: np.sqrt(tg.sum(base(A))) + np.mean(base(A)),
])
def test_numpy_numbers_mixed_into_tape_scalars_are_refused(f):
    with pytest.raises(tg.TapegradError, match="NumPy number.*float\\(value\\)"):
        tg.gradient(f, A0.copy())


def test_python_numbers_and_constant_arrays_are_still_constants():
    w = np.arange(7.0)
    (g,) = tg.gradient(lambda A: 0.5 * tg.dot(base(A), w) + float(np.sum(w)), A0.copy())
    np.testing.assert_allclose(g, w * A0)             # d/dA 0.5 <A^2, w> = w A


@pytest.mark.parametrize("verify", [False, True])
def test_host_code_changing_a_recorded_array_in_place_is_refused(verify):
    def scaled_then_summed(A):
        B = base(A)
        B *= 3.0
        return tg.sum(B)

    def scaled_between_launches(A):
        B = base(A)
        B *= 3.0
        C = np.zeros_like(A)
        sin_k(CPU)(C, B, ndrange=A.size)
        return tg.sum(C)

    for f in (scaled_then_summed, scaled_between_launches):
        with tg.Tape(verify=verify) as tape, pytest.raises(tg.TapegradError, match="B \\*= 3.0"):
            f(A0.copy())
        del tape


def test_verify_catches_a_change_to_one_element_anywhere():
    A = A0.copy()
    with tg.Tape(verify=True), pytest.raises(tg.TapegradError, match="changed by code"):
        B = base(A)
        B[3] = 0.0                  # neither the first nor the last element
        tg.sum(B)


def test_verify_by_environment(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_VERIFY", "1")
    assert tg.Tape().verify
    monkeypatch.setenv("TAPEGRAD_VERIFY", "0")
    assert not tg.Tape().verify


def test_nan_results_are_not_mistaken_for_changes():
    A = np.array([np.nan, 1.0, 2.0, np.nan])
    for verify in (False, True):
        with tg.Tape(verify=verify) as tape:
            B = base(A)
            loss = tg.sum(B)
        (g,) = tape.gradient(loss, [A])
        np.testing.assert_allclose(g[1:3], 2 * A[1:3])


def test_the_recorded_host_operations_give_the_right_gradients():
    def f(A):
        B = base(A)                                   # A^2
        return tg.sum(tg.scale(tg.reshape(tg.copy(B), (7, 1)), 2.0)) + tg.sum(B)
    (g,) = tg.gradient(f, A0.copy())
    np.testing.assert_allclose(g, 6 * A0)             # d/dA (2 A^2 + A^2)


def test_scale_by_a_tape_scalar_differentiates_both():
    A = A0.copy()
    with tg.Tape() as tape:
        B = base(A)
        s = tg.sum(B)                                 # s = sum A^2
        loss = tg.sum(tg.scale(B, s))                 # s * sum A^2 = s^2
    (g,) = tape.gradient(loss, [A])
    np.testing.assert_allclose(g, 2 * np.sum(A * A) * 2 * A)


def test_scale_and_reshape_in_forward_mode():
    A, v = A0.copy(), np.linspace(-1, 1, 7)
    y, y_dot = tg.jvp(lambda A: tg.sum(tg.scale(tg.reshape(base(A), (7, 1)), 3.0)), A, v)
    assert math.isclose(y, 3 * np.sum(A * A))
    assert math.isclose(y_dot, np.dot(6 * A, v))


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("made_by", ["a launch", "tg.copy", "tg.scale", "the source itself"])
def test_an_array_changed_in_place_between_two_recorded_reads_is_refused(made_by, verify):
    """Whatever made the array (or if it is the source), a recorded operation read it and
    host code changed it before the next read: the first read's derivative would see the new
    contents (before, for all but a launch's result: a gradient 0.7 off, silently)."""
    def f(A):
        if made_by == "a launch":
            T = np.empty_like(A)
            sq(CPU)(T, A, ndrange=A.size)
        elif made_by == "tg.copy":
            T = tg.copy(A)
        elif made_by == "tg.scale":
            T = tg.scale(A, 1.0)
        else:
            T = A
        B, C = np.empty_like(A), np.empty_like(A)
        sin_k(CPU)(B, T, ndrange=A.size)
        T *= 2.0                                     # invisible to the tape
        sin_k(CPU)(C, T, ndrange=A.size)
        return tg.dot(B, C)

    with tg.Tape(verify=verify), pytest.raises(tg.TapegradError, match="B \\*= 3.0"):
        f(A0.copy())


def test_a_result_of_tg_copy_changed_before_its_first_read_is_refused():
    def f(A):
        T = tg.copy(A)
        T *= 2.0                                     # between tg.copy and the launch
        B = np.empty_like(A)
        sin_k(CPU)(B, T, ndrange=A.size)
        return tg.sum(B)

    with tg.Tape(), pytest.raises(tg.TapegradError, match="B \\*= 3.0"):
        f(A0.copy())


def test_arrays_changed_before_the_tapes_first_use_or_after_its_last_are_fine():
    """(Only a change between two recorded uses is refused; the gradients against closed
    forms.)"""
    def f(A):
        w = np.ones_like(A)
        w *= 3.0                                     # before any recorded use of w
        B = base(A)
        C = np.empty_like(A)
        sin_k(CPU)(C, w, ndrange=A.size)
        loss = tg.dot(B, w) + tg.sum(C)
        B[...] = 0.0                                 # after its last recorded use
        return loss

    (g,) = tg.gradient(f, A0.copy())
    np.testing.assert_allclose(g, 6.0 * A0, rtol=1e-14)        # d/dA 3 sum(A^2)
    (g,) = tg.gradient(lambda A: tg.dot(base(A), base(A)), A0.copy())
    np.testing.assert_allclose(g, 4 * A0 ** 3, rtol=1e-14)    # A read twice, unchanged


@tg.kernel
def gathered(B, A, idx):
    i = tg.index()
    B[i] = A[idx[i]] * A[idx[i]]


@tg.kernel
def counted(H, idx):
    i = tg.index()
    tg.atomic_add(H, idx[i], 1)


def test_an_index_array_changed_between_two_launches_that_read_it_is_refused():
    """(The first launch's adjoint reads the index array when the gradient is computed: it
    would gather by the new indices; the gradient came back wrong, silently.)"""
    n = 7

    def f(A, reverse_between):
        idx = np.arange(n)
        B, C = np.empty(n), np.empty(n)
        gathered(CPU)(B, A, idx, ndrange=n)
        if reverse_between:
            idx[:] = idx[::-1].copy()
        else:
            idx = idx[::-1].copy()                   # a new array: fine
        gathered(CPU)(C, A, idx, ndrange=n)
        return tg.dot(B, np.arange(float(n))) + tg.sum(C)

    with pytest.raises(tg.TapegradError, match="int64 of shape \\(7,\\).*new array"):
        tg.gradient(lambda A: f(A, True), A0.copy())
    (g,) = tg.gradient(lambda A: f(A, False), A0.copy())
    np.testing.assert_allclose(g, 2 * A0 * (np.arange(n) + 1), rtol=1e-14)


def test_an_int_array_no_derivative_reads_may_change_between_launches():
    """(Counts a kernel adds into, reset by host code: no adjoint reads them.)"""
    H, idx = np.zeros(3, np.int64), np.array([0, 1, 1, 2, 2, 2, 0])
    with tg.Tape() as tape:
        counted(CPU)(H, idx, ndrange=idx.size)
        H[:] = 0
        counted(CPU)(H, idx, ndrange=idx.size)
        loss = tg.sum(base(A0.copy()))
    assert H.tolist() == [2, 2, 3] and float(loss) == pytest.approx(float(np.sum(A0 ** 2)))
    del tape
