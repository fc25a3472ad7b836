"""The benchmark problems (float32 data) and tapegrad's version of each.

Every gradient is that of ``loss = <w, output>`` with respect to the problem's inputs.  For a
single kernel it is one ``tg.autodiff`` with the output ``DuplicatedNoNeed`` and ``w`` as its
shadow: the value of the output is not wanted, so only the adjoint launch runs (as
``jax.grad`` computes no value).  ``make_tapegrad`` uses the functional form
(``accumulate=False``: ``w`` is read, the gradients overwritten, as ``jax.grad`` and NumPy by
hand produce new gradients); ``make_tapegrad_enzyme`` keeps Enzyme's conventions, so the timed
code also copies ``w`` into a shadow the adjoint consumes and zeroes the shadows it adds to.
The simulation is the tape over all its launches (``tg.gradient``; Enzyme's form:
``tg.autodiff`` of the host function into a zeroed shadow).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.peers import Pair

TILE = 16


@tg.kernel
def sin_k(Y, X):
    i = tg.index()
    Y[i] = math.sin(X[i])


@tg.kernel
def saxpy_k(Z, a, X, Y):
    i = tg.index()
    Z[i] = a * X[i] + Y[i]


@tg.kernel
def stencil1d_k(Y, X):
    i = tg.index()
    if i > 0 and i < X.size - 1:
        Y[i] = X[i - 1] - 2.0 * X[i] + X[i + 1]
    else:
        Y[i] = 0.0


@tg.kernel
def stencil2d_k(T_new, T, alpha):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = T.shape
    if i > 0 and j > 0 and i < n - 1 and j < m - 1:
        T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                         + T[i, j + 1] - 4.0 * T[i, j])
    else:
        T_new[i, j] = T[i, j]


@tg.kernel
def gather_k(Y, X, idx):
    i = tg.index()
    v = X[idx[i]]
    Y[i] = v * v


@tg.kernel
def matmul_k(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[li, k] * tile_b[k, lj]
        tg.synchronize()
    C[i, j] = acc


@tg.kernel
def matmul_fma_k(C, A, B):
    """matmul_k with its products added by tg.fma: rounded once, as BLAS's are."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc = tg.fma(tile_a[li, k], tile_b[k, lj], acc)
        tg.synchronize()
    C[i, j] = acc


def problems(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    n = 1 << (18 if quick else 22)
    side = 512 if quick else 2048
    mm = 128 if quick else 512
    heat = 64 if quick else 256

    def f32(*shape: int) -> np.ndarray:
        return rng.random(shape, dtype=np.float32)

    return [
        dict(kind="sin", name=f"sin, {n}", x=f32(n), w=f32(n), bytes_primal=8 * n),
        dict(kind="saxpy", name=f"saxpy (Active a), {n}", x=f32(n), y=f32(n), a=2.0,
             w=f32(n), bytes_primal=12 * n),
        dict(kind="stencil1d", name=f"1-D stencil, {n}", x=f32(n), w=f32(n), bytes_primal=8 * n),
        dict(kind="stencil2d", name=f"2-D stencil, {side}^2", x=f32(side, side),
             w=f32(side, side), alpha=0.1, bytes_primal=8 * side * side),
        dict(kind="gather", name=f"gather, {n} from {n // 64}", x=f32(n // 64), w=f32(n),
             idx=rng.integers(0, n // 64, n).astype(np.int64), bytes_primal=16 * n),
        dict(kind="matmul", name=f"matmul, {mm}^2", x=f32(mm, mm), b=f32(mm, mm),
             w=f32(mm, mm), bytes_primal=12 * mm * mm),
        dict(kind="heat", name=f"heat, 100 steps of {heat}^2", x=f32(heat, heat),
             w=f32(heat, heat), alpha=0.2, steps=100, bytes_primal=800 * heat * heat),
    ]


def make_tapegrad(p: dict, backend: Any = None) -> Pair:
    """tapegrad's primal and gradient of problem ``p``: the functional gradient."""
    return _make(p, backend, accumulate=False)


def make_tapegrad_enzyme(p: dict, backend: Any = None) -> Pair:
    """The same gradient with Enzyme's conventions (the shadows accumulate)."""
    return _make(p, backend, accumulate=True)


def make_tapegrad_fma(p: dict, backend: Any = None) -> Pair | None:
    """The tiled matmul with its products added by ``tg.fma`` (``matmul_fma_k``), as BLAS
    adds them; None for the other problems."""
    if p["kind"] != "matmul":
        return None
    return _make(p, backend, accumulate=False, matmul=matmul_fma_k)


def make_tapegrad_captured(p: dict, backend: Any = None) -> Pair | None:
    """The heat simulation captured (``tg.capture``): its primal and gradient replay without
    the loop's Python; None for the one-launch problems (nothing to capture)."""
    if p["kind"] != "heat":
        return None
    simulate = tg.capture(heat_simulation(p, backend or tg.CPU()))

    def loss(t: np.ndarray) -> Any:
        return tg.dot(simulate(t), p["w"])

    return lambda: simulate(p["x"]), lambda: tg.gradient(loss, p["x"])


def make_tapegrad_captured_loss(p: dict, backend: Any = None) -> Pair | None:
    """The heat loss captured whole, simulation and ``tg.dot``: ``tg.gradient`` of it skips
    the forward, whose values its reverse does not read (the problem is linear), as XLA's
    dead-code elimination does for JAX's ``jit(grad)``."""
    if p["kind"] != "heat":
        return None
    simulate = heat_simulation(p, backend or tg.CPU())
    loss = tg.capture(lambda t: tg.dot(simulate(t), p["w"]))
    return lambda: loss(p["x"]), lambda: tg.gradient(loss, p["x"])


def heat_simulation(p: dict, backend: Any) -> Any:
    """``simulate(t0)``: the heat problem's ``p["steps"]`` stencil steps from a copy of
    ``t0``."""
    cfg, steps, alpha = stencil2d_k(backend, (8, 64)), p["steps"], p["alpha"]

    def simulate(t0: np.ndarray) -> np.ndarray:
        t = tg.copy(t0)
        for _ in range(steps):
            t_new = np.empty_like(t)
            cfg(t_new, t, alpha, ndrange=t.shape)
            t = t_new
        return t
    return simulate


def _make(p: dict, backend: Any, accumulate: bool, matmul: Any = matmul_k) -> Pair:
    cpu = backend or tg.CPU()
    kind, x, w = p["kind"], p["x"], p["w"]
    out = np.empty((x.shape[0], p["b"].shape[1]) if kind == "matmul" else
                   (p["idx"].size,) if kind == "gather" else x.shape, np.float32)
    dx = np.zeros_like(x)
    seed = np.empty_like(out)

    def reverse(cfg: Any, out: Any, *args: Any, ndrange: Any) -> Any:
        if not accumulate:      # w is read, the gradients are overwritten
            return tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(out, w), *args,
                               ndrange=ndrange, accumulate=False)
        seed[...] = w           # the output's shadow: consumed by the adjoint
        dx[...] = 0             # shadows accumulate: start from zero
        for a in args:
            if isinstance(a, tg.Duplicated) and a.dval is not dx:
                a.dval[...] = 0
        return tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(out, seed), *args,
                           ndrange=ndrange)

    if kind == "sin":
        cfg = sin_k(cpu)
        return (lambda: cfg(out, x, ndrange=x.size),
                lambda: reverse(cfg, out, tg.Duplicated(x, dx), ndrange=x.size))
    if kind == "saxpy":
        cfg, y, dy = saxpy_k(cpu), p["y"], np.zeros_like(p["y"])
        a = np.float32(p["a"])
        return (lambda: cfg(out, a, x, y, ndrange=x.size),
                lambda: reverse(cfg, out, tg.Active(a), tg.Duplicated(x, dx),
                                tg.Duplicated(y, dy), ndrange=x.size))
    if kind == "stencil1d":
        cfg = stencil1d_k(cpu)
        return (lambda: cfg(out, x, ndrange=x.size),
                lambda: reverse(cfg, out, tg.Duplicated(x, dx), ndrange=x.size))
    if kind == "stencil2d":
        cfg = stencil2d_k(cpu, (4, 256))
        return (lambda: cfg(out, x, p["alpha"], ndrange=x.shape),
                lambda: reverse(cfg, out, tg.Duplicated(x, dx), p["alpha"], ndrange=x.shape))
    if kind == "gather":
        cfg, idx = gather_k(cpu), p["idx"]
        return (lambda: cfg(out, x, idx, ndrange=idx.size),
                lambda: reverse(cfg, out, tg.Duplicated(x, dx), idx, ndrange=idx.size))
    if kind == "matmul":
        cfg, b, db = matmul(cpu, (TILE, TILE)), p["b"], np.zeros_like(p["b"])
        return (lambda: cfg(out, x, b, ndrange=out.shape),
                lambda: reverse(cfg, out, tg.Duplicated(x, dx), tg.Duplicated(b, db),
                                ndrange=out.shape))
    if kind == "heat":
        simulate = heat_simulation(p, cpu)

        def loss(t: np.ndarray) -> Any:
            return tg.dot(simulate(t), w)

        if accumulate:
            def gradient() -> Any:
                dx[...] = 0
                return tg.autodiff(tg.Reverse, loss, tg.Active, tg.Duplicated(x, dx))
        else:
            def gradient() -> Any:
                return tg.gradient(loss, x)
        return lambda: simulate(x), gradient
    raise ValueError(kind)
