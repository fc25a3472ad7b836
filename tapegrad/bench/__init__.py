"""``python -m tapegrad bench``: tapegrad side by side with its peers, in one run, on the same
data.

1. Kernels against the same loops written by hand with ``numba.njit(parallel=True)`` and
   against NumPy, and the copy bandwidth measured on the spot (the floor of each kernel).
2. Primal and gradient of seven problems (float32) for tapegrad, NumPy with hand-written
   derivatives, JAX ``jit(grad)``, PyTorch autograd, NVIDIA Warp (``wp.Tape``) and Taichi
   (``ti.ad.Tape``); peers that are not installed are skipped with a note.
3. Adjoint and tangent launches against their primal and against adjoints written by hand.
4. The overhead per launch: a tiny kernel called directly, launched, recorded on a tape,
   its adjoint replayed, and differentiated with ``tg.autodiff``.
5. First-launch compile time and cached-load time, each in a fresh process.

Times are medians of several runs after a warm-up call; in the peers' table each
implementation's primal and gradient are timed in turn, so that a slow minute of a shared
machine slows both and their ratio stays honest.  Benchmarks never run as timed tests; the
test suite only smoke-runs ``--quick``.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

import tapegrad as tg
from tapegrad.backends.numba_cache import njit
from tapegrad.bench.problems import TILE
from tapegrad.bench.problems import matmul_k as matmul
from tapegrad.bench.problems import saxpy_k as axpy
from tapegrad.bench.problems import sin_k as sin_kernel
from tapegrad.bench.problems import stencil2d_k as stencil


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


@njit(parallel=True)
def _numba_saxpy(Y, a, X):
    for i in numba.prange(X.size):
        Y[i] = a * X[i] + Y[i]


@njit(parallel=True)
def _numba_sin(B, A):
    for i in numba.prange(A.size):
        B[i] = math.sin(A[i])


@njit(parallel=True)
def _numba_stencil(T_new, T, alpha):
    n, m = T.shape
    for i in numba.prange(1, n - 1):
        for j in range(1, m - 1):
            T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                             + T[i, j + 1] - 4.0 * T[i, j])


@njit(parallel=True)
def _numba_matmul(C, A, B):
    n, k = A.shape
    m = B.shape[1]
    for i in numba.prange(n):
        for j in range(m):
            C[i, j] = 0.0
        for p in range(k):
            a = A[i, p]
            for j in range(m):
                C[i, j] += a * B[p, j]


@njit(parallel=True)
def _numba_sin_adjoint(B_bar, A, A_bar):
    for i in numba.prange(A.size):
        g = B_bar[i]
        B_bar[i] = 0.0
        A_bar[i] += g * math.cos(A[i])


@njit(parallel=True)
def _numba_axpy_adjoint(Z_bar, a, X, X_bar, Y_bar):
    a_bar = 0.0
    for i in numba.prange(X.size):
        g = Z_bar[i]
        Z_bar[i] = 0.0
        a_bar += g * X[i]
        X_bar[i] += g * a
        Y_bar[i] += g
    return a_bar


def _gradient_cases(quick: bool) -> list[dict]:
    """Adjoint launches against the primal and against the adjoint written by hand."""
    rng = np.random.default_rng(1)
    cpu = tg.CPU()
    n = 1 << (18 if quick else 22)
    A, B, dA, dB = rng.random(n), np.zeros(n), np.zeros(n), np.ones(n)
    X, Y, Z = rng.random(n), rng.random(n), np.zeros(n)
    dX, dY, dZ = np.zeros(n), np.zeros(n), np.ones(n)
    tg.autodiff(tg.Reverse, sin_kernel(cpu), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=n)
    sin_adjoint = sin_kernel.cache[("last", "reverse", cpu)]
    tg.autodiff(tg.Reverse, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ), tg.Active(2.0),
                tg.Duplicated(X, dX), tg.Duplicated(Y, dY), ndrange=n)
    axpy_adjoint = axpy.cache[("last", "reverse", cpu)]
    tA = rng.random(n)
    tg.autodiff(tg.Forward, sin_kernel(cpu), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, tA), ndrange=n)
    sin_tangent = sin_kernel.cache[("last", "forward", cpu)]
    tg.autodiff(tg.Forward, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ), tg.Duplicated(2.0, 1.0),
                tg.Duplicated(X, dX), tg.Duplicated(Y, dY), ndrange=n)
    axpy_tangent = axpy.cache[("last", "forward", cpu)]
    a_out = np.zeros(1)
    return [
        dict(name=f"sin, {n} float64",
             primal=lambda: sin_kernel(cpu)(B, A, ndrange=n),
             adjoint=lambda: sin_adjoint((B, A, dB, dA), (n,)),
             autodiff=lambda: tg.autodiff(tg.Reverse, sin_kernel(cpu), tg.Const,
                                          tg.Duplicated(B, dB), tg.Duplicated(A, dA), ndrange=n),
             hand=lambda: _numba_sin_adjoint(dB, A, dA),
             tangent=lambda: sin_tangent((B, A, dB, tA), (n,))),
        dict(name=f"z = a x + y, Active a, {n} float64",
             primal=lambda: axpy(cpu)(Z, 2.0, X, Y, ndrange=n),
             adjoint=lambda: axpy_adjoint((Z, 2.0, X, Y, dZ, dX, dY, a_out), (n,)),
             autodiff=lambda: tg.autodiff(tg.Reverse, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ),
                                          tg.Active(2.0), tg.Duplicated(X, dX),
                                          tg.Duplicated(Y, dY), ndrange=n),
             hand=lambda: _numba_axpy_adjoint(dZ, 2.0, X, dX, dY),
             tangent=lambda: axpy_tangent((Z, 2.0, X, Y, dZ, 1.0, dX, dY), (n,))),
    ]


def _numpy_stencil(T_new, T, alpha):
    T_new[1:-1, 1:-1] = T[1:-1, 1:-1] + alpha * (T[:-2, 1:-1] + T[2:, 1:-1] + T[1:-1, :-2]
                                                 + T[1:-1, 2:] - 4.0 * T[1:-1, 1:-1])


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


def _cases(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    cpu = tg.CPU()
    n = 1 << (18 if quick else 22)            # 4M float64 elements in the full run
    side = 512 if quick else 2048
    mm = 128 if quick else 512
    X, Y, B = rng.random(n), rng.random(n), np.empty(n)
    T, T_new = rng.random((side, side)), np.zeros((side, side))
    A1, B1, C1 = rng.random((mm, mm)), rng.random((mm, mm)), np.zeros((mm, mm))
    return [
        dict(name=f"saxpy, {n} float64", bytes=3 * n * 8,
             tapegrad=lambda: saxpy(cpu)(Y, 2.0, X, ndrange=n),
             numba=lambda: _numba_saxpy(Y, 2.0, X),
             numpy=lambda: np.add(2.0 * X, Y, out=Y)),
        dict(name=f"sin, {n} float64", bytes=2 * n * 8,
             tapegrad=lambda: sin_kernel(cpu)(B, X, ndrange=n),
             numba=lambda: _numba_sin(B, X),
             numpy=lambda: np.sin(X, out=B)),
        dict(name=f"5-point stencil, {side}x{side} float64", bytes=2 * side * side * 8,
             tapegrad=lambda: stencil(cpu, (4, 256))(T_new, T, 0.1, ndrange=T.shape),
             numba=lambda: _numba_stencil(T_new, T, 0.1),
             numpy=lambda: _numpy_stencil(T_new, T, 0.1)),
        dict(name=f"tiled matmul, {mm}x{mm} float64", bytes=3 * mm * mm * 8,
             tapegrad=lambda: matmul(cpu, (TILE, TILE))(C1, A1, B1, ndrange=C1.shape),
             numba=lambda: _numba_matmul(C1, A1, B1),
             numpy=lambda: np.matmul(A1, B1, out=C1)),
    ]


def _bandwidth_gbs(quick: bool) -> float:
    """Copy bandwidth measured now: the floor a memory-bound kernel could reach."""
    src = np.ones(1 << (22 if quick else 24))
    dst = np.empty_like(src)
    ms = _median_ms(lambda: np.copyto(dst, src), 5)
    return 2 * src.nbytes / (ms * 1e-3) / 1e9


def _device_ms(backend: Any, fn: Callable[[], Any], repeats: int) -> float:
    """Median milliseconds of ``fn`` on ``backend``: between CUDA events on CuPy's current
    stream on a GPU, else wall time up to the device's finish."""
    if backend.name != "cuda":
        def finished() -> None:
            fn()
            backend.synchronize()
        finished()
        return _median_ms(finished, repeats)
    import cupy
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return float(np.median(times))


def device_main(name: str, quick: bool = False, json_path: str | None = None) -> int:
    """A GPU backend (``cuda``) or OpenCL device: host cost per launch, recorded launch and
    replayed adjoint; elementwise kernels' primal against the copy bandwidth and their adjoint
    and tangent against the primal; every result checked against the CPU backend's.  On PoCL
    (OpenCL on the CPU) it measures correctness and overheads, not a GPU's speed."""
    try:
        backend = tg.CUDA() if name == "cuda" else tg.OpenCL()
    except tg.BackendError as e:
        print(f"bench --backend {name}: {e}")
        return 1
    gpu = name == "cuda"
    n = 1 << ((20 if quick else 26) if gpu else (16 if quick else 20))
    repeats = 5 if quick else 20
    rng = np.random.default_rng(0)
    host = {k: rng.random(n, dtype=np.float32) for k in ("A", "X", "Y", "tA")}
    A, X, Y, tA = (backend.asarray(host[k]) for k in ("A", "X", "Y", "tA"))
    B, Z, dA, dX, dY = (backend.zeros(np.float32, (n,)) for _ in range(5))
    dB, dZ = (backend.ones(np.float32, (n,)) for _ in range(2))
    src, dst = backend.ones(np.float32, (n,)), backend.allocate(np.float32, (n,))
    copy_ms = _device_ms(backend, lambda: dst.__setitem__(Ellipsis, src), repeats)
    copy_gbs = 2 * n * 4 / (copy_ms * 1e-3) / 1e9
    print(f"tapegrad {tg.__version__} bench on {backend!r} (n = {n} float32); copy "
          f"bandwidth {copy_gbs:.0f} GB/s")
    errors = _check_against_cpu(backend, host, (A, B, dA, dB, tA, X, Y, Z, dX, dY, dZ), n)
    sin_adj = sin_kernel.cache[("last", "reverse", backend)]
    tg.autodiff(tg.Forward, sin_kernel(backend), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, tA), ndrange=n)
    sin_tan = sin_kernel.cache[("last", "forward", backend)]
    axpy_adj = axpy.cache[("last", "reverse", backend)]
    a_out = backend.zeros(np.float64, (1,))
    cases = [
        ("sin", 2 * n * 4, lambda: sin_kernel(backend)(B, A, ndrange=n),
         lambda: sin_adj((B, A, dB, dA), (n,)), lambda: sin_tan((B, A, dB, tA), (n,))),
        ("z = a x + y (Active a)", 3 * n * 4, lambda: axpy(backend)(Z, 2.0, X, Y, ndrange=n),
         lambda: axpy_adj((Z, 2.0, X, Y, dZ, dX, dY, a_out), (n,)), None),
    ]
    rows = []
    print(f"{'kernel':<26} {'primal':>9} {'of copy bw':>10} {'adjoint':>9} {'adj/primal':>10} "
          f"{'tangent':>9} {'tan/primal':>10}")
    for label, nbytes, primal, adjoint, tangent in cases:
        p_ms = _device_ms(backend, primal, repeats)
        a_ms = _device_ms(backend, adjoint, repeats)
        t_ms = _device_ms(backend, tangent, repeats) if tangent else float("nan")
        frac = nbytes / (p_ms * 1e-3) / 1e9 / copy_gbs
        rows.append({"kernel": label, "primal_ms": p_ms, "adjoint_ms": a_ms, "tangent_ms": t_ms,
                     "fraction_of_copy_bandwidth": frac, "adjoint_over_primal": a_ms / p_ms})
        print(f"{label:<26} {p_ms:>6.3f} ms {frac:>9.0%} {a_ms:>6.3f} ms {a_ms / p_ms:>9.2f}x "
              f"{t_ms:>6.3f} ms {t_ms / p_ms:>9.2f}x")
    torch_rows = _torch_cuda(host, n, repeats) if gpu else {}
    for label, row in torch_rows.items():
        mine = next(r for r in rows if r["kernel"] == label)
        print(f"{label:<26} PyTorch CUDA: primal {row['primal_ms']:.3f} ms, forward + backward "
              f"{row['forward_backward_ms']:.3f} ms; tapegrad primal + adjoint "
              f"{mine['primal_ms'] + mine['adjoint_ms']:.3f} ms")
    overheads = _launch_overheads(quick, backend)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": repr(backend), "n": n, "copy_gbs": copy_gbs,
                       "max_relative_error_vs_cpu": errors, "results": rows,
                       "torch_cuda": torch_rows, "launch_overhead_us": overheads}, f,
                      indent=2)
        print(f"wrote {json_path}")
    worst = max(errors.values())
    print(f"results against the CPU backend's: largest relative difference {worst:.1e} "
          f"({'ok' if worst < 1e-5 else 'WRONG'})")
    return 0 if worst < 1e-5 else 1


def _torch_cuda(host: dict, n: int, repeats: int) -> dict:
    """The same two kernels in PyTorch on the same GPU, where PyTorch has CUDA: the primal,
    and forward + backward through autograd (milliseconds between CUDA events)."""
    try:
        import torch
    except ImportError:
        return {}
    if not torch.cuda.is_available():
        return {}

    def ms(fn: Callable[[], Any]) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        return float(np.median(times))

    a, x, y = (torch.from_numpy(host[k]).cuda() for k in ("A", "X", "Y"))
    b, z, ones = torch.empty_like(a), torch.empty_like(a), torch.ones_like(a)
    a_req, x_req, y_req = (t.clone().requires_grad_() for t in (a, x, y))
    scale = torch.tensor(2.0, device="cuda", requires_grad=True)
    return {
        "sin": {"primal_ms": ms(lambda: torch.sin(a, out=b)),
                "forward_backward_ms": ms(lambda: torch.sin(a_req).backward(ones))},
        "z = a x + y (Active a)": {
            "primal_ms": ms(lambda: torch.add(y, x, alpha=2.0, out=z)),
            "forward_backward_ms": ms(lambda: (scale * x_req + y_req).backward(ones))},
    }


def _check_against_cpu(backend: Any, host: dict, arrays: tuple, n: int) -> dict:
    """Run sin's adjoint and tangent and a x + y's adjoint on ``backend`` and on the CPU from
    the same data; the largest relative difference of each result."""
    cpu = tg.CPU()
    results = {}
    for where, (A, B, dA, dB, tA, X, Y, Z, dX, dY, dZ) in (
            (backend, arrays),
            (cpu, (host["A"], np.zeros(n, np.float32), np.zeros(n, np.float32),
                   np.ones(n, np.float32), host["tA"], host["X"], host["Y"],
                   np.zeros(n, np.float32), np.zeros(n, np.float32), np.zeros(n, np.float32),
                   np.ones(n, np.float32)))):
        tg.autodiff(tg.Reverse, sin_kernel(where), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(A, dA), ndrange=n)
        (da,) = tg.autodiff(tg.Reverse, axpy(where), tg.Const, tg.Duplicated(Z, dZ),
                            tg.Active(2.0), tg.Duplicated(X, dX), tg.Duplicated(Y, dY),
                            ndrange=n)[0][1:2]
        tB = tg.make_zero(B)
        tg.autodiff(tg.Forward, sin_kernel(where), tg.Const, tg.Duplicated(B, tB),
                    tg.Duplicated(A, tA), ndrange=n)
        results[where.name] = {"sin": tg.to_numpy(B), "sin adjoint": tg.to_numpy(dA),
                               "sin tangent": tg.to_numpy(tB), "axpy": tg.to_numpy(Z),
                               "axpy adjoint": tg.to_numpy(dX), "Active a": np.float32(da)}
    return {k: float(np.max(np.abs(v - results["cpu"][k]) / (np.abs(results["cpu"][k]) + 1e-30)))
            for k, v in results[backend.name].items()}


def _peer_table(quick: bool, repeats: int) -> list[dict]:
    from tapegrad.bench.peers import PEERS, Unavailable
    from tapegrad.bench.problems import (
        make_tapegrad,
        make_tapegrad_captured,
        make_tapegrad_captured_loss,
        make_tapegrad_enzyme,
        problems,
    )
    print()
    header = (f"{'problem (float32)':<30} {'implementation':<10} {'primal':>10} {'gradient':>10} "
              f"{'grad/primal':>11}")
    print(header)
    print("-" * len(header))
    rows, skipped = [], {}
    ours = [("tapegrad", make_tapegrad), ("tg Enzyme", make_tapegrad_enzyme),
            ("tg capture", make_tapegrad_captured), ("capt. loss", make_tapegrad_captured_loss)]
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
            for impl, key in (("tg capture", "captured"), ("capt. loss", "captured_loss")):
                if impl in timings:
                    captured = timings[impl][1] / peers[best][1]
                    rows[-1][f"{key}_over_best_peer_gradient"] = captured
                    print(f"{'':<30} {'':<10} {impl} gradient / best peer: {captured:.2f}x; "
                          f"/ uncaptured primal {timings[impl][1] / timings['tapegrad'][0]:.2f}x")
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


def _launch_overheads(quick: bool, backend: Any = None) -> dict:
    """Microseconds per launch of a 64-element kernel, where the work is nothing and the cost
    is all overhead: the compiled kernel called directly, a plain launch, a launch recorded
    on a tape, an adjoint replayed by the tape's sweep, and ``tg.autodiff`` of one launch
    (the costs a simulation of many small steps pays per step), on the CPU or ``backend``."""
    from tapegrad.bench.problems import saxpy_k
    from tapegrad.runtime.launch import prepare
    from tapegrad.tape import chains
    backend = backend or tg.CPU()
    n, steps = 64, 100
    cfg = saxpy_k(backend)
    x = backend.asarray(np.linspace(0.0, 1.0, n, dtype=np.float32))
    w, y = backend.ones(np.float32, (n,)), backend.asarray(np.full(n, 0.5, np.float32))
    z, dx = backend.allocate(np.float32, (n,)), backend.allocate(np.float32, (n,))
    launcher, nd, key = prepare(cfg, (z, 0.5, x, y), n)
    _, bounds = cfg.kernel.cache[key]          # its launch check (tapegrad/runtime/bounds.py)

    def states(x: Any) -> Any:
        for _ in range(steps):
            out = backend.allocate(np.float32, (n,))
            cfg(out, 0.5, x, y, ndrange=n)
            x = out
        return x

    def chain(x: Any) -> Any:
        return tg.sum(states(x))

    def record() -> Any:
        tape = tg.Tape(watch_changes=False)
        with tape:
            loss = chain(x)
        return tape, loss

    def autodiff() -> Any:
        return tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(z, w), 0.5,
                           tg.Duplicated(x, dx), y, ndrange=n, accumulate=False)

    def replay_one_by_one() -> Any:
        chains.enabled = False
        try:
            return tape.gradient(loss, x)
        finally:
            chains.enabled = True

    def sines(x: Any) -> Any:     # (nonlinear steps: each adjoint reads its step's state)
        for _ in range(steps):
            out = backend.allocate(np.float32, (n,))
            sin_kernel(backend)(out, x, ndrange=n)
            x = out
        return tg.sum(x)

    captured, captured_sines = tg.capture(chain), tg.capture(sines)
    repeats = 5 if quick else 20
    tape, loss = record()
    tape.gradient(loss, x)
    autodiff()
    for _ in range(3):      # records, then compiles its replay (and its reverse)
        captured(x)
        tg.gradient(captured, x)
        tg.gradient(captured_sines, x)
        tg.gradient(sines, x)
    us = {
        "kernel_call": _median_ms(lambda: [launcher((z, 0.5, x, y), nd) for _ in range(steps)],
                                  repeats) * 1e3 / steps,
        "launch": _median_ms(lambda: [cfg(z, 0.5, x, y, ndrange=n) for _ in range(steps)],
                             repeats) * 1e3 / steps,
        "launch_check": _median_ms(lambda: [bounds.failing((z, 0.5, x, y), nd)
                                            for _ in range(steps)], repeats) * 1e3 / steps,
        "recorded_launch": _median_ms(record, repeats) * 1e3 / steps,
        "replayed_adjoint": _median_ms(lambda: tape.gradient(loss, x), repeats) * 1e3 / steps,
        "replayed_one_by_one": _median_ms(replay_one_by_one, repeats) * 1e3 / steps,
        "autodiff": _median_ms(lambda: [autodiff() for _ in range(steps)], repeats) * 1e3 / steps,
        "captured_replay": _median_ms(lambda: captured(x), repeats) * 1e3 / steps,
        "captured_gradient": _median_ms(lambda: tg.gradient(captured, x), repeats) * 1e3 / steps,
        "nonlinear_gradient": _median_ms(lambda: tg.gradient(sines, x), repeats) * 1e3 / steps,
        "captured_nonlinear_gradient": _median_ms(lambda: tg.gradient(captured_sines, x),
                                                  repeats) * 1e3 / steps,
    }
    us.update(_captured_kernels_alone(captured, x, repeats, steps))
    print(f"\nper launch of a {n}-element kernel (all overhead): compiled kernel called "
          f"{us['kernel_call']:.1f} us, launch {us['launch']:.1f} us (of which its index "
          f"range check {us['launch_check']:.2f} us), recorded on a tape "
          f"{us['recorded_launch']:.1f} us, adjoint replayed {us['replayed_adjoint']:.1f} us "
          f"({us['replayed_one_by_one']:.1f} us record by record, where the launches are not "
          "one chain: tapegrad/tape/chains.py), "
          f"tg.autodiff {us['autodiff']:.1f} us")
    split = (f", of which the compiled kernels themselves {us['compiled_kernels']:.2f} us: "
             f"{us['captured_overhead']:.2f} us of replay overhead per launch"
             if "compiled_kernels" in us else "")
    how = ("the reverse compiled too" if isinstance(x, np.ndarray)
           else "the reverse's launches packed in advance") + ": tapegrad/capturing/reverse.py"
    print(f"captured (tg.capture) chain of {steps}: replayed {us['captured_replay']:.2f} us per "
          f"launch{split}; its gradient {us['captured_gradient']:.2f} us per launch ({how}); "
          "a chain of sin steps (each "
          f"adjoint reads its state): gradient {us['nonlinear_gradient']:.2f} us per launch "
          f"recorded, {us['captured_nonlinear_gradient']:.2f} us captured")
    return us


def _captured_kernels_alone(captured: Any, x: Any, repeats: int, steps: int) -> dict:
    """A captured replay's compiled launches called without the replay around them (what the
    kernels cost from compiled code), and the replay's overhead per launch beyond that."""
    from tapegrad.backends.cpu.driver import Stretch
    (program,) = next(iter(captured.programs.values()))
    stretches = [what for compiled, what in program.compiled or () if compiled]
    if not stretches or not isinstance(stretches[0], Stretch):
        return {}
    frame = program.frame((x,), fresh_kept=False)
    alone = _median_ms(lambda: [s(frame) for s in stretches], repeats) * 1e3 / steps
    replay = _median_ms(lambda: captured(x), repeats) * 1e3 / steps
    return {"compiled_kernels": alone, "captured_overhead": replay - alone}


def _compile_times() -> dict:
    """First launch with an empty kernel cache, then again in a new process (cache hit)."""
    import subprocess
    import sys
    import tempfile
    code = ("import time, numpy as np; t0 = time.perf_counter(); import tapegrad as tg; "
            "from tapegrad.bench import saxpy; t1 = time.perf_counter(); X = np.ones(16); "
            "saxpy(tg.CPU())(X, 2.0, X, ndrange=16); t2 = time.perf_counter(); "
            "print(t1 - t0, t2 - t1)")
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, TAPEGRAD_CACHE_DIR=cache)
        out = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  env=env, timeout=300)
            out.append([float(v) for v in proc.stdout.split()])
    result = {"import_s": out[1][0], "first_launch_compile_s": out[0][1],
              "first_launch_cached_s": out[1][1]}
    print(f"\nfirst launch of a kernel in a new process: {result['first_launch_compile_s']:.2f} s "
          f"compiling, {result['first_launch_cached_s']:.3f} s from the on-disk cache "
          f"(import tapegrad: {result['import_s']:.2f} s)")
    return result


_BUSY_LOOP = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def _busy_machine(quick: bool) -> dict:
    """The heat gradient with one busy process per core running alongside, against idle: the
    fair share of the cores is about 2x (more threads than granted cores would wait at
    barriers for descheduled ones: tapegrad/backends/cpu/threads.py)."""
    import subprocess
    import sys

    from tapegrad.bench.problems import make_tapegrad, problems
    heat = next(p for p in problems(quick) if p["kind"] == "heat")
    _, gradient = make_tapegrad(heat)
    repeats = 5 if quick else 15
    gradient()
    idle = _median_ms(gradient, repeats)
    cores = os.cpu_count() or 1
    busy = [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(seconds=120)])
            for _ in range(cores)]
    try:
        time.sleep(0.5)                     # (the busy processes started and running)
        loaded = _median_ms(gradient, repeats)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    result = {"kernel": heat["name"], "idle_ms": idle, "busy_ms": loaded,
              "busy_over_idle": loaded / idle, "busy_processes": cores}
    print(f"\nbusy machine ({cores} busy processes, one per core): {heat['name']} gradient "
          f"{idle:.2f} ms idle, {loaded:.2f} ms busy: {loaded / idle:.2f}x (fair share ~2x)")
    return result


def main(quick: bool = False, json_path: str | None = None, backend: str = "cpu") -> int:
    if backend != "cpu":
        return device_main(backend, quick, json_path)
    repeats = 5 if quick else 20
    print(f"tapegrad {tg.__version__} bench ({'quick' if quick else 'full'}): "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"numba {numba.__version__}, numpy {np.__version__}")
    gbs = _bandwidth_gbs(quick)
    print(f"memory bandwidth (numpy copy, measured now): {gbs:.1f} GB/s")
    header = (f"{'kernel':<34} {'first launch':>12} {'tapegrad':>10} {'numba':>10} "
              f"{'numpy':>10} {'tg/numba':>9} {'tg/numpy':>9} {'floor':>8}")
    print(header)
    print("-" * len(header))
    results = []
    for case in _cases(quick):
        t0 = time.perf_counter()
        case["tapegrad"]()
        first = time.perf_counter() - t0
        case["numba"]()
        row = {"kernel": case["name"], "first_launch_s": first}
        for impl in ("tapegrad", "numba", "numpy"):
            row[f"{impl}_ms"] = _median_ms(case[impl], repeats)
        row["floor_ms"] = case["bytes"] / (gbs * 1e9) * 1e3
        row["tg_over_numba"] = row["tapegrad_ms"] / row["numba_ms"]
        row["tg_over_numpy"] = row["tapegrad_ms"] / row["numpy_ms"]
        results.append(row)
        print(f"{row['kernel']:<34} {first:>10.3f} s {row['tapegrad_ms']:>7.3f} ms "
              f"{row['numba_ms']:>7.3f} ms {row['numpy_ms']:>7.3f} ms "
              f"{row['tg_over_numba']:>8.2f}x {row['tg_over_numpy']:>8.2f}x "
              f"{row['floor_ms']:>5.2f} ms")
    print("numba = the same loop written by hand with numba.njit(parallel=True); "
          "floor = bytes moved / bandwidth")
    print()
    header = (f"{'gradient':<38} {'primal':>10} {'adjoint':>10} {'autodiff':>10} "
              f"{'by hand':>10} {'adj/primal':>10} {'adj/hand':>9} {'tangent':>10} "
              f"{'tan/primal':>10}")
    print(header)
    print("-" * len(header))
    gradients = []
    for case in _gradient_cases(quick):
        case["hand"]()
        row = {"kernel": case["name"]}
        for impl in ("primal", "adjoint", "autodiff", "hand", "tangent"):
            row[f"{impl}_ms"] = _median_ms(case[impl], repeats)
        row["adjoint_over_primal"] = row["adjoint_ms"] / row["primal_ms"]
        row["adjoint_over_hand"] = row["adjoint_ms"] / row["hand_ms"]
        row["tangent_over_primal"] = row["tangent_ms"] / row["primal_ms"]
        gradients.append(row)
        print(f"{row['kernel']:<38} {row['primal_ms']:>7.3f} ms {row['adjoint_ms']:>7.3f} ms "
              f"{row['autodiff_ms']:>7.3f} ms {row['hand_ms']:>7.3f} ms "
              f"{row['adjoint_over_primal']:>9.2f}x {row['adjoint_over_hand']:>8.2f}x "
              f"{row['tangent_ms']:>7.3f} ms {row['tangent_over_primal']:>9.2f}x")
    print("adjoint = the generated adjoint kernel's launch; autodiff = tg.autodiff, i.e. the "
          "primal launch, then the adjoint; by hand = the adjoint loop written with numba; "
          "tangent = the forward-mode launch (outputs and tangents)")
    peers = _peer_table(quick, repeats)
    overheads = _launch_overheads(quick)
    from tapegrad.bench.interop import main as interop
    wrapped = interop(quick)
    compile_times = _compile_times()
    busy = _busy_machine(quick)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"bandwidth_gbs": gbs, "quick": quick, "results": results,
                       "gradients": gradients, "peers": peers, "overhead_us": overheads,
                       "compile": compile_times, "busy_machine": busy,
                       "interop": wrapped}, f, indent=2)
        print(f"wrote {json_path}")
    return 0
