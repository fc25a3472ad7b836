"""The bench's ``tg.deterministic()`` lines: each peer problem's gradient (tapegrad's
functional form) timed with and without it, in turn, in one process.  (That its bits repeat
is tested: tests/backends/test_deterministic.py.)"""

from __future__ import annotations

import functools
from typing import Any

import tapegrad as tg
from tapegrad.bench.problems import make_tapegrad, problems
from tapegrad.bench.timing import in_turn_ms


def deterministic_lines(quick: bool, repeats: int) -> list[dict]:
    """Per problem: gradient ms without and with ``tg.deterministic()``, and their ratio."""
    print(f"\n{'gradient under tg.deterministic()':<34} {'plain':>10} {'ordered':>10} "
          f"{'cost':>7}")
    rows = []
    for p in problems(quick):
        _, gradient = make_tapegrad(p)
        with tg.deterministic():
            gradient()                      # (compiled, and its copies made, before timing)
        plain, ordered = in_turn_ms(gradient, functools.partial(_ordered, gradient), repeats)
        row = {"problem": p["name"], "plain_ms": plain, "deterministic_ms": ordered}
        row["cost"] = row["deterministic_ms"] / row["plain_ms"]
        rows.append(row)
        print(f"{row['problem']:<34} {row['plain_ms']:>7.3f} ms {row['deterministic_ms']:>7.3f} "
              f"ms {row['cost']:>6.2f}x")
    return rows


def _ordered(gradient: Any) -> Any:
    with tg.deterministic():
        return gradient()
