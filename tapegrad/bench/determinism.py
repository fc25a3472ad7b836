"""The bench's ``tg.deterministic()`` lines: each peer problem's gradient (tapegrad's
functional form) timed with and without it, in turn, in one process.  (That its bits repeat
is tested: tests/backends/test_deterministic.py.)"""

from __future__ import annotations

import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import make_tapegrad, problems
from tapegrad.bench.timing import _median_ms


def deterministic_lines(quick: bool, repeats: int) -> list[dict]:
    """Per problem: gradient ms without and with ``tg.deterministic()``, and their ratio."""
    print(f"\n{'gradient under tg.deterministic()':<34} {'plain':>10} {'ordered':>10} "
          f"{'cost':>7}")
    rows = []
    for p in problems(quick):
        _, gradient = make_tapegrad(p)
        with tg.deterministic():
            gradient()                      # (compiled, and its copies made, before timing)
        plain, ordered = [], []
        for _ in range(repeats):            # (in turn: a slow minute slows both)
            plain.append(_median_ms(gradient, 1))
            with tg.deterministic():
                ordered.append(_median_ms(gradient, 1))
        row = {"problem": p["name"], "plain_ms": float(np.median(plain)),
               "deterministic_ms": float(np.median(ordered))}
        row["cost"] = row["deterministic_ms"] / row["plain_ms"]
        rows.append(row)
        print(f"{row['problem']:<34} {row['plain_ms']:>7.3f} ms {row['deterministic_ms']:>7.3f} "
              f"ms {row['cost']:>6.2f}x")
    return rows
