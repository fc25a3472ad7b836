"""``python -m tapegrad bench --checkpointing``: a nonlinear 2-D simulation (Gray-Scott, the
one of examples/long_simulation.py) differentiated with the plain tape and with
``tg.checkpoint_loop`` (its default and several numbers of snapshots): time, memory the tape
held, and the peak memory of the run and its gradient, against Revolve's predicted forward
steps.

Each configuration runs in a fresh process (``measure``), so that no run inherits another's
memory: after a short warm-up run (the compiled kernels loaded), a timed run, whose process
peak is the resident high-water mark (``VmHWM``; ``ru_maxrss`` where there is no /proc), then
the same run again under tracemalloc, which counts NumPy's arrays exactly: the peak of the
run and its gradient above what the process held before it (the initial state made), in
states."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import tracemalloc

import numpy as np

import tapegrad as tg
from tapegrad.checkpointing.loop import LoopRecord
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


def _gradient(n: int, steps: int, snapshots: int | str | None,
              state: tuple | None = None) -> tuple[float, int, float, str]:
    """(seconds for the run and its gradient, bytes the tape held, d loss / d feed, what
    the loop chose): ``snapshots`` None is the plain tape, "default" the loop's own choice."""
    u0, v0 = state or _state(n)
    t0 = time.perf_counter()
    with tg.Tape() as tape:
        feed = tape.watch(0.037)
        if snapshots is None:
            u, v = u0, v0
            for _ in range(steps):
                u, v = step(u, v, feed, 0.06)
        else:
            u, v = tg.checkpoint_loop(step, (u0, v0), steps, params=(feed, 0.06),
                                      snapshots=None if snapshots == "default" else snapshots)
        loss = tg.mean(v)
    held = tape.memory()["total"]
    (d_feed,) = tape.gradient(loss, [feed])
    seconds = time.perf_counter() - t0
    loops = [r.loop for r in tape.records if isinstance(r, LoopRecord)]
    chosen = f"s={loops[0].s}" if loops else "every step"
    return seconds, held, d_feed, chosen


def _status(field: str) -> int | None:
    """A size from ``/proc/self/status`` in bytes (``VmHWM``, ``VmRSS``), None without it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _process_peak() -> int:
    """This process's resident high-water mark in bytes: ``VmHWM`` (this process's own,
    where ``ru_maxrss`` may count the parent it was spawned from), else ``ru_maxrss``."""
    peak = _status("VmHWM")
    if peak is not None:
        return peak
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024     # (bytes there, KiB here)


def _resident() -> int:
    return _status("VmRSS") or 0


def measure(n: int, steps: int, snapshots: int | str | None) -> dict:
    """One configuration in this process (meant to be a fresh one): the timed run and its
    gradient with the process's peak, then the run again under tracemalloc for NumPy's."""
    _gradient(n, 3, None)
    _gradient(n, 3, 2 if snapshots is not None else None)     # (the kernels loaded)
    state = _state(n)
    gc.collect()
    before = _resident()
    seconds, held, d_feed, chosen = _gradient(n, steps, snapshots, state)
    process_peak = _process_peak()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        _gradient(n, steps, snapshots, state)
        numpy_peak = tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()
    return {"seconds": seconds, "held_bytes": held, "d_feed": d_feed, "chosen": chosen,
            "peak_bytes": numpy_peak, "process_peak_bytes": process_peak,
            "process_before_bytes": before}


def _fresh(n: int, steps: int, snapshots: int | str | None) -> dict:
    """``measure`` in a new Python process."""
    code = ("import json, sys; from tapegrad.bench.checkpointing import measure; "
            f"print(json.dumps(measure({n}, {steps}, {snapshots!r})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench --checkpointing: the run with snapshots={snapshots!r} "
                           f"failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(quick: bool = False) -> list[dict]:
    n, steps = (64, 200) if quick else (256, 1000)
    state = 2 * n * n * 8
    u, v = _state(n)
    step(u, v, 0.037, 0.06)
    _gradient(n, 3, None)
    _gradient(n, 3, 2)                         # (compiled, for the fresh processes too)
    t0 = time.perf_counter()
    for _ in range(steps):
        u, v = step(u, v, 0.037, 0.06)
    primal = time.perf_counter() - t0
    print(f"\ncheckpointing: {steps} steps of Gray-Scott on {n}x{n} (a state: "
          f"{state / 2**10:.0f} KiB); primal run {primal * 1e3:.0f} ms; each row in a fresh "
          "process")
    print(f"{'tape':<32} {'held':>10} {'states':>7} {'peak':>6} {'process':>9} "
          f"{'gradient':>10} {'/ primal':>9} {'t/N + 1.5':>10}")
    rows, reference, before = [], None, []
    for s in (None, "default", 40, 20, 10, 5):
        got = _fresh(n, steps, s)
        seconds, held, d_feed = got["seconds"], got["held_bytes"], got["d_feed"]
        reference = d_feed if reference is None else reference
        predicted = forward_steps(steps, s) / steps + 1.5 if isinstance(s, int) \
            else float("nan")
        label = "plain" if s is None else f"checkpoint_loop s={s}" if isinstance(s, int) \
            else "checkpoint_loop default" + (" = plain" if got["chosen"] == "every step"
                                             else f" {got['chosen']}")
        peak = got["peak_bytes"] / state
        before.append(got["process_before_bytes"])
        rows.append({"tape": label, "held_bytes": held, "states": held / state,
                     "peak_bytes": got["peak_bytes"], "peak_states": peak,
                     "process_peak_bytes": got["process_peak_bytes"],
                     "process_before_bytes": got["process_before_bytes"],
                     "seconds": seconds, "over_primal": seconds / primal,
                     "t_over_n_plus_1_5": predicted,
                     "relative_difference": abs(d_feed - reference) / abs(reference)})
        print(f"{label:<32} {held / 2**20:>6.1f} MiB {held / state:>7.1f} {peak:>6.1f} "
              f"{got['process_peak_bytes'] / 2**20:>5.0f} MiB {seconds:>8.2f} s "
              f"{seconds / primal:>8.1f}x {predicted:>10.2f}")
    worst = max(r["relative_difference"] for r in rows)
    print(f"d loss / d feed equal across them to {worst:.1e} relative")
    print(f"peak: NumPy's arrays at most during the run and its gradient (tracemalloc, the run "
          f"again), beyond the initial state, in states; process: the process's resident peak "
          f"(VmHWM), {min(before) / 2**20:.0f}-{max(before) / 2**20:.0f} MiB before the run "
          "(Python, NumPy, Numba, the kernels)")
    return rows
