"""The heat inverse problem of `tapegrad demo`, on a 2-D domain decomposition over MPI: every
process owns a block of the plate, exchanges one ghost cell per side each step (a recorded
`Halo.exchange`), and the loss is a global sum (`tgm.allreduce`); `tape.gradient` on every
process gives its block of the global gradient. Prints the loss falling and a gradient check.
Run: mpiexec -n 4 python examples/heat_mpi.py     (HEAT_MPI_N, _STEPS, _ITERS: sizes)"""

import os
import time

import numpy as np
from mpi4py import MPI

import tapegrad as tg
import tapegrad.mpi as tgm

N = int(os.environ.get("HEAT_MPI_N", 64))           # global grid points per side
STEPS = int(os.environ.get("HEAT_MPI_STEPS", 100))  # explicit time steps per simulation
ITERS = int(os.environ.get("HEAT_MPI_ITERS", 30))   # gradient-descent iterations
ALPHA = 0.2                                 # diffusion number (stable below 0.25)


@tg.kernel
def heat_step(T_new, T, alpha):
    """One step on this process's block: its own cells from their neighbours (ghosts
    included), ghosts copied (beyond the plate's edge they are 0: its border condition)."""
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = T.shape
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        T_new[i, j] = T[i, j]
    else:
        T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                         + T[i, j + 1] - 4.0 * T[i, j])


@tg.kernel
def misfit(R, T, observed, owned):
    """R = T - observed on the cells this process owns, 0 on its ghosts."""
    i, j = tg.index(tg.Global, tg.NTuple)
    R[i, j] = owned[i, j] * (T[i, j] - observed[i, j])


def simulate(halo, T0):
    T = tg.copy(T0)
    for _ in range(STEPS):
        halo.exchange(T)                        # neighbours' edge cells into the ghosts
        T_next = np.empty_like(T)
        heat_step(tg.CPU(), (8, 8))(T_next, T, ALPHA, ndrange=T.shape)
        T = T_next
    return T


def loss(halo, T0, observed, owned):
    R = np.empty_like(T0)
    misfit(tg.CPU(), (8, 8))(R, simulate(halo, T0), observed, owned, ndrange=R.shape)
    return tgm.allreduce(tg.dot(R, R), halo.cart)      # the same global loss on every process


def value_and_gradient(halo, T0, observed, owned):
    with tg.Tape() as tape:
        value = loss(halo, T0, observed, owned)
    (g,) = tape.gradient(value, [T0])
    return float(value), g * owned             # (the ghosts are not unknowns)


def true_initial_field():
    y, x = np.mgrid[0:N, 0:N] / (N - 1)
    blobs = ((0.3, 0.3, 0.08, 1.0), (0.7, 0.6, 0.12, 0.7), (0.45, 0.75, 0.05, 1.2))
    return sum(a * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * s ** 2))
               for cx, cy, s, a in blobs)


def main():
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    halo = tgm.Halo(comm, (N, N), width=1)       # a balanced 2-D process grid, not periodic
    owned = halo.owned()
    observed = simulate(halo, halo.local(true_initial_field()))     # the "measurement"
    sent = comm.allreduce(halo.volume(), op=MPI.SUM)
    if rank == 0:
        print(f"{size} process(es) as a {halo.dims[0]} x {halo.dims[1]} grid; {N} x {N} plate, "
              f"{STEPS} steps; this process's block {halo.interior}; all processes send "
              f"{sent / 1024:.1f} KiB per exchange (as much again in its adjoint)")
    T0 = halo.zeros()                            # first guess: a cold plate
    first = None
    t0 = time.perf_counter()
    for it in range(ITERS):
        value, g = value_and_gradient(halo, T0, observed, owned)
        first = value if first is None else first
        if rank == 0 and (it % 5 == 0 or it == ITERS - 1):
            print(f"iteration {it:3d}: loss {value:.4e}")
        T0 -= 0.5 * g                           # gradient descent (the step: 1 / Lipschitz)
    per_gradient = (time.perf_counter() - t0) / ITERS
    last, g = value_and_gradient(halo, T0, observed, owned)

    # the gradient along a random direction against central differences, across all blocks
    d = halo.local(np.random.default_rng(0).standard_normal((N, N))) * owned
    eps = 1e-6
    plus = float(loss(halo, T0 + eps * d, observed, owned))
    minus = float(loss(halo, T0 - eps * d, observed, owned))
    slope = comm.allreduce(float(np.vdot(g, d)), op=MPI.SUM)
    fd = (plus - minus) / (2 * eps)
    error = abs(slope - fd) / abs(fd)
    if rank == 0:
        print(f"loss {first:.4e} -> {last:.4e}; {per_gradient * 1e3:.1f} ms per gradient")
        print(f"gradient check: directional derivative {slope:.8e}, central differences "
              f"{fd:.8e}, relative error {error:.1e}")
    assert last < 0.1 * first, "the loss did not fall"
    assert error < 1e-6, "the gradient check failed"


if __name__ == "__main__":
    main()
