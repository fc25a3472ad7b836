"""Random host programs (Hypothesis; the steps of test_random_programs.py, with host code
around them) called several times with changes between the calls: new array and float
values, a global array rebound (``W = W * 1.5``) or changed in place, an array replaced in a
dict, the global array passed as the argument.  Each call of the captured function gives the
uncaptured function's result and gradients (float64, to rounding), or refuses with a
tapegrad error: never a stale number (docs/capture.md, "What a replay depends on")."""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tests.capture.test_random_programs import OPS, _apply

N = 8
CPU = tg.CPU()
# (more in a long run: TAPEGRAD_RANDOM_CHANGES_EXAMPLES=200)
EXAMPLES = int(os.environ.get("TAPEGRAD_RANDOM_CHANGES_EXAMPLES", "10"))

W = np.linspace(0.5, 1.5, N)              # a global array a kernel reads
P = {"V": np.linspace(-1.0, 1.0, N)}      # an array in a global dict that a reduction reads


@tg.kernel
def weigh(out, u, w, a):
    i = tg.index()
    out[i] = a * w[i] * u[i]


def _program(ops: list[str], host: frozenset[str]):
    """``ops`` on the argument, with the host code of ``host`` around them: ``sqrt`` (a
    kernel's argument from math.sqrt of the float argument), ``branch`` (an if on a tape
    scalar), ``steps`` (a step count from the float argument)."""
    def run(u, kappa):
        for op in ops:
            u = _apply(op, u, kappa, CPU)
        if "steps" in host:
            for _ in range(int(kappa // 0.1)):
                u = _apply("soft", u, kappa, CPU)
        if "branch" in host and tg.sum(u) > 0:
            u = tg.scale(u, 2.0)
        v = np.empty_like(u)
        weigh(CPU)(v, u, W, math.sqrt(kappa) if "sqrt" in host else 1.0, ndrange=N)
        return tg.dot(v, P["V"]) + tg.dot(v, v) + 0.3 * tg.sum(u) * kappa
    return run


CHANGES = ["values", "kappa", "rebind W", "edit W", "replace V", "pass W"]


def _change(change: str, u: np.ndarray, kappa: float, rng: np.random.Generator) -> tuple:
    """The next call's arguments, after ``change`` (to the globals, or to them)."""
    global W
    if change == "values":
        return rng.uniform(-1.0, 1.0, N), float(rng.uniform(0.05, 0.4))
    if change == "kappa":
        return u, float(rng.uniform(0.05, 0.4))
    if change == "rebind W":
        W = W * 1.5
    elif change == "edit W":
        W *= -0.5
    elif change == "replace V":
        P["V"] = P["V"] + rng.uniform(-1.0, 1.0, N)
    elif change == "pass W":
        return W, kappa
    return u, kappa


def _outcome(fn, u: np.ndarray, kappa: float) -> tuple | tg.TapegradError:
    """``fn``'s value and gradients, or the tapegrad error it raised."""
    try:
        value = float(fn(u, kappa))
        gu, gk = tg.gradient(fn, u, kappa)
    except tg.TapegradError as e:
        return e
    return value, gu, gk


def _check(ops: list[str], host: frozenset[str], changes: list[str], seed: int) -> None:
    global W
    run = _program(ops, host)
    captured = tg.capture(run)
    rng = np.random.default_rng(seed)
    u, kappa = None, None
    saved = W, W.copy(), P["V"]
    try:
        for change in ["values", *changes]:
            u, kappa = _change(change, u, kappa, rng)
            expected = _outcome(run, u, kappa)
            got = _outcome(captured, u, kappa)
            assert not isinstance(expected, Exception), expected
            if isinstance(got, tg.TapegradError):
                continue          # (a refusal: never a wrong number)
            np.testing.assert_allclose(got[0], expected[0], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(got[1], expected[1], rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(got[2], expected[2], rtol=1e-12, atol=1e-14)
    finally:
        W, P["V"] = saved[0], saved[2]
        W[...] = saved[1]


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(st.sampled_from(OPS), max_size=3),
       st.frozensets(st.sampled_from(["sqrt", "branch", "steps"])),
       st.lists(st.sampled_from(CHANGES), min_size=2, max_size=6), st.integers(0, 2**16))
def test_captured_equals_uncaptured_across_changes(ops, host, changes, seed):
    _check(ops, host, changes, seed)
