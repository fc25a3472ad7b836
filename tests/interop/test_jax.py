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
from tests.capture.test_reverse import square  # noqa: E402
from tests.interop.test_torch import heat_k, simulate_host, softplus_host  # noqa: E402

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


def test_grad_of_jit_with_a_float_constant_argument():
    """(jax.grad(jax.jit(f)) handed the backward a float literal, not an array: it raised
    AttributeError.)"""
    x = jnp.linspace(0.0, 0.5, 12)

    def loss(u):
        return simulate(u, 0.15)[0]
    g = jax.grad(jax.jit(loss))(x)
    np.testing.assert_allclose(g, jax.grad(loss)(x), rtol=1e-14)
    np.testing.assert_allclose(g, jax.jit(jax.grad(loss))(x), rtol=1e-14)
    e = jnp.zeros(12).at[3].set(1e-6)                 # and right: a central difference
    fd = (loss(x + e) - loss(x - e)) / 2e-6
    assert float(g[3]) == pytest.approx(float(fd), rel=1e-6)


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


# -- a backward that runs several times (issue 43, item 16) ---------------------------------

def softplus_jax(x):
    """The same math in JAX, differentiated by JAX itself."""
    return jnp.logaddexp(x, 0.0)


def simulate_jax(u, kappa):
    for _ in range(100):
        inner = u[1:-1] + kappa * (u[:-2] - 2.0 * u[1:-1] + u[2:]) - 0.1 * u[1:-1] ** 3
        u = u.at[1:-1].set(inner)
    return jnp.dot(u, u), u


def central_differences(f, x, eps=1e-6):
    """d f / d x (f: NumPy array -> NumPy array) in float64, column by column."""
    x = np.asarray(x, dtype=np.float64)
    columns = []
    for k in range(x.size):
        step = np.zeros_like(x)
        step.flat[k] = eps
        columns.append((np.asarray(f(x + step)) - np.asarray(f(x - step))).ravel() / (2 * eps))
    return np.stack(columns, axis=-1)


@pytest.mark.parametrize("transform", [lambda f: f, jax.jit], ids=["eager", "jit"])
def test_jacrev_matches_jaxs_own_jacrev_and_central_differences(transform):
    x = jnp.linspace(-2.0, 2.0, 6)
    jac = transform(jax.jacrev(softplus))(x)
    np.testing.assert_allclose(jac, jax.jacrev(softplus_jax)(x), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(jac, central_differences(softplus_host, x), rtol=1e-7,
                               atol=1e-9)
    u, kappa = jnp.linspace(0.0, 0.5, 12), jnp.asarray(0.15)
    (de_du, de_dk), (df_du, df_dk) = transform(jax.jacrev(simulate, argnums=(0, 1)))(u, kappa)
    (re_du, re_dk), (rf_du, rf_dk) = jax.jacrev(simulate_jax, argnums=(0, 1))(u, kappa)
    for ours, theirs in [(de_du, re_du), (de_dk, re_dk), (df_du, rf_du), (df_dk, rf_dk)]:
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-13)
    fd = central_differences(lambda u: simulate_host(u, 0.15)[1], np.asarray(u))
    np.testing.assert_allclose(df_du, fd, rtol=1e-6, atol=1e-8)


def test_a_vjp_fn_called_again_gives_the_same_gradient_even_after_its_tape_was_dropped():
    u, kappa = jnp.linspace(0.0, 0.5, 12), jnp.asarray(0.15)
    (energy, final), vjp_fn = jax.vjp(simulate, u, kappa)
    (_, final_jax), vjp_jax = jax.vjp(simulate_jax, u, kappa)
    np.testing.assert_allclose(final, final_jax, rtol=1e-13)
    w = jnp.linspace(1.0, 2.0, 12)
    expected = vjp_jax((2.0, w))
    for _ in range(2):
        for ours, theirs in zip(vjp_fn((2.0, w)), expected):
            np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-14)
    tgj._calls.clear()
    tgj._answered.clear()                 # (as when more forward passes waited than kept)
    for ours, theirs in zip(vjp_fn((2.0, w)), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-11, atol=1e-14)


def test_jacrev_and_a_reused_vjp_fn_through_pure_callback(monkeypatch):
    monkeypatch.setattr(tgj, "_buffer_callback", lambda: None)
    f = tgj.function(softplus_host)
    x = jnp.linspace(-2.0, 2.0, 5)
    np.testing.assert_allclose(jax.jacrev(f)(x), jax.jacrev(softplus_jax)(x), rtol=1e-13,
                               atol=1e-15)
    _, vjp_fn = jax.vjp(f, x)
    w = jnp.linspace(0.5, 1.5, 5)
    np.testing.assert_allclose(vjp_fn(w)[0], vjp_fn(w)[0], rtol=0, atol=0)
    np.testing.assert_allclose(vjp_fn(w)[0], w * jax.nn.sigmoid(x), rtol=1e-13)


WEIGHTS = np.linspace(1.0, 2.0, 5)


@tg.kernel
def weighted_k(out, x, w):
    i = tg.index()
    out[i] = w[i] * x[i] * x[i]


def _weighted(x):
    y = np.empty_like(x)
    weighted_k(tg.CPU())(y, x, WEIGHTS, ndrange=x.size)
    return y


def test_a_dropped_tape_recorded_again_with_different_results_is_refused():
    """The forward pass recorded again for a repeated backward must give the same results:
    ``f`` read a global array that was rebound since, or a random number, so its gradient
    would be another's."""
    global WEIGHTS
    x = jnp.linspace(0.5, 1.5, 5)
    _, vjp_fn = jax.vjp(tgj.function(_weighted), x)
    w = jnp.ones(5)
    np.testing.assert_allclose(vjp_fn(w)[0], 2 * WEIGHTS * x, rtol=1e-14)
    tgj._calls.clear()
    tgj._answered.clear()
    np.testing.assert_allclose(vjp_fn(w)[0], 2 * WEIGHTS * x, rtol=1e-14)   # recorded again
    tgj._answered.clear()
    old, WEIGHTS = WEIGHTS, 3 * WEIGHTS
    try:
        with pytest.raises(Exception, match="_weighted: its backward pass ran again after its "
                           "tape was dropped, and what the function reads without taking it "
                           r"as an argument \(the global WEIGHTS\) changed since the forward "
                           "pass"):
            vjp_fn(w)
    finally:
        WEIGHTS = old
    _, vjp_fn = jax.vjp(tgj.function(_randomly_scaled), x)
    tgj._calls.clear()
    with pytest.raises(Exception, match="recording the forward pass again from the same "
                       "arguments gave different results: the function depends on "
                       "something besides its arguments"):
        vjp_fn(w)


def _randomly_scaled(x):
    y = np.empty_like(x)
    weighted_k(tg.CPU())(y, x, np.random.default_rng().random(x.size), ndrange=x.size)
    return y


# -- arrays read from outside the arguments, changed in place --------------------------------

def _weighted_sum(x):
    y = np.empty_like(x)
    weighted_k(tg.CPU())(y, x, WEIGHTS, ndrange=x.size)
    return tg.sum(y)


@pytest.mark.parametrize("dropped", [False, True], ids=["kept tape", "dropped tape"])
def test_a_global_array_changed_in_place_before_the_backward_is_refused(dropped):
    x = jnp.linspace(0.5, 1.5, 5)
    f = tgj.function(_weighted_sum)
    value, vjp_fn = jax.vjp(f, x)
    np.testing.assert_allclose(value, np.sum(WEIGHTS * np.asarray(x) ** 2), rtol=1e-14)
    if dropped:
        tgj._calls.clear()
        tgj._answered.clear()
    WEIGHTS[1] = 7.0
    expected = ("its backward pass ran again after its tape was dropped, and what the function "
                r"reads without taking it as an argument \(the global WEIGHTS\) changed"
                if dropped else
                r"_weighted_sum: the global WEIGHTS \(an array of shape \(5,\) that the "
                r"function reads without taking it as an argument\) was changed in place after "
                "the forward pass.* Pass it to the function as an argument .*, or take the "
                r"gradient \(each vector-Jacobian product\) before changing it")
    try:
        with pytest.raises(Exception, match=expected):
            vjp_fn(1.0)
    finally:
        WEIGHTS[1] = 1.25
    assert WEIGHTS.tolist() == np.linspace(1.0, 2.0, 5).tolist()
    (grad,) = vjp_fn(1.0)                     # unchanged again: the closed form 2 W x
    np.testing.assert_allclose(grad, 2 * WEIGHTS * x, rtol=1e-14)
    np.testing.assert_allclose(grad, central_differences(
        lambda v: np.sum(WEIGHTS * v * v), x)[0], rtol=1e-8)
    if not dropped:                          # a tape answered before: asked again
        WEIGHTS[0] = -1.0
        try:
            with pytest.raises(Exception, match="the global WEIGHTS .* was changed in place"):
                vjp_fn(1.0)
        finally:
            WEIGHTS[0] = 1.0


def test_under_jit_an_outside_array_gives_the_uncaptured_gradient():
    x = jnp.linspace(0.5, 1.5, 5)
    grad = jax.jit(jax.grad(tgj.function(_weighted_sum)))(x)
    np.testing.assert_allclose(grad, 2 * WEIGHTS * x, rtol=1e-14)


def test_a_function_reading_nothing_from_outside_fingerprints_nothing():
    tgj._calls.clear()
    jax.vjp(softplus, jnp.linspace(-2.0, 2.0, 7))
    jax.vjp(simulate, jnp.linspace(0.0, 0.5, 12), jnp.asarray(0.15))
    jax.vjp(tgj.function(_weighted_sum), jnp.linspace(0.5, 1.5, 5))
    assert [[x is WEIGHTS for x, _ in call.outside] for call in tgj._calls.values()] == \
        [[], [], [True]]



def _squared(x):
    y = np.empty_like(x)
    square(tg.CPU())(y, x, ndrange=x.size)
    return y


def test_a_number_tapegrad_did_not_make_is_refused_not_zero():
    """(NumPy's sum of a kernel's output: the gradient was zero.)"""
    f = tgj.function(lambda x: np.sum(_squared(x)))
    with pytest.raises(Exception, match="result 0 is the number .* and a derivative reaches"):
        jax.grad(f)(jnp.linspace(0.5, 2.0, 8))


def test_an_argument_returned_as_it_is_passes_its_cotangent_back():
    """(Its gradient was zero; a table passed through with argnums=0 was refused.)"""
    x, m = jnp.linspace(0.5, 2.0, 8), jnp.linspace(0.0, 1.0, 8)
    f = tgj.function(lambda x, m: (x, _squared(x), m))

    def loss(x, m):
        a, b, c = f(x, m)
        return jnp.sum(a ** 2 + b * c)
    gx, gm = jax.grad(loss, argnums=(0, 1))(x, m)
    np.testing.assert_allclose(gx, 2 * x + 2 * x * m, rtol=1e-14)
    np.testing.assert_allclose(gm, x * x, rtol=1e-14)
    np.testing.assert_allclose(jax.grad(loss)(x, m), gx, rtol=1e-14)


def test_a_constant_array_result_is_a_constant_under_grad_and_jacrev():
    f = tgj.function(lambda x: (tg.sum(_squared(x)), np.arange(3.0)))
    x = jnp.linspace(0.5, 2.0, 8)
    np.testing.assert_allclose(jax.grad(lambda x: f(x)[0] + jnp.sum(f(x)[1]))(x), 2 * x,
                               rtol=1e-14)
    g = tgj.function(lambda x: (_squared(x), np.arange(3.0)))
    square, table = jax.jacrev(g)(x)
    np.testing.assert_allclose(square, np.diag(2 * np.asarray(x)), rtol=1e-14)
    assert table.shape == (3, 8) and not np.any(table)


def _steps(u, n):
    for _ in range(n):
        u = simulate_step(u)
    return tg.dot(u, u)


def simulate_step(u):
    out = np.empty_like(u)
    heat_k(tg.CPU())(out, u, 0.15, ndrange=u.size)
    return out


def test_an_integer_argument_stays_an_int_under_grad():
    """(A step count was watched as a float: range(n) raised TypeError under jax.grad.)"""
    def by_jax(u, n):
        for _ in range(n):
            inner = u[1:-1] + 0.15 * (u[:-2] - 2.0 * u[1:-1] + u[2:]) - 0.1 * u[1:-1] ** 3
            u = u.at[1:-1].set(inner)
        return jnp.dot(u, u)
    u = jnp.linspace(0.0, 0.5, 12)
    grad = jax.grad(tgj.function(_steps))(u, 3)
    np.testing.assert_allclose(grad, jax.grad(by_jax)(u, 3), rtol=1e-12)


WIDTH = 4


def _first(x):
    return _squared(x)[:WIDTH].copy()


def test_a_result_shape_that_depends_on_a_global_is_refused_when_it_changes():
    """(The shape JAX traced was reused: a (1,) result was broadcast into (4,).)"""
    global WIDTH
    f = tgj.function(_first)
    x = jnp.linspace(0.5, 2.0, 8)
    assert f(x).shape == jax.jit(f)(x).shape == (4,)
    WIDTH = 1
    try:
        for call in (f, jax.jit(f)):
            with pytest.raises(Exception, match=r"result 0 of the wrapped function has shape "
                                                r"\(1,\) .* where it had shape \(4,\)"):
                jax.block_until_ready(call(x))
    finally:
        WIDTH = 4


def test_results_are_float32_while_x64_is_off():
    """(float64 results, JAX's own being float32: jax.vjp's pullback refused a float32
    cotangent.)"""
    jax.config.update("jax_enable_x64", False)
    try:
        f = tgj.function(lambda x: tg.sum(_squared(x)))
        x = jnp.linspace(0.5, 2.0, 8, dtype=jnp.float32)
        value, pullback = jax.vjp(f, x)
        assert value.dtype == jnp.float32
        (grad,) = pullback(jnp.float32(1.0))
        assert grad.dtype == jnp.float32
        np.testing.assert_allclose(grad, 2 * np.asarray(x), rtol=1e-6)
    finally:
        jax.config.update("jax_enable_x64", True)


def test_forward_mode_and_keyword_arguments_are_tapegrad_errors():
    f = tgj.function(lambda x: tg.sum(_squared(x)))
    x = jnp.linspace(0.5, 2.0, 8)
    for transform in (lambda: jax.jvp(f, (x,), (x,)), lambda: jax.jacfwd(f)(x),
                      lambda: jax.hessian(f)(x)):
        with pytest.raises(tg.TapegradError, match="reverse mode only .* tg.jvp, tg.hvp"):
            transform()
    with pytest.raises(tg.TapegradError, match="takes its arguments by position"):
        f(x=x)
