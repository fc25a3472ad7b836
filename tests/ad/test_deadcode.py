"""Dead code removed from adjoints (tapegrad/ad/deadcode.py): the forward replay keeps only
what the reverse sweep reads, and every derivative stays exact (finite differences)."""

import numpy as np
import pytest

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error


@tg.kernel
def window_sum(Y, X, W):
    i = tg.index()
    acc = 0.0
    for k in range(3):
        acc += W[k] * X[i + k]
    Y[i] = acc


@tg.kernel
def window_product(Y, X):
    i = tg.index()
    acc = 1.0
    k = 0
    while k < 3:
        acc = acc * X[i + k]
        k += 1
    Y[i] = acc


def _forward_part(source: str) -> str:
    """The adjoint up to its reverse sweep (which reads the output's shadow)."""
    return source.split("Y_bar[i]")[0]


@pytest.mark.parametrize("wrt", [[1], [1, 2]])
def test_a_linear_loop_is_not_replayed(wrt):
    n = 9
    rng = np.random.default_rng(len(wrt))
    args = [np.zeros(n), rng.uniform(-1, 1, n + 2), rng.uniform(-1, 1, 3)]
    err, *_ = kernel_vjp_error(window_sum(tg.CPU(), 4), args, n, wrt=wrt, outputs=[0])
    assert err < 1e-8
    replay = _forward_part(window_sum.source(mode="reverse"))
    # the reverse sweep reads no partial sum (W_bar needs X, not acc): no replayed sum, and
    # the loop left empty is gone too
    assert "acc = acc +" not in replay and "for k in range(" not in replay


def test_a_loop_whose_values_the_reverse_sweep_needs_is_replayed():
    n = 7
    X = np.random.default_rng(3).uniform(0.5, 1.5, n + 2)
    err, *_ = kernel_vjp_error(window_product(tg.CPU(), 4), [np.zeros(n), X], n, wrt=[1],
                               outputs=[0])
    assert err < 1e-8
    assert "acc = acc * X" in _forward_part(window_product.source(mode="reverse"))
