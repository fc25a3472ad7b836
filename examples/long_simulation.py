"""100,000 steps of a nonlinear 2-D simulation (Gray-Scott reaction-diffusion) differentiated
with tg.checkpoint_loop: the tape keeps 40 snapshots instead of a record per step, and the
reverse sweep recomputes what it needs (Revolve's binomial schedule).
Run: python examples/long_simulation.py [steps]   (CI runs fewer steps: STEPS=2000)"""

import os
import sys
import time

import numpy as np

import tapegrad as tg
from tapegrad.bench.checkpointing import step  # the Gray-Scott kernel and one step with it

N = 48                   # grid points per side (periodic)


def initial_state():
    u, v = np.ones((N, N)), np.zeros((N, N))
    u[20:28, 20:28], v[20:28, 20:28] = 0.5, 0.25
    v += 0.01 * np.random.default_rng(0).random((N, N))
    return u, v


def plain_tape_bytes_per_step(steps=100):
    """What the plain tape keeps per recorded step (measured over a few steps)."""
    u, v = initial_state()
    with tg.Tape() as tape:
        for _ in range(steps):
            u, v = step(u, v, 0.037, 0.06)
        tg.mean(v)
    return tape.memory()["total"] / steps


def loss_and_gradient(steps, snapshots):
    u0, v0 = initial_state()
    with tg.Tape() as tape:
        feed, kill = tape.watch(0.037), tape.watch(0.06)
        u, v = tg.checkpoint_loop(step, (u0, v0), steps, params=(feed, kill),
                                  snapshots=snapshots)
        loss = tg.mean(v)                # how much of the second species is left
    held = tape.memory()
    d_feed, d_kill, d_v0 = tape.gradient(loss, [feed, kill, v0])
    return float(loss), d_feed, d_kill, d_v0, held


if __name__ == "__main__":
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("STEPS", 100_000))
    snapshots = 40
    state_bytes = 2 * N * N * 8
    t0 = time.perf_counter()
    loss, d_feed, d_kill, d_v0, held = loss_and_gradient(steps, snapshots)
    seconds = time.perf_counter() - t0
    print(f"{steps} steps of Gray-Scott on {N}x{N}: mean v = {loss:.6f}, d/d feed = {d_feed:.5g}, "
          f"d/d kill = {d_kill:.5g} ({seconds:.1f} s for the run and its gradient)")
    per_step = plain_tape_bytes_per_step()
    print(f"the tape held {held['total'] / 2**20:.2f} MiB ({held['total'] / state_bytes:.0f} "
          f"states of {state_bytes / 2**10:.0f} KiB); recording every step would keep "
          f"{steps * per_step / 2**20:.0f} MiB ({per_step / 2**10:.0f} KiB per step, measured)")
    # the derivative with respect to feed, against central differences of the loop itself
    h = 1e-6
    u0, v0 = initial_state()
    plus = np.mean(tg.checkpoint_loop(step, (u0, v0), steps, params=(0.037 + h, 0.06))[1])
    minus = np.mean(tg.checkpoint_loop(step, (u0, v0), steps, params=(0.037 - h, 0.06))[1])
    fd = (plus - minus) / (2 * h)
    print(f"d/d feed by finite differences: {fd:.5g}")
    assert abs(d_feed - fd) <= 1e-5 * max(1.0, abs(fd)), (d_feed, fd)
    assert held["total"] <= (snapshots + 4) * state_bytes
