"""``python -m tapegrad bench --checkpointing``: a nonlinear 2-D simulation (Gray-Scott, the
one of examples/long_simulation.py) differentiated with the plain tape and with
``tg.checkpoint_loop`` at several numbers of snapshots: time and memory held, against
Revolve's predicted forward steps."""

from __future__ import annotations

import time

import numpy as np

import tapegrad as tg
from tapegrad.checkpointing.revolve import forward_steps

DU, DV, DT = 0.16, 0.08, 0.5


@tg.kernel
def gray_scott(u_new, v_new, u, v, feed, kill):
    i, j = tg.index(tg.Global, tg.NTuple)
    n = u.shape[0]
    lap_u = u[(i + 1) % n, j] + u[(i - 1) % n, j] + u[i, (j + 1) % n] + u[i, (j - 1) % n] \
        - 4.0 * u[i, j]
    lap_v = v[(i + 1) % n, j] + v[(i - 1) % n, j] + v[i, (j + 1) % n] + v[i, (j - 1) % n] \
        - 4.0 * v[i, j]
    uvv = u[i, j] * v[i, j] * v[i, j]
    u_new[i, j] = u[i, j] + DT * (DU * lap_u - uvv + feed * (1.0 - u[i, j]))
    v_new[i, j] = v[i, j] + DT * (DV * lap_v + uvv - (feed + kill) * v[i, j])


def step(u: np.ndarray, v: np.ndarray, feed: float, kill: float) -> tuple:
    """One Gray-Scott step into new arrays (examples/long_simulation.py runs it too)."""
    u_new, v_new = np.empty_like(u), np.empty_like(v)
    gray_scott(tg.CPU(), (8, 16))(u_new, v_new, u, v, feed, kill, ndrange=u.shape)
    return u_new, v_new


def _state(n: int) -> tuple:
    u, v = np.ones((n, n)), np.zeros((n, n))
    c = n // 2
    u[c - 4:c + 4, c - 4:c + 4], v[c - 4:c + 4, c - 4:c + 4] = 0.5, 0.25
    return u, v


def _gradient(n: int, steps: int, snapshots: int | None) -> tuple[float, int, float]:
    """(seconds for the run and its gradient, bytes the tape held, d loss / d feed)."""
    u0, v0 = _state(n)
    t0 = time.perf_counter()
    with tg.Tape() as tape:
        feed = tape.watch(0.037)
        if snapshots is None:
            u, v = u0, v0
            for _ in range(steps):
                u, v = step(u, v, feed, 0.06)
        else:
            u, v = tg.checkpoint_loop(step, (u0, v0), steps, params=(feed, 0.06),
                                      snapshots=snapshots)
        loss = tg.mean(v)
    held = tape.memory()["total"]
    (d_feed,) = tape.gradient(loss, [feed])
    return time.perf_counter() - t0, held, d_feed


def main(quick: bool = False) -> list[dict]:
    n, steps = (64, 200) if quick else (256, 1000)
    state = 2 * n * n * 8
    u, v = _state(n)
    step(u, v, 0.037, 0.06)
    _gradient(n, 3, None)
    _gradient(n, 3, 2)                         # (compiled)
    t0 = time.perf_counter()
    for _ in range(steps):
        u, v = step(u, v, 0.037, 0.06)
    primal = time.perf_counter() - t0
    print(f"\ncheckpointing: {steps} steps of Gray-Scott on {n}x{n} (a state: "
          f"{state / 2**10:.0f} KiB); primal run {primal * 1e3:.0f} ms")
    print(f"{'tape':<22} {'held':>10} {'states':>7} {'gradient':>10} {'/ primal':>9} "
          f"{'t/N + 1.5':>10}")
    rows, reference = [], None
    for s in (None, 40, 20, 10, 5):
        seconds, held, d_feed = _gradient(n, steps, s)
        reference = d_feed if reference is None else reference
        predicted = forward_steps(steps, s) / steps + 1.5 if s else float("nan")
        label = "plain" if s is None else f"checkpoint_loop s={s}"
        rows.append({"tape": label, "held_bytes": held, "states": held / state,
                     "seconds": seconds, "over_primal": seconds / primal,
                     "t_over_n_plus_1_5": predicted,
                     "relative_difference": abs(d_feed - reference) / abs(reference)})
        print(f"{label:<22} {held / 2**20:>6.1f} MiB {held / state:>7.1f} {seconds:>8.2f} s "
              f"{seconds / primal:>8.1f}x {predicted:>10.2f}")
    worst = max(r["relative_difference"] for r in rows)
    print(f"d loss / d feed equal across them to {worst:.1e} relative")
    return rows
