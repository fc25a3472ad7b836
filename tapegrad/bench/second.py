"""The bench's ``tg.hvp`` lines: a Hessian-vector product against a gradient of the same
function, in turn, in one process (that hvp is right is tested: tests/ad/test_hvp.py).

The losses are nonlinear (a linear simulation's ``<w, T>`` has a zero Hessian, which hvp
finds without running the reverse sweep): the heat simulation's ``|T|^2``, and ``|y|^2`` of
the sine and gather kernels."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import gather_k, heat_simulation, problems, sin_k
from tapegrad.bench.timing import in_turn_ms


def _loss(p: dict) -> Any:
    kind = p["kind"]
    if kind == "heat":
        simulate = heat_simulation(p, tg.CPU())
        return lambda x: tg.dot(*(simulate(x),) * 2)
    if kind == "sin":
        cfg = sin_k(tg.CPU())
        out = np.empty_like(p["x"])

        def sines(x: np.ndarray) -> Any:
            cfg(out, x, ndrange=x.size)
            return tg.dot(out, out)
        return sines
    cfg, idx = gather_k(tg.CPU()), p["idx"]

    def gathered(x: np.ndarray) -> Any:
        y = np.empty(idx.size, x.dtype)
        cfg(y, x, idx, ndrange=idx.size)
        return tg.dot(y, y)
    return gathered


def hvp_lines(quick: bool, repeats: int) -> list[dict]:
    """Per problem: gradient and hvp ms, and their ratio."""
    print(f"\n{'hvp (reverse over forward)':<34} {'gradient':>10} {'hvp':>10} {'ratio':>7}")
    rows = []
    for p in problems(quick):
        if p["kind"] not in ("sin", "gather", "heat"):
            continue
        loss, x = _loss(p), p["x"]
        v = np.random.default_rng(0).random(x.shape, dtype=x.dtype)
        gradient = functools.partial(tg.gradient, loss, x)
        hvp = functools.partial(tg.hvp, loss, x, v)
        gradient(), hvp()                   # (compiled before timing)
        plain, second = in_turn_ms(gradient, hvp, repeats)
        row = {"problem": p["name"], "gradient_ms": plain, "hvp_ms": second}
        row["ratio"] = row["hvp_ms"] / row["gradient_ms"]
        rows.append(row)
        print(f"{row['problem']:<34} {row['gradient_ms']:>7.3f} ms {row['hvp_ms']:>7.3f} ms "
              f"{row['ratio']:>6.2f}x")
    return rows
