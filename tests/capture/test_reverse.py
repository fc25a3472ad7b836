"""A captured program's reverse sweep, written down once and run compiled afterwards
(``tapegrad/capturing/reverse.py``): its gradients are the uncaptured function's (to
rounding, float64) on new data and parameters, per kind of sweep; sweeps it cannot write
down stay Python sweeps and stay right."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.driver import Stretch
from tapegrad.capturing.reverse import Reverse

N = 16
CPU = tg.CPU()


@tg.kernel
def react(u_new, u, k, K):
    i = tg.index()
    if i > 0 and i < u.shape[0] - 1:
        u_new[i] = u[i] + k * (u[i + 1] - 2.0 * u[i] + u[i - 1]) - K[i] * u[i] * u[i] * u[i]
    else:
        u_new[i] = u[i]


def simulate(u, K, a, b, steps=12):
    u = tg.copy(u)
    for s in range(steps):
        u_new = np.empty_like(u)
        react(CPU)(u_new, u, a if s < steps // 2 else b, K, ndrange=u.size)
        u = u_new
    return u


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return rng.uniform(-1, 1, N), rng.uniform(0.0, 0.05, N), rng.uniform(0.5, 1.5, N)


def reverses(captured):
    (program,) = next(iter(captured.programs.values()))
    return program.reverses


def test_a_nonlinear_simulations_reverse_runs_compiled_and_equals_the_python_one(data):
    u0, K, w = data
    captured = tg.capture(simulate)
    rng = np.random.default_rng(0)
    for a, b in ((0.2, 0.2), (0.2, 0.2), (0.3, 0.1), (0.15, 0.25)):
        u = u0 + 0.1 * rng.standard_normal(N)        # new data each call
        g = tg.gradient(lambda u, a=a, b=b: tg.dot(captured(u, K, a, b), w), u)[0]
        g_plain = tg.gradient(lambda u, a=a, b=b: tg.dot(simulate(u, K, a, b), w), u)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse)
    # the launches, the copy's adjoint and the zeroing: compiled stretches only
    assert reverse.compiled and all(isinstance(what, Stretch) for _, what in reverse.compiled)
    assert captured.recordings == 1
    # and against central differences along a random direction
    d = rng.standard_normal(N)
    h = 1e-6
    f = lambda u: float(tg.dot(captured(u, K, 0.3, 0.1), w))   # noqa: E731
    g = tg.gradient(lambda u: tg.dot(captured(u, K, 0.3, 0.1), w), u0)[0]
    assert np.dot(g, d) == pytest.approx((f(u0 + h * d) - f(u0 - h * d)) / (2 * h), rel=1e-7)


def test_each_kind_of_sweep_has_its_own_reverse_and_a_gradient_keeps_its_values(data):
    u0, K, w = data
    captured = tg.capture(simulate)
    both = lambda u, K: tg.dot(captured(u, K, 0.2, 0.1), w)   # noqa: E731
    plain = lambda u, K: tg.dot(simulate(u, K, 0.2, 0.1), w)  # noqa: E731
    expected = tg.gradient(plain, u0, K)
    kept = []
    for _ in range(3):
        gu, gK = tg.gradient(both, u0, K)
        (gu_only,) = tg.gradient(lambda u: both(u, K), u0)
        np.testing.assert_allclose(gu, expected[0], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(gK, expected[1], rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(gu_only, expected[0], rtol=1e-13, atol=1e-15)
        kept += [gu, gK, gu_only]
    # (a gradient is the outer sweep's array, not a buffer the program reuses)
    for g, want in zip(kept, [expected[0], expected[1], expected[0]] * 3):
        np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-15)
    kinds = reverses(captured)       # (u and K given, u alone; and the output's, both)
    assert sorted(len(given) for given, _, _ in kinds) == [2, 3]
    assert all(isinstance(r, Reverse) for r in kinds.values())


def test_float_arguments_gradients_run_compiled_too(data):
    # (each adjoint adds its Active scalar's gradient into an array per argument, summed once
    # after the reverse)
    u0, K, w = data
    captured = tg.capture(simulate)
    rng = np.random.default_rng(3)
    for a, b in ((0.2, 0.1), (0.2, 0.1), (0.25, 0.15), (0.1, 0.3)):
        u = u0 + 0.1 * rng.standard_normal(N)
        g = tg.gradient(lambda u, a, b: tg.dot(captured(u, K, a, b), w), u, a, b)
        g_plain = tg.gradient(lambda u, a, b: tg.dot(simulate(u, K, a, b), w), u, a, b)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13, atol=1e-15)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
        assert g[2] == pytest.approx(g_plain[2], rel=1e-13)
    h = 1e-6
    f = lambda a: float(tg.dot(captured(u, K, a, b), w))   # noqa: E731
    assert g[1] == pytest.approx((f(a + h) - f(a - h)) / (2 * h), rel=1e-7)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse)
    assert reverse.compiled and any(isinstance(what, Stretch) for _, what in reverse.compiled)


def test_a_float_argument_through_scalar_arithmetic_runs_compiled_too(data):
    # (the arithmetic's adjoint runs on the host between the compiled stretches: the
    # launches' sums for 0.5 * a are added up before it passes them on to a)
    u0, K, w = data
    half = lambda u, a: simulate(u, K, 0.5 * a, a * a)    # noqa: E731
    captured = tg.capture(half)
    for a in (0.2, 0.2, 0.3, 0.1):
        g = tg.gradient(lambda u, a: tg.dot(captured(u, a), w), u0, a)
        g_plain = tg.gradient(lambda u, a: tg.dot(half(u, a), w), u0, a)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13, atol=1e-15)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
    h = 1e-6
    f = lambda a: float(tg.dot(captured(u0, a), w))   # noqa: E731
    assert g[1] == pytest.approx((f(a + h) - f(a - h)) / (2 * h), rel=1e-7)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse)
    assert [op.kind for op in reverse.ops].count("scalar") == 2


def two_outputs(u, K):
    v, z = np.empty_like(u), np.empty_like(u)
    react(CPU)(v, u, 0.2, K, ndrange=u.size)
    react(CPU)(z, K, 0.1, K, ndrange=u.size)      # does not depend on u
    return v, z


def test_an_output_no_adjoint_reaches_gets_its_zeros(data):
    u0, K, w = data
    captured = tg.capture(two_outputs)
    for _ in range(3):
        g = tg.gradient(lambda u: tg.dot(captured(u, K)[0], w) + tg.dot(captured(u, K)[1], w),
                        u0)[0]
        g_plain = tg.gradient(lambda u: tg.dot(two_outputs(u, K)[0], w)
                              + tg.dot(two_outputs(u, K)[1], w), u0)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)


@tg.kernel
def square(y, x):
    i = tg.index()
    y[i] = x[i] * x[i]


def head_squared(x):
    u = tg.copy(x)
    y = np.empty(x.size - 4)
    square(CPU)(y, u, ndrange=y.size)     # reads u[:-4] only: u's shadow needs its zeros
    return y


def test_a_reverse_assumes_nothing_of_what_its_buffers_held_before(data):
    u0, _, w = data
    captured = tg.capture(head_squared)
    expected = np.concatenate([2 * u0[:-4] * w[:-4], np.zeros(4)])
    for _ in range(3):
        g = tg.gradient(lambda x: tg.dot(captured(x), w[:-4]), u0)[0]
        np.testing.assert_allclose(g, expected, rtol=1e-15)
        for reverse in reverses(captured).values():
            for buffer in reverse.temps:       # whatever they hold between calls
                buffer.fill(np.nan)
    assert len(reverses(captured)) == 1


@tg.kernel
def diffuse_periodic(u_new, u, kappa):
    i = tg.index()
    n = u.shape[0]
    u_new[i] = u[i] + kappa * (u[(i + 1) % n] - 2.0 * u[i] + u[(i - 1) % n])


def periodic(u, kappa):
    for _ in range(9):
        u_new = np.empty_like(u)
        diffuse_periodic(CPU)(u_new, u, kappa, ndrange=u.size)
        u = u_new
    return u


def test_an_adjoint_adding_through_per_task_copies_runs_compiled_too(data):
    # (an index computed with %: the adjoint adds with atomics, into per-task copies that
    # the compiled stretch keeps and passes, as the launcher does)
    u0, _, w = data
    captured = tg.capture(periodic)
    for kappa in (0.2, 0.3, 0.1):
        g = tg.gradient(lambda u, kappa=kappa: tg.dot(captured(u, kappa), w), u0)[0]
        g_plain = tg.gradient(lambda u, kappa=kappa: tg.dot(periodic(u, kappa), w), u0)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)
    (reverse,) = reverses(captured).values()
    assert reverse.compiled and all(isinstance(what, Stretch) for _, what in reverse.compiled)
    assert any(what.pools for _, what in reverse.compiled)


def losses(u, K, a, kind):
    v = simulate(u, K, a, a)
    return {"dot": lambda: tg.dot(v, K), "sum": lambda: tg.sum(v), "mean": lambda: tg.mean(v),
            "norm": lambda: tg.norm(v), "scaled": lambda: 2.0 * tg.dot(v, v)}[kind]()


@pytest.mark.parametrize("kind", ["dot", "sum", "mean", "norm", "scaled"])
def test_a_loss_captured_with_its_simulation(data, kind):
    # the reduction making the result takes the caller's seed in the compiled reverse; a
    # seed of 0 and scalar arithmetic after the reduction go by the Python sweep
    u0, K, _ = data
    captured = tg.capture(losses)
    for seed in (1.0, 3.0, 0.0, -0.5):
        g = tg.gradient(lambda u, s=seed: s * captured(u, K, 0.2, kind), u0)[0]
        g_plain = tg.gradient(lambda u, s=seed: s * losses(u, K, 0.2, kind), u0)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)
    compiled = [r for r in reverses(captured).values() if r]
    assert len(compiled) == 1      # (seeds of 0 skip the reduction: not written down)


def test_threads_calling_one_captured_function_get_their_own_results(data):
    # (a program's temporaries and its reverse's buffers are its own memory: calls take
    # turns with them; the kernels themselves release the GIL)
    from concurrent.futures import ThreadPoolExecutor
    _, K, w = data
    captured = tg.capture(simulate)
    rng = np.random.default_rng(5)
    inputs = [rng.uniform(-1, 1, N) for _ in range(16)]
    captured(inputs[0], K, 0.2, 0.1)
    tg.gradient(lambda u: tg.dot(captured(u, K, 0.2, 0.1), w), inputs[0])

    def both(u):
        return captured(u, K, 0.2, 0.1), tg.gradient(
            lambda u: tg.dot(captured(u, K, 0.2, 0.1), w), u)[0]

    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            for u, (y, g) in zip(inputs, pool.map(both, inputs)):
                np.testing.assert_array_equal(y, simulate(u, K, 0.2, 0.1))
                np.testing.assert_allclose(
                    g, tg.gradient(lambda u: tg.dot(simulate(u, K, 0.2, 0.1), w), u)[0],
                    rtol=1e-13, atol=1e-15)


def opencl_simulation(data):
    """(the OpenCL queue, ``sim(u, a)``: six nonlinear steps on OpenCL arrays and a dot)"""
    import pyopencl.array as cla
    cl = tg.OpenCL()
    u0, _, w = data
    Kd, wd = cla.to_device(cl.queue, 0.05 * np.abs(u0)), cla.to_device(cl.queue, w)

    def sim(u, a):
        for _ in range(6):
            u_new = cla.empty_like(u)
            react(cl)(u_new, u, a, Kd, ndrange=N)
            u = u_new
        return tg.dot(u, wd)
    return cl, sim


def test_on_opencl_the_reverse_replays_packed_launches(data):
    import pyopencl.array as cla
    cl, sim = opencl_simulation(data)
    u0 = data[0]
    captured = tg.capture(sim)
    for a in (0.2, 0.3, 0.1):
        u = cla.to_device(cl.queue, u0)
        g = tg.gradient(lambda u, a=a: captured(u, a), u)[0].get()
        g_plain = tg.gradient(lambda u, a=a: sim(u, a), u)[0].get()
        np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)
    (reverse,) = reverses(captured).values()
    assert [type(what).__name__ for packed, what in reverse.compiled if packed] \
        == ["QueuedLaunches"]


def test_a_long_nonlinear_simulation_loops_over_lists_of_its_states(data):
    # (300 launches over states that differ from launch to launch: a loop over lists of
    # them, not a line per launch; the lists mostly kept from call to call)
    from tapegrad.backends.cpu.driver import LIST_FROM
    u0, K, w = data
    steps = LIST_FROM + 44
    captured = tg.capture(lambda u, a: simulate(u, K, a, a, steps))
    rng = np.random.default_rng(8)
    for a in (0.2, 0.25, 0.15):
        u = u0 + 0.1 * rng.standard_normal(N)
        np.testing.assert_array_equal(captured(u, a), simulate(u, K, a, a, steps))
        g = tg.gradient(lambda u, a=a: tg.dot(captured(u, a), w), u)[0]
        g_plain = tg.gradient(lambda u, a=a: tg.dot(simulate(u, K, a, a, steps), w), u)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-12, atol=1e-14)
    (program,) = next(iter(captured.programs.values()))
    (reverse,) = program.reverses.values()
    for plan in (program.compiled, reverse.compiled):
        assert any(isinstance(what, Stretch) and what.lists for _, what in plan)


@tg.kernel
def relax(y, x, a):
    i = tg.index()
    y[i] = x[i] - a * x[i] * x[i] * x[i]


def two_kernels(u, K, a, steps):
    for _ in range(steps):
        v = np.empty_like(u)
        react(CPU)(v, u, a, K, ndrange=u.size)
        u = np.empty_like(v)
        relax(CPU)(u, v, 0.1, ndrange=u.size)
    return u


def test_steps_of_two_kernels_loop_over_lists_too(data):
    from tapegrad.backends.cpu.driver import LIST_FROM
    u0, K, w = data
    steps = LIST_FROM // 2 + 10
    captured = tg.capture(lambda u, a: two_kernels(u, K, a, steps))
    for a in (0.2, 0.1, 0.3):     # (records, writes its reverse down, replays it)
        g = tg.gradient(lambda u, a=a: tg.dot(captured(u, a), w), u0)[0]
        g_plain = tg.gradient(lambda u, a=a: tg.dot(two_kernels(u, K, a, steps), w), u0)[0]
        np.testing.assert_allclose(g, g_plain, rtol=1e-12, atol=1e-14)
    (program,) = next(iter(captured.programs.values()))
    (reverse,) = program.reverses.values()
    for plan in (program.compiled, reverse.compiled):
        assert any(isinstance(what, Stretch) and what.lists for _, what in plan)


def scaled(u, K, a):
    v = tg.scale(simulate(u, K, 0.2, 0.2), a)           # a float argument: a parameter
    return tg.scale(v, 0.5 + tg.mean(v) * tg.mean(v))     # a factor that depends on u


def test_tg_scale_in_the_reverse(data):
    u0, K, w = data
    captured = tg.capture(lambda u, K, a: tg.scale(simulate(u, K, 0.2, 0.2), a))
    both = tg.capture(scaled)
    for a in (0.5, 2.0, -1.5):
        for f, plain in ((captured, lambda u, K, a: tg.scale(simulate(u, K, 0.2, 0.2), a)),
                         (both, scaled)):
            g = tg.gradient(lambda u, a=a, f=f: tg.dot(f(u, K, a), w), u0)[0]
            g_plain = tg.gradient(lambda u, a=a, p=plain: tg.dot(p(u, K, a), w), u0)[0]
            np.testing.assert_allclose(g, g_plain, rtol=1e-13, atol=1e-15)
    assert all(reverses(captured).values())          # the parameter's factor: written down
    assert all(reverses(both).values())    # the mean's too: arithmetic on its value


@tg.kernel
def diffuse(u_new, u, k):
    i = tg.index()
    if i > 0 and i < u.shape[0] - 1:
        u_new[i] = u[i] + k * (u[i + 1] - 2.0 * u[i] + u[i - 1])
    else:
        u_new[i] = u[i]


def diffusion(u, k, steps=10):
    u = tg.copy(u)
    for _ in range(steps):
        u_new = np.empty_like(u)
        diffuse(CPU)(u_new, u, k, ndrange=u.size)
        u = u_new
    return u


def diffusion_matrix(k, steps=10):
    step = np.eye(N)
    for i in range(1, N - 1):
        step[i, i - 1:i + 2] += k * np.array([1.0, -2.0, 1.0])
    return np.linalg.matrix_power(step, steps)


@pytest.fixture
def forwards(monkeypatch):
    """How many times a captured program's forward ran."""
    from tapegrad.capturing.program import Program
    runs, run = [], Program.run
    monkeypatch.setattr(Program, "run", lambda self, frame: (runs.append(1), run(self, frame)))
    return runs


@pytest.mark.parametrize("kind", ["dot", "sum", "mean"])
def test_a_linear_loss_gradient_does_not_run_its_forward(data, forwards, kind):
    # tg.gradient of a captured loss wants no value: where the written-down reverse reads
    # nothing the forward computes (a linear simulation's adjoints, a linear reduction's
    # cotangent), the forward is not run at all
    _, _, w = data
    reduce = {"dot": lambda v: tg.dot(v, w), "sum": tg.sum, "mean": tg.mean}[kind]
    captured = tg.capture(lambda u: reduce(diffusion(u, 0.2)))
    seed = {"dot": w, "sum": np.ones(N), "mean": np.full(N, 1.0 / N)}[kind]
    rng = np.random.default_rng(11)
    for call in range(4):
        u = rng.uniform(-1, 1, N)
        del forwards[:]
        (g,) = tg.gradient(captured, u)
        # (the first call records, the second traces its sweep, then none runs the forward)
        assert len(forwards) == (0 if call >= 2 else 1 if call == 1 else 0)
        np.testing.assert_allclose(g, diffusion_matrix(0.2).T @ seed, rtol=1e-13, atol=1e-15)
        np.testing.assert_allclose(g, tg.gradient(lambda u: reduce(diffusion(u, 0.2)), u)[0],
                                   rtol=1e-13, atol=1e-15)
    (reverse,) = reverses(captured).values()
    assert reverse and not reverse.reads_forward
    # the value is there whenever it is asked for
    assert float(captured(u)) == pytest.approx(float(reduce(diffusion(u, 0.2))), rel=1e-13)


@pytest.mark.parametrize("kind", ["self dot", "norm", "nonlinear", "wrapped"])
def test_a_gradient_that_reads_the_forwards_values_runs_it(data, forwards, kind):
    u0, K, w = data
    loss = {"self dot": lambda u: tg.dot(diffusion(u, 0.2), diffusion(u, 0.1)),
            "norm": lambda u: tg.norm(diffusion(u, 0.2)),
            "nonlinear": lambda u: tg.dot(simulate(u, K, 0.2, 0.2), w)}.get(
        kind, lambda u: tg.dot(diffusion(u, 0.2), w))
    captured = tg.capture(loss)
    if kind == "wrapped":       # the call's value could be used: it runs
        f = lambda u: captured(u)    # noqa: E731
    else:
        f = captured
    for call in range(3):
        u = u0 + 0.1 * call
        del forwards[:]
        (g,) = tg.gradient(f, u)
        np.testing.assert_allclose(g, tg.gradient(loss, u)[0], rtol=1e-13, atol=1e-15)
        assert len(forwards) == (call > 0)


def test_a_gradient_inside_another_recording_is_refused_before_anything_runs(data, forwards):
    """(its result would be a constant to the recording tape: a loss made of it lost its
    second-order terms)"""
    u0, _, w = data
    captured = tg.capture(lambda u: tg.dot(diffusion(u, 0.2), w))
    for f in (captured, lambda u: tg.dot(diffusion(u, 0.2), w)):
        with tg.Tape() as outer, pytest.raises(tg.TapegradError, match="while a tape records"):
            tg.gradient(f, u0)
        assert not forwards and not outer.records


def test_on_opencl_a_linear_loss_gradient_skips_its_forward_too(data, forwards):
    import pyopencl.array as cla
    cl = tg.OpenCL()
    u0, _, w = data
    wd = cla.to_device(cl.queue, w)

    def loss(u):
        for _ in range(10):
            u_new = cla.empty_like(u)
            diffuse(cl)(u_new, u, 0.2, ndrange=N)
            u = u_new
        return tg.dot(u, wd)

    captured = tg.capture(loss)
    for call in range(4):
        del forwards[:]
        (g,) = tg.gradient(captured, cla.to_device(cl.queue, u0 + 0.1 * call))
        np.testing.assert_allclose(g.get(), diffusion_matrix(0.2).T @ w, rtol=1e-13,
                                   atol=1e-15)
        assert len(forwards) == (call == 1)


def test_on_opencl_a_float_arguments_gradient_runs_compiled(data):
    import pyopencl.array as cla
    cl, sim = opencl_simulation(data)
    u0 = data[0]
    captured = tg.capture(sim)
    for a in (0.2, 0.3, 0.1):
        u = cla.to_device(cl.queue, u0)
        g, ga = tg.gradient(captured, u, a)
        g_plain, ga_plain = tg.gradient(sim, u, a)
        np.testing.assert_allclose(g.get(), g_plain.get(), rtol=1e-13, atol=1e-15)
        assert ga == pytest.approx(ga_plain, rel=1e-13)
    (reverse,) = reverses(captured).values()
    assert [type(what).__name__ for packed, what in reverse.compiled if packed] \
        == ["QueuedLaunches"]


def test_a_gradient_that_is_zero_when_traced_is_traced_again_later(data):
    # (a reduction whose gradient is 0 skips its work in the sweep, so a trace of that sweep
    # lacks it: it is not kept, and a later sweep traces again; then zeros run compiled)
    u0, K, w = data
    loss = lambda u, c: c * tg.dot(simulate(u, K, 0.2, 0.2), w)   # noqa: E731
    captured = tg.capture(loss)
    for c in (1.0, 0.0, 0.0, 2.0, 0.0, -1.5):
        g = tg.gradient(captured, u0, c)
        g_plain = tg.gradient(loss, u0, c)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13, atol=1e-15)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
    assert all(isinstance(r, Reverse) for r in reverses(captured).values())


def test_tg_scales_factor_gradient_runs_compiled(data):
    u0, K, w = data
    loss = lambda u, a: tg.dot(tg.scale(simulate(u, K, 0.2, 0.2), a), w)   # noqa: E731
    captured = tg.capture(loss)
    for a in (0.5, 2.0, -1.5):
        g = tg.gradient(captured, u0, a)
        g_plain = tg.gradient(loss, u0, a)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13, atol=1e-15)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
    assert g[1] == pytest.approx(float(tg.dot(simulate(u0, K, 0.2, 0.2), w)), rel=1e-13)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse) and "factor" in [op.kind for op in reverse.ops]


@tg.kernel
def cube_in_place(x, a):
    i = tg.index()
    x[i] = x[i] + a * x[i] * x[i] * x[i]


def in_place(u, a, steps=6):
    u = tg.copy(u)
    for _ in range(steps):
        cube_in_place(CPU)(u, a, ndrange=u.size)
    return u


def test_kernels_updating_in_place_run_compiled_with_their_stacks(data, forwards):
    # (each adjoint recomputes its step on a copy of the state it reads and keeps values
    # on a per-work-item stack: the copies are operations of the reverse, the stacks'
    # status one array checked after it)
    u0, _, w = data
    captured = tg.capture(in_place)
    rng = np.random.default_rng(9)
    for a in (0.2, 0.2, 0.1, 0.3):
        u = 0.5 * u0 + 0.1 * rng.standard_normal(N)
        g = tg.gradient(lambda u, a: tg.dot(captured(u, a), w), u, a)
        g_plain = tg.gradient(lambda u, a: tg.dot(in_place(u, a), w), u, a)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13, atol=1e-15)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
    d, h = rng.standard_normal(N), 1e-6
    f = lambda u: float(tg.dot(captured(u, a), w))    # noqa: E731
    assert g[0] @ d == pytest.approx((f(u + h * d) - f(u - h * d)) / (2 * h), rel=1e-7)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse) and reverse.status is not None
    assert reverse.compiled and any(isinstance(what, Stretch) for _, what in reverse.compiled)


@tg.kernel
def drift(B, A, steps):
    i = tg.index()
    s = A[i]
    for k in range(steps[i]):          # a trip count in the data: the stack it needs too
        s = s + 0.0005 * math.cos(s + k)
    B[i] = s


def test_a_stack_that_overflows_in_the_written_down_reverse(data):
    # (the reverse checks the stacks' status after it ran: on an overflow it puts the given
    # shadows back as they were and the Python sweep runs, growing the stack; a later sweep
    # writes the reverse down again, deeper)
    u0, _, w = data

    def run(u, steps):
        b = np.empty_like(u)
        drift(CPU)(b, u, steps, ndrange=N)
        return b

    captured = tg.capture(run)
    for count in (2, 2, 2, 3000, 3000, 3000, 2):
        steps = np.full(N, count, dtype=np.int64)
        (g,) = tg.gradient(lambda u, s=steps: tg.dot(captured(u, s), w), u0)
        (g_plain,) = tg.gradient(lambda u, s=steps: tg.dot(run(u, s), w), u0)
        np.testing.assert_allclose(g, g_plain, rtol=1e-12, atol=1e-14)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse)


def test_on_opencl_updates_in_place_run_compiled_too(data):
    import pyopencl.array as cla
    cl = tg.OpenCL()
    u0, _, w = data
    wd = cla.to_device(cl.queue, w)

    def loss(u, a):
        u = tg.copy(u)
        for _ in range(4):
            cube_in_place(cl)(u, a, ndrange=N)
        return tg.dot(u, wd)

    captured = tg.capture(loss)
    for a in (0.2, 0.3, 0.1, 0.25):
        u = cla.to_device(cl.queue, 0.5 * u0)
        g, ga = tg.gradient(captured, u, a)
        g_plain, ga_plain = tg.gradient(loss, u, a)
        np.testing.assert_allclose(g.get(), g_plain.get(), rtol=1e-13, atol=1e-15)
        assert ga == pytest.approx(ga_plain, rel=1e-13)
    (reverse,) = reverses(captured).values()
    assert isinstance(reverse, Reverse) and reverse.status is not None
