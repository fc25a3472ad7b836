"""``tapegrad demo``: a heat-equation simulation, a tiled matmul and a block reduction on the
CPU backend, each checked against NumPy.  Exits non-zero if any check fails."""

from __future__ import annotations

import time

import numpy as np

import tapegrad as tg

TILE = 16


@tg.kernel
def heat_step(T_new, T, alpha):
    """One explicit step of the 2-D heat equation; the border stays fixed."""
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = T.shape
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        T_new[i, j] = T[i, j]
    else:
        lap = T[i - 1, j] + T[i + 1, j] + T[i, j - 1] + T[i, j + 1] - 4.0 * T[i, j]
        T_new[i, j] = T[i, j] + alpha * lap


@tg.kernel
def matmul(C, A, B):
    """C = A @ B with TILE x TILE tiles staged in workgroup-local memory."""
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
def block_sum(total, x):
    """Sum x: a tree reduction per workgroup in local memory, then one atomic per group."""
    li = tg.index(tg.Local)
    gi = tg.index()
    partial = tg.localmem(x.dtype, tg.groupsize())
    partial[li] = x[gi] if gi < x.size else 0.0
    tg.synchronize()
    stride = tg.groupsize()[0] // 2
    while stride > 0:
        if li < stride:
            partial[li] += partial[li + stride]
        tg.synchronize()
        stride //= 2
    if li == 0:
        tg.atomic_add(total, 0, partial[0])


def _heat_numpy(T: np.ndarray, alpha: float, steps: int) -> np.ndarray:
    T = T.copy()
    for _ in range(steps):
        new = T.copy()
        new[1:-1, 1:-1] = T[1:-1, 1:-1] + alpha * (
            T[:-2, 1:-1] + T[2:, 1:-1] + T[1:-1, :-2] + T[1:-1, 2:] - 4 * T[1:-1, 1:-1])
        T = new
    return T


def _report(name: str, ok: bool, err: float, ms: float) -> bool:
    print(f"  {name:<42} max |error| {err:9.2e}   {ms:8.2f} ms   {'ok' if ok else 'FAILED'}")
    return ok


def main() -> int:
    cpu = tg.CPU()
    rng = np.random.default_rng(0)
    print(f"tapegrad {tg.__version__} demo on {cpu!r}: kernels checked against NumPy")
    results = []

    # 1. heat equation: 100 steps, ping-ponging two buffers
    n, steps, alpha = 128, 100, 0.2
    T0 = np.zeros((n, n))
    T0[n // 4: n // 2, n // 4: 3 * n // 4] = 1.0
    a, b = T0.copy(), np.empty_like(T0)
    t0 = time.perf_counter()
    heat_step(cpu, (8, 32))(b, a, alpha, ndrange=a.shape)     # compiles on first launch
    compile_s = time.perf_counter() - t0
    a, b = T0.copy(), np.empty_like(T0)
    t0 = time.perf_counter()
    step = heat_step(cpu, (8, 32))
    for _ in range(steps):
        step(b, a, alpha, ndrange=a.shape)
        a, b = b, a
    ms = (time.perf_counter() - t0) * 1e3
    err = float(np.abs(a - _heat_numpy(T0, alpha, steps)).max())
    results.append(_report(f"heat equation {n}x{n}, {steps} launches", err < 1e-12, err, ms))

    # 2. tiled matmul with local memory and barriers inside a loop
    A = rng.standard_normal((96, 64))
    B = rng.standard_normal((64, 80))
    C = np.zeros((96, 80))
    matmul(cpu, (TILE, TILE))(C, A, B, ndrange=C.shape)
    t0 = time.perf_counter()
    matmul(cpu, (TILE, TILE))(C, A, B, ndrange=C.shape)
    ms = (time.perf_counter() - t0) * 1e3
    err = float(np.abs(C - A @ B).max())
    results.append(_report("tiled matmul 96x64 @ 64x80 (local memory)", err < 1e-10, err, ms))

    # 3. block reduction with atomics; ndrange rounded up to whole workgroups
    x = rng.random(100_000).astype(np.float32)
    total = np.zeros(1, np.float32)
    groups = -(-x.size // 256)
    block_sum(cpu, 256)(total, x, ndrange=groups * 256)
    total[:] = 0
    t0 = time.perf_counter()
    block_sum(cpu, 256)(total, x, ndrange=groups * 256)
    ms = (time.perf_counter() - t0) * 1e3
    exact = float(np.sum(x, dtype=np.float64))
    err = abs(float(total[0]) - exact) / exact
    results.append(_report("block sum of 100000 float32 (relative)", err < 1e-5, err, ms))

    print(f"  first launch of heat_step: {compile_s:.2f} s (compiled once, then loaded from the "
          "on-disk cache by later runs)")
    if all(results):
        print("all checks passed")
        return 0
    print("SOME CHECKS FAILED")
    return 1
