"""Run on every process of ``mpiexec -n P`` (tests/mpi/test_mpi.py starts P = 1, 2, 4): a
domain-decomposed simulation's gradient on P processes against the same program on one
process holding the whole grid (``Halo`` over ``MPI.COMM_SELF``), for 1-, 2- and 3-D grids,
uneven splits, periodic and not, ghost widths 1 and 2, and losses made of global, per-process
and mixed reductions; sendrecv against a closed form; forward mode against reverse."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import tapegrad as tg
import tapegrad.mpi as tgm

comm = MPI.COMM_WORLD
P = comm.Get_size()


@tg.kernel
def step_1d(out, u, kappa, w):
    i = tg.index()
    n = u.shape[0]
    if w <= i < n - w:
        c = u[i]
        out[i] = c + kappa * (u[i - 1] + u[i + 1] - 2.0 * c) \
            + 0.05 * (u[i - w] + u[i + w] - 2.0 * c) - 0.1 * c * c * c
    else:
        out[i] = u[i]


@tg.kernel
def step_2d(out, u, kappa, w):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = u.shape
    if w <= i < n - w and w <= j < m - w:
        c = u[i, j]
        out[i, j] = c + kappa * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1]
                                 - 4.0 * c) \
            + 0.05 * (u[i - w, j - w] + u[i + w, j + w] - 2.0 * c) - 0.1 * c * c * c
    else:
        out[i, j] = u[i, j]


@tg.kernel
def step_3d(out, u, kappa, w):
    i, j, k = tg.index(tg.Global, tg.NTuple)
    n, m, q = u.shape
    if w <= i < n - w and w <= j < m - w and w <= k < q - w:
        c = u[i, j, k]
        out[i, j, k] = c + kappa * (u[i - 1, j, k] + u[i + 1, j, k] + u[i, j - 1, k]
                                    + u[i, j + 1, k] + u[i, j, k - 1] + u[i, j, k + 1]
                                    - 6.0 * c) \
            + 0.05 * (u[i - w, j + w, k - w] - c) - 0.1 * c * c * c
    else:
        out[i, j, k] = u[i, j, k]


@tg.kernel
def masked_square(e, u, mask):
    i = tg.index()
    e[i] = mask[i] * u[i] * u[i]


STEPS = {1: step_1d, 2: step_2d, 3: step_3d}

CASES = [((23,), 1, True), ((23,), 2, False),
         ((13, 10), 1, (True, False)), ((13, 10), 2, True), ((9, 11), 1, False),
         ((7, 6, 5), 1, True), ((7, 6, 5), 2, (False, True, False))]


def run(halo, u0, kappa, steps=4):
    """The simulation's final state and its owned cells' energy (a per-process number)."""
    u = tg.copy(u0)
    step = STEPS[len(halo.shape)](tg.CPU())
    for _ in range(steps):
        halo.exchange(u)
        out = halo.zeros()
        step(out, u, kappa, halo.width, ndrange=u.shape)
        u = out
    e = np.empty(u.size)
    masked_square(tg.CPU())(e, tg.reshape(u, (-1,)), halo.owned().ravel(), ndrange=u.size)
    return u, tg.sum(e)


def global_grid(shape):
    return np.random.default_rng(len(shape) * 100 + shape[0]).random(shape)


def gradients(halo, loss, g, kappa=0.11):
    """Each process's gradient of ``loss(halo, u, k)`` for its block of ``g``: the owned
    cells' gradients gathered into the global grid, and kappa's summed over processes."""
    u0 = halo.local(g)
    with tg.Tape() as tape:
        k = tape.watch(kappa)
        target = loss(halo, u0, k)
    g_u, g_k = tape.gradient(target, [u0, k])
    return halo.gather(g_u), halo.cart.allreduce(g_k, op=MPI.SUM), float(target)


def replicated(halo, u0, k):
    """A global objective mixing a nonlinear function of one global reduction with another."""
    u, energy = run(halo, u0, k)
    total = tgm.allreduce(energy, halo.cart)
    return 0.5 * total * total + 0.3 * tgm.allreduce(tg.dot(u, halo.owned()), halo.cart)


@pytest.mark.parametrize("shape, width, periodic", CASES)
def test_exchange_fills_the_ghosts_as_the_global_grid_has_them(shape, width, periodic):
    halo = tgm.Halo(comm, shape, width, periodic)
    g = global_grid(shape)
    expected = halo.local(g)
    u = halo.zeros()
    halo.inner(u)[...] = halo.inner(expected)
    halo.exchange(u)
    np.testing.assert_array_equal(u, expected)
    np.testing.assert_array_equal(halo.gather(u), g)


@pytest.mark.parametrize("shape, width, periodic", CASES)
def test_gradient_on_p_processes_equals_one_process(shape, width, periodic):
    g = global_grid(shape)
    whole = tgm.Halo(MPI.COMM_SELF, shape, width, periodic)
    ref_u, ref_k, ref_value = gradients(whole, replicated, g)
    got_u, got_k, value = gradients(tgm.Halo(comm, shape, width, periodic), replicated, g)
    assert value == pytest.approx(ref_value, rel=1e-12)
    np.testing.assert_allclose(got_u, ref_u, rtol=1e-12, atol=1e-14 * np.abs(ref_u).max())
    assert got_k == pytest.approx(ref_k, rel=1e-12)


def test_kappas_gradient_equals_central_differences():
    shape, width, periodic = (13, 10), 1, (True, False)
    halo = tgm.Halo(comm, shape, width, periodic)
    g = global_grid(shape)
    _, g_k, _ = gradients(halo, replicated, g, kappa=0.11)
    eps = 1e-6
    plus = replicated(halo, halo.local(g), 0.11 + eps)
    minus = replicated(halo, halo.local(g), 0.11 - eps)
    assert g_k == pytest.approx((plus - minus) / (2 * eps), rel=1e-6)


def test_per_process_targets_sum_and_a_replicated_part_counts_per_process():
    """The convention: the objective is the sum over processes of their targets, a value
    held by all of them counting once (tgm.allreduce's docstring)."""
    shape, width, periodic = (13, 10), 2, (False, True)
    g = global_grid(shape)
    halo, whole = (tgm.Halo(c, shape, width, periodic) for c in (comm, MPI.COMM_SELF))

    def local_only(halo, u0, k):                     # objective: sum of the energies
        return run(halo, u0, k)[1]
    ref = gradients(whole, local_only, g)
    got = gradients(halo, local_only, g)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12, atol=1e-14 * np.abs(ref[0]).max())
    assert got[1] == pytest.approx(ref[1], rel=1e-12)

    def mixed(halo, u0, k):         # replicated + per process: sum over P = P * A + sum of B
        u, energy = run(halo, u0, k)
        return tgm.allreduce(energy, halo.cart) + tg.dot(u, halo.owned())

    def mixed_reference(halo, u0, k):
        u, energy = run(halo, u0, k)
        return P * energy + tg.dot(u, halo.owned())
    ref = gradients(whole, mixed_reference, g)
    got = gradients(halo, mixed, g)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12, atol=1e-14 * np.abs(ref[0]).max())
    assert got[1] == pytest.approx(ref[1], rel=1e-12)


@pytest.mark.parametrize("periodic", [True, False])
def test_sendrecv_around_a_ring_against_the_closed_form(periodic):
    me = comm.Get_rank()
    dest, source = (me + 1) % P, (me - 1) % P
    if not periodic:
        dest = dest if me + 1 < P else MPI.PROC_NULL
        source = source if me > 0 else MPI.PROC_NULL
    x = np.arange(5.0) + 10 * me
    weights = np.linspace(1.0, 2.0, 5) * (me + 1)
    with tg.Tape() as tape:
        y = tgm.sendrecv(x, dest, source)
        loss = tgm.allreduce(tg.dot(y, y) * 0.5 + tg.dot(y, weights))
    (g,) = tape.gradient(loss, [x])
    expected_y = np.zeros(5) if source == MPI.PROC_NULL else np.arange(5.0) + 10 * source
    np.testing.assert_array_equal(y, expected_y)
    # d loss / d x = (y + weights) on the process x went to
    if dest == MPI.PROC_NULL:
        expected = np.zeros(5)
    else:
        expected = x + np.linspace(1.0, 2.0, 5) * (dest + 1)
    np.testing.assert_allclose(g, expected, rtol=1e-14)


def test_forward_mode_through_exchanges_and_allreduce_equals_reverse():
    shape, width, periodic = (9, 11), 1, (True, False)
    halo = tgm.Halo(comm, shape, width, periodic)
    g = global_grid(shape)
    _, g_k, _ = gradients(halo, replicated, g, kappa=0.11)
    _, tangent = tg.jvp(lambda k: replicated(halo, halo.local(g), k), 0.11, 1.0)
    assert tangent == pytest.approx(g_k, rel=1e-12)


def test_hvp_through_exchanges_and_allreduce_equals_differences_of_the_gradient():
    """tg.hvp in kappa (a number) and in the grid (each process its block): the recorded
    tangents' exchanges and allreduces, differentiated, against central differences of the
    P-process gradient."""
    shape, width, periodic = (9, 11), 1, (True, False)
    halo = tgm.Halo(comm, shape, width, periodic)
    g = global_grid(shape)
    h = 1e-4
    _, up, _ = gradients(halo, replicated, g, kappa=0.11 + h)
    _, down, _ = gradients(halo, replicated, g, kappa=0.11 - h)
    hv = tg.hvp(lambda k: replicated(halo, halo.local(g), k), 0.11, 1.0)
    # (each process's share, as with tape.gradient of a number every process holds)
    assert halo.cart.allreduce(hv, op=MPI.SUM) == pytest.approx((up - down) / (2 * h), rel=1e-6)
    v = np.random.default_rng(7).standard_normal(shape)
    local = tg.hvp(lambda u0: replicated(halo, u0, 0.11), halo.local(g), halo.local(v))
    (g_up, _, _), (g_down, _, _) = (gradients(halo, replicated, g + s * h * v) for s in (1, -1))
    np.testing.assert_allclose(halo.gather(local), (g_up - g_down) / (2 * h), rtol=1e-6,
                               atol=1e-9)


def test_a_width_larger_than_a_share_is_refused_on_every_process():
    with pytest.raises(tg.TapegradError, match="fewer than the ghost width 3"):
        tgm.Halo(comm, (2 * P - 1,), width=3)


def test_a_checkpointed_loop_of_exchanges_equals_the_plain_tape():
    """tg.checkpoint_loop around steps that exchange ghosts: the sweep's recomputation and
    each step's adjoint communicate in the same order on every process."""
    shape, width, periodic = (13, 10), 1, (True, False)
    halo = tgm.Halo(comm, shape, width, periodic)
    g = global_grid(shape)
    stencil = step_2d(tg.CPU())

    def step(u, k):
        halo.exchange(u)
        out = halo.zeros()
        stencil(out, u, k, width, ndrange=u.shape)
        return out

    results = []
    for snapshots in (None, 3):
        u0 = halo.local(g)
        with tg.Tape() as tape:
            k = tape.watch(0.11)
            u = tg.copy(u0)
            if snapshots is None:
                for _ in range(9):
                    u = step(u, k)
            else:
                u = tg.checkpoint_loop(step, u, 9, params=(k,), snapshots=snapshots)
            loss = tgm.allreduce(tg.dot(u, u), halo.cart)
        g_u, g_k = tape.gradient(loss, [u0, k])
        results.append((halo.gather(g_u), comm.allreduce(g_k, op=MPI.SUM)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-12)
    assert results[1][1] == pytest.approx(results[0][1], rel=1e-12)
