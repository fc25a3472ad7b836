"""The bench's table of peers: primal and gradient of each problem for tapegrad (plain,
Enzyme-style, captured) and for NumPy, JAX, PyTorch, Warp and Taichi where installed, each
implementation's primal and gradient timed in turn."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _peer_table(quick: bool, repeats: int) -> list[dict]:
    from tapegrad.bench.peers import PEERS, Unavailable
    from tapegrad.bench.problems import (
        make_tapegrad,
        make_tapegrad_captured,
        make_tapegrad_captured_loss,
        make_tapegrad_enzyme,
        make_tapegrad_fma,
        problems,
    )
    print()
    header = (f"{'problem (float32)':<30} {'implementation':<10} {'primal':>10} {'gradient':>10} "
              f"{'grad/primal':>11}")
    print(header)
    print("-" * len(header))
    rows, skipped = [], {}
    ours = [("tapegrad", make_tapegrad), ("tg Enzyme", make_tapegrad_enzyme),
            ("tg fma", make_tapegrad_fma), ("tg capture", make_tapegrad_captured),
            ("capt. loss", make_tapegrad_captured_loss)]
    for prob in problems(quick):
        timings = {}
        for impl, make in ours + list(PEERS.items()):
            try:
                pair = make(prob)
                if pair is None:
                    continue
                primal, grad = pair
                primal()
                grad()
                t_p, t_g = _alternating_medians(primal, grad, repeats)
            except Unavailable as why:
                skipped.setdefault(impl, str(why))
                continue
            except Exception as exc:   # a peer failing must not stop the comparison
                print(f"{prob['name']:<30} {impl:<10} failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:60] if str(exc) else ''}")
                continue
            timings[impl] = (t_p, t_g)
            rows.append({"problem": prob["name"], "implementation": impl, "primal_ms": t_p,
                         "gradient_ms": t_g, "gradient_over_primal": t_g / t_p})
            print(f"{prob['name']:<30} {impl:<10} {t_p:>7.3f} ms {t_g:>7.3f} ms {t_g / t_p:>10.2f}x")
        peers = {k: v for k, v in timings.items() if k not in dict(ours)}
        if "tapegrad" in timings and peers:
            best = min(peers, key=lambda k: peers[k][1])
            ratio = timings["tapegrad"][1] / peers[best][1]
            rows.append({"problem": prob["name"], "tapegrad_over_best_peer_gradient": ratio,
                         "best_peer": best})
            print(f"{'':<30} {'':<10} tapegrad gradient / best peer ({best}): {ratio:.2f}x")
            for impl, key in (("tg fma", "fma"), ("tg capture", "captured"),
                              ("capt. loss", "captured_loss")):
                if impl in timings:
                    ours_over = timings[impl][1] / peers[best][1]
                    rows[-1][f"{key}_over_best_peer_gradient"] = ours_over
                    print(f"{'':<30} {'':<10} {impl} gradient / best peer: {ours_over:.2f}x; "
                          f"/ tapegrad's primal {timings[impl][1] / timings['tapegrad'][0]:.2f}x")
    for impl, why in skipped.items():
        print(f"skipped {impl}: {why}")
    return rows


WARMUP = 5   # untimed primal/gradient pairs before each implementation's timed ones


def _alternating_medians(primal: Callable[[], Any], grad: Callable[[], Any], repeats: int
                         ) -> tuple[float, float]:
    """Median milliseconds of ``primal`` and of ``grad``, timed in turn: a shared machine's
    slow minute then slows both, and their ratio (the table's grad/primal) stays honest.
    (Not interleaved with the other implementations: a call after another library's calls
    runs cold: tapegrad's 4M-element sin took 6-9 ms that way against 2.9 ms in a loop,
    which measures a warm-up, not the kernels.)  The first ``WARMUP`` pairs are not timed:
    the first calls after the first one still run slower (tapegrad's heat gradient: 4.3-4.9
    ms for its first few, then 3.8-4.3, with no page faults or collections in either), and
    a loop that asks for gradients runs in the steady state after them."""
    for _ in range(WARMUP):
        primal()
        grad()
    p_ms, g_ms = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        primal()
        t1 = time.perf_counter()
        grad()
        t2 = time.perf_counter()
        p_ms.append((t1 - t0) * 1e3)
        g_ms.append((t2 - t1) * 1e3)
    return float(np.median(p_ms)), float(np.median(g_ms))
