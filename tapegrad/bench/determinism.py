"""The bench's ``tg.deterministic()`` lines: each peer problem's gradient (tapegrad's
functional form) timed with and without it, in turn, in one process; on a GPU or OpenCL
device, the adjoints whose atomics it orders (a gather's, an ``Active`` scalar's), and
whether their bits repeat.  (Tested: tests/backends/test_deterministic.py, test_ordered.py.)"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import gather_k, make_tapegrad, problems, saxpy_k
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


def device_lines(backend: Any, n: int, timer: Callable[[Callable[[], Any]], float]) -> list[dict]:
    """On ``backend`` (float32, ``n`` work-items): a gather's adjoint (from ``n // 64``
    elements) and ``a x + y``'s with ``Active`` a, timed by ``timer`` without and with
    ``tg.deterministic()``, and whether two ordered runs give the same bits."""
    rng = np.random.default_rng(1)
    m = max(n // 64, 1)
    X, Y = backend.asarray(rng.random(m, dtype=np.float32)), backend.zeros(np.float32, (n,))
    W, Z = backend.asarray(rng.random(n, dtype=np.float32)), backend.zeros(np.float32, (n,))
    V, idx = backend.asarray(rng.random(n, dtype=np.float32)), backend.asarray(rng.integers(0, m, n))
    dX, dW = backend.zeros(np.float32, (m,)), backend.zeros(np.float32, (n,))
    dY, dZ = backend.ones(np.float32, (n,)), backend.ones(np.float32, (n,))
    cases = {
        f"gather adjoint, {n} from {m}": (dX, lambda: tg.autodiff(
            tg.Reverse, gather_k(backend), tg.Const, tg.Duplicated(Y, dY),
            tg.Duplicated(X, dX), idx, ndrange=n)),
        f"a x + y adjoint (Active a), {n}": (None, lambda: tg.autodiff(
            tg.Reverse, saxpy_k(backend), tg.Const, tg.Duplicated(Z, dZ), tg.Active(2.0),
            tg.Const(W), tg.Duplicated(V, dW), ndrange=n)),
    }
    print(f"\n{'adjoint under tg.deterministic()':<40} {'plain':>10} {'ordered':>10} {'cost':>7} "
          f"{'same bits':>9}")
    rows = []
    for label, (shadow, adjoint) in cases.items():
        plain = timer(adjoint)
        ordered = timer(functools.partial(_ordered, adjoint))
        bits = [_bits(shadow, functools.partial(_ordered, adjoint)) for _ in range(2)]
        row = {"adjoint": label, "plain_ms": plain, "deterministic_ms": ordered,
               "cost": ordered / plain, "same_bits": bits[0] == bits[1]}
        rows.append(row)
        print(f"{label:<40} {plain:>7.3f} ms {ordered:>7.3f} ms {row['cost']:>6.2f}x "
              f"{'yes' if row['same_bits'] else 'NO':>9}")
    return rows


def _bits(shadow: Any, adjoint: Callable[[], Any]) -> bytes:
    """The bits of one adjoint's result: ``shadow`` zeroed first, or the Active scalar."""
    if shadow is None:
        return np.float64(adjoint()[0][1]).tobytes()
    shadow[...] = 0
    adjoint()
    return tg.to_numpy(shadow).tobytes()
