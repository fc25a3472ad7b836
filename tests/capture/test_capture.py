"""``tg.capture``: a replay gives what the function's Python gives (primal bit for bit,
gradients to rounding, float64), records again where a shape, a constant or a branch
differs (or refuses, strictly), and refuses what it could not replay faithfully."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu.driver import Stretch

N = 12
CPU = tg.CPU()


@tg.kernel
def diffuse(u_new, u, kappa):
    i = tg.index()
    n = u.shape[0]
    u_new[i] = u[i] + kappa * (u[(i + 1) % n] - 2.0 * u[i] + u[(i - 1) % n])


@tg.kernel
def squash(y, x, a):
    i = tg.index()
    y[i] = math.tanh(a * x[i]) + x[i]


def simulate(u, kappa, steps):
    for _ in range(steps):
        u_new = np.empty_like(u)
        diffuse(CPU)(u_new, u, kappa, ndrange=u.size)
        u = u_new
    return u


def loss_of(run):
    w = np.linspace(0.5, 1.5, N)
    return lambda u, kappa: tg.dot(run(u, kappa, 20), w) + 0.1 * tg.sum(run(u, kappa, 20)) ** 2


@pytest.fixture(scope="module")
def u0():
    return np.random.default_rng(0).uniform(-1, 1, N)


def test_replays_equal_the_functions_python_and_skip_it(u0):
    captured = tg.capture(simulate)
    for kappa in (0.2, 0.1, 0.3):
        np.testing.assert_array_equal(captured(u0, kappa, 20), simulate(u0, kappa, 20))
    assert captured.recordings == 1
    (program,) = captured.programs[next(iter(captured.programs))]
    # on the CPU the 20 launches are one compiled function, its alternating run a loop
    assert isinstance(program.compiled[0][1], Stretch) and len(program.compiled) == 1


def test_gradients_equal_the_uncaptured_ones_and_central_differences(u0):
    captured = tg.capture(simulate)
    g_plain = tg.gradient(loss_of(simulate), u0, 0.2)
    for _ in range(3):      # the first call records, under the gradient's tape; then replays
        g = tg.gradient(loss_of(captured), u0, 0.2)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12, atol=1e-14)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    assert captured.recordings == 1
    f = loss_of(captured)
    h = 1e-6
    fd = (float(f(u0, 0.2 + h)) - float(f(u0, 0.2 - h))) / (2 * h)
    assert g[1] == pytest.approx(fd, rel=1e-7)


def test_a_new_shape_or_constant_records_again(u0):
    captured = tg.capture(simulate)
    captured(u0, 0.2, 20)
    np.testing.assert_array_equal(captured(u0[:8].copy(), 0.2, 20), simulate(u0[:8], 0.2, 20))
    np.testing.assert_array_equal(captured(u0, 0.2, 7), simulate(u0, 0.2, 7))
    assert captured.recordings == 3
    captured(u0, 0.25, 7)
    assert captured.recordings == 3


def branchy(u, a):
    v = np.empty_like(u)
    if tg.sum(u) > 0:                 # a branch on a tape scalar: the replays check it
        squash(CPU)(v, u, a, ndrange=u.size)
    else:
        squash(CPU)(v, u, -a, ndrange=u.size)
    return tg.dot(v, v)


def test_a_branch_taken_otherwise_records_a_second_variant(u0):
    captured = tg.capture(branchy)
    pos, neg = np.abs(u0), -np.abs(u0)
    for _ in range(2):
        for x in (pos, neg):
            assert float(captured(x, 0.7)) == float(branchy(x, 0.7))
            g, g_plain = tg.gradient(captured, x, 0.7), tg.gradient(branchy, x, 0.7)
            np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13)
            assert g[1] == pytest.approx(g_plain[1], rel=1e-13)
    assert captured.recordings == 2
    assert len(captured.programs[next(iter(captured.programs))]) == 2


def test_strict_refuses_a_new_branch_and_a_new_shape(u0):
    captured = tg.capture(branchy, strict=True)
    captured(np.abs(u0), 0.7)
    with pytest.raises(tg.CaptureError, match=r"another branch than the recorded one.*"
                       r"strict capture does not record again"):
        captured(-np.abs(u0), 0.7)
    with pytest.raises(tg.CaptureError, match=r"strict=True for arguments \(ndarray\[12\] "
                       r"float64, float\), and this call has \(ndarray\[5\] float64, float\)"):
        captured(np.ones(5), 0.7)


def test_a_captured_step_in_checkpoint_loop_and_tg_autodiff(u0):
    def step(u, kappa):
        u_new = np.empty_like(u)
        diffuse(CPU)(u_new, u, kappa, ndrange=u.size)
        return u_new

    captured = tg.capture(step)

    def run(stepper, u, kappa):
        return tg.dot(tg.checkpoint_loop(stepper, u, 30, params=(kappa,), snapshots=4), u0)

    g_plain = tg.gradient(lambda u, k: run(step, u, k), u0, 0.15)
    g = tg.gradient(lambda u, k: run(captured, u, k), u0, 0.15)
    np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12)
    assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    du, w = np.zeros(N), np.linspace(-1.0, 1.0, N)
    tg.autodiff(tg.Reverse, lambda u: tg.dot(captured(u, 0.15), w), tg.Active,
                tg.Duplicated(u0.copy(), du))
    plain = tg.gradient(lambda u: tg.dot(step(u, 0.15), w), u0)[0]
    np.testing.assert_allclose(du, plain, rtol=1e-13)


def two_states(u, v, a, b):
    u_new, v_new = np.empty_like(u), np.empty_like(v)
    squash(CPU)(u_new, v, a, ndrange=u.size)       # (nonlinear: the adjoints read u and v)
    squash(CPU)(v_new, u, b, ndrange=u.size)
    return u_new, v_new


def test_a_nonlinear_captured_step_in_checkpoint_loop(u0):
    # (its recording keeps the states: the loop must not take it for a linear step, whose
    # one recording would serve every step; b, a plain float, is no tape scalar from outside)
    captured, w = tg.capture(two_states), np.linspace(-1.0, 1.0, N)

    def run(stepper, u, a):
        u, v = tg.checkpoint_loop(stepper, (u, 0.5 * u0), 12, params=(a, 0.3), snapshots=3)
        return tg.dot(u, w) + tg.dot(v, w)

    g_plain = tg.gradient(lambda u, a: run(two_states, u, a), u0, 0.7)
    for _ in range(3):
        g = tg.gradient(lambda u, a: run(captured, u, a), u0, 0.7)
        np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    h = 1e-6
    fd = (float(run(two_states, u0, 0.7 + h)) - float(run(two_states, u0, 0.7 - h))) / (2 * h)
    assert g[1] == pytest.approx(fd, rel=1e-7)


def test_forward_mode_runs_the_python(u0):
    captured = tg.capture(simulate)
    t = np.linspace(0.0, 1.0, N)
    y, dy = tg.jvp(lambda u: captured(u, 0.2, 5), u0, t)
    y_plain, dy_plain = tg.jvp(lambda u: simulate(u, 0.2, 5), u0, t)
    np.testing.assert_array_equal(y, y_plain)
    np.testing.assert_allclose(dy, dy_plain, rtol=1e-13)


def _line(fn, text: str) -> str:
    """``test_capture.py:<line>`` of the line of ``fn`` holding ``text``, for a match."""
    lines, start = inspect.getsourcelines(fn)
    at = start + next(k for k, line in enumerate(lines) if text in line)
    return re.escape(f"test_capture.py:{at}")


def test_what_a_replay_could_not_do_faithfully_is_refused(u0):
    buffer = np.empty(N)

    def into_closure(u):
        diffuse(CPU)(buffer, u, 0.1, ndrange=u.size)
        return tg.sum(buffer)

    # (each names the line of the operation, in the user's file)
    with pytest.raises(tg.CaptureError, match=_line(into_closure, "(buffer, u") +
                       ": into_closure writes.*did not make.*Pass it as an argument"):
        tg.capture(into_closure)(u0)

    def view_of_argument(u):
        v = np.empty(N - 2)
        diffuse(CPU)(v, u[1:-1], 0.1, ndrange=N - 2)
        return v

    with pytest.raises(tg.CaptureError, match=_line(view_of_argument, "u[1:-1]") +
                       ": view_of_argument passes a view of argument 0"):
        tg.capture(view_of_argument)(u0)

    captured = tg.capture(simulate)      # (by name is by position)
    np.testing.assert_array_equal(captured(u0, kappa=0.1, steps=2), captured(u0, 0.1, 2))
    assert captured.recordings == 1
    with pytest.raises(tg.CaptureError, match="simulate: missing a required argument: 'steps'"):
        captured(u0, 0.1)
    with pytest.raises(tg.CaptureError, match="argument 1 is a list"):
        tg.capture(simulate)(u0, [0.1], 2)

    def made_by_numpy(u):
        noise = np.random.default_rng().uniform(size=N)    # host code: not replayed
        v = np.empty_like(u)
        diffuse(CPU)(v, noise, 0.1, ndrange=N)
        return tg.dot(v, u)

    with pytest.raises(tg.CaptureError, match=_line(made_by_numpy, "(v, noise") +
                       r": made_by_numpy reads .*made by host code inside the function.*"
                       "read the first call's contents"):
        tg.capture(made_by_numpy)(u0)

    def two_scalars(u):
        return tg.sum(u), tg.dot(u, u)

    with pytest.raises(tg.CaptureError, match="more than one tape scalar"):
        tg.capture(two_scalars)(u0)


def test_on_opencl_arrays_the_launches_replay_packed_in_advance(u0):
    import pyopencl.array as cla
    cl = tg.OpenCL()

    def sim(u, kappa):
        for _ in range(6):
            u_new = cla.empty_like(u)
            diffuse(cl)(u_new, u, kappa, ndrange=N)
            u = u_new
        return tg.dot(u, u)

    captured = tg.capture(sim)
    for kappa in (0.2, 0.3):
        u = cla.to_device(cl.queue, u0)
        assert float(captured(u, kappa)) == pytest.approx(float(sim(u, kappa)), rel=1e-14)
        g, g_plain = tg.gradient(captured, u, kappa), tg.gradient(sim, u, kappa)
        np.testing.assert_allclose(g[0].get(), g_plain[0].get(), rtol=1e-12)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    assert captured.recordings == 1
    # (the six launches: one run packed once, kappa put in its place per call)
    (program,) = captured.programs[next(iter(captured.programs))]
    queued = [what for packed, what in program.compiled if packed]
    assert [type(q).__name__ for q in queued] == ["QueuedLaunches"]
    assert queued[0].stop - queued[0].start == 6


def test_inside_a_pytorch_function(u0):
    import torch

    import tapegrad.torch as tgt

    w = np.linspace(-1.0, 1.0, N)

    def loss(u, kappa):
        return tg.dot(simulate(u, kappa, 5), w)

    captured = tg.capture(loss)
    f = tgt.function(captured)
    x = torch.tensor(u0, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: f(x, 0.2), (x,))
    for _ in range(2):
        x.grad = None
        f(x, 0.2).backward()
        np.testing.assert_allclose(x.grad.numpy(), tg.gradient(loss, u0, 0.2)[0], rtol=1e-12)
    assert captured.recordings == 1


WEIGHTS = np.linspace(0.0, 1.0, N)


def _smoothed_weights():
    v = np.empty(N)
    diffuse(CPU)(v, WEIGHTS, 0.25, ndrange=N)     # a global, read two calls down
    return v


def test_constants_from_outside_are_read_as_they_are_at_each_replay(u0):
    captured = tg.capture(lambda u: tg.dot(_smoothed_weights(), u))
    first = float(captured(u0))
    WEIGHTS[0] += 1.0
    try:
        assert float(captured(u0)) == float(tg.dot(_smoothed_weights(), u0)) != first
    finally:
        WEIGHTS[0] -= 1.0
    assert captured.recordings == 1


def test_the_docs_example_runs(tmp_path):
    """docs/capture.md's example, run from a file (kernels need their source)."""
    import re
    import runpy
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "capture.md").read_text()
    script = tmp_path / "capture_example.py"
    script.write_text(re.search(r"```python\n(.*?)```", doc, re.S).group(1))
    ns = runpy.run_path(str(script))
    assert ns["simulate"].recordings == 1
    u0, simulate = ns["u0"], ns["simulate"]
    h = 1e-6
    fd = (float(ns["loss"](u0, 0.2 + h)) - float(ns["loss"](u0, 0.2 - h))) / (2 * h)
    assert ns["dkappa"] == pytest.approx(fd, rel=1e-6)
    assert simulate.recordings == 1


def test_inside_a_jax_function(u0):
    import jax
    from jax.test_util import check_grads

    import tapegrad.jax as tgj

    jax.config.update("jax_enable_x64", True)
    w = np.linspace(-1.0, 1.0, N)

    def loss(u, kappa):
        return tg.dot(simulate(u, kappa, 5), w)

    captured = tg.capture(loss)
    f = tgj.function(captured)
    u, kappa = jax.numpy.asarray(u0), jax.numpy.asarray(0.2)
    check_grads(f, (u, kappa), order=1, modes=["rev"])
    g = jax.grad(f, argnums=(0, 1))(u, kappa)
    g_plain = tg.gradient(loss, u0, 0.2)
    np.testing.assert_allclose(np.asarray(g[0]), g_plain[0], rtol=1e-12)
    assert float(g[1]) == pytest.approx(g_plain[1], rel=1e-12)


def test_a_captured_function_inside_another_is_part_of_its_recording(u0):
    inner = tg.capture(simulate)
    inner(u0, 0.1, 3)
    outer = tg.capture(lambda u, k: tg.sum(inner(u, k, 3)) * k)
    for k in (0.1, 0.2):
        assert float(outer(u0, k)) == float(tg.sum(simulate(u0, k, 3)) * k)
    assert outer.recordings == 1 and inner.recordings == 1
    g, g_plain = tg.gradient(outer, u0, 0.2), tg.gradient(
        lambda u, k: tg.sum(simulate(u, k, 3)) * k, u0, 0.2)
    np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13)
    assert g[1] == pytest.approx(g_plain[1], rel=1e-13)


def test_one_array_for_two_arguments_is_not_replayed_as_two(u0):
    def step(u, v):
        diffuse(CPU)(v, u, 0.1, ndrange=N)
        return tg.sum(v)

    captured = tg.capture(step)
    captured(u0.copy(), np.empty(N))
    a = u0.copy()
    with pytest.raises(tg.CaptureError, match="arguments 0 and 1 are the same array"):
        captured(a, a)
    np.testing.assert_array_equal(a, u0)          # (refused before anything ran)


def test_a_float32_argument_is_a_constant_of_its_own_type(u0):
    x = u0.astype(np.float32)
    captured = tg.capture(simulate)
    for kappa in (np.float32(0.2), np.float32(0.2), np.float32(0.1)):
        np.testing.assert_array_equal(captured(x, kappa, 5), simulate(x, kappa, 5))
    assert captured.recordings == 2


def test_a_tape_scalar_from_outside_is_refused(u0):
    """Taken through a closure, its value would be the first call's and its gradient lost."""
    for uses in (lambda u, k: tg.sum(simulate(u, k, 3)),         # in a launch
                 lambda u, k: tg.sum(u) * k,                     # in host arithmetic
                 lambda u, k: tg.sum(tg.scale(u, k)),            # in tg.scale
                 lambda u, k: (tg.sum(u), k)[1]):                # returned as it is
        with tg.Tape() as tape:
            k = tape.watch(0.2)
            captured = tg.capture(_closing_over(uses, k))
            with pytest.raises(tg.CaptureError, match="uses a tape scalar from outside.*"
                               "Pass it as a float argument"):
                captured(u0)


def _closing_over(f, k):
    """``f`` with the tape scalar ``k`` taken from a closure, not as an argument."""
    return lambda *state: f(*state, k)
