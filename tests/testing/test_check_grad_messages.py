"""check_grad's failures say why the finite differences may be the wrong side: a function
that computes in float32 (a float32 intermediate: check_grad's float64 copies do not help),
or one whose differences change with the step; its refusals name check_grad."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.testing import check_grad
from tests.capture.test_guards import sq

CPU = tg.CPU()


def loss_in_float32(x):
    y = np.empty(x.size, np.float32)          # the intermediate in float32
    sq(CPU)(y, x, ndrange=x.size)
    return tg.sum(y)


def test_a_float32_intermediate_is_named_as_the_cause():
    x = np.random.default_rng(1).random(8).astype(np.float32)
    with pytest.raises(AssertionError) as info:
        check_grad(loss_in_float32, x)
    message = str(info.value)
    assert "reverse mode gives" in message
    assert "f appears to compute in float32" in message
    assert "np.empty_like(x)" in message


def test_differences_that_change_with_the_step_are_named():
    """(|x| at x = eps / 2: the step crosses the kink, and a twice larger one differently)"""
    with pytest.raises(AssertionError) as info:
        check_grad(lambda x: tg.norm(x), np.array([5e-7]))
    message = str(info.value)
    assert "reverse mode gives 1.0, central finite differences 0.5" in message
    assert "With a step of 2 * eps central finite differences give 0.2499" in message
    assert "float32" not in message
    assert "not smooth at this point" in message


def test_a_correct_gradient_passes_without_the_second_look():
    assert check_grad(lambda x: tg.dot(x, x), np.array([0.3, -1.2]))


@pytest.mark.parametrize("arg, says", [(np.arange(4), "has dtype int64"), (3, "is 3")],
                         ids=["int-array", "int"])
def test_an_integer_argument_is_refused_by_check_grad_by_name(arg, says):
    with pytest.raises(tg.TapegradError) as info:
        check_grad(lambda a: tg.sum(a * np.ones(4)), arg)
    message = str(info.value)
    assert message.startswith("tg.testing.check_grad differentiates with respect to float")
    assert says in message and "tape.gradient" not in message
