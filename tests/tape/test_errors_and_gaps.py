"""Errors that used to mislead (each is now a tapegrad error that says what to do) and the API
gaps found with them: numbers as sources of a tape, tg.gradient and check_grad over floats.
Gradients meet closed forms or finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def sq(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


@tg.kernel
def scaled_sin(B, A, c):
    i = tg.index()
    B[i] = c * math.sin(A[i])


def test_a_kernel_launched_without_a_backend_says_how_to_launch():
    A, B = np.ones(10), np.zeros(10)
    with pytest.raises(tg.LaunchError, match=r"sq\(backend\)\(B, A, ndrange=n\)"):
        sq(B, A, ndrange=10)
    assert np.all(B == 0)


def test_vjp_with_a_cotangent_of_the_wrong_shape():
    def f(A):
        B = np.zeros_like(A)
        sq(CPU)(B, A, ndrange=A.size)
        return B

    with pytest.raises(tg.TapegradError, match=r"shape \(3,\).*shape \(4,\)"):
        tg.vjp(f, np.ones(4), np.ones(3))


def test_a_kernel_launching_a_kernel_is_refused_at_its_line():
    with pytest.raises(tg.KernelSyntaxError, match="cannot launch a kernel.*@tg.func") as err:
        @tg.kernel
        def outer(B, A):
            sq(tg.CPU())(B, A, ndrange=10)
    assert err.value.lineno is not None and "test_errors_and_gaps.py" in err.value.filename


def test_forward_mode_over_atomic_max_says_what_to_do_instead():
    @tg.kernel
    def biggest(M, A):
        i = tg.index()
        tg.atomic_max(M, 0, A[i])

    A, M = np.array([0.3, 0.9, 0.1]), np.zeros(1)
    with pytest.raises(tg.TapegradError, match="without atomics"):
        tg.autodiff(tg.Forward, biggest(CPU), tg.Const, tg.Duplicated(M, np.zeros(1)),
                    tg.Duplicated(A, np.ones(3)), ndrange=3)


def test_a_watched_number_is_a_source_of_a_tape():
    A, B = np.array([0.2, 0.5, 1.1]), np.zeros(3)
    with tg.Tape() as tape:
        c = tape.watch(1.5)
        scaled_sin(CPU)(B, A, c, ndrange=3)
        loss = tg.sum(B) * c                     # c^2 * sum(sin A)
    gc, gA = tape.gradient(loss, [c, A])
    assert math.isclose(gc, 2 * 1.5 * np.sum(np.sin(A)))
    np.testing.assert_allclose(gA, 1.5 ** 2 * np.cos(A))
    with pytest.raises(tg.TapegradError, match="inside the"):
        tape.watch(2.0)


def test_gradient_and_check_grad_take_floats():
    def f(A, c):
        B = np.zeros_like(A)
        scaled_sin(CPU)(B, A, c, ndrange=A.size)
        return tg.sum(B) + c * c
    A = np.array([0.3, 0.8])
    gA, gc = tg.gradient(f, A, 0.7)
    assert isinstance(gc, float) and math.isclose(gc, np.sum(np.sin(A)) + 1.4)
    np.testing.assert_allclose(gA, 0.7 * np.cos(A))
    assert tg.testing.check_grad(f, A, 0.7)
    with pytest.raises(tg.TapegradError, match="no derivative.*closure"):
        tg.gradient(lambda A, n: tg.sum(A) * n, A, 3)


def test_demo_help_describes_the_demo(capsys):
    from tapegrad.cli import main
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    assert "initial temperature" in capsys.readouterr().out
