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
