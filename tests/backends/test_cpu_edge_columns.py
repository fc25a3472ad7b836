"""A 2-D stencil's adjoint runs the edge columns of its interior rows after the task's groups,
column by column (``split_item_loop``'s column pass in tapegrad/backends/cpu/lower.py).  The
gradients are checked against the transposed step matrix in float64 and against finite
differences, in the CPU's rows (groups of one row), in the launch's own groups (several rows,
several columns of groups, task runs that start and end inside a row of groups), and where
a row's rest is too wide for the pass."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import stencil2d_k as diffuse
from tests.ad.gradcheck import kernel_vjp_error
from tests.tape.test_chains import step_matrix

CPU = tg.CPU()


@tg.kernel
def narrow(Y, X):
    """An interior of three columns, so that a row's rest is most of it (more than the
    column pass takes), and an else branch with a branch of its own."""
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if 0 < i < n - 1 and 0 < j < 4:
        Y[i, j] = X[i - 1, j] * X[i + 1, j - 1]
    else:
        if X[i, j] > 0.0:
            Y[i, j] = 3.0 * X[i, j]
        else:
            Y[i, j] = X[i, j] * X[i, j]


@pytest.mark.parametrize("shape, group", [((64, 256), (8, 64)),   # the CPU's rows of 256
                                          ((10, 37), (4, 8))])     # the launch's groups
def test_diffusion_adjoint_equals_the_transposed_step(shape, group):
    rng = np.random.default_rng(3)
    x, w = rng.random(shape), rng.standard_normal(shape)
    y, dx = np.empty_like(x), np.full_like(x, np.nan)
    cfg = diffuse(CPU, group)
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(y, w.copy()),
                tg.Duplicated(x, dx), 0.2, ndrange=shape, accumulate=False)
    expected = (step_matrix(shape, 0.2).T @ w.ravel()).reshape(shape)
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)
    assert "column by column" in diffuse.source("reverse", backend=CPU)


def test_the_pass_is_for_adjoints_that_test_each_neighbour():
    # the primal's rest is a copy, without branches: it stays in the rows
    x = np.random.default_rng(4).random((64, 256))
    diffuse(CPU, (8, 64))(np.empty_like(x), x, 0.2, ndrange=x.shape)
    assert "column by column" not in diffuse.source("primal", backend=CPU)


@pytest.mark.parametrize("shape, group", [((40, 300), (1, 64)), ((9, 70), (4, 16))])
def test_a_rest_wider_than_the_pass_takes(shape, group):
    x = np.random.default_rng(5).uniform(-1, 1, shape)
    err, _, _ = kernel_vjp_error(narrow(CPU, group), [np.zeros(shape), x], shape, wrt=[1],
                                 outputs=[0], functional=True)
    assert err < 1e-6
