"""``tapegrad.torch.function``: torch.autograd.gradcheck in float64 on an elementwise kernel,
a stencil, an Active scalar parameter (a 0-d tensor that requires grad), a 100-launch
simulation, several inputs and outputs; constants, retain_graph, non-contiguous tensors."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'tapegrad[torch]')")
import tapegrad.torch as tgt  # noqa: E402


@tg.kernel
def softplus_k(out, x):
    i = tg.index()
    out[i] = tg.logaddexp(x[i], 0.0)


@tg.kernel
def heat_k(out, u, kappa):
    i = tg.index()
    n = u.shape[0]
    if i == 0 or i == n - 1:
        out[i] = u[i]
    else:
        out[i] = u[i] + kappa * (u[i - 1] - 2.0 * u[i] + u[i + 1]) - 0.1 * u[i] * u[i] * u[i]


def softplus_host(x):
    y = np.empty_like(x)
    softplus_k(tg.CPU())(y, x, ndrange=x.size)
    return y


def simulate_host(u, kappa):
    """100 launches, two outputs (also wrapped for JAX: tests/interop/test_jax.py)."""
    for _ in range(100):
        out = np.empty_like(u)
        heat_k(tg.CPU())(out, u, kappa, ndrange=u.size)
        u = out
    return tg.dot(u, u), u


softplus = tgt.function(softplus_host)
simulate = tgt.function(simulate_host)


@tgt.function
def stencil(u, kappa):
    out = np.empty_like(u)
    heat_k(tg.CPU())(out, u, kappa, ndrange=u.size)
    return out


def double(*shape):
    return torch.rand(*shape, dtype=torch.float64, requires_grad=True)


def test_gradcheck_elementwise_and_stencil():
    assert torch.autograd.gradcheck(softplus, (double(7) * 4 - 2,))
    assert torch.autograd.gradcheck(stencil, (double(9), 0.2))


def test_gradcheck_an_active_scalar_parameter():
    kappa = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(stencil, (double(9), kappa))


def test_gradcheck_a_100_launch_simulation_with_two_outputs():
    kappa = torch.tensor(0.15, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(simulate, (double(12) * 0.5, kappa))


def test_constants_retain_graph_and_non_contiguous_tensors():
    base = double(8, 2)
    u = base[:, 0]                            # a strided view: copied once, gradient exact
    assert not u.is_contiguous()
    kappa = torch.tensor(0.2, dtype=torch.float64)      # no grad: a constant
    loss = stencil(u, kappa).pow(2).sum()
    loss.backward(retain_graph=True)
    first = base.grad.clone()
    assert first[:, 0].abs().sum() > 0 and not first[:, 1].any()
    loss.backward()
    torch.testing.assert_close(base.grad, 2 * first)
    assert kappa.grad is None


def test_outputs_are_tensors_without_copies_and_the_errors_are_tapegrads():
    x = torch.rand(5, dtype=torch.float64)
    y = softplus(x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float64
    with pytest.raises(tg.TapegradError, match="returned a dict; a wrapped tapegrad function "
                       "returns arrays, numbers"):
        tgt.function(lambda x: {"a": x})(x)


def test_torch_func_grad_and_vmap():
    x = torch.linspace(-2.0, 2.0, 6, dtype=torch.float64)
    torch.testing.assert_close(torch.func.grad(lambda x: softplus(x).sum())(x), torch.sigmoid(x))
    batch = torch.stack([x, 2 * x, -x])
    torch.testing.assert_close(torch.func.vmap(softplus)(batch),
                               torch.nn.functional.softplus(batch))
    u = torch.stack([torch.linspace(0.0, 0.5, 12, dtype=torch.float64)] * 2)
    energies, finals = torch.func.vmap(simulate, in_dims=(0, None))(u, 0.15)
    assert energies.shape == (2,) and finals.shape == (2, 12)
    torch.testing.assert_close(energies[0], energies[1])


def test_vmap_of_grad_and_jacrev_take_each_examples_own_call():
    x = torch.linspace(-2.0, 2.0, 6, dtype=torch.float64)
    batch = torch.stack([x, 2 * x, -x])
    per_example = torch.func.vmap(torch.func.grad(lambda x: softplus(x).sum()))(batch)
    torch.testing.assert_close(per_example, torch.sigmoid(batch), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(torch.func.jacrev(softplus)(x), torch.diag(torch.sigmoid(x)),
                               rtol=1e-12, atol=1e-14)
    u = torch.linspace(0.0, 0.5, 12, dtype=torch.float64)
    kappas = torch.tensor([0.1, 0.2], dtype=torch.float64)
    d_kappa = torch.func.vmap(torch.func.grad(lambda u, k: simulate(u, k)[0], argnums=1),
                              in_dims=(None, 0))(u, kappas)
    eps = 1e-6
    for k, g in zip(kappas.tolist(), d_kappa.tolist()):         # central differences
        fd = (simulate_host(u.numpy(), k + eps)[0] - simulate_host(u.numpy(), k - eps)[0])
        assert g == pytest.approx(float(fd) / (2 * eps), rel=1e-7)


def test_a_second_derivative_is_refused_not_zero():
    x, w = double(5), double(5)
    (g,) = torch.autograd.grad(softplus(x), x, grad_outputs=w, create_graph=True)
    torch.testing.assert_close(g, (w * torch.sigmoid(x)).detach())
    with pytest.raises(RuntimeError, match="differentiate twice a function that was marked "
                       "with @once_differentiable"):
        g.sum().backward()


def test_inside_torch_compile_as_a_graph_break():
    x = torch.linspace(-2.0, 2.0, 6, dtype=torch.float64, requires_grad=True)
    loss = torch.compile(backend="aot_eager")(lambda x: (softplus(3.0 * x) * x).sum())
    loss(x).backward()
    expected = torch.nn.functional.softplus(3.0 * x) + 3.0 * x * torch.sigmoid(3.0 * x)
    torch.testing.assert_close(x.grad, expected.detach(), rtol=1e-12, atol=1e-14)


def test_several_inputs_and_outputs_through_tg_vjp_match_torch():
    u, kappa = np.linspace(0.0, 0.5, 12), 0.15
    w_u = np.linspace(1.0, 2.0, 12)
    (energy, final), (u_bar, kappa_bar) = tg.vjp(
        simulate_host, (u, kappa), (2.0, w_u))
    ut = torch.from_numpy(u.copy()).requires_grad_()
    kt = torch.tensor(kappa, dtype=torch.float64, requires_grad=True)
    e, f = simulate(ut, kt)
    (2.0 * e + (f * torch.from_numpy(w_u)).sum()).backward()
    torch.testing.assert_close(ut.grad, torch.from_numpy(u_bar))
    assert kt.grad.item() == pytest.approx(kappa_bar, rel=1e-12)
