"""A shadow that is, or overlaps, its own primal, another argument or another argument's shadow
is refused before anything runs, and the arrays are left as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def run(B, A):
    sin_k(CPU)(B, A, ndrange=A.size)
    return tg.sum(B)


def _cases():
    A, B = np.linspace(0.1, 1.0, 6), np.zeros(6)
    dA, dB = np.zeros(6), np.ones(6)
    big = np.zeros(12)
    return [
        ("its own array", (tg.Duplicated(B, dB), tg.Duplicated(A, A))),
        ("its own array", (tg.Duplicated(B, B), tg.Duplicated(A, dA))),
        ("argument 1's array", (tg.Duplicated(B, A), tg.Duplicated(A, dA))),
        ("its own array", (tg.Duplicated(B, dB), tg.Duplicated(A, A[::-1]))),
        ("share some of their elements", (tg.Duplicated(B, big[:6]),
                                          tg.Duplicated(A, big[3:9]))),
    ]


@pytest.mark.parametrize("case", range(5))
@pytest.mark.parametrize("where", ["kernel", "host"])
def test_overlapping_shadows_are_refused_and_nothing_changes(case, where):
    message, args = _cases()[case]
    before = [(a.val.copy(), a.dval.copy()) for a in args]
    with pytest.raises(tg.TapegradError, match=message):
        if where == "kernel":
            tg.autodiff(tg.Reverse, sin_k(CPU), tg.Const, *args, ndrange=6)
        else:
            tg.autodiff(tg.Reverse, run, tg.Active, *args)
    for a, (val, dval) in zip(args, before):
        assert np.array_equal(a.val, val) and np.array_equal(a.dval, dval)


def test_forward_mode_refuses_a_tangent_that_is_its_primal():
    A, B = np.linspace(0.1, 1.0, 4), np.zeros(4)
    with pytest.raises(tg.TapegradError, match="its own array"):
        tg.autodiff(tg.Forward, sin_k(CPU), tg.Const, tg.Duplicated(B, np.zeros(4)),
                    tg.Duplicated(A, A), ndrange=4)


def test_one_array_passed_twice_with_its_one_shadow_is_accepted():
    @tg.kernel
    def add_sq(C, A, B):
        i = tg.index()
        C[i] = A[i] * B[i]

    A, C = np.array([1.0, 2.0, 3.0]), np.zeros(3)
    dA, dC = np.zeros(3), np.ones(3)
    tg.autodiff(tg.Reverse, add_sq(CPU), tg.Const, tg.Duplicated(C, dC),
                tg.Duplicated(A, dA), tg.Duplicated(A, dA), ndrange=3)
    assert np.allclose(dA, 2 * A)            # d(A*A)/dA
