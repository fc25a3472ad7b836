"""A tape records each launch with a function written for the launch's recording plan
(tapegrad/tape/recorder.py).  Each case takes one of the generated code's branches (two views
of one memory, found among many arrays; an array read and overwritten whose contents the
adjoint needs; a tracked scalar) and checks the gradient against a closed form."""

from __future__ import annotations

import traceback

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.tape.recorder import RecordPlan

CPU = tg.CPU()
N = 16


@tg.kernel
def add_four(E, A, B, C, D):
    i = tg.index()
    E[i] = A[i] + B[i] + C[i] * D[i]


@tg.kernel
def square_in_place(X):
    i = tg.index()
    X[i] = X[i] * X[i]


@tg.kernel
def scale_by(Y, s, X):
    i = tg.index()
    Y[i] = s * X[i]


def plans(kernel) -> list[RecordPlan]:
    return [v for k, v in kernel.cache.items() if isinstance(k, tuple) and k[0] == "record plan"]


def test_two_views_of_one_memory_among_five_arrays():
    # ten pairs of identities: the generated test calls _repeats; A[:] is A's memory again
    a = np.linspace(0.5, 1.5, N)
    b, d = np.full(N, 2.0), np.linspace(-1.0, 1.0, N)

    def loss(a, d):
        e = np.empty_like(a)
        add_four(CPU, 8)(e, a, b, a[:], d, ndrange=N)
        return tg.sum(e)

    ga, gd = tg.gradient(loss, a, d)
    np.testing.assert_allclose(ga, 1.0 + d)      # d(a + b + a d)/da
    np.testing.assert_allclose(gd, a)
    (plan,) = plans(add_four)
    assert "_repeats([" in plan.source and "_launch_merged" in plan.source


def test_overwritten_array_whose_contents_the_adjoint_reads():
    x = np.linspace(0.5, 1.5, N)

    def loss(x):
        y = tg.copy(x)
        square_in_place(CPU, 8)(y, ndrange=N)
        square_in_place(CPU, 8)(y, ndrange=N)
        return tg.sum(y)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 4.0 * x ** 3, rtol=1e-12)
    (plan,) = plans(square_in_place)
    assert "tape.will_overwrite(a0, True, i0)" in plan.source


def test_tracked_scalar_argument():
    x = np.linspace(0.5, 1.5, N)

    def loss(x):
        s = tg.sum(x)                       # a tracked scalar, passed to the kernel
        y = np.empty_like(x)
        scale_by(CPU, 8)(y, s, x, ndrange=N)
        return tg.sum(y)                    # s * sum(x) = sum(x)^2

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 2.0 * x.sum(), rtol=1e-12)
    tracked = [p for p in plans(scale_by) if p.tracked]
    assert tracked and "args[1].node" in tracked[0].source


def test_source_is_readable_python():
    x = np.linspace(0.5, 1.5, N)
    (g,) = tg.gradient(lambda x: tg.sum(_scaled(x)), x)
    np.testing.assert_allclose(g, 3.0)
    (plan,) = [p for p in plans(scale_by) if not p.tracked]
    compile(plan.source, "<check>", "exec")
    assert plan.source.startswith("# Records a launch of scale_by")
    assert "a0 = Y (written; held weakly)" in plan.source
    assert "a2 = X (read; held weakly)" in plan.source     # linear in X: not kept

    def failing(plain, nd):
        raise ValueError("from the kernel")

    # a failure inside shows the generated line in its traceback
    y = np.empty_like(x)
    with pytest.raises(ValueError) as info:
        plan.record(tg.Tape(), scale_by(CPU, 8), (y, 3.0, x), (y, 3.0, x), failing, (N,), N)
    assert "launcher(plain, nd)" in "".join(traceback.format_tb(info.tb))


def _scaled(x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    scale_by(CPU, 8)(y, 3.0, x, ndrange=N)
    return y
