"""Run on every process of ``mpiexec -n P`` (tests/mpi/test_mpi.py starts P = 2 and 4): the
guards of docs/mpi.md ("Guards"), each against an independent reference (central
differences of the global objective in float64, perturbing every process's inputs at once; a
closed form; forward mode against reverse) or against the error it must raise on every
process that the mistake concerns.  Each program here differs from one process to the next
(a tangent, a sensor, a state's size, a dtype on some processes only), which is what the
guards are for."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import tapegrad as tg
import tapegrad.mpi as tgm

comm = MPI.COMM_WORLD
P, RANK = comm.Get_size(), comm.Get_rank()
NULL = MPI.PROC_NULL
pytestmark = pytest.mark.skipif(P < 2, reason="the guards are about differences between "
                                "processes")


@tg.kernel
def square(a, x):
    i = tg.index()
    a[i] = x[i] * x[i]


@tg.kernel
def combine(out, F, G):
    i = tg.index()
    if 0 < i < F.shape[0] - 1:
        out[i] = F[i - 1] * G[i + 1] + F[i + 1] + G[i - 1]
    else:
        out[i] = 0.0


@tg.kernel
def stencil(out, u):
    i = tg.index()
    if 0 < i < u.shape[0] - 1:
        out[i] = u[i] + 0.2 * (u[i - 1] - 2.0 * u[i] + u[i + 1]) - 0.1 * u[i] * u[i] * u[i]
    else:
        out[i] = u[i]


def directional_fd(f, x, v, h=1e-6):
    """Central differences of ``f`` (the same number on every process) along ``v``, every
    process's ``x`` moved at once."""
    return (float(f(x + h * v)) - float(f(x - h * v))) / (2 * h)


# -- forward mode: tangents on some processes only ---------------------------------------

def sources_on_two_processes(halo):
    """A global objective whose halo exchanges carry tangents from process 0 (F) and from
    process 1 (G) alone: the others exchange no tangent of their own.  (Every process's x
    enters the objective: the gradient of one it does not reach is refused.)"""
    def f(x):
        F, G, out = halo.zeros(), halo.zeros(), halo.zeros()
        if RANK == 0:
            square(tg.CPU())(F, x, ndrange=F.shape)
        if RANK == 1:
            square(tg.CPU())(G, x, ndrange=G.shape)
        halo.exchange(F)
        halo.exchange(G)
        combine(tg.CPU())(out, F, G, ndrange=out.shape)
        return tgm.allreduce(tg.dot(out, halo.owned()) + 0.5 * tg.dot(x, halo.owned()))
    return f


def test_jvp_with_a_tangent_on_some_processes_equals_central_differences():
    halo = tgm.Halo(comm, (4 * P,), width=1)
    f = sources_on_two_processes(halo)
    x0 = halo.local(np.linspace(1.0, 2.0, 4 * P))
    v = halo.local(np.linspace(0.3, -0.5, 4 * P))
    value = float(f(x0))
    y, y_dot = tg.jvp(f, x0, v)
    assert float(y) == pytest.approx(value, rel=1e-14)
    assert float(y_dot) == pytest.approx(directional_fd(f, x0, v), rel=1e-7)
    (g,) = tg.gradient(f, x0)
    assert float(y_dot) == pytest.approx(comm.allreduce(float(g @ v)), rel=1e-12)
    assert float(f(x0)) == value           # (no message of the jvp left behind)


def test_hvp_with_a_tangent_on_some_processes_equals_differences_of_the_gradient():
    halo = tgm.Halo(comm, (4 * P,), width=1)
    f = sources_on_two_processes(halo)
    x0 = halo.local(np.linspace(1.0, 2.0, 4 * P))
    v = halo.local(np.linspace(0.3, -0.5, 4 * P))
    h = 1e-5
    fd = (tg.gradient(f, x0 + h * v)[0] - tg.gradient(f, x0 - h * v)[0]) / (2 * h)
    np.testing.assert_allclose(tg.hvp(f, x0, v), fd, rtol=1e-6, atol=1e-8)


def test_jvp_through_a_sendrecv_pipeline_equals_the_closed_form():
    """Process r sends its squares to r + 1 and receives r - 1's (zeros on process 0), so
    the receiving end's x has no tangent that matters: F = sum_r (|y_r|^2 + sum a_r),
    dF = sum_r (4 x_{r-1}^3 + 2 x_r) . v (a_r = x_r^2)."""
    dest = RANK + 1 if RANK + 1 < P else NULL
    source = RANK - 1 if RANK > 0 else NULL

    def f(x):
        a = np.empty_like(x)
        square(tg.CPU())(a, x, ndrange=x.size)
        y = tgm.sendrecv(a if dest != NULL else np.zeros(3), dest, source)
        return tgm.allreduce(tg.dot(y, y) + tg.sum(a))

    x0 = np.array([1.0, 2.0, 3.0]) + RANK
    v = np.array([0.5, -1.0, 0.25])
    value = float(f(x0))
    y, y_dot = tg.jvp(f, x0, v)
    sent = x0 if dest != NULL else np.zeros(3)
    mine = float(2 * x0 @ v) + (float(4 * sent ** 3 @ v) if dest != NULL else 0.0)
    assert float(y) == pytest.approx(value, rel=1e-14)
    assert float(y_dot) == pytest.approx(comm.allreduce(mine), rel=1e-12)
    assert float(f(x0)) == value           # (no message of the jvp left behind)


# -- checkpointing ----------------------------------------------------------------------

@tg.checkpoint
def squared_norm(u):
    return tgm.allreduce(tg.dot(u, u))


@pytest.mark.parametrize("kind", ["L", "L+M", "L*M", "allreduce(L)"])
def test_a_checkpointed_allreduce_counts_as_the_plain_one(kind):
    """A tg.checkpoint segment returning an allreduce result: L = sum_p u_p.u_p held by all,
    M = sum_p sum u_p; closed forms."""
    u = np.arange(3.0) + 10 * RANK + 1
    L, M = comm.allreduce(float(u @ u)), comm.allreduce(float(u.sum()))
    build, expected = {
        "L": (lambda u: squared_norm(u), 2 * u),
        "L+M": (lambda u: squared_norm(u) + tgm.allreduce(tg.sum(u)), 2 * u + 1),
        "L*M": (lambda u: squared_norm(u) * tgm.allreduce(tg.sum(u)), M * 2 * u + L),
        "allreduce(L)": (lambda u: tgm.allreduce(squared_norm(u)), P * 2 * u),
    }[kind]
    with tg.Tape() as tape:
        loss = build(u)
    np.testing.assert_allclose(tape.gradient(loss, [u])[0], expected, rtol=1e-14)


def halo_steps(halo):
    def step(u):
        halo.exchange(u)
        out = np.empty_like(u)
        stencil(tg.CPU())(out, u, ndrange=u.shape)
        return out
    return step


@pytest.mark.parametrize("how", ["loop", "segment"])
def test_checkpointed_exchanges_with_a_target_on_one_process(how):
    """A sensor on process 0 alone: the other processes' targets do not depend on the
    checkpointed exchanges, whose adjoints must still run there (process 0's wait for their
    messages).  Against the plain tape, and its derivative against central differences."""
    halo = tgm.Halo(comm, (4 * P,), width=1)
    step, n = halo_steps(halo), 6
    sensor = halo.zeros()
    if RANK == 0:
        sensor[2] = 1.0

    @tg.checkpoint
    def segment(u):
        u = tg.copy(u)
        for _ in range(n):
            u = step(u)
        return u

    def f(u0, mode):
        if mode == "plain":
            u = tg.copy(u0)
            for _ in range(n):
                u = step(u)
        elif mode == "loop":
            u = tg.checkpoint_loop(step, u0, n, snapshots=3)
        else:
            u = segment(u0)
        return tgm.allreduce(tg.dot(u, sensor) if RANK == 0 else 0.0)

    agrees_with_plain(halo, f, "plain", how, halo.local(np.linspace(0.2, 1.0, 4 * P)))


def agrees_with_plain(halo, f, plain, other, u0):
    """``f(u0, other)``'s gradient is ``f(u0, plain)``'s, and its derivative along a
    direction is the plain run's central difference (over all processes)."""
    grads = []
    for mode in (plain, other):
        with tg.Tape() as tape:
            loss = f(u0, mode)
        grads.append(tape.gradient(loss, [u0])[0])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-13, atol=1e-16)
    v = halo.local(np.cos(np.arange(4.0 * P)))
    assert comm.allreduce(float(grads[1] @ v)) == pytest.approx(
        directional_fd(lambda u: f(u, plain), u0, v), rel=1e-6)


@pytest.mark.parametrize("memory", [None, 288, 10 ** 9])
def test_snapshots_chosen_from_memory_agree_across_processes(memory, capsys):
    """An uneven split (9 cells): each process's state has another size, and on its own it
    would choose another schedule (288 bytes: 5 states of 56 B, 6 of 48 B); the least over
    the processes is taken.  Against central differences."""
    halo = tgm.Halo(comm, (9,), width=1)
    step = halo_steps(halo)
    u0 = halo.local(np.linspace(0.2, 1.0, 9))
    n = 20

    def f(u0, **options):
        u = tg.checkpoint_loop(step, u0, n, **options) if options else tg.copy(u0)
        if not options:
            for _ in range(n):
                u = step(u)
        return tgm.allreduce(tg.dot(u, halo.owned()))

    with tg.Tape() as tape:
        loss = f(u0, memory=memory)
    (g,) = tape.gradient(loss, [u0])
    v = halo.local(np.sin(np.arange(9.0)) + 1.5)
    assert comm.allreduce(float(g @ v)) == pytest.approx(directional_fd(f, u0, v), rel=1e-6)
    said = capsys.readouterr().err
    assert ("the least over the processes" in said) == (RANK == 0)


# -- which processes hold a target ------------------------------------------------------

@pytest.mark.skipif(P != 4, reason="a 2 x 2 grid of processes")
def test_rows_and_columns_of_a_process_grid_hold_their_own_values():
    """target_p = (sum over p's row of x.x) * (sum over p's column of sum x): held by p alone
    (its row and its column share no other process), so the objective is their sum."""
    cart = comm.Create_cart([2, 2])
    row, col = cart.Sub([False, True]), cart.Sub([True, False])
    x0 = np.array([1.0, 2.0]) + RANK
    (g,) = tg.gradient(lambda x: tgm.allreduce(tg.dot(x, x), row)
                       * tgm.allreduce(tg.sum(x), col), x0)
    A, B = row.allreduce(float(x0 @ x0)), col.allreduce(float(x0.sum()))
    np.testing.assert_allclose(g, row.allreduce(B) * 2 * x0 + col.allreduce(A), rtol=1e-14)


@pytest.mark.skipif(P != 4, reason="a 2 x 2 grid of processes")
def test_a_value_of_the_whole_grid_times_one_of_a_row_is_held_by_the_row():
    """allreduce over all (4) times allreduce over a row (2): held by the row's 2 processes,
    counted once per row: objective L * (B_row0 + B_row1) = L * B."""
    cart = comm.Create_cart([2, 2])
    row = cart.Sub([False, True])
    x0 = np.array([1.0, 2.0]) + RANK
    (g,) = tg.gradient(lambda x: tgm.allreduce(tg.dot(x, x)) * tgm.allreduce(tg.sum(x), row),
                       x0)
    L, B = comm.allreduce(float(x0 @ x0)), comm.allreduce(float(x0.sum()))
    np.testing.assert_allclose(g, B * 2 * x0 + L, rtol=1e-14)


def test_a_per_process_number_after_the_allreduce_is_refused_on_every_process():
    u = np.arange(3.0) + 10 * RANK + 1
    c = 1.0 + RANK
    with tg.Tape() as tape:
        target = c * tgm.allreduce(tg.dot(u, u))
    with pytest.raises(tg.TapegradError, match=r"its value differs between them.*"
                       r"tgm.allreduce\(c\) \* total"):
        tape.gradient(target, [u])
    # what it says to write instead: (sum of c_p) * L, two ways; closed form
    expected = comm.allreduce(c) * 2 * u
    with tg.Tape() as tape:
        target = tgm.allreduce(c) * tgm.allreduce(tg.dot(u, u))
    np.testing.assert_allclose(tape.gradient(target, [u])[0], expected, rtol=1e-14)
    with tg.Tape() as tape:
        k = tape.watch(c)
        target = k * tgm.allreduce(tg.dot(u, u))
    np.testing.assert_allclose(tape.gradient(target, [u])[0], expected, rtol=1e-14)


def test_a_target_of_another_kind_on_some_processes_is_refused_on_every_process():
    u = np.arange(3.0) + RANK
    with tg.Tape() as tape:
        total = tgm.allreduce(tg.dot(u, u))
        target = total if RANK == 0 else total + tg.sum(u)
    with pytest.raises(tg.TapegradError, match="the targets differ in kind"):
        tape.gradient(target, [u])


# -- messages of the wrong size ---------------------------------------------------------

def partner():
    """Pairs (0, 1), (2, 3), ...; an odd last process talks to no one."""
    other = RANK ^ 1
    return other if other < P else NULL


def test_sendrecv_of_another_shape_is_refused_where_it_arrives():
    """Even processes send 3 values, odd ones 4; each expects 4: the odd ones get 3."""
    other = partner()
    x = np.arange(3.0 if RANK % 2 == 0 else 4.0) + 1
    if RANK % 2 == 1:
        with pytest.raises(tg.TapegradError, match="sent 24 bytes, but this process expects "
                           "32 bytes"):
            tgm.sendrecv(x, dest=other, source=other, shape=(4,))
    else:
        y = tgm.sendrecv(x, dest=other, source=other, shape=(4,))
        assert other == NULL or y.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_sendrecv_and_exchange_of_another_dtype_are_refused_on_both_sides():
    other = partner()
    x = np.array([1.5, 2.5], dtype=np.float32 if RANK % 2 == 0 else np.float64)
    if other != NULL:
        with pytest.raises(tg.TapegradError, match="tgm.sendrecv: process"):
            tgm.sendrecv(x, dest=other, source=other)
    halo = tgm.Halo(comm, (3 * P,), width=1)
    u = halo.local(np.arange(3.0 * P)).astype(np.float32 if RANK % 2 == 0 else np.float64)
    with pytest.raises(tg.TapegradError, match="halo.exchange: process .* one dtype"):
        halo.exchange(u)
    comm.Barrier()
    halo.exchange(halo.local(np.arange(3.0 * P)))      # (and the next exchange is right)


@tg.kernel
def diffuse(out, u, c):
    i = tg.index()
    if 0 < i < u.shape[0] - 1:
        out[i] = u[i] + c * (u[i - 1] - 2.0 * u[i] + u[i + 1])
    else:
        out[i] = u[i]


def test_a_host_decision_on_one_process_takes_the_general_path_on_all():
    """A linear step (its adjoint keeps nothing of the state) whose factor process 1 alone
    changes at step 3: that process cannot take the linear shortcut, so none does (the
    shortcut runs other steps than the schedule).  (Today no step that communicates takes
    it: guards.signature does not compare communicating records; the loop agrees across the
    processes anyway, for when it does.)  Against the plain tape and central differences."""
    halo = tgm.Halo(comm, (4 * P,), width=1)
    n = 7

    def step(u, k):
        halo.exchange(u)
        out = np.empty_like(u)
        diffuse(tg.CPU())(out, u, 0.2 if RANK == 1 and k >= 3 else 0.1, ndrange=u.shape)
        return out

    def f(u0, checkpointed):
        if checkpointed:
            u = tg.checkpoint_loop(step, u0, n, snapshots=2)
        else:
            u = tg.copy(u0)
            for k in range(n):
                u = step(u, k)
        return tgm.allreduce(tg.dot(u, u))

    agrees_with_plain(halo, f, False, True, halo.local(np.linspace(0.2, 1.0, 4 * P) ** 2))


def test_a_loop_that_communicates_with_other_steps_on_some_processes_is_refused():
    halo = tgm.Halo(comm, (4 * P,), width=1)
    step = halo_steps(halo)
    u0 = halo.local(np.linspace(0.2, 1.0, 4 * P))
    with tg.Tape():
        with pytest.raises(tg.TapegradError, match="n_steps from 5 to 6 and snapshots from 2 "
                           "to 3"):
            tg.checkpoint_loop(step, u0, 5 if RANK == 0 else 6, snapshots=2 + (RANK > 0))


@pytest.mark.parametrize("mode", [tg.Reverse, tg.Forward], ids=["reverse", "forward"])
def test_a_jacobian_through_the_processes_is_refused_on_every_process(mode):
    """(Its rows were seeded on every process at once: rank 0 got the sum over processes,
    [12 23 34] for [1.5 2.5 3.5], and uneven sizes hung.)"""
    x, w = np.arange(1.0, 4.0) + RANK, np.full(3, 0.5)
    with pytest.raises(tg.TapegradError, match="tg.jacobian cannot differentiate through "
                                               "tapegrad.mpi.allreduce"):
        tg.jacobian(lambda x: tgm.allreduce(tg.dot(w, x) + 0.5 * tg.dot(x, x)), x, mode=mode)
    one = tgm.allreduce(1.0)                  # (every process is still in step)
    assert float(one) == P


def test_a_halo_on_this_process_alone_first_leaves_the_others_in_step():
    """(A Halo split its communicator by node on a process's first Halo only: rank 0's
    COMM_SELF Halo made it skip the split of the world's, where the others waited.)"""
    if RANK == 0:
        alone = tgm.Halo(MPI.COMM_SELF, (8,), 1)
        assert alone.shape == (10,)
    halo = tgm.Halo(comm, (8 * P,), 1)
    u = halo.local(np.arange(8.0 * P))
    halo.exchange(u)
    np.testing.assert_array_equal(u[1:-1], np.arange(8.0 * RANK, 8.0 * RANK + 8))
