"""tapegrad.testing: check_grad accepts right gradients, rejects wrong ones by naming the
worst element, and its Hypothesis strategies drive property-based tests of user kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tapegrad.testing import arrays, check_grad, duplicated, shadow_of


@tg.kernel
def softsign(B, A):
    i = tg.index()
    B[i] = A[i] / (1.0 + abs(A[i])) + math.sin(A[i]) * A[i]


def energy(A):
    B = np.zeros_like(A)
    softsign(tg.get_backend(A))(B, A, ndrange=A.size)
    return tg.dot(B, B) + 0.1 * tg.sum(A)


@settings(max_examples=20, deadline=None)
@given(arrays(min_value=-2.0, max_value=2.0))
def test_property_user_kernel_gradient(A):
    assert check_grad(energy, A)


@settings(max_examples=10, deadline=None)
@given(duplicated(arrays(shape=(6,))), st.floats(0.1, 2.0))
def test_property_shadows_accumulate(dup, scale):
    A = dup.val
    for _ in range(2):
        tg.autodiff(tg.Reverse, lambda a: energy(a) * scale, tg.Active, dup)
    (g,) = tg.gradient(energy, A)
    np.testing.assert_allclose(dup.dval, 2 * scale * g, rtol=1e-10, atol=1e-12)


@settings(max_examples=10, deadline=None)
@given(arrays(shape=(5,)).flatmap(lambda x: st.tuples(st.just(x), shadow_of(x))))
def test_property_vjp_matches_jacobian_transpose(xw):
    x, w = xw

    def f(x):
        y = np.zeros_like(x)
        softsign(tg.CPU())(y, x, ndrange=x.size)
        return y

    J = tg.jacobian(f, x)
    _, x_bar = tg.vjp(f, x, w)
    np.testing.assert_allclose(x_bar, J.T @ w, rtol=1e-10, atol=1e-12)


square_wrong = tg.register_adjoint(np.square, reverse=lambda y_bar, x: y_bar * x)


def test_check_grad_rejects_a_wrong_rule_naming_the_worst_element():
    x = np.array([0.5, -1.0, 3.0])
    with pytest.raises(AssertionError, match=r"index \(2,\)") as info:
        check_grad(lambda x: tg.sum(square_wrong(x)), x)
    assert "finite differences" in str(info.value)


def test_check_grad_on_float32_inputs_checks_in_float64():
    A = np.linspace(-1, 1, 7).astype(np.float32)
    assert check_grad(energy, A)
