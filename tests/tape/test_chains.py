"""A reverse sweep runs a chain of replays of one adjoint in one loop (tapegrad/tape/chains.py):
a linear one's compiled, a nonlinear one's a loop of launches reading each record's state.
Every gradient here is checked against an independent one: the transposed step matrix
applied in float64, a closed form or finite differences, and the chain must actually have
run where it can (and be refused where it cannot, with the same gradients)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import stencil2d_k as diffuse
from tapegrad.tape import chains
from tests.tape.test_sweep_shadows import scaled as scale

CPU = tg.CPU()


@tg.kernel
def cube(Y, X):
    i = tg.index()
    Y[i] = X[i] * X[i] * X[i]


def step_matrix(shape: tuple[int, int], alpha: float) -> np.ndarray:
    """The diffusion step as a matrix on the flattened grid, in float64."""
    n, m = shape
    S = np.eye(n * m)
    for i in range(1, n - 1):
        for j in range(1, m - 1):
            r = i * m + j
            S[r, r] = 1.0 - 4.0 * alpha
            for q in (r - m, r + m, r - 1, r + 1):
                S[r, q] = alpha
    return S


@pytest.fixture
def runs(monkeypatch):
    """The number of records each chain ran, in order."""
    seen: list[int] = []
    extend = chains.extend

    def spy(*args):
        n = extend(*args)
        if n:
            seen.append(n)
        return n

    monkeypatch.setattr(chains, "extend", spy)
    return seen


def simulate(x: np.ndarray, steps: int, alphas) -> np.ndarray:
    t = tg.copy(x)
    for s in range(steps):
        t_new = np.empty_like(t)
        diffuse(CPU, (4, 8))(t_new, t, alphas[s], ndrange=t.shape)
        t = t_new
    return t


@pytest.mark.parametrize("steps", [1, 3, 4, 7, 10])
def test_a_diffusion_chain_gradient_is_the_transposed_steps(runs, steps):
    rng = np.random.default_rng(steps)
    x, w = rng.random((6, 9)), rng.random((6, 9))
    alphas = [0.2] * steps
    (g,) = tg.gradient(lambda t: tg.dot(simulate(t, steps, alphas), w), x)
    S = step_matrix(x.shape, 0.2)
    expected = np.linalg.matrix_power(S.T, steps) @ w.ravel()
    np.testing.assert_allclose(g.ravel(), expected, rtol=1e-12)
    # the last step's record runs as usual and heads the chain of the others
    assert runs == ([steps - 1] if steps - 1 >= chains.MIN_RUN else [])


def test_the_same_gradients_with_and_without_chains(monkeypatch):
    rng = np.random.default_rng(1)
    x, w = rng.random((16, 16)).astype(np.float32), rng.random((16, 16)).astype(np.float32)

    def loss(t):
        return tg.dot(simulate(t, 12, [0.1] * 12), w)

    (with_chains,) = tg.gradient(loss, x)
    monkeypatch.setattr(chains, "extend", lambda *args: 0)
    np.testing.assert_array_equal(tg.gradient(loss, x)[0], with_chains)


def test_a_tape_asked_twice_gives_the_same_gradient(runs):
    rng = np.random.default_rng(2)
    x, w = rng.random((5, 7)), rng.random((5, 7))
    with tg.Tape() as tape:
        loss = tg.dot(simulate(x, 9, [0.15] * 9), w)
    first = tape.gradient(loss, [x])[0].copy()
    second = tape.gradient(loss, [x])[0]
    np.testing.assert_array_equal(first, second)
    expected = np.linalg.matrix_power(step_matrix(x.shape, 0.15).T, 9) @ w.ravel()
    np.testing.assert_allclose(second.ravel(), expected, rtol=1e-12)
    assert runs == [8, 8]


def test_a_changing_scalar_breaks_the_chain_where_it_changes(runs):
    rng = np.random.default_rng(3)
    x, w = rng.random((6, 6)), rng.random((6, 6))
    alphas = [0.1] * 5 + [0.2] * 6
    (g,) = tg.gradient(lambda t: tg.dot(simulate(t, 11, alphas), w), x)
    expected = w.ravel()
    for a in reversed(alphas):
        expected = step_matrix(x.shape, a).T @ expected
    np.testing.assert_allclose(g.ravel(), expected, rtol=1e-12)
    assert runs == [5, 4]      # records 10..6 (0.2) below 11, then 4..1 (0.1) below 5


def test_a_captured_run_verified_for_equal_rates_is_not_reused_for_different_ones(
        runs, monkeypatch):
    # a captured program's Python sweeps (kept here from being written down, as for CuPy
    # arrays, capturing/reverse.py) remember the runs they verified (tape.sweep.Frozen):
    # with a == b the 11 steps' adjoints are one run; a later call with a != b must split it
    import tapegrad.capturing.record as record
    monkeypatch.setattr(record, "usable", lambda given: False)
    rng = np.random.default_rng(4)
    x, w = rng.random((6, 6)), rng.random((6, 6))
    captured = tg.capture(lambda t, a, b: 2.0 * tg.dot(simulate(t, 11, [a] * 5 + [b] * 6), w))
    for a, b in ((0.1, 0.1), (0.1, 0.1), (0.1, 0.2), (0.2, 0.2), (0.3, 0.1)):
        runs.clear()
        (g,) = tg.gradient(lambda t, a=a, b=b: captured(t, a, b), x)
        expected = 2.0 * w.ravel()
        for alpha in reversed([a] * 5 + [b] * 6):
            expected = step_matrix(x.shape, alpha).T @ expected
        np.testing.assert_allclose(g.ravel(), expected, rtol=1e-12)
        assert runs == ([10] if a == b else [5, 4])
    assert captured.recordings == 1


@pytest.mark.parametrize("written_down", [True, False])
def test_a_captured_loss_scaled_by_zero_between_others(runs, monkeypatch, written_down):
    # (a zero gradient for the reduction skips its adjoint: that sweep leaves the path the
    # earlier ones verified, and the next ones must still be right; in Python sweeps and in
    # the reverse written down, capturing/reverse.py)
    if not written_down:
        import tapegrad.capturing.record as record
        monkeypatch.setattr(record, "usable", lambda given: False)
    rng = np.random.default_rng(6)
    x, w = rng.random((6, 6)), rng.random((6, 6))
    captured = tg.capture(lambda t, p: p * tg.dot(simulate(t, 11, [0.1] * 11), w))
    expected = w.ravel()
    for _ in range(11):
        expected = step_matrix(x.shape, 0.1).T @ expected
    for p in (1.0, 1.0, 0.0, 2.0, 0.0, -1.0):
        (g,) = tg.gradient(lambda t, p=p: captured(t, p), x)
        np.testing.assert_allclose(g.ravel(), p * expected, rtol=1e-12, atol=1e-300)


def test_states_the_caller_keeps_are_neither_read_nor_written(runs):
    """The chain passes the first record's arrays for states the adjoint does not read:
    whether the caller still holds one does not matter, and it is left as it was."""
    rng = np.random.default_rng(4)
    x, w = rng.random((6, 6)), rng.random((6, 6))
    kept = []

    def loss(t0):
        t = tg.copy(t0)
        for s in range(8):
            t_new = np.empty_like(t)
            diffuse(CPU, (4, 8))(t_new, t, 0.2, ndrange=t.shape)
            t = t_new
            if s == 3:
                kept.append(t)
        return tg.dot(t, w)

    with tg.Tape() as tape:
        value = loss(x)
    held = kept[0].copy()
    (g,) = tape.gradient(value, [x])
    expected = np.linalg.matrix_power(step_matrix(x.shape, 0.2).T, 8) @ w.ravel()
    np.testing.assert_allclose(g.ravel(), expected, rtol=1e-12)
    np.testing.assert_array_equal(kept[0], held)
    assert runs == [7]


def test_a_chain_from_the_source_itself_stops_before_its_given_shadow(runs):
    """Without tg.copy the first launch reads the source, whose shadow the caller gave."""
    rng = np.random.default_rng(5)
    x, w = rng.random(64), rng.random(64)
    dx = rng.random(64)
    start = dx.copy()

    def loss(t):
        for _ in range(6):
            t_new = np.empty_like(t)
            scale(CPU)(t_new, t, 0.5, ndrange=t.size)
            t = t_new
        return tg.dot(t, w)

    tg.autodiff(tg.Reverse, loss, tg.Active, tg.Duplicated(x, dx))
    np.testing.assert_allclose(dx, start + 0.5 ** 6 * w, rtol=1e-14)
    assert runs == [4]          # records 4..1 below record 5; record 0 reads x


def test_a_nonlinear_chain_reads_each_records_own_state(runs):
    """The cube's adjoint reads the state its record kept: a loop of launches, each with its
    own (the head's for all would give 81 x0^80 with the wrong x)."""
    rng = np.random.default_rng(6)
    x, w = rng.uniform(0.5, 1.0, 32), rng.random(32)

    def loss(t):
        for _ in range(4):
            t_new = np.empty_like(t)
            cube(CPU)(t_new, t, ndrange=t.size)
            t = t_new
        return tg.dot(t, w)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 81.0 * x ** 80 * w, rtol=1e-12)
    assert runs == [2]          # records 2..1 below record 3; record 0 reads x


@tg.kernel
def sine(Y, X):
    i = tg.index()
    Y[i] = math.sin(X[i])


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_a_sine_chain_gives_the_record_by_record_numbers(runs, backend):
    """sin's adjoint reads each step's input: the chain of launches passes each record's
    own (checked against the chain rule in float64, and bit for bit against the sweep that
    goes record by record), special values among the inputs: 0, -0, inf (sin gives NaN),
    NaN."""
    be = CPU if backend == "cpu" else tg.OpenCL()
    rng = np.random.default_rng(11)
    x, w = rng.uniform(-2.0, 2.0, 24), rng.random(24)
    x[:4] = 0.0, -0.0, np.inf, np.nan
    steps = 7

    def loss(t):
        t = tg.copy(t)
        for _ in range(steps):
            t_new = be.allocate(np.float64, t.shape)
            sine(be)(t_new, t, ndrange=t.size)
            t = t_new
        return tg.dot(t, be.asarray(w))

    (g,) = tg.gradient(loss, be.asarray(x))
    expected, t = np.ones_like(x), x.copy()
    with np.errstate(invalid="ignore"):          # (sin and cos of inf: NaN, as expected)
        for _ in range(steps):
            expected, t = expected * np.cos(t), np.sin(t)
    np.testing.assert_allclose(be.to_numpy(g), expected * w, rtol=1e-13)
    assert runs == [steps - 1]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chains, "enabled", False)
        np.testing.assert_array_equal(be.to_numpy(tg.gradient(loss, be.asarray(x))[0]),
                                      be.to_numpy(g))
    assert runs == [steps - 1]


def test_alternating_kernels_go_record_by_record(runs):
    rng = np.random.default_rng(7)
    x, w = rng.random(48), rng.random(48)

    def loss(t):
        t = tg.copy(t)
        for k in range(8):
            t_new = np.empty_like(t)
            scale(CPU, (16,) if k % 2 else (8,))(t_new, t, 0.9, ndrange=t.size)
            t = t_new
        return tg.dot(t, w)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_allclose(g, 0.9 ** 8 * w, rtol=1e-14)
    assert runs == []


@tg.kernel
def damp(Y, X, K):
    i = tg.index()
    Y[i] = K[i] * X[i]


def damped(x: np.ndarray, K: np.ndarray, steps: int) -> np.ndarray:
    t = tg.copy(x)
    for _ in range(steps):
        t_new = np.empty_like(t)
        damp(CPU)(t_new, t, K, ndrange=t.size)
        t = t_new
    return t


def test_a_constant_field_read_by_every_step_keeps_the_chain(runs):
    rng = np.random.default_rng(8)
    x, w, K = rng.random(40), rng.random(40), rng.uniform(0.5, 1.5, 40)
    (g,) = tg.gradient(lambda t: tg.dot(damped(t, K, 9), w), x)
    np.testing.assert_allclose(g, K ** 9 * w, rtol=1e-13)
    assert runs == [8]


def test_a_field_differentiated_too_goes_record_by_record(runs):
    """Its shadow gathers from every step: not a chain of two buffers."""
    rng = np.random.default_rng(9)
    x, w, K = rng.random(40), rng.random(40), rng.uniform(0.5, 1.5, 40)
    gx, gK = tg.gradient(lambda t, k: tg.dot(damped(t, k, 9), w), x, K)
    np.testing.assert_allclose(gx, K ** 9 * w, rtol=1e-13)
    np.testing.assert_allclose(gK, 9 * K ** 8 * x * w, rtol=1e-13)
    assert runs == []


# found in review: states of two shapes, and a scalar's sign


@tg.kernel
def stencil1d(Y, X, a):
    i = tg.index()
    n = X.shape[0]
    if i > 0 and i < n - 1:
        Y[i] = X[i] + a * (X[i - 1] - 2.0 * X[i] + X[i + 1])
    else:
        Y[i] = X[i]


def two_shapes(kern, short: int, long: int, steps: int, w: np.ndarray):
    """A loss whose states alternate between ``short`` and ``long`` elements, each step over
    the first ``short``."""
    def loss(t):
        t = tg.copy(t)
        for s in range(steps):
            t_new = np.zeros(short if s % 2 == 0 else long)
            kern(CPU)(t_new, t, 0.5, ndrange=short)
            t = t_new
        return tg.dot(t, w)
    return loss


def test_states_of_two_shapes_go_record_by_record(runs):
    """Shadows of the longer states are not covered by the launches' ndrange: zeroed first,
    record by record; a chain would have mixed the two buffers' shapes."""
    rng = np.random.default_rng(12)
    x, w = rng.random(12), rng.random(12)
    (g,) = tg.gradient(two_shapes(scale, 10, 12, 8, w), x)
    np.testing.assert_allclose(g, np.r_[0.5 ** 8 * w[:10], 0.0, 0.0], rtol=1e-14)
    assert runs == []


def test_a_stencil_chain_over_states_of_two_shapes(runs):
    """Its adjoint's gather runs over the shadow's shape: a chain mixing the shapes read and
    wrote past the shorter buffer."""
    rng = np.random.default_rng(13)
    x, w = rng.random(64), rng.random(64)
    loss = two_shapes(stencil1d, 40, 64, 10, w)
    (g,) = tg.gradient(loss, x)
    chains.enabled = False
    try:
        (expected,) = tg.gradient(loss, x)
    finally:
        chains.enabled = True
    np.testing.assert_array_equal(g, expected)
    assert runs == [] and np.all(g[41:] == 0.0)   # (item 39 reads element 40)


@tg.kernel
def flip(Y, X, a):
    i = tg.index()
    Y[i] = math.copysign(0.5, a) * X[i]


def test_a_scalar_zero_of_the_other_sign_breaks_the_chain(runs):
    x, w = np.linspace(0.1, 1.0, 8), np.ones(8)

    def loss(t):
        t = tg.copy(t)
        for s in range(6):
            t_new = np.empty_like(t)
            flip(CPU)(t_new, t, 0.0 if s < 3 else -0.0, ndrange=8)
            t = t_new
        return tg.dot(t, w)

    (g,) = tg.gradient(loss, x)
    np.testing.assert_array_equal(g, np.full(8, 0.5 ** 3 * (-0.5) ** 3))
    assert runs == [2, 2]


@pytest.mark.parametrize("steps", [2, 7])
def test_a_chain_on_opencl_runs_from_one_loop_of_launches(runs, steps):
    """(tapegrad/backends/launch_chain.py: GPUs' chains, a Python loop of written-out
    launches; on PoCL here)"""
    gpu = tg.OpenCL()
    rng = np.random.default_rng(10 + steps)
    x, w = rng.random((6, 9)), rng.random((6, 9))

    def loss(t):
        t = tg.copy(t)
        for _ in range(steps):
            t_new = gpu.allocate(np.float64, t.shape)
            diffuse(gpu, (4, 8))(t_new, t, 0.2, ndrange=t.shape)
            t = t_new
        return tg.dot(t, gpu.asarray(w))

    (g,) = tg.gradient(loss, gpu.asarray(x))
    expected = np.linalg.matrix_power(step_matrix(x.shape, 0.2).T, steps) @ w.ravel()
    np.testing.assert_allclose(gpu.to_numpy(g).ravel(), expected, rtol=1e-12)
    assert runs == ([steps - 1] if steps - 1 >= chains.MIN_RUN else [])
