"""``tg.checkpoint(fn)``: the same gradients as recording ``fn`` itself, with less held on the
tape; forward mode through it; what it reads from outside refused."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def layer(out, x, w, b):
    i = tg.index()
    acc = b
    for j in range(x.shape[0]):
        acc += w[i, j] * x[j]
    out[i] = tg.tanh(acc)


def block(x, w, b):
    """Three layers: each launch's adjoint keeps its input and output."""
    for _ in range(3):
        y = np.empty(w.shape[0])
        layer(tg.CPU())(y, x, w, b, ndrange=w.shape[0])
        x = y
    return x


rng = np.random.default_rng(8)
X, W = rng.uniform(-1, 1, 12), rng.uniform(-0.5, 0.5, (12, 12))
TARGET = rng.uniform(-1, 1, 12)


def run(fn):
    x, w = X.copy(), W.copy()
    with tg.Tape() as tape:
        b = tape.watch(0.1)
        y = fn(x, w, b)
        loss = tg.dot(y, TARGET) + tg.sum(fn(y, w, b))
    return tape.gradient(loss, [x, w, b]), tape.memory()["total"]


def test_gradients_equal_recording_the_function_itself_and_less_is_held():
    want, plain_bytes = run(block)
    got, kept_bytes = run(tg.checkpoint(block))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)
    assert np.abs(got[1]).sum() > 0 and got[2] != 0.0
    assert kept_bytes < plain_bytes


def test_a_scalar_result_and_the_tape_asked_twice():
    @tg.checkpoint
    def energy(x, w, b):
        return tg.dot(block(x, w, b), block(x, w, b))

    x, w = X.copy(), W.copy()
    with tg.Tape() as tape:
        loss = energy(x, w, 0.1)
    first = tape.gradient(loss, [x, w])
    again = tape.gradient(loss, [x, w])
    h = 1e-6
    e = np.zeros(12)
    e[3] = h
    fd = (float(energy(x + e, w, 0.1)) - float(energy(x - e, w, 0.1))) / (2 * h)
    assert first[0][3] == pytest.approx(fd, rel=1e-7)
    np.testing.assert_array_equal(again[0], first[0])


def test_forward_mode_runs_the_function_itself():
    f = tg.checkpoint(lambda x: tg.sum(block(x, W, 0.1)))
    _, tangent = tg.jvp(f, X.copy(), np.eye(12)[5])
    (g,) = tg.gradient(f, X.copy())
    assert tangent == pytest.approx(g[5], rel=1e-12)


def test_an_array_from_outside_is_followed_and_a_tape_scalar_refused():
    def run(f):
        x, w = X.copy(), W.copy()
        with tg.Tape() as tape:
            w2 = tg.scale(w, 1.5)
            loss = tg.sum(f(lambda x: block(x, w2, 0.1))(x))
        return tape.gradient(loss, [x, w])
    for g, want in zip(run(tg.checkpoint), run(lambda f: f)):
        np.testing.assert_allclose(g, want, rtol=1e-12, atol=1e-15)
    x, w = X.copy(), W.copy()
    with pytest.raises(tg.TapegradError, match="uses a tape scalar from outside"):
        with tg.Tape() as tape:
            b = tape.watch(0.1)
            tg.checkpoint(lambda x: block(x, w, b))(x)
