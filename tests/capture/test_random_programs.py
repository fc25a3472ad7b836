"""Random step sequences (Hypothesis), on the CPU and on OpenCL: a captured function's replays
give the function's own loss bit for bit and its gradients (with respect to the input array
and a float parameter) to rounding, and agree with central differences, on new data and a new
parameter, through every kind of operation a capture replays: launches (new arrays, an update
in place, a tape scalar as a kernel's argument), tg.copy, tg.scale, tg.reshape, reductions
and arithmetic on tape scalars."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tests.capture.test_capture import diffuse
from tests.conftest import _opencl_on_numpy

N = 8
CPU = tg.CPU()
OPENCL = _opencl_on_numpy()


@tg.kernel
def soft(y, x, a):
    i = tg.index()
    y[i] = math.tanh(a * x[i]) + 0.5 * x[i]


@tg.kernel
def cube_in_place(x, a):
    i = tg.index()
    x[i] = x[i] + a * x[i] * x[i] * x[i]


def _apply(op: str, u: np.ndarray, kappa, backend) -> np.ndarray:
    if op == "diffuse":
        v = np.empty_like(u)
        diffuse(backend)(v, u, kappa, ndrange=N)
        return v
    if op == "soft":
        v = np.empty_like(u)
        soft(backend)(v, u, 1.3, ndrange=N)
        return v
    if op == "in place":           # on the function's own copy: its input stays as it was
        v = tg.copy(u)
        cube_in_place(backend)(v, 0.2, ndrange=N)
        return v
    if op == "scale":
        return tg.scale(u, kappa)
    if op == "reshape":
        return tg.reshape(tg.reshape(u, (2, N // 2)), (N,))
    if op == "mean as argument":   # a tape scalar computed on the way, given to a kernel
        v = np.empty_like(u)
        soft(backend)(v, u, 0.5 + tg.mean(u) * tg.mean(u), ndrange=N)
        return v
    raise ValueError(op)


OPS = ["diffuse", "soft", "in place", "scale", "reshape", "mean as argument"]


def _program(ops: list[str], backend):
    def run(u, kappa):
        for op in ops:
            u = _apply(op, u, kappa, backend)
        return tg.dot(u, u) + 0.3 * tg.sum(u) * kappa
    return run


def _check(ops: list[str], kappas: list[float], seed: int, backend) -> None:
    run = _program(ops, backend)
    captured = tg.capture(run)
    rng = np.random.default_rng(seed)
    for kappa in kappas:
        u = rng.uniform(-1, 1, N)
        assert float(captured(u, kappa)) == float(run(u, kappa))
        g = tg.gradient(captured, u, kappa)
        g_plain = tg.gradient(run, u, kappa)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12, atol=1e-14)
        assert math.isclose(g[1], g_plain[1], rel_tol=1e-12, abs_tol=1e-14)
    # and independently: central differences of the replays along a random direction
    d, dk, h = rng.uniform(-1, 1, N), 0.5, 1e-6
    fd = (float(captured(u + h * d, kappa + h * dk))
          - float(captured(u - h * d, kappa - h * dk))) / (2 * h)
    assert math.isclose(fd, float(g[0] @ d) + g[1] * dk, rel_tol=1e-6, abs_tol=1e-8)
    assert captured.recordings == 1


def _check_arrays_only(ops: list[str], kappas: list[float], seed: int, loss_inside: bool,
                       backend) -> None:
    """Gradients with respect to the array alone, the loss a reduction (inside the captured
    function or outside it): the reverse is written down on the second call and replayed
    from the third (capturing/reverse.py) where the program allows it."""
    w = np.linspace(-1.0, 2.0, N)

    def states(u, kappa):
        for op in ops:
            u = _apply(op, u, kappa, backend)
        return tg.dot(u, w) if loss_inside else u

    captured = tg.capture(states)
    loss = (lambda f, kappa: lambda u: f(u, kappa)) if loss_inside else \
        (lambda f, kappa: lambda u: tg.dot(f(u, kappa), w))
    rng = np.random.default_rng(seed)
    for kappa in kappas + kappas:
        u = rng.uniform(-1, 1, N)
        (g,) = tg.gradient(loss(captured, kappa), u)
        (g_plain,) = tg.gradient(loss(states, kappa), u)
        np.testing.assert_allclose(g, g_plain, rtol=1e-12, atol=1e-14)
    d, h = rng.uniform(-1, 1, N), 1e-6
    f = loss(captured, kappa)
    fd = (float(f(u + h * d)) - float(f(u - h * d))) / (2 * h)
    assert math.isclose(fd, float(g @ d), rel_tol=1e-6, abs_tol=1e-8)
    assert captured.recordings == 1


PROGRAMS = st.lists(st.sampled_from(OPS), min_size=1, max_size=7)
KAPPAS = st.lists(st.floats(0.05, 0.4), min_size=3, max_size=3)


@settings(max_examples=25, deadline=None)
@given(PROGRAMS, KAPPAS, st.integers(0, 2**16))
def test_captured_equals_uncaptured(ops, kappas, seed):
    _check(ops, kappas, seed, CPU)


@settings(max_examples=8, deadline=None)
@given(PROGRAMS, KAPPAS, st.integers(0, 2**16))
def test_captured_equals_uncaptured_on_opencl(ops, kappas, seed):
    """The same on OpenCL C (PoCL, through the test harness that copies NumPy arrays to the
    device at each launch), where the operations replay one by one."""
    _check(ops, kappas, seed, OPENCL)


@settings(max_examples=25, deadline=None)
@given(PROGRAMS, KAPPAS, st.integers(0, 2**16), st.booleans())
def test_captured_reverse_equals_the_python_sweep(ops, kappas, seed, loss_inside):
    _check_arrays_only(ops, kappas, seed, loss_inside, CPU)


@settings(max_examples=6, deadline=None)
@given(PROGRAMS, KAPPAS, st.integers(0, 2**16), st.booleans())
def test_captured_reverse_equals_the_python_sweep_on_opencl(ops, kappas, seed, loss_inside):
    _check_arrays_only(ops, kappas, seed, loss_inside, OPENCL)
