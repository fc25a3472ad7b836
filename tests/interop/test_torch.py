"""``tapegrad.torch.function``: torch.autograd.gradcheck in float64 on an elementwise kernel,
a stencil, an Active scalar parameter (a 0-d tensor that requires grad), a 100-launch
simulation, several inputs and outputs; constants, retain_graph, non-contiguous tensors."""

from __future__ import annotations

import warnings

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
    """(Refused where the gradient is asked for with create_graph=True, whether or not the
    seed requires grad: with a seed that did not, the gradient came back without a graph.)"""
    x = double(5)
    for w in (double(5), torch.ones(5, dtype=torch.float64)):
        with pytest.raises(tg.TapegradError, match="create_graph=True"):
            torch.autograd.grad(softplus(x), x, grad_outputs=w, create_graph=True)
    (g,) = torch.autograd.grad(softplus(x), x, grad_outputs=torch.ones_like(x))
    torch.testing.assert_close(g, torch.sigmoid(x).detach())


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


# -- what the backward depends on: PyTorch's version counters (issue 43, item 15) ----------

@tg.kernel
def square_k(out, u):
    i = tg.index()
    out[i] = u[i] * u[i]


@tg.kernel
def scale_k(out, u, a):
    i = tg.index()
    out[i] = a * u[i]


@tg.kernel
def add_one_k(u):
    i = tg.index()
    u[i] += 1.0


@tgt.function
def energy(u):
    y = np.empty_like(u)
    square_k(tg.CPU())(y, u, ndrange=u.size)
    return tg.sum(y)


@tgt.function
def squares_and_fourth_powers(u):
    """The second launch's adjoint reads the first one's output, which is returned."""
    y, z = np.empty_like(u), np.empty_like(u)
    square_k(tg.CPU())(y, u, ndrange=u.size)
    square_k(tg.CPU())(z, y, ndrange=y.size)
    return y, tg.sum(z)


@tgt.function
def doubled_sum(u):
    y = np.empty_like(u)
    scale_k(tg.CPU())(y, u, 2.0, ndrange=u.size)
    return tg.sum(y)


@tgt.function
def add_one(u):
    add_one_k(tg.CPU())(u, ndrange=u.size)
    return tg.sum(u)


def test_an_input_changed_in_place_before_backward_is_refused_like_pytorchs_own_ops():
    x = double(5)
    h = x * 1
    s = energy(h)
    h.mul_(3)
    with pytest.raises(RuntimeError, match=r"energy: its argument u \(a tensor of shape "
                       r"\(5,\)\) was modified by an inplace operation after the forward pass: "
                       r"it is at version 1, the backward pass expected version 0 .* Call "
                       r"backward\(\) before changing it, or change a copy .*clone\(\)") \
            as refusal:
        s.backward()
    assert isinstance(refusal.value, tg.InplaceModificationError)
    h_torch = x * 1                          # PyTorch's own ops on the same math refuse too
    s_torch = (h_torch * h_torch).sum()
    h_torch.mul_(3)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        s_torch.backward()
    energy(x * 1).backward()                 # unchanged: PyTorch's gradient of the same math
    expected = torch.autograd.grad((x * x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected, rtol=1e-14, atol=0)


def test_an_output_the_backward_reads_changed_in_place_is_refused():
    x = double(4)
    y, s = squares_and_fourth_powers(x)
    y.mul_(3)
    with pytest.raises(tg.TapegradError, match=r"squares_and_fourth_powers: its output 0 .* "
                       "modified by an inplace operation .* at version 1, the backward pass "
                       "expected version 0"):
        s.backward()
    y, s = squares_and_fourth_powers(x)
    (s + y.sum()).backward()
    expected = torch.autograd.grad((x ** 4).sum() + (x * x).sum(), x)[0]
    torch.testing.assert_close(x.grad, expected, rtol=1e-13, atol=0)


def test_a_change_the_backward_does_not_read_is_allowed_as_in_pytorch():
    """A linear kernel's adjoint reads none of its input (PyTorch's 2 * h saves none)."""
    x = double(5)
    h = x * 1
    s = doubled_sum(h)
    h.mul_(3)
    s.backward()
    h_torch = x.detach().clone().requires_grad_()
    expected = torch.autograd.grad((2.0 * (h_torch * 1)).sum(), h_torch)[0]
    torch.testing.assert_close(x.grad, expected)


def test_a_kernel_writing_an_input_that_requires_grad_is_refused_before_it_writes():
    x = double(4)
    before = x.detach().clone()
    with pytest.raises(tg.LaunchError, match="argument u is read-only"):
        add_one(x)
    a = x.exp()                              # a non-leaf that PyTorch's exp saved
    with pytest.raises(tg.LaunchError, match="argument u is read-only"):
        add_one(a)
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)
    torch.testing.assert_close(a.detach(), before.exp(), rtol=0, atol=0)


def test_a_kernel_writing_a_constant_that_pytorch_saved_makes_pytorch_refuse():
    x = double(4)
    c = torch.rand(4, dtype=torch.float64)
    y = x * c                                # MulBackward saves c
    add_one(c)                               # c is a constant here: written, version raised
    assert c._version == 1
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    c = torch.rand(4, dtype=torch.float64)
    y = x + c                                # AddBackward saves nothing: no refusal
    total = add_one(c)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(4, dtype=torch.float64))
    assert float(total) == pytest.approx(float(c.sum()))


def test_where_an_input_cannot_be_read_only_its_write_is_refused_after_the_call(monkeypatch):
    """CUDA tensors have no read-only view: a write into one that requires grad is found in
    the recorded call and refused (here a CPU tensor passed writable, as a CUDA one is)."""
    to_tapegrad = tgt._to_tapegrad
    monkeypatch.setattr(tgt, "_to_tapegrad", lambda torch, x, read_only=False:
                        to_tapegrad(torch, x))
    with pytest.raises(tg.TapegradError, match="its argument u, a tensor that requires grad, "
                       "was written in place by tapegrad's kernels, which PyTorch's graph "
                       "cannot follow"):
        add_one(double(4))


# -- what the backward depends on: arrays read from outside the arguments -------------------

@tg.kernel
def weighted_square_k(out, u, w):
    i = tg.index()
    out[i] = w[i] * u[i] * u[i]


@tg.kernel
def shift_k(out, u, w):
    i = tg.index()
    out[i] = u[i] + w[i]


W = np.linspace(1.0, 2.0, 5)


@tgt.function
def weighted_energy(u):
    """Reads the global W: its adjoint reads W's contents."""
    y = np.empty_like(u)
    weighted_square_k(tg.CPU())(y, u, W, ndrange=u.size)
    return tg.sum(y)


@tgt.function
def shifted_sum(u):
    """Reads the global W, which its adjoint does not read."""
    y = np.empty_like(u)
    shift_k(tg.CPU())(y, u, W, ndrange=u.size)
    return tg.sum(y)


def _closing_over(v):
    @tgt.function
    def closure_energy(u):
        y = np.empty_like(u)
        weighted_square_k(tg.CPU())(y, u, v, ndrange=u.size)
        return tg.sum(y)
    return closure_energy


SCRATCH = np.empty(5)


@tgt.function
def through_a_global_buffer(u):
    """Writes a global work array that its backward reads: each call overwrites it."""
    square_k(tg.CPU())(SCRATCH, u, ndrange=u.size)
    return tg.dot(SCRATCH, SCRATCH)


def test_a_global_array_changed_in_place_before_backward_is_refused():
    x = double(5)
    s = weighted_energy(x)
    W[:] *= 3
    try:
        with pytest.raises(RuntimeError, match=r"weighted_energy: the global W \(an array of "
                           r"shape \(5,\) that the function reads without taking it as an "
                           r"argument\) was changed in place after the forward pass.* Pass it "
                           r"to the function as an argument .*, or call backward\(\) before "
                           "changing it") as refusal:
            s.backward()
        assert isinstance(refusal.value, tg.InplaceModificationError)
        assert x.grad is None
    finally:
        W[:] /= 3
    weighted_energy(x).backward()            # unchanged: the closed form 2 W x
    torch.testing.assert_close(x.grad, 2 * torch.from_numpy(W) * x.detach(), rtol=1e-14,
                               atol=0)
    reference = torch.autograd.grad((torch.from_numpy(W) * x * x).sum(), x)[0]
    torch.testing.assert_close(x.grad, reference, rtol=1e-14, atol=0)


def test_a_closure_array_changed_in_place_before_backward_is_refused():
    v = np.linspace(0.5, 1.0, 4)
    f = _closing_over(v)
    x = double(4)
    s = f(x)
    v[2] = -1.0
    with pytest.raises(tg.InplaceModificationError, match="closure_energy: the closure "
                       "variable v .* was changed in place after the forward pass"):
        s.backward()
    f(x).backward()
    torch.testing.assert_close(x.grad, 2 * torch.from_numpy(v) * x.detach(), rtol=1e-14,
                               atol=0)
    assert torch.autograd.gradcheck(f, (x,))


def test_a_global_work_array_overwritten_by_a_second_call_is_refused():
    """Two forward passes, then the first one's backward: it would read the second call's
    contents of the global work array."""
    a, b = double(5), double(5)
    s_a = through_a_global_buffer(a)
    s_b = through_a_global_buffer(b)
    with pytest.raises(tg.InplaceModificationError, match="the global SCRATCH"):
        s_a.backward()
    s_b.backward()                           # its own contents: d sum(b^4) = 4 b^3
    torch.testing.assert_close(b.grad, 4 * b.detach() ** 3, rtol=1e-14, atol=0)


KEPT: list = []


@tgt.function
def keeping_its_temporary(u):
    """A temporary that ``f`` also keeps where the caller can reach it."""
    y = np.empty_like(u)
    square_k(tg.CPU())(y, u, ndrange=u.size)
    KEPT.append(y)
    return tg.dot(y, y)


def test_a_temporary_kept_where_the_caller_reaches_it_is_guarded_too():
    x = double(4)
    s = keeping_its_temporary(x)
    KEPT[0][1] = 5.0
    with pytest.raises(tg.InplaceModificationError, match=r"the global KEPT\[0\] \(an array "
                       r"of shape \(4,\)"):
        s.backward()
    KEPT.clear()
    keeping_its_temporary(x).backward()
    torch.testing.assert_close(x.grad, 4 * x.detach() ** 3, rtol=1e-14, atol=0)
    KEPT.clear()


def test_an_outside_array_the_backward_does_not_read_may_change():
    x = double(5)
    s = shifted_sum(x)
    W[:] *= 3
    try:
        s.backward()
    finally:
        W[:] /= 3
    torch.testing.assert_close(x.grad, torch.ones(5, dtype=torch.float64))


def test_a_function_reading_nothing_from_outside_fingerprints_nothing():
    """Its temporaries only the tape holds: nothing to guard, nothing to pay."""
    x = double(6)
    for s in (energy(x), squares_and_fourth_powers(x)[1], simulate(x, 0.1)[0]):
        assert s.grad_fn.call.outside == []
    assert [a is W for a, _ in weighted_energy(x[:5]).grad_fn.call.outside] == [True]


# -- wrong numbers an adversarial review found, now errors --------------------------------

@tg.kernel
def scaled_product(out, x, y, a):
    i = tg.index()
    out[i] = a * tg.sin(x[i]) * y[i]


@tgt.function
def product(x, y, a):
    out = np.empty_like(x)
    scaled_product(tg.CPU())(out, x, y, a, ndrange=x.size)
    return out


def test_two_arguments_sharing_memory_with_a_gradient_wanted_are_refused():
    """(Each got the memory's total derivative: f(x, x) came back twice the right gradient,
    f(x, x.detach()) with the detached argument's share.)"""
    x = double(4)
    for y in (x, x[:], x.detach()):
        with pytest.raises(tg.TapegradError, match="arguments x and y share memory.*clone"):
            product(x, y, 0.7)
    product(x, x.clone(), 0.7).sum().backward()        # the way out: a copy
    expected = 0.7 * (torch.cos(x) * x + torch.sin(x)).detach()
    torch.testing.assert_close(x.grad, expected, rtol=1e-12, atol=0)


def test_a_numpy_argument_changed_before_backward_is_refused():
    x, w = double(4), np.linspace(1.0, 2.0, 4)
    out = product(x, w, 0.5)
    w *= 3.0
    with pytest.raises(tg.errors.InplaceModificationError, match="NumPy array of shape"):
        out.sum().backward()


@tgt.function
def square_as_matrix(x):
    out = np.empty_like(x)
    scaled_product(tg.CPU())(out, x, x.copy(), 1.0, ndrange=x.size)
    return out.reshape(2, 2)


def test_a_result_returned_as_a_view_is_refused_not_zero():
    x = double(4)
    with pytest.raises(tg.TapegradError, match="result 0 .* shares memory.*tg.reshape"):
        square_as_matrix(x).sum().backward()


def test_a_number_tapegrad_did_not_make_is_refused_not_zero():
    """(NumPy's sum of a kernel's output: x.grad was zero.)"""
    x = double(6)
    with pytest.raises(tg.TapegradError, match="result 0 is the number .* and a derivative"):
        tgt.function(lambda x: np.sum(softplus_host(x)))(x).backward()


def test_an_argument_returned_as_it_is_passes_its_cotangent_back():
    """(x.grad was zero.)"""
    x = double(6)
    (tgt.function(lambda x: x)(x) ** 2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach(), rtol=1e-14, atol=0)


def test_a_result_that_is_an_argument_is_a_tensor_of_its_own():
    """(It was a tensor on the argument's memory: read-only with a PyTorch warning where the
    argument wants a gradient, and changing with the argument, unseen by autograd.)"""
    x, m = double(6), torch.linspace(0.0, 1.0, 6, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y, mask = tgt.function(lambda x, m: (x, m))(x, m)
    before = x.detach().clone()
    with torch.no_grad():
        y.add_(1.0)
        mask.mul_(2.0)
    torch.testing.assert_close(x.detach(), before, rtol=0, atol=0)
    torch.testing.assert_close(m, torch.linspace(0.0, 1.0, 6, dtype=torch.float64),
                               rtol=0, atol=0)
    torch.testing.assert_close(mask, 2 * m, rtol=0, atol=0)


def test_a_constant_array_result_that_the_loss_uses_is_a_constant():
    f = tgt.function(lambda x: (softplus_host(x), np.arange(3.0)))
    x = double(6)
    y, table = f(x)
    (y.sum() + table.sum()).backward()
    torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()), rtol=1e-12, atol=0)


def test_an_argument_without_a_gradient_returned_as_it_is_is_a_constant():
    """(A mask passed through was refused as 'one of its arguments' though no gradient is
    wanted for it.)"""
    f = tgt.function(lambda x, m: (softplus_host(x), m))
    x, m = double(6), torch.linspace(0.0, 1.0, 6, dtype=torch.float64)
    y, mask = f(x, m)
    (y * mask).sum().backward()
    torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()) * m, rtol=1e-12, atol=0)
