"""Python's ``math`` of a scalar that carries a derivative (tapegrad/tape/hostmath.py): while a
tape records or forward mode runs, ``math.sqrt(s)`` is ``tg.sqrt(s)`` (recorded, tangents
carried, guarded while tg.capture records) or, where tapegrad has no derivative rule, refused;
on plain numbers, and in other threads, it is math's function."""

from __future__ import annotations

import cmath
import math
import threading
import types
from math import sqrt

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
A = np.array([0.3, 0.45, 0.6, 0.75])
V = np.array([1.0, -0.5, 0.25, 2.0])
# math's own functions, in a dict: a global bound to one that a recorded block names is
# the wrapper while it records, as `sqrt` here is (tape/hostmath.py)
REAL = {"sqrt": math.sqrt, "gamma": math.gamma, "exp": math.exp}


@tg.kernel
def square(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


@tg.kernel
def scaled(out, u, a):
    i = tg.index()
    out[i] = a * u[i]


def _s(A):
    """sum(A * A): a tape scalar while a tape records, a dual in forward mode."""
    B = np.empty_like(A)
    square(CPU)(B, A, ndrange=A.size)
    return tg.sum(B)


# (expression of s, its derivative d/ds in closed form)
EXPRESSIONS = {
    "sqrt": (lambda s: s * math.sqrt(s), lambda s: 1.5 * math.sqrt(s)),
    "log exp": (lambda s: math.log(s) + math.exp(0.5 * s),
                lambda s: 1.0 / s + 0.5 * math.exp(0.5 * s)),
    "sin cos": (lambda s: math.sin(s) * math.cos(s), lambda s: math.cos(2.0 * s)),
    "atan2 hypot": (lambda s: math.atan2(s, 2.0) + math.hypot(s, 1.0),
                    lambda s: 2.0 / (s * s + 4.0) + s / math.hypot(s, 1.0)),
    "pow, log base 2": (lambda s: math.pow(s, 1.5) + math.log(s, 2.0),
                        lambda s: 1.5 * math.sqrt(s) + 1.0 / (s * math.log(2.0))),
    "fsum prod degrees": (lambda s: math.fsum([s, s * s, 1.0]) + math.prod([s, s, 2.0])
                          + math.degrees(s), lambda s: 1.0 + 6.0 * s + 180.0 / math.pi),
    "erf": (lambda s: math.erf(s), lambda s: 2.0 / math.sqrt(math.pi) * math.exp(-s * s)),
}
IDS = list(EXPRESSIONS)


def _loss(expr):
    return lambda A: expr(_s(A))


def _central(f, x, d, h=1e-6):
    """float64 central difference of ``f`` (plain floats, math's functions) along ``d``."""
    return (float(f(x + h * d)) - float(f(x - h * d))) / (2 * h)


@pytest.mark.parametrize("name", IDS)
def test_gradient_through_math_matches_central_differences(name):
    expr, slope = EXPRESSIONS[name]
    loss = _loss(expr)
    (g,) = tg.gradient(loss, A)
    s = float(np.sum(A * A))
    np.testing.assert_allclose(g, slope(s) * 2 * A, rtol=1e-12)      # closed form
    fd = [_central(loss, A, e) for e in np.eye(A.size)]
    np.testing.assert_allclose(g, fd, rtol=1e-6)


@pytest.mark.parametrize("name", IDS)
def test_jvp_through_math_carries_the_tangent(name):
    expr, slope = EXPRESSIONS[name]
    loss = _loss(expr)
    y, y_dot = tg.jvp(loss, A, V)
    s = float(np.sum(A * A))
    assert float(y) == pytest.approx(float(loss(A)), rel=1e-15)
    assert y_dot == pytest.approx(slope(s) * float(2 * A @ V), rel=1e-12)
    assert y_dot == pytest.approx(_central(loss, A, V), rel=1e-6)


@pytest.mark.parametrize("name", IDS)
def test_hvp_through_math_matches_second_differences(name):
    loss = _loss(EXPRESSIONS[name][0])
    hv = tg.hvp(loss, A, V)
    h = 1e-4
    second = (float(loss(A + h * V)) - 2 * float(loss(A)) + float(loss(A - h * V))) / h**2
    assert float(V @ hv) == pytest.approx(second, rel=1e-5)


def test_hvp_of_s_log_s_in_closed_form():
    """The review's case: s * math.log(s) gave another Hessian than s * tg.log(s)."""
    hv = tg.hvp(lambda a: (lambda s: s * math.log(s))(_s(a)), A, V)
    s, ds = float(np.sum(A**2)), 2 * A
    hessian = np.outer(ds, ds) / s + (math.log(s) + 1.0) * 2 * np.eye(A.size)
    np.testing.assert_allclose(hv, hessian @ V, rtol=1e-12)


def test_hvp_and_jvp_of_a_number():
    # (d/dx)^2 x e^x = (x + 2) e^x; the argument itself is the dual, no kernel in between
    assert tg.hvp(lambda x: x * math.exp(x), 0.5, 1.0) == pytest.approx(2.5 * math.exp(0.5),
                                                                        rel=1e-14)
    y, y_dot = tg.jvp(lambda x: math.sqrt(x) * x, 0.25, 2.0)
    assert (y, y_dot) == (pytest.approx(0.125), pytest.approx(2.0 * 1.5 * 0.5))


def test_a_tape_records_math_of_its_scalars():
    with tg.Tape() as tape:
        assert math.sqrt is not REAL["sqrt"]          # (the wrapper, while the tape records)
        s = _s(A)
        loss = s * math.sqrt(s)
        assert isinstance(loss, float) and type(loss) is not float
    assert math.sqrt is REAL["sqrt"]
    (g,) = tape.gradient(loss, [A])
    # the review's figure: g / dB/dA was sqrt(s) (3.23 there), where 1.5 sqrt(s) is right
    np.testing.assert_allclose(g, 1.5 * math.sqrt(np.sum(A**2)) * 2 * A, rtol=1e-12)


def test_nested_tapes_both_record_math():
    with tg.Tape() as outer:
        with tg.Tape() as inner:
            s = _s(A)
            loss = math.exp(s)
        assert math.sqrt is not REAL["sqrt"]          # (the outer tape still records)
    (g_inner,) = inner.gradient(loss, [A])
    (g_outer,) = outer.gradient(loss, [A])
    np.testing.assert_allclose(g_inner, math.exp(np.sum(A**2)) * 2 * A, rtol=1e-12)
    np.testing.assert_array_equal(g_outer, g_inner)
    assert math.sqrt is REAL["sqrt"]


def _captured_loss(u, kappa):
    out = np.empty_like(u)
    scaled(CPU)(out, u, math.sqrt(kappa) * 0.5, ndrange=u.size)
    return tg.sum(out) * math.exp(kappa)


def test_capture_records_math_of_a_float_argument_and_replays_it():
    cf = tg.capture(_captured_loss)
    u = np.linspace(0.1, 1.5, 8)
    kappas = (0.09, 0.09, 0.25, 0.09, 0.25, 1.44)
    for kappa in kappas:
        g_u, g_k = tg.gradient(cf, u, kappa)
        root = math.sqrt(kappa)
        # L = sum(u) sqrt(k) exp(k) / 2: dL/dk = sum(u) exp(k) (1 / (2 sqrt(k)) + sqrt(k)) / 2
        want = np.sum(u) * math.exp(kappa) * (0.5 / root + root) * 0.5
        assert g_k == pytest.approx(want, rel=1e-12)          # (the review: 0.0)
        h = 1e-6
        fd = (_captured_loss(u, kappa + h) - _captured_loss(u, kappa - h)) / (2 * h)
        assert g_k == pytest.approx(fd, rel=1e-7)
        np.testing.assert_allclose(g_u, 0.5 * root * math.exp(kappa), rtol=1e-14)
        assert float(cf(u, kappa)) == float(_captured_loss(u, kappa))
    # math.sqrt(kappa)'s answer is still a guard: one recording per value, the rest replays
    assert cf.recordings == len(set(kappas))
    assert math.sqrt is REAL["sqrt"]


def test_capture_of_math_of_a_reduction_is_right_for_new_arrays():
    cf = tg.capture(lambda A: (lambda s: s * math.log(s))(_s(A)))
    for scale in (1.0, 1.0, 1.5):
        x = scale * A
        (g,) = tg.gradient(cf, x)
        s = float(np.sum(x * x))
        np.testing.assert_allclose(g, (math.log(s) + 1.0) * 2 * x, rtol=1e-12)
    assert cf.recordings == 2        # (a new value of the guard math.log(s) records again)


def test_capture_finds_a_math_function_in_a_closure():
    from math import log as ln

    def f(u, kappa):
        out = np.empty_like(u)
        scaled(CPU)(out, u, ln(kappa), ndrange=u.size)
        return tg.sum(out)

    cf = tg.capture(f)
    u = np.ones(8)
    for kappa in (0.5, 0.5, 2.0):
        assert tg.gradient(cf, u, kappa)[1] == pytest.approx(8.0 / kappa, rel=1e-14)
    assert cf.recordings == 2


def test_a_name_imported_from_math_under_a_plain_gradient():
    """(tg.gradient, tg.jvp and tg.hvp put the wrappers where the function names them, as a
    capture's first call does: api/sources.py call_on_sources)"""
    (g,) = tg.gradient(lambda A: (lambda s: s * sqrt(s))(_s(A)), A)
    np.testing.assert_allclose(g, 1.5 * math.sqrt(np.sum(A**2)) * 2 * A, rtol=1e-12)
    _, t = tg.jvp(lambda A: _s(A) * sqrt(_s(A)), A, np.ones_like(A))
    assert t == pytest.approx(float(np.sum(g)), rel=1e-12)
    assert sqrt is REAL["sqrt"]


HELPERS = types.ModuleType("helpers")      # a user's module: from math import exp there
exec("from math import exp\ndef grown(s):\n    return exp(0.01 * s)\n", vars(HELPERS))


class Settings(dict):
    """A global whose attributes are its items: reading one that is not there raises
    KeyError, ``__dict__`` included."""

    __slots__ = ()
    __getattr__ = dict.__getitem__


SETTINGS = Settings(scale=2.0)


def _deep(s, k):          # (reached by _nested at depth 4, and by _shallow at depth 2)
    return _deeper(s) if k else s


def _deeper(s):
    return sqrt(s)


def _nested(s):
    return _nested2(s)


def _nested2(s):
    return _deep(s, 1)


def _shallow(s):
    return _deep(s, 1)


def _nested_first(A):
    s = _s(A)
    return s * SETTINGS.scale + _nested(s) + _shallow(s) + HELPERS.grown(s)


def _shallow_first(A):
    s = _s(A)
    return s * SETTINGS.scale + _shallow(s) + _nested(s) + HELPERS.grown(s)


@pytest.mark.parametrize("f", [_nested_first, _shallow_first])
def test_gradient_finds_math_names_in_user_modules_and_by_the_shortest_path(f):
    """(tape/hostmath.py places: a module of the user's named through the module; a
    function first met at the deepest level and then by a shorter path, in either order; a
    global whose attribute lookup raises is passed over: the derivative through sqrt was
    lost, or tg.gradient raised KeyError)"""

    (g,) = tg.gradient(f, A)
    s = float(np.sum(A ** 2))
    expected = (2.0 + 2 * 0.5 / math.sqrt(s) + 0.01 * math.exp(0.01 * s)) * 2 * A
    np.testing.assert_allclose(g, expected, rtol=1e-12)
    assert sqrt is REAL["sqrt"] and HELPERS.exp is REAL["exp"]


def test_the_standard_librarys_names_are_left_alone():
    import random
    import statistics
    seen = []

    def f(A):
        seen.append((random._sqrt, statistics.sqrt))
        return _s(A) * statistics.fmean([1.0, 2.0]) * random.random() ** 0

    (g,) = tg.gradient(f, A)
    np.testing.assert_allclose(g, 1.5 * 2 * A, rtol=1e-12)
    assert seen == [(REAL["sqrt"], REAL["sqrt"])]


def test_capture_sees_a_name_imported_from_math():
    def f(u, kappa):
        out = np.empty_like(u)
        scaled(CPU)(out, u, sqrt(kappa), ndrange=u.size)
        return tg.sum(out)

    cf = tg.capture(f)
    u = np.ones(8)
    for kappa in (0.25, 0.25, 4.0):
        assert tg.gradient(cf, u, kappa)[1] == pytest.approx(4.0 / math.sqrt(kappa), rel=1e-14)
    assert sqrt is REAL["sqrt"]


def _gamma_loss(A):
    s = _s(A)
    return math.gamma(s)                     # (the line the refusal names)


@pytest.mark.parametrize("run", [
    lambda: tg.gradient(_gamma_loss, A), lambda: tg.jvp(_gamma_loss, A, V),
    lambda: tg.hvp(_gamma_loss, A, V), lambda: tg.gradient(tg.capture(_gamma_loss), A)],
    ids=["gradient", "jvp", "hvp", "capture"])
def test_a_function_without_a_derivative_rule_is_refused_at_the_users_line(run):
    with pytest.raises(tg.TapegradError, match=r"test_host_math.py:\d+: math.gamma\(s\) of a "
                       r"scalar that carries a derivative .*cannot be differentiated: "
                       r"tapegrad has no derivative rule for math.gamma") as caught:
        run()
    message = str(caught.value)
    assert "sqrt, tan, tanh" in message and "compute it outside the function" in message
    assert f"test_host_math.py:{_gamma_loss.__code__.co_firstlineno + 2}:" in message
    assert math.gamma is REAL["gamma"]


@pytest.mark.parametrize("call, why", [
    (lambda s: cmath.sqrt(s).real, r"cmath.sqrt's answer is complex.*math.sqrt\(abs\(s\)\)"),
    (lambda s: math.hypot(s, s, 1.0), r"takes two arguments.*math.hypot\(math.hypot\(x, y\), z"),
    (lambda s: math.frexp(s)[0], r"no derivative rule for math.frexp"),
    (lambda s: math.ldexp(s, 2), r"no derivative rule for math.ldexp")],
    ids=["cmath.sqrt", "hypot of three", "frexp", "ldexp"])
def test_other_refusals_name_the_function(call, why):
    with pytest.raises(tg.TapegradError, match=why):
        tg.gradient(lambda A: call(_s(A)), A)


def test_plain_answers_and_plain_numbers_inside_a_recording_are_unchanged():
    with tg.Tape() as tape:
        s = _s(A)
        value = float.__float__(s)
        assert math.sqrt(2.0) == REAL["sqrt"](2.0) and type(math.sqrt(2.0)) is float
        assert math.gamma(3.5) == REAL["gamma"](3.5)                        # (a plain float: as is)
        assert math.fsum(x * 0.1 for x in range(10)) == 4.5          # (a generator: read once)
        assert math.sqrt(np.float64(4.0)) == 2.0
        assert math.isnan(s) is False and math.isfinite(s) is True   # (no derivative to lose)
        assert math.floor(s) == math.floor(value) and math.isclose(s, value)
        assert cmath.isfinite(s) and cmath.phase(s) == 0.0
        with pytest.raises(ValueError, match="math domain error"):
            math.sqrt(-s)                     # (math's value, math's error)
        loss = s * 2.0
    (g,) = tape.gradient(loss, [A])
    np.testing.assert_allclose(g, 4 * A, rtol=1e-15)
    assert math.sqrt is REAL["sqrt"] and math.gamma is REAL["gamma"]


def test_another_threads_math_is_math_while_one_thread_records():
    recording, done = threading.Event(), threading.Event()
    seen = {}

    def record():
        with tg.Tape() as tape:
            s = _s(A)
            recording.set()
            done.wait(10)
            loss = s * math.sqrt(s)
        seen["g"] = tape.gradient(loss, [A])[0]

    thread = threading.Thread(target=record)
    thread.start()
    try:
        assert recording.wait(10)
        wrapper = math.sqrt
        assert wrapper is not REAL["sqrt"]               # (installed for every thread meanwhile)
        assert math.sqrt(2.0) == REAL["sqrt"](2.0) and math.gamma(0.5) == REAL["gamma"](0.5)
        s_here = tg.sum(A)      # (a plain float here: no tape records in this thread)
        assert type(math.sqrt(s_here)) is float
        # this thread's own gradient, while the other thread's tape records
        (g,) = tg.gradient(lambda A: math.exp(_s(A)), A)
        np.testing.assert_allclose(g, math.exp(np.sum(A**2)) * 2 * A, rtol=1e-12)
        assert math.sqrt is wrapper               # (the other thread still records)
    finally:
        done.set()
        thread.join(10)
    np.testing.assert_allclose(seen["g"], 1.5 * math.sqrt(np.sum(A**2)) * 2 * A, rtol=1e-12)
    assert math.sqrt is REAL["sqrt"]
