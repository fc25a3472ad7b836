"""The cost of calling tapegrad through PyTorch or JAX: a wrapped call's forward and backward
against the same gradient asked of tapegrad directly (``tg.gradient``), for a 64-element kernel
(all overhead) and for the 100-step heat simulation of ``tapegrad.bench.problems``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import sin_k, stencil2d_k


def _interleaved_medians_us(calls: dict[str, Callable[[], Any]], repeats: int) -> dict:
    """Median µs per call of each function, the functions called in turn (one round each per
    repeat) so that a busy moment of the machine falls on all of them alike."""
    for fn in calls.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) * 1e6 for name, t in times.items()}


def _sin_energy(x: np.ndarray) -> Any:
    y = np.empty_like(x)
    sin_k(tg.CPU())(y, x, ndrange=x.size)
    return tg.dot(y, y)


def _heat(t0: np.ndarray) -> Any:
    t = t0
    for _ in range(100):
        out = np.empty_like(t)
        stencil2d_k(tg.CPU(), (8, 32))(out, t, 0.2, ndrange=t.shape)
        t = out
    return tg.sum(t)


def main(quick: bool = False) -> list[dict]:
    cases = [("64-element kernel", _sin_energy, np.linspace(0.0, 1.0, 64), 20 if quick else 400),
             ("heat, 100 steps of 256^2", _heat,
              np.random.default_rng(0).random((256, 256)), 5 if quick else 30)]
    print(f"\n{'wrapped call (forward + backward)':<34} {'tapegrad':>10} {'torch':>10} "
          f"{'jax (jit)':>10}  target: <= 2x + 30 us")
    return [_row(label, f, x, repeats) for label, f, x, repeats in cases]


def _row(label: str, f: Callable[[np.ndarray], Any], x: np.ndarray, repeats: int) -> dict:
    calls: dict[str, Callable[[], Any]] = {"tapegrad": lambda: tg.gradient(f, x)}
    try:
        import torch

        import tapegrad.torch as tgt
        wrapped = tgt.function(f)
        xt = torch.from_numpy(x.copy()).requires_grad_()

        def torch_call() -> None:
            xt.grad = None
            wrapped(xt).backward()
        calls["torch"] = torch_call
    except ImportError:
        pass
    try:
        import jax

        import tapegrad.jax as tgj
        jax.config.update("jax_enable_x64", True)
        grad = jax.jit(jax.grad(tgj.function(f)))
        xj = jax.numpy.asarray(x)
        calls["jax"] = lambda: grad(xj).block_until_ready()
    except ImportError:
        pass
    medians = _interleaved_medians_us(calls, repeats)
    row = {"case": label, "tapegrad_us": medians["tapegrad"],
           "torch_us": medians.get("torch", float("nan")),
           "jax_us": medians.get("jax", float("nan"))}
    base = row["tapegrad_us"]
    row["within_target"] = all(not row[k] > 2 * base + 30 for k in ("torch_us", "jax_us"))
    print(f"{label:<34} {base:>7.0f} us {row['torch_us']:>7.0f} us {row['jax_us']:>7.0f} us"
          f"  ({row['torch_us'] / base:.2f}x, {row['jax_us'] / base:.2f}x)")
    return row
