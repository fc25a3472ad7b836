"""``tg.register_adjoint``: what a registered function and its rules may return.  Each
refusal here stands for a silently wrong derivative or a bare TypeError before."""

import numpy as np
import pytest

import tapegrad as tg

X = np.array([1.0, 2.0, 3.0])


def test_a_correct_rule_gives_the_closed_form():
    square = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar,
                                 forward=lambda x, dx: 2 * x * dx)
    (g,) = tg.gradient(lambda x: tg.sum(square(x)), X)
    np.testing.assert_allclose(g, 2 * X)
    _, dy = tg.jvp(lambda x: tg.sum(square(x)), X, np.array([1.0, 0.5, -1.0]))
    assert dy == pytest.approx(2 * 1 + 4 * 0.5 - 6)


@pytest.mark.parametrize("fn", [lambda x: x, lambda x: x.reshape(3, 1), np.asarray],
                         ids=["itself", "reshape", "asarray"])
def test_returning_the_argument_or_a_view_is_refused(fn):
    # the identity returning x itself gave the gradient 2, as the rule's cotangent was added
    # into the shadow it had read
    op = tg.register_adjoint(fn, reverse=lambda y_bar, x: y_bar.reshape(x.shape))
    with pytest.raises(tg.TapegradError, match="sharing memory with its argument 0.*copy"):
        tg.gradient(lambda x: tg.sum(op(x)), X.copy())


def test_a_tuple_result_is_refused():
    both = tg.register_adjoint(lambda x: (2 * x, 3 * x), reverse=lambda y_bar, x: y_bar)
    with pytest.raises(tg.TapegradError, match="returned a tuple.*one function per output"):
        tg.gradient(lambda x: tg.sum(both(x)[0]), X)


def test_a_cotangent_of_another_shape_is_refused():
    # a summed cotangent was broadcast into every element: gradient [12, 12, 12] for [2, 4, 6]
    summed = tg.register_adjoint(np.square,
                                 reverse=lambda y_bar, x: float(np.sum(2 * x * y_bar)))
    with pytest.raises(tg.TapegradError, match=r"cotangent for argument 0 of square.*\(3,\)"):
        tg.gradient(lambda x: tg.sum(summed(x)), X)
    row = tg.register_adjoint(np.square, reverse=lambda y_bar, x: (2 * x * y_bar)[None, :])
    with pytest.raises(tg.TapegradError, match=r"array of shape \(1, 3\)"):
        tg.gradient(lambda x: tg.sum(row(x)), X)


def test_a_tangent_of_another_shape_is_refused():
    summed = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar,
                                 forward=lambda x, dx: float(np.sum(2 * x * dx)))
    with pytest.raises(tg.TapegradError, match=r"forward rule's tangent of square.*\(3,\)"):
        tg.jvp(lambda x: tg.sum(summed(x)), X, np.ones(3))
