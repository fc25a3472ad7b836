"""``python -m tapegrad bench --backend cuda|opencl``: a GPU backend or OpenCL device, its
results checked against the CPU backend's, and PyTorch's CUDA kernels beside it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.determinism import device_lines
from tapegrad.bench.machine import describe
from tapegrad.bench.overheads import _launch_overheads
from tapegrad.bench.problems import saxpy_k as axpy
from tapegrad.bench.problems import sin_k as sin_kernel
from tapegrad.bench.timing import _median_ms


def _device_ms(backend: Any, fn: Callable[[], Any], repeats: int, calls: int = 10) -> float:
    """Median milliseconds of ``fn`` on ``backend``: on a GPU, ``calls`` calls between one
    pair of CUDA events on CuPy's current stream (so the host's time between the events, some
    20 us, is not counted as the kernel's), per call; else wall time up to the device's
    finish."""
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
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / calls)
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
    ordered = device_lines(backend, n, lambda fn: _device_ms(backend, fn, repeats))
    overheads = _launch_overheads(quick, backend)
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"machine": describe(), "device": repr(backend), "n": n, "copy_gbs": copy_gbs,
                       "max_relative_error_vs_cpu": errors, "results": rows,
                       "torch_cuda": torch_rows, "launch_overhead_us": overheads,
                       "deterministic": ordered}, f,
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
