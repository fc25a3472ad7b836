"""``tapegrad.jax.function``: jax.test_util.check_grads (reverse, order 1) in float64 under
jax.jit, jax.grad and jax.vmap."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'tapegrad[jax]')")
import jax.numpy as jnp  # noqa: E402
from jax.test_util import check_grads  # noqa: E402

import tapegrad as tg  # noqa: E402
import tapegrad.jax as tgj  # noqa: E402
from tests.interop.test_torch import simulate_host, softplus_host  # noqa: E402

jax.config.update("jax_enable_x64", True)


softplus = tgj.function(softplus_host)
simulate = tgj.function(simulate_host)


def test_check_grads_elementwise_and_a_simulation_with_an_active_scalar():
    x = jnp.linspace(-2.0, 2.0, 7)
    check_grads(softplus, (x,), order=1, modes=["rev"])
    u, kappa = jnp.linspace(0.0, 0.5, 12), jnp.asarray(0.15)
    check_grads(simulate, (u, kappa), order=1, modes=["rev"])


def test_under_jit_grad_and_vmap():
    u = jnp.linspace(0.0, 0.5, 12)
    loss = jax.jit(lambda u, k: simulate(u, k)[0])
    g = jax.grad(loss, argnums=(0, 1))(u, 0.15)
    eps = 1e-6
    fd = (loss(u, 0.15 + eps) - loss(u, 0.15 - eps)) / (2 * eps)
    assert float(g[1]) == pytest.approx(float(fd), rel=1e-6)
    xs = jnp.stack([jnp.linspace(-1.0, 1.0, 5), jnp.linspace(0.0, 2.0, 5)])
    batched = jax.vmap(jax.grad(lambda x: jnp.sum(softplus(x))))(xs)
    np.testing.assert_allclose(batched, jax.nn.sigmoid(xs), rtol=1e-12)


def test_without_buffer_callback_through_pure_callback(monkeypatch):
    """The path JAX on a GPU takes (and JAX before 0.7): jax.pure_callback."""
    monkeypatch.setattr(tgj, "_buffer_callback", lambda: None)
    u, kappa = jnp.linspace(0.0, 0.5, 12), jnp.asarray(0.15)
    check_grads(tgj.function(simulate_host), (u, kappa), order=1, modes=["rev"])


@tg.kernel
def increment_k(x):
    i = tg.index()
    x[i] = x[i] + 1.0


def _increments_its_input(x):
    increment_k(tg.CPU())(x, ndrange=x.size)
    return tg.sum(x)


@pytest.mark.parametrize("transform", [jax.jit, lambda f: jax.jit(jax.grad(f))])
def test_a_kernel_writing_an_input_is_refused_and_the_jax_array_unchanged(transform):
    x = jnp.ones(4)
    with pytest.raises(Exception, match="argument x is read-only"):
        transform(tgj.function(_increments_its_input))(x)
    assert x.tolist() == [1.0] * 4
