"""How a tape's reverse sweep treats the shadows it owns: a shadow nothing reads afterwards is
not zeroed where consumed, a shadow that holds no values yet is stored into instead of being
zeroed and added to.  Both must leave every gradient exactly as Enzyme's semantics give it;
each test checks against finite differences or a closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tests.tape.test_tape import fd_gradient

CPU = tg.CPU()
rng = np.random.default_rng(11)


@tg.kernel
def smooth(Y, X):
    i = tg.index()
    if i > 0 and i < X.size - 1:
        Y[i] = X[i - 1] + 2.0 * X[i] + X[i + 1]
    else:
        Y[i] = X[i]


@tg.kernel
def stored_twice(Y, X, c):
    i = tg.index()
    if c > 0.0:
        Y[i] = X[i]             # overwritten below on this path: its shadow must be consumed
    Y[i] = 3.0 * X[i]


@tg.kernel
def square(Y, X):
    i = tg.index()
    Y[i] = X[i] * X[i]


def chain(x, steps=3):
    """A small simulation: each state only the tape holds, each adjoint a gather kernel."""
    t = tg.copy(x)
    for _ in range(steps):
        t_new = np.empty_like(t)
        smooth(CPU)(t_new, t, ndrange=t.size)
        t = t_new
    return t


def test_a_chain_of_stencils_matches_finite_differences():
    x, w = rng.random(37), rng.random(37)
    (g,) = tg.gradient(lambda x: tg.dot(chain(x), w), x)
    np.testing.assert_allclose(g, fd_gradient(lambda x: tg.dot(chain(x), w), x), rtol=1e-7)


def test_the_stencil_adjoint_on_a_tape_is_only_its_gather_kernel():
    x, w = rng.random(16), rng.random(16)
    tg.gradient(lambda x: tg.dot(chain(x, 1), w), x)
    source = smooth.source(mode="reverse", backend=CPU)
    # the output's shadow is dead after the adjoint: nothing is left to zero, so the rest of
    # the adjoint (which only consumed it) is not even compiled; the source shown is what ran:
    # the gather storing into the new gradient (it showed the adding gather, which did not run)
    assert "smooth_adjoint_store_X_bar" in source and "def smooth_adjoint(" not in source
    assert "smooth_adjoint_gather_X_bar" not in source


def test_a_shadow_two_stores_consume_is_zeroed_between_them():
    x, w = rng.random(8), rng.random(8)

    def loss(x):
        y = np.empty_like(x)
        stored_twice(CPU)(y, x, 1.0, ndrange=x.size)
        return tg.dot(y, w)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 3.0 * w, rtol=1e-12)     # not 4 w


def test_a_source_read_twice_gets_the_stored_then_the_added_part():
    x, w1, w2 = rng.random(21), rng.random(21), rng.random(21)

    def loss(x):
        y1, y2 = np.empty_like(x), np.empty_like(x)
        smooth(CPU)(y1, x, ndrange=x.size)
        smooth(CPU)(y2, x, ndrange=x.size)
        return tg.dot(y1, w1) + tg.dot(y2, w2)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, fd_gradient(loss, x), rtol=1e-7)


def test_a_source_no_adjoint_reaches_gets_exact_zeros():
    x, z, w = rng.random(9), rng.random(9), rng.random(9)

    def loss(x, z):
        y, unused = np.empty_like(x), np.empty_like(z)
        square(CPU)(y, x, ndrange=x.size)
        smooth(CPU)(unused, z, ndrange=z.size)   # recorded, but the loss does not use it
        return tg.dot(y, w)

    gx, gz = tg.gradient(loss, x, z)
    np.testing.assert_allclose(gx, 2.0 * x * w, rtol=1e-12)
    assert np.array_equal(gz, np.zeros_like(z))


@pytest.mark.parametrize("steps", [1, 4])
def test_vjp_and_tape_gradient_agree_with_the_enzyme_api(steps):
    """The same derivative three ways: tape.gradient (owned shadows), tg.vjp, and
    tg.autodiff with user shadows that must be zeroed and consumed as Enzyme does."""
    x, w = rng.random(29), rng.random(29)
    with tg.Tape() as tape:
        loss = tg.dot(chain(x, steps), w)
    (g_tape,) = tape.gradient(loss, [x])
    _, g_vjp = tg.vjp(lambda x: chain(x, steps), x, w)
    np.testing.assert_allclose(g_vjp, g_tape, rtol=1e-12)
    if steps == 1:
        y, y_bar, x_bar = np.empty_like(x), w.copy(), np.ones_like(x)
        tg.autodiff(tg.Reverse, smooth(CPU), tg.Const, tg.Duplicated(y, y_bar),
                    tg.Duplicated(x, x_bar), ndrange=x.size)
        np.testing.assert_allclose(x_bar - 1.0, g_tape, rtol=1e-12)   # added to the ones
        assert np.array_equal(y_bar, np.zeros_like(y_bar))              # consumed


# -- what the tape keeps: only contents an adjoint can read -----------------------------------

@tg.kernel
def scale_in_place(Y, s):
    i = tg.index()
    Y[i] = s * Y[i]


def _peak_bytes(f):
    import tracemalloc
    tracemalloc.start()
    try:
        f()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kernel, linear", [(smooth, True), (square, False)])
def test_ping_pong_buffers_are_copied_only_for_adjoints_that_read_them(kernel, linear):
    n, steps = 1 << 17, 10                     # 1 MiB per copy
    x, w = rng.random(n), rng.random(n)

    def loss(x):
        a, b = tg.copy(x), np.empty_like(x)
        for _ in range(steps):                 # each launch overwrites what the last read
            kernel(CPU)(b, a, ndrange=n)
            kernel(CPU)(a, b, ndrange=n)
        return tg.dot(a, w)

    def record():
        with tg.Tape() as tape:
            loss(x)
        return tape

    record()                                   # compiles: Numba's allocations count too
    peak = _peak_bytes(record)
    if linear:       # a stencil's adjoint reads no primal value: nothing to keep
        assert peak < 4 * 8 * n
    else:            # X * X: every overwritten state is kept for its adjoint
        assert peak > 2 * steps * 8 * n
    small = 1.0 + 0.01 * rng.random(12)          # x ** 64 stays near 1
    small_w = rng.random(12)

    def small_loss(x):
        a, b = tg.copy(x), np.empty_like(x)
        for _ in range(3):
            kernel(CPU)(b, a, ndrange=x.size)
            kernel(CPU)(a, b, ndrange=x.size)
        return tg.dot(a, small_w)

    (g,) = tg.gradient(small_loss, small)
    np.testing.assert_allclose(g, fd_gradient(small_loss, small), rtol=1e-6)


def test_an_active_scale_makes_the_adjoint_read_the_array():
    # with s active, ds = sum(y_bar * y): the old contents are needed and kept
    x, dx = rng.random(11), np.zeros(11)

    def loss(x, s):
        y = tg.copy(x)
        scale_in_place(CPU)(y, s, ndrange=y.size)
        scale_in_place(CPU)(y, s, ndrange=y.size)
        return tg.sum(y)

    ((_, ds),) = tg.autodiff(tg.Reverse, loss, tg.Active, tg.Duplicated(x, dx), tg.Active(1.5))
    np.testing.assert_allclose(dx, 1.5 ** 2 * np.ones_like(x), rtol=1e-12)
    np.testing.assert_allclose(ds, 2 * 1.5 * x.sum(), rtol=1e-12)


# -- arrays the tape does not keep alive -------------------------------------------------------

@tg.kernel
def twice(Y, X):
    i = tg.index()
    Y[i] = 2.0 * X[i]


@tg.kernel
def add_to(Y, X):
    i = tg.index()
    Y[i] = Y[i] + X[i]


def test_a_linear_simulation_holds_no_state_on_the_tape():
    n, steps = 1 << 17, 100                    # 1 MiB per state: 100 MiB if kept
    x, w = rng.random(n), rng.random(n)

    def record():
        with tg.Tape() as tape:
            loss = tg.dot(chain(x, steps), w)
        return tape, loss

    tape, loss = record()                      # compiles: Numba's allocations count too
    assert _peak_bytes(record) < 8 * 8 * n
    (g,) = tape.gradient(loss, [x])
    (g_few,) = tg.gradient(lambda x: tg.dot(chain(x, steps), w), x)   # the same, fresh tape
    np.testing.assert_allclose(g, g_few, rtol=1e-12)
    small, small_w = rng.random(10), rng.random(10)
    (gs,) = tg.gradient(lambda x: tg.dot(chain(x, 7), small_w), small)
    np.testing.assert_allclose(gs, fd_gradient(lambda x: tg.dot(chain(x, 7), small_w), small),
                               rtol=1e-7)


def test_a_new_array_in_freed_memory_is_a_new_array():
    # d is freed after each step (no adjoint reads it); NumPy's zeros then often land in the
    # same memory: had the tape taken z for d, z's shadow would flow into d's writer
    x, w = rng.random(16), rng.random(16)
    reused = []

    def loss(x):
        out = tg.copy(x)
        for _ in range(6):
            d = np.empty_like(x)
            twice(CPU)(d, x, ndrange=x.size)
            add_to(CPU)(out, d, ndrange=x.size)
            address = d.ctypes.data
            del d
            z = np.zeros_like(x)               # unrecorded: contributes nothing
            reused.append(z.ctypes.data == address)
            add_to(CPU)(out, z, ndrange=x.size)
        return tg.dot(out, w)

    (g,) = tg.gradient(loss, x)
    assert any(reused), "the allocator never reused the memory: the test proves nothing"
    np.testing.assert_allclose(g, 13.0 * w, rtol=1e-12)


def test_a_strided_view_no_adjoint_reads_is_kept_as_it_is():
    # a stand-in for a freed non-contiguous view would need another compiled kernel: the tape
    # keeps such an argument alive instead of holding it weakly
    x, w = rng.random(16)[::2], rng.random(8)

    def loss(x):
        y = np.empty(8)
        twice(CPU)(y, x, ndrange=8)
        return tg.dot(y, w)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 2.0 * w, rtol=1e-12)


@tg.kernel
def scaled(Y, X, s):
    i = tg.index()
    Y[i] = s * X[i]


@tg.kernel
def sine(Y, X):
    i = tg.index()
    Y[i] = math.sin(X[i])


def test_an_array_read_while_constant_then_overwritten_from_the_source():
    """Activity follows arrays by identity: ``c`` is active by the end, so the launch that
    read it while it was constant gets an adjoint, whose output must then be active too."""
    c0, w = rng.random(6), rng.random(6)

    def f(x):
        c = c0.copy()
        y = np.empty(6)
        square(CPU)(y, c, ndrange=6)          # does not depend on x
        scaled(CPU)(c, x, 2.0, ndrange=6)     # c overwritten from x
        return tg.dot(y, w) + tg.dot(c, w)

    x = rng.random(6)
    (g,) = tg.gradient(f, x)
    np.testing.assert_allclose(g, 2.0 * w, rtol=1e-12)
    np.testing.assert_allclose(g, fd_gradient(f, x), rtol=1e-7)


def test_with_an_active_return_every_given_shadow_is_a_seed():
    """Enzyme's semantics: a Duplicated output's shadow holding values is consumed and
    propagated even when that output does not reach the returned scalar, so two functions
    equal as mathematics give the same derivatives."""
    a, w = np.linspace(0.1, 0.5, 5), rng.random(5)

    def f(b, c, a):
        sine(CPU)(b, a, ndrange=5)
        sine(CPU)(c, a, ndrange=5)
        return tg.sum(b)

    def f_same(b, c, a):
        sine(CPU)(b, a, ndrange=5)
        sine(CPU)(c, a, ndrange=5)
        return tg.sum(b) + 0.0 * tg.sum(c)

    for fn in (f, f_same):
        da, dc = np.zeros(5), w.copy()
        tg.autodiff(tg.Reverse, fn, tg.Active, tg.Duplicated(np.zeros(5), np.zeros(5)),
                    tg.Duplicated(np.zeros(5), dc), tg.Duplicated(a.copy(), da))
        np.testing.assert_allclose(da, np.cos(a) * (1.0 + w), rtol=1e-12)
        np.testing.assert_array_equal(dc, 0.0)     # consumed: c was overwritten



@tg.kernel
def product(Z, X, Y):
    i = tg.index()
    Z[i] = X[i] * Y[i]


def test_one_shadow_given_for_two_sources_sums_both_gradients():
    """The sweep checks once whether the caller gave one array as the shadow of two
    arguments; a launch reading both then adds both parts into it, not one over the other."""
    x, y, w = rng.random(6), rng.random(6), rng.random(6)

    def f(x, y):
        z = np.empty(6)
        product(CPU)(z, x, y, ndrange=6)
        return tg.dot(z, w)

    d = np.full(6, 0.5)                  # shadows accumulate
    tg.autodiff(tg.Reverse, f, tg.Active, tg.Duplicated(x, d), tg.Duplicated(y, d))
    np.testing.assert_allclose(d, 0.5 + w * y + w * x, rtol=1e-12)
    gx, gy = tg.gradient(f, x, y)
    np.testing.assert_allclose(gx, fd_gradient(lambda v: f(v, y), x), rtol=1e-7)
    np.testing.assert_allclose(d, 0.5 + gx + gy, rtol=1e-12)
