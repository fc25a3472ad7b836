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


def _median_us(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


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
    repeats = 5 if quick else 30
    cases = [("64-element kernel", _sin_energy, np.linspace(0.0, 1.0, 64)),
             ("heat, 100 steps of 256^2", _heat,
              np.random.default_rng(0).random((256, 256)))]
    print(f"\n{'wrapped call (forward + backward)':<34} {'tapegrad':>10} {'torch':>10} "
          f"{'jax (jit)':>10}  target: <= 2x + 30 us")
    return [_row(label, f, x, repeats) for label, f, x in cases]


def _row(label: str, f: Callable[[np.ndarray], Any], x: np.ndarray, repeats: int) -> dict:
    row = {"case": label, "tapegrad_us": _median_us(lambda: tg.gradient(f, x), repeats),
           "torch_us": float("nan"), "jax_us": float("nan")}
    try:
        import torch

        import tapegrad.torch as tgt
        wrapped = tgt.function(f)
        xt = torch.from_numpy(x.copy()).requires_grad_()

        def torch_call() -> None:
            xt.grad = None
            wrapped(xt).backward()
        row["torch_us"] = _median_us(torch_call, repeats)
    except ImportError:
        pass
    try:
        import jax

        import tapegrad.jax as tgj
        jax.config.update("jax_enable_x64", True)
        grad = jax.jit(jax.grad(tgj.function(f)))
        xj = jax.numpy.asarray(x)
        row["jax_us"] = _median_us(lambda: grad(xj).block_until_ready(), repeats)
    except ImportError:
        pass
    base = row["tapegrad_us"]
    row["within_target"] = all(not row[k] > 2 * base + 30 for k in ("torch_us", "jax_us"))
    print(f"{label:<34} {base:>7.0f} us {row['torch_us']:>7.0f} us {row['jax_us']:>7.0f} us"
          f"  ({row['torch_us'] / base:.2f}x, {row['jax_us'] / base:.2f}x)")
    return row
