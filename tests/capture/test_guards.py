"""The guard rules of docs/capture.md ("What a replay depends on"): whatever a replay depends
on is checked before it writes anything, or refused at the user's line (issue 43)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
N = 8


@tg.kernel
def sc(out, u, a):
    i = tg.index()
    out[i] = a * u[i]


@tg.kernel
def add1(u):
    i = tg.index()
    u[i] += 1.0


def scaled(u, a):
    out = np.empty_like(u)
    sc(CPU)(out, u, a, ndrange=u.size)
    return tg.sum(out)


@pytest.mark.parametrize("convert", [
    lambda k: math.floor(k), lambda k: math.ceil(k), lambda k: int(k // 0.25) * 0.25,
    lambda k: divmod(k, 0.5)[0], lambda k: k.real, lambda k: round(k)],
    ids=["floor", "ceil", "floordiv", "divmod", "real", "round"])
def test_a_float_converted_on_the_host_is_a_value_guard(convert):
    def f(u, k):
        return scaled(u, convert(k))

    cf = tg.capture(f)
    u = np.ones(N)
    for k in (0.25, 4.0, 2.6, 4.0, 0.25):
        assert float(cf(u, k)) == float(f(u, k))


def test_a_step_count_from_a_float_replays_its_own_number_of_steps():
    def f(u, t):
        for _ in range(int(t // 0.25)):
            out = np.empty_like(u)
            sc(CPU)(out, u, 2.0, ndrange=u.size)
            u = out
        return tg.sum(u)

    cf = tg.capture(f)
    u = np.ones(N)
    for t in (0.5, 1.0, 0.75):
        assert float(cf(u, t)) == float(f(u, t))


def test_a_guard_failing_after_a_write_in_place_writes_once():
    def f(u):
        if tg.sum(u) > 0:
            add1(CPU)(u, ndrange=u.size)
        if tg.sum(u) > 10:
            add1(CPU)(u, ndrange=u.size)
        return tg.sum(u)

    cf = tg.capture(f)
    for start in (1.0, 0.2, 1.0, -3.0):
        u, v = np.full(N, start), np.full(N, start)
        assert float(cf(u, )) == float(f(v))
        np.testing.assert_array_equal(u, v)


def test_a_read_only_argument_written_by_a_replay_is_a_launch_error():
    cf = tg.capture(lambda u: add1(CPU)(u, ndrange=u.size))
    cf(np.ones(N))
    u = np.ones(N)
    u.flags.writeable = False
    with pytest.raises(tg.LaunchError, match="read-only.*u.copy()"):
        cf(u)


def test_the_written_down_reverse_says_it_compiles(monkeypatch, capfd):
    from tapegrad.backends import notice
    monkeypatch.setattr(notice.compiling.__init__, "__defaults__", (0.0,))

    @tg.capture
    def loss(u):
        out = np.empty_like(u)
        sc(CPU)(out, u, 2.0, ndrange=u.size)
        return tg.dot(out, u)

    u = np.linspace(0.0, 1.0, N)
    for _ in range(3):
        (g,) = tg.gradient(lambda u: loss(u), u)
    np.testing.assert_allclose(g, 4 * u)
    assert "tapegrad: compiling loss (reverse)" in capfd.readouterr().err


W = np.full(N, 2.0)
K = 3.0
P = {"W": np.full(N, 2.0)}


def _weighted(u):
    out = np.empty_like(u)
    sc(CPU)(out, u, K, ndrange=u.size)
    out2 = np.empty_like(u)
    sc(CPU)(out2, out, 1.0, ndrange=u.size)
    return tg.dot(out2, W) + tg.dot(out, P["W"])


def test_a_rebound_global_records_again():
    global W, K
    cf = tg.capture(_weighted)
    u = np.linspace(0.0, 1.0, N)
    saved = W, K, P["W"]
    try:
        for change in (lambda: None, lambda: globals().update(W=W * 3),
                       lambda: P.update(W=P["W"] * 3), lambda: globals().update(K=5.0)):
            change()
            assert float(cf(u)) == float(_weighted(u))
            (g,) = tg.gradient(cf, u)
            (g_plain,) = tg.gradient(_weighted, u)
            np.testing.assert_allclose(g, g_plain, rtol=1e-12)
    finally:
        W, K, P["W"] = saved


def test_the_global_array_passed_as_an_argument_is_a_call_of_its_own():
    def f(x):
        out = np.empty_like(x)
        sc(CPU)(out, x, 2.0, ndrange=x.size)
        return tg.dot(out, W)

    cf = tg.capture(f)
    x = np.linspace(0.0, 1.0, N)
    assert float(cf(W)) == float(f(W))
    assert float(cf(x)) == float(f(x))
    (g,) = tg.gradient(cf, x)
    h = 1e-6
    fd = [(float(f(x + h * e)) - float(f(x - h * e))) / (2 * h) for e in np.eye(N)]
    np.testing.assert_allclose(g, fd, rtol=1e-7)


@tg.kernel
def sq(out, u):
    i = tg.index()
    out[i] = u[i] * u[i]


def _square_twice(u):
    y = np.empty_like(u)
    sq(CPU)(y, u, ndrange=u.size)
    z = np.empty_like(u)
    sq(CPU)(z, y, ndrange=u.size)
    return y, tg.sum(z)


def test_a_returned_array_the_reverse_reads_changed_before_the_gradient_is_refused():
    cf = tg.capture(_square_twice)
    for fn in (_square_twice, cf, cf, cf):
        u = np.linspace(0.1, 1.0, N)
        with tg.Tape() as tape:
            y, s = fn(u)
        (g,) = tape.gradient(s, [u])
        np.testing.assert_allclose(g, 4 * u ** 3, rtol=1e-12)
        with tg.Tape() as tape:
            y, s = fn(u)
        y *= 3
        with pytest.raises(tg.TapegradError, match="changed after recording and before"):
            tape.gradient(s, [u])


def test_an_argument_changed_in_place_by_numpy_is_refused():
    def f(u):
        u *= 2
        return scaled(u, 1.0)

    with pytest.raises(tg.CaptureError, match=r"changed argument 0 .*in place.*u \*= 2"):
        tg.capture(f)(np.ones(N))
