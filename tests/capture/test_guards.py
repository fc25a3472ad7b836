"""The guard rules of docs/capture.md ("What a replay depends on"): whatever a replay depends
on is checked before it writes anything, or refused at the user's line (issue 43)."""

from __future__ import annotations

import cmath
import math
import types
from concurrent.futures import ThreadPoolExecutor
from math import sqrt

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
N = 8
_SQRT = math.sqrt


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


def _sqrt_of(k):           # (a helper the captured function reaches by name)
    return sqrt(k)


@pytest.mark.parametrize("convert", [
    lambda k: math.sqrt(k), lambda k: sqrt(k), lambda k: math.exp(k) - math.log(k),
    lambda k: _sqrt_of(k), lambda k: math.fsum([k, 1.0]) + math.hypot(k, 2.0),
    lambda k: math.pow(k, 2.0) if math.isfinite(k) else 0.0,
    lambda k: math.isclose(k, 4.0, rel_tol=0.1) + 1.0],
    ids=["math.sqrt", "from math import sqrt", "exp log", "helper", "fsum hypot", "pow",
         "keyword"])
def test_math_of_a_float_argument_is_a_value_guard(convert):
    def f(u, k):
        return scaled(u, convert(k))

    cf = tg.capture(f)
    u = np.ones(N)
    ks = (0.25, 4.0, 0.25, 2.0, 4.0)
    for k in ks:
        assert float(cf(u, k)) == float(f(u, k))
        (g, gk) = tg.gradient(cf, u, k)
        (g_plain, gk_plain) = tg.gradient(f, u, k)
        np.testing.assert_array_equal(g, g_plain)
        assert gk == gk_plain
    assert cf.recordings == len({convert(k) for k in ks})    # (one per answer)
    assert math.sqrt is _SQRT and sqrt is _SQRT     # (put back after each recording)


def test_cmath_of_a_float_argument_is_refused_naming_the_way_out():
    """(its derivative would be lost: tg's functions are real; the guard alone kept the value
    and gave d/dk 0)"""
    cf = tg.capture(lambda u, k: scaled(u, cmath.sqrt(-k).imag))
    with pytest.raises(tg.TapegradError, match="cmath.sqrt"):
        cf(np.ones(N), 4.0)
    assert math.sqrt is _SQRT and cmath.sqrt(-4.0) == 2j


def test_math_in_a_closure_and_a_domain_error_at_the_users_line():
    from math import sqrt as root

    def f(u, k):
        return scaled(u, root(k))

    cf = tg.capture(f)
    u = np.ones(N)
    assert float(cf(u, 4.0)) == 16.0
    with pytest.raises(ValueError, match="math domain error") as caught:
        cf(u, -1.0)       # (the guard cannot answer: recording again raises, in f)
    assert "f" in [entry.name for entry in caught.traceback]
    assert float(cf(u, 0.25)) == 4.0


def test_math_guards_in_threads_recording_at_once():
    def f(u, k):
        return scaled(u, math.sqrt(k) + sqrt(k))

    def calls(k):
        cf = tg.capture(f)
        u = np.ones(N)
        return [float(cf(u, k + j)) - float(f(u, k + j)) for j in range(4)]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(calls, [0.25, 1.0, 4.0, 9.0]))
    assert results == [[0.0] * 4] * 4
    assert math.sqrt is _SQRT and sqrt is _SQRT


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
    monkeypatch.setattr(notice.compiling.__init__, "__defaults__", (0.0, None))

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
SETTINGS = types.ModuleType("settings")      # a module of settings: SETTINGS.W, SETTINGS.k
SETTINGS.W, SETTINGS.k = np.full(N, 0.5), 1.5


class Rates:
    """A class of settings: Rates.r"""

    r = 1.0


def _weighted(u):
    out = np.empty_like(u)
    sc(CPU)(out, u, K, ndrange=u.size)
    out2 = np.empty_like(u)
    sc(CPU)(out2, out, SETTINGS.k * Rates.r, ndrange=u.size)
    return tg.dot(out2, W) + tg.dot(out, P["W"]) + tg.dot(out, SETTINGS.W)


def test_a_rebound_global_records_again():
    """(A module's attribute rebound, SETTINGS.W or SETTINGS.k, or a class's, Rates.r,
    replayed the first call's.)"""
    global W, K
    cf = tg.capture(_weighted)
    u = np.linspace(0.0, 1.0, N)
    saved = W, K, P["W"], SETTINGS.W, SETTINGS.k, Rates.r
    try:
        for change in (lambda: None, lambda: globals().update(W=W * 3),
                       lambda: P.update(W=P["W"] * 3), lambda: globals().update(K=5.0),
                       lambda: setattr(SETTINGS, "W", SETTINGS.W * 3),
                       lambda: setattr(SETTINGS, "k", 2.5),
                       lambda: setattr(Rates, "r", 0.5)):
            change()
            assert float(cf(u)) == float(_weighted(u))
            (g,) = tg.gradient(cf, u)
            (g_plain,) = tg.gradient(_weighted, u)
            np.testing.assert_allclose(g, g_plain, rtol=1e-12)
            np.testing.assert_allclose(g, K * (SETTINGS.k * Rates.r * W + P["W"] + SETTINGS.W),
                                       rtol=1e-12)
    finally:
        W, K, P["W"], SETTINGS.W, SETTINGS.k, Rates.r = saved


class _SettingsModule(types.ModuleType):
    """A module whose class is a subclass (sys.modules[__name__].__class__ = ...)"""


MODULE_SUBCLASS = _SettingsModule("subclassed")
MODULE_SUBCLASS.rate, MODULE_SUBCLASS.unrelated = 2.0, 0.0


class Odd:
    """A class whose __module__ is no string."""

    __module__ = None
    rate = 3.0


def _module_subclass(u):
    out = np.empty_like(u)
    sc(CPU)(out, u, MODULE_SUBCLASS.rate * Odd.rate, ndrange=u.size)
    return tg.sum(out)


def test_a_module_subclass_is_read_by_the_names_the_code_uses():
    """(a module subclass was walked as an object: every attribute compared, so an unrelated
    one changing each call recorded again each call; a class whose __module__ is None raised
    AttributeError)"""
    cf = tg.capture(_module_subclass)
    u = np.linspace(0.0, 1.0, N)
    for k in range(3):
        MODULE_SUBCLASS.unrelated = float(k)
        (g,) = tg.gradient(cf, u)
        np.testing.assert_allclose(g, np.full(N, 6.0), rtol=1e-15)
    assert cf.recordings == 1
    try:
        MODULE_SUBCLASS.rate = 0.5
        (g,) = tg.gradient(cf, u)
        np.testing.assert_allclose(g, np.full(N, 1.5), rtol=1e-15)
        assert cf.recordings == 2
    finally:
        MODULE_SUBCLASS.rate = 2.0


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


def _numpy_before_a_kernel_writes(u):
    u *= 2
    add1(CPU)(u, ndrange=u.size)
    return tg.sum(u)


def _numpy_after_a_kernel_wrote(u):
    add1(CPU)(u, ndrange=u.size)
    u *= 2
    return 1.0


def _numpy_between_a_write_and_a_read(u):
    add1(CPU)(u, ndrange=u.size)
    u[3] = 7.0         # (one element: the plain tape's two samples need not see it)
    return scaled(u, 2.0)


@pytest.mark.parametrize("f, where", [
    (_numpy_before_a_kernel_writes, r"test_guards.py:\d+: .*before this line"),
    (_numpy_after_a_kernel_wrote, r"after test_guards.py:\d+, before it returned"),
    (_numpy_between_a_write_and_a_read, r"test_guards.py:\d+: .*between test_guards.py:\d+ "
                                        "and this line")],
    ids=["before", "after", "between"])
def test_an_argument_kernels_write_changed_in_place_by_numpy_is_refused(f, where):
    with pytest.raises(tg.CaptureError, match=r"changed argument 0 .*in place.*u \*= 2"
                       ) as caught:
        tg.capture(f)(np.ones(N))
    assert caught.match(where)


def test_arguments_written_by_kernels_alone_are_not_refused():
    def f(u, v, w):       # (v and w: two halves of one array, written through each other)
        add1(CPU)(u, ndrange=u.size)
        add1(CPU)(v, ndrange=v.size)
        return scaled(u, 2.0) + scaled(w, 3.0)

    cf = tg.capture(f)
    for _ in range(3):
        u, uv = np.ones(N), np.arange(2.0 * N)
        u2, uv2 = u.copy(), uv.copy()
        assert float(cf(u, uv[:N], uv[N:])) == float(f(u2, uv2[:N], uv2[N:]))
        np.testing.assert_array_equal(u, u2)
        np.testing.assert_array_equal(uv, uv2)


def test_a_global_named_only_in_a_comprehension_is_guarded_too():
    global W
    def f(u):
        return [tg.dot(scaled_array(u), W) for _ in range(1)][0]

    cf = tg.capture(f)
    u = np.linspace(0.0, 1.0, N)
    saved = W
    try:
        for change in (lambda: None, lambda: globals().update(W=W * 3)):
            change()
            assert float(cf(u)) == float(f(u))
    finally:
        W = saved


def scaled_array(u):
    out = np.empty_like(u)
    sc(CPU)(out, u, 2.0, ndrange=u.size)
    return out


def test_checkpoint_loop_inside_a_capture_is_named_in_the_error():
    """The loop's own copy of its state is gone by the time the capture is written down: the
    refusal names the loop, not a missing array."""
    def step(u):
        out = np.empty_like(u)
        sc(CPU)(out, u, 0.5, ndrange=u.size)
        return out

    simulate = tg.capture(lambda u0: tg.checkpoint_loop(step, tg.copy(u0), 6, snapshots=2))
    with pytest.raises(tg.CaptureError, match="uses tg.checkpoint_loop, which a captured "
                                              "function cannot replay"):
        tg.gradient(lambda u0: tg.sum(simulate(u0)), np.ones(N))


@pytest.mark.parametrize("mode", ["reverse", "forward"])
def test_tg_autodiff_inside_a_captured_function_is_refused_with_the_way_out(mode):
    @tg.kernel
    def squared(B, A):
        i = tg.index()
        B[i] = A[i] * A[i]

    def f(B, dB, A, dA):
        m = tg.Reverse if mode == "reverse" else tg.Forward
        tg.autodiff(m, squared(CPU), tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA),
                    ndrange=A.size)
        return dA

    A, dA = np.linspace(0.0, 1.0, 6), np.ones(6)
    with pytest.raises(tg.errors.CaptureError, match="tg.autodiff inside a function that "
                                                    "tg.capture records"):
        tg.capture(f)(np.zeros(6), np.ones(6), A, dA)
    np.testing.assert_array_equal(dA, 1.0)
