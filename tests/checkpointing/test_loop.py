"""``tg.checkpoint_loop`` gives the plain tape's gradients (float64, to 1e-12 relative) while
keeping only its snapshots, with Revolve's number of forward steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tapegrad.checkpointing.loop import LoopRecord
from tapegrad.checkpointing.revolve import forward_steps

N_CELLS = 16
DT = 0.05


@tg.kernel
def react(u_new, v_new, u, v, forcing, k):
    """A nonlinear two-field step (reaction with diffusion along a ring)."""
    i = tg.index()
    n = u.shape[0]
    lap = u[(i + 1) % n] - 2.0 * u[i] + u[(i - 1) % n]
    u_new[i] = u[i] + DT * (0.3 * lap + v[i] - k * u[i] * u[i] * u[i])
    v_new[i] = v[i] - DT * (math.sin(u[i]) * forcing[i] + 0.1 * v[i])


def step(u, v, forcing, k):
    u_new, v_new = np.empty_like(u), np.empty_like(v)
    react(tg.CPU())(u_new, v_new, u, v, forcing, k, ndrange=u.size)
    return u_new, v_new


@tg.kernel
def assign(dst, src):
    i = tg.index()
    dst[i] = src[i]


def in_place(u, v, forcing, k):
    """The same step writing back into its state with a kernel (as ping-pong code does)."""
    u_new, v_new = step(u, v, forcing, k)
    assign(tg.CPU())(u, u_new, ndrange=u.size)
    assign(tg.CPU())(v, v_new, ndrange=v.size)
    return u, v


def numpy_in_place(u, v, forcing, k):
    """Writing back with NumPy, which no tape sees."""
    u_new, v_new = step(u, v, forcing, k)
    u[...], v[...] = u_new, v_new
    return u, v


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    return rng.uniform(-1, 1, N_CELLS), rng.uniform(-1, 1, N_CELLS), rng.uniform(0.5, 1.5, N_CELLS)


def gradients(loop, data, n, snapshots=None, stepper=step):
    """d loss / d (u0, v0, forcing, k): ``loop`` is the checkpointed or the plain loop."""
    u0, v0, forcing = (x.copy() for x in data)
    w = np.linspace(0.5, 1.5, N_CELLS)
    with tg.Tape() as tape:
        k = tape.watch(0.7)
        if loop == "plain":
            u, v = u0, v0
            for _ in range(n):
                u, v = step(u, v, forcing, k)
        else:
            u, v = tg.checkpoint_loop(stepper, (u0, v0), n, params=(forcing, k),
                                      snapshots=snapshots)
        loss = tg.dot(u, w) + 0.5 * tg.dot(v, v)
    grads = tape.gradient(loss, [u0, v0, forcing, k])
    records = [r for r in tape.records if isinstance(r, LoopRecord)]
    return grads, (records[0].loop if records else None), float(loss)


def assert_same(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("n, s", [(1, 1), (1, 5), (2, 1), (7, 3), (13, 4), (40, 6), (5, 20),
                                  (61, 2)])
def test_gradients_equal_the_plain_tapes(data, n, s):
    want, _, loss = gradients("plain", data, n)
    got, loop, loss_cp = gradients("checkpoint", data, n, s)
    assert loss_cp == loss
    assert_same(got, want)
    assert np.abs(got[2]).sum() > 0 and got[3] != 0.0
    assert loop.forward_steps == forward_steps(n, min(s, n)) and loop.recorded_steps == n


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 50), s=st.integers(1, 12))
def test_any_number_of_steps_and_snapshots(data, n, s):
    want, _, _ = gradients("plain", data, n)
    got, loop, _ = gradients("checkpoint", data, n, s)
    assert_same(got, want)
    assert loop.forward_steps == forward_steps(n, min(s, n))


def test_a_step_that_updates_its_state_in_place(data):
    want, _, _ = gradients("plain", data, 30)
    got, _, _ = gradients("checkpoint", data, 30, 4, stepper=in_place)
    assert_same(got, want)
    u0, v0, forcing = (x.copy() for x in data)
    with pytest.raises(tg.TapegradError, match="returned an array of shape \\(16,\\) that no "
                       "recorded operation wrote"):
        with tg.Tape():
            tg.checkpoint_loop(numpy_in_place, (u0, v0), 3, params=(forcing, 0.7),
                               snapshots=2)
    assert (u0 == data[0]).all() and (v0 == data[1]).all()     # the caller's arrays untouched


def test_the_tape_can_be_asked_again(data):
    u0, v0, forcing = (x.copy() for x in data)
    with tg.Tape() as tape:
        u, v = tg.checkpoint_loop(step, (u0, v0), 25, params=(forcing, 0.7), snapshots=3)
        loss = tg.sum(u) + tg.sum(v)
    first = tape.gradient(loss, [u0, forcing])
    again = tape.gradient(loss, [u0, forcing])
    assert_same(again, first)


def test_a_state_returned_as_given_and_a_vjp_through_the_loop(data):
    """A part of the state the step returns as it was given carries its cotangent back
    unchanged; ``tape.vjp`` through the loop gives the plain tape's product and leaves the
    caller's cotangents as they were (the sweep takes the loop's cotangents over: its own
    shadows, copies of the caller's)."""
    def half(u, v, forcing, k):
        return step(u, v, forcing, k)[0], v

    w = np.linspace(0.5, 1.5, N_CELLS)
    cu, cv = np.linspace(-1.0, 1.0, N_CELLS), np.linspace(0.2, 0.3, N_CELLS)
    results = []
    for checkpointed in (False, True):
        u0, v0, forcing = (x.copy() for x in data)
        with tg.Tape() as tape:
            k = tape.watch(0.7)
            if checkpointed:
                u, v = tg.checkpoint_loop(half, (u0, v0), 9, params=(forcing, k), snapshots=3)
            else:
                u, v = u0, v0
                for _ in range(9):
                    u, v = half(u, v, forcing, k)
            loss = tg.dot(u, w) + tg.dot(v, v)
        got = tape.gradient(loss, [u0, v0, forcing, k])
        got += tape.vjp([u, v], [cu, cv], [u0, v0, forcing, k])
        results.append(got)
    assert_same(results[1], results[0])
    assert (cu == np.linspace(-1.0, 1.0, N_CELLS)).all() and (cv == np.linspace(0.2, 0.3,
                                                                                N_CELLS)).all()


@tg.kernel
def weigh_twice(out, u, a, b):
    i = tg.index()
    out[i] = u[i] * a[i] * b[i] + 0.01 * u[i] * u[i]


def test_an_array_given_twice_in_params_gets_its_gradient_once():
    def step(u, a, b):
        out = np.empty_like(u)
        weigh_twice(tg.CPU())(out, u, a, b, ndrange=u.size)
        return out
    results = []
    for checkpointed in (False, True):
        u0, f = np.array([0.5, 0.6]), np.array([0.9, 1.1])
        with tg.Tape() as tape:
            if checkpointed:
                u = tg.checkpoint_loop(step, u0, 5, params=(f, f), snapshots=2)
            else:
                u = u0
                for _ in range(5):
                    u = step(u, f, f)
            loss = tg.sum(u)
        results.append(tape.gradient(loss, [u0, f]))
    assert_same(results[1], results[0])


def test_a_single_array_state_and_no_tape():
    x = np.linspace(0.0, 1.0, 8)

    def halve(x):
        out = np.empty_like(x)
        react_scale(tg.CPU())(out, x, ndrange=x.size)
        return out
    y = tg.checkpoint_loop(halve, x, 3)
    np.testing.assert_allclose(y, x / 8)
    (g,) = tg.gradient(lambda x: tg.sum(tg.checkpoint_loop(halve, x, 3, snapshots=2)), x)
    np.testing.assert_allclose(g, np.full(8, 1 / 8))


@tg.kernel
def react_scale(out, x):
    i = tg.index()
    out[i] = 0.5 * x[i]


def test_an_array_step_reads_from_outside_is_followed(data):
    """Without params=, an array the tape follows still gets its gradient (the loop takes
    it for a parameter: tests/checkpointing/test_guards.py has the rules)."""
    def run(checkpointed):
        u0, v0, forcing = (x.copy() for x in data)
        with tg.Tape() as tape:
            scaled = tg.scale(forcing, 2.0)           # the tape follows it
            if checkpointed:
                u, v = tg.checkpoint_loop(lambda u, v: step(u, v, scaled, 0.7), (u0, v0), 5,
                                          snapshots=2)
            else:
                u, v = u0, v0
                for _ in range(5):
                    u, v = step(u, v, scaled, 0.7)
            loss = tg.sum(u) + tg.dot(v, v)
        return tape.gradient(loss, [u0, forcing])
    assert_same(run(True), run(False))


def test_a_tape_scalar_step_reads_without_params_is_refused(data):
    u0, v0, forcing = (x.copy() for x in data)
    with pytest.raises(tg.TapegradError, match="uses a tape scalar from outside without taking it"):
        with tg.Tape() as tape:
            k = tape.watch(0.7)
            tg.checkpoint_loop(lambda u, v: step(u, v, forcing, k), (u0, v0), 5, snapshots=2)
    # in host arithmetic or tg.scale rather than a launch (its gradient was lost silently)
    for through in (lambda u, v, k: step(u, v, forcing, 2.0 * k),
                    lambda u, v, k: (tg.scale(u, k), tg.scale(v, 0.5))):
        with pytest.raises(tg.TapegradError,
                           match="uses a tape scalar from outside without taking it"):
            with tg.Tape() as tape:
                k = tape.watch(0.7)
                tg.checkpoint_loop(_closing_over(through, k), (u0, v0), 5, snapshots=2)


def _closing_over(f, k):
    """``f`` with the tape scalar ``k`` taken from a closure, not from params=."""
    return lambda *state: f(*state, k)


@pytest.mark.parametrize("bad, message", [
    (dict(n_steps=-1), "n_steps is a number of steps"),
    (dict(snapshots=0), "snapshots is a number of states to keep"),
    (dict(state=[1.0, 2.0]), "state is an array or a tuple of arrays"),
])
def test_bad_arguments_are_clear_errors(data, bad, message):
    u0, v0, forcing = data
    args = dict(state=(u0, v0), n_steps=3, snapshots=2) | bad
    with pytest.raises(tg.TapegradError, match=message):
        with tg.Tape():
            tg.checkpoint_loop(step, args["state"], args["n_steps"], params=(forcing, 0.7),
                               snapshots=args["snapshots"])


def test_a_step_returning_something_else_is_refused(data):
    u0, v0, forcing = data
    with pytest.raises(tg.TapegradError, match=r"must return a state like the one it takes, "
                       r"a tuple or list of 2 arrays \(\(16,\) float64, \(16,\) float64\), but "
                       r"returned an array \(\(16,\) float64\)$"):
        with tg.Tape():
            tg.checkpoint_loop(lambda u, v: step(u, v, forcing, 0.7)[0], (u0, v0), 3,
                               snapshots=2)


def test_the_chosen_number_of_snapshots_is_said(data, capsys):
    u0, v0, forcing = data
    with tg.Tape():
        tg.checkpoint_loop(step, (u0, v0), 50, params=(forcing, 0.7), memory=10 * 2 * 16 * 8)
    err = capsys.readouterr().err
    assert "checkpoint_loop keeps 10 snapshot(s) of 256 B" in err
    assert f"{forward_steps(50, 10) / 50:.2f} forward steps per step" in err


def test_where_every_state_fits_the_default_is_the_plain_tape(data, capsys):
    """snapshots=None and memory for all n states: every step recorded, no recomputation
    (the schedule would hold as much and run each step twice)."""
    want, _, _ = gradients("plain", data, 30)
    u0, v0, forcing = (x.copy() for x in data)
    w = np.linspace(0.5, 1.5, N_CELLS)
    with tg.Tape() as tape:
        k = tape.watch(0.7)
        u, v = tg.checkpoint_loop(in_place, (u0, v0), 30, params=(forcing, k),
                                  memory=30 * 2 * u0.nbytes)
        loss = tg.dot(u, w) + 0.5 * tg.dot(v, v)
    assert "checkpoint_loop records every step: 30 states of 256 B" in capsys.readouterr().err
    assert not [r for r in tape.records if isinstance(r, LoopRecord)]
    assert_same(tape.gradient(loss, [u0, v0, forcing, k]), want)
    assert (u0 == data[0]).all() and (v0 == data[1]).all()     # in place: on copies


def test_the_tape_holds_a_few_states_where_the_plain_tape_holds_one_per_step(data):
    """N = 10,000 steps, s = 20: the tape's own count of what it holds is at most s + 4
    states (the plain tape keeps u, which the step's adjoint reads, for every step)."""
    u0, v0, forcing = (x.copy() for x in data)
    state = u0.nbytes + v0.nbytes
    with tg.Tape() as plain:
        u, v = u0, v0
        for _ in range(1000):
            u, v = step(u, v, forcing, 0.7)
        tg.sum(u)
    assert plain.memory()["total"] > 1000 * u0.nbytes
    with tg.Tape() as tape:
        u, v = tg.checkpoint_loop(step, (u0, v0), 10_000, params=(forcing, 0.7), snapshots=20)
        tg.sum(u) + tg.sum(v)
    held = tape.memory()
    assert held["snapshots"] <= 24 * state and held["total"] <= 25 * state, (held, state)


def test_the_reverse_sweep_holds_at_most_its_snapshots(data):
    """Between its forward run and its reverse sweep the loop holds its snapshots and one
    recorded step; during the sweep, never more than ``snapshots`` stored states."""
    for n, s in ((300, 7), (64, 3), (10, 20)):
        _, loop, _ = gradients("checkpoint", data, n, s)
        assert loop.most_stored <= min(s, n) and loop.recorded_steps == n


@tg.kernel
def diffuse(out, u, forcing, k):
    """A linear step: its adjoint reads the parameters, never the state."""
    i = tg.index()
    n = u.shape[0]
    out[i] = u[i] + k * (u[(i + 1) % n] - 2.0 * u[i] + u[(i - 1) % n]) + 0.01 * forcing[i]


def linear_step(u, forcing, k):
    out = np.empty_like(u)
    diffuse(tg.CPU())(out, u, forcing, k, ndrange=u.size)
    return out


def test_a_linear_step_keeps_no_snapshots_and_runs_no_step_twice(data):
    u0, _, forcing = (x.copy() for x in data)
    w = np.linspace(0.5, 1.5, N_CELLS)

    def run(checkpointed):
        u = u0.copy()
        with tg.Tape() as tape:
            k = 0.2        # (a tape scalar k would make it bilinear: k's adjoint reads u)
            src = tg.copy(u)
            if checkpointed:
                out = tg.checkpoint_loop(linear_step, src, 200, params=(forcing, k), snapshots=3)
            else:
                out = src
                for _ in range(200):
                    out = linear_step(out, forcing, k)
            loss = tg.dot(out, w)
        records = [r for r in tape.records if isinstance(r, LoopRecord)]
        return tape.gradient(loss, [u, forcing]), records, tape.memory()
    want, _, _ = run(False)
    got, (record,), held = run(True)
    assert_same(got, want)
    loop = record.loop
    assert loop.linear is not None and loop.forward_steps == 0 and loop.recorded_steps == 1
    assert not loop.stored and held["snapshots"] <= 2 * u0.nbytes


def test_a_tape_past_its_max_memory_says_to_checkpoint(data):
    u0, v0, forcing = (x.copy() for x in data)
    with pytest.raises(tg.TapegradError, match=r"this tape holds .* MiB, over its max_memory of "
                       r"0.0 MiB, after \d+ recorded operations.*tg.checkpoint_loop"):
        with tg.Tape(max_memory=20 * u0.nbytes):
            u, v = u0, v0
            for _ in range(100):
                u, v = step(u, v, forcing, 0.7)
    with tg.Tape(max_memory=30 * 2 * u0.nbytes) as tape:     # the same, checkpointed: fits
        u, v = tg.checkpoint_loop(step, (u0, v0), 100, params=(forcing, 0.7), snapshots=10)
        loss = tg.sum(u)
    assert np.isfinite(tape.gradient(loss, [u0])[0]).all()
    with pytest.raises(tg.TapegradError, match="max_memory=...\\) is a number of bytes"):
        tg.Tape(max_memory="1 GB")


def test_on_opencl_arrays_it_gives_the_cpus_gradients(data):
    """The loop on PyOpenCL arrays (PoCL here): snapshots are the device's arrays."""
    import pyopencl.array as cla  # (the test extra installs it: no skip)
    cl = tg.OpenCL()

    def device_step(u, v, forcing, k):
        u_new, v_new = cl.allocate(u.dtype, u.shape), cl.allocate(v.dtype, v.shape)
        react(cl)(u_new, v_new, u, v, forcing, k, ndrange=u.size)
        return u_new, v_new

    want, _, _ = gradients("checkpoint", data, 9, 3)
    u0, v0, forcing = (cla.to_device(cl.queue, x) for x in data)
    w = cla.to_device(cl.queue, np.linspace(0.5, 1.5, N_CELLS))
    with tg.Tape() as tape:
        k = tape.watch(0.7)
        u, v = tg.checkpoint_loop(device_step, (u0, v0), 9, params=(forcing, k), snapshots=3)
        loss = tg.dot(u, w) + 0.5 * tg.dot(v, v)
    got = tape.gradient(loss, [u0, v0, forcing, k])
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g.get() if hasattr(g, "get") else g, w_, rtol=1e-12,
                                   atol=1e-15)


def test_snapshots_on_disk_give_the_same_gradients_from_a_private_folder(data):
    import gc
    import os
    import stat
    want, _, _ = gradients("checkpoint", data, 40, 6)
    u0, v0, forcing = (x.copy() for x in data)
    w = np.linspace(0.5, 1.5, N_CELLS)
    with tg.Tape() as tape:
        k = tape.watch(0.7)
        u, v = tg.checkpoint_loop(step, (u0, v0), 40, params=(forcing, k), snapshots=6,
                                  storage="disk", in_memory=2)
        loss = tg.dot(u, w) + 0.5 * tg.dot(v, v)
    (record,) = [r for r in tape.records if isinstance(r, LoopRecord)]
    store = record.loop.stored
    folder = store.folder
    assert store.on_disk and len(store.memory) <= 2
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    with tg.Tape() as in_memory:
        tg.checkpoint_loop(step, (u0, v0), 40, params=(forcing, 0.7), snapshots=6)
    # (in memory, the stored initial state is the one the loop keeps anyway; on disk, a copy)
    assert tape.memory()["total"] <= in_memory.memory()["total"] - 2 * u0.nbytes
    assert_same(tape.gradient(loss, [u0, v0, forcing, k]), want)
    del tape, record, store, loss, k
    gc.collect()
    assert not os.path.exists(folder)
    with pytest.raises(tg.TapegradError, match="storage is 'memory' or 'disk'"):
        with tg.Tape():
            tg.checkpoint_loop(step, (u0, v0), 3, params=(forcing, 0.7), storage="ssd")


def test_the_reverse_sweep_needs_a_few_states_beyond_what_the_tape_holds():
    """What the sweep allocates on top of what the tape holds (a recorded step, cotangents)
    is a few states, whatever the number of snapshots or steps (tracemalloc counts NumPy's
    allocations)."""
    import tracemalloc
    rng = np.random.default_rng(5)
    u0, v0, forcing = (rng.uniform(-1, 1, 8192) for _ in range(3))
    state = u0.nbytes + v0.nbytes
    extras = []
    for n, s in ((5, 2), (40, 3), (80, 12)):       # (the first compiles what the sweep runs)
        tracemalloc.start()
        try:
            with tg.Tape() as tape:
                k = tape.watch(0.7)
                u, v = tg.checkpoint_loop(step, (u0, v0), n, params=(forcing, k), snapshots=s)
                loss = tg.sum(u) + tg.dot(v, v)
            del u, v
            held = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            tape.gradient(loss, [u0, k])
            extra = (tracemalloc.get_traced_memory()[1] - held) / state
        finally:
            tracemalloc.stop()
        extras.append(extra)
    # (measured 3.8: the gradient of u0; at a step back, the state in hand, the step's
    # result, the cotangent carried back and the one made from it; the final state's
    # cotangent is the first of them, not a copy)
    assert max(extras[1:]) < 4.5 and abs(extras[1] - extras[2]) < 0.5, extras
