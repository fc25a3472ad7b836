"""The same benchmark problems written for the peers: NumPy with hand-written derivatives,
JAX (``jit(grad)``), PyTorch autograd, NVIDIA Warp (``wp.Tape``) and Taichi (``ti.ad.Tape``).

Each ``make_<peer>(problem)`` returns ``(primal, gradient)`` callables for one problem, or
raises ``Unavailable`` when the peer is not installed or has no version of that problem.
Every gradient is that of ``loss = <w, output>`` with respect to the problem's inputs, computed
the cheapest way each system offers: without the primal value where it is not needed (NumPy by
hand, ``jax.grad``, tapegrad with the output ``DuplicatedNoNeed``) and with the forward pass
for the taping systems (PyTorch, Warp, Taichi), which need it; all run on the CPU, on the problem's own float32 data (copied once into the peer's arrays).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class Unavailable(Exception):
    """This peer cannot run this problem here (not installed, or not written for it)."""


Pair = tuple[Callable[[], Any], Callable[[], Any]]


# -- NumPy, derivatives by hand ----------------------------------------------------------

def make_numpy(p: dict) -> Pair:
    kind, x, w = p["kind"], p["x"], p["w"]
    if kind == "sin":
        out = np.empty_like(x)
        return (lambda: np.sin(x, out=out), lambda: w * np.cos(x))
    if kind == "saxpy":
        a, y = p["a"], p["y"]
        return (lambda: a * x + y,
                lambda: (a * w, w, float(np.vdot(w, x))))
    if kind == "stencil1d":
        def primal():
            out = np.zeros_like(x)
            out[1:-1] = x[:-2] - 2 * x[1:-1] + x[2:]
            return out

        def grad():
            g = np.zeros_like(x)
            wi = w[1:-1]
            g[:-2] += wi
            g[1:-1] -= 2 * wi
            g[2:] += wi
            return g
        return primal, grad
    if kind == "stencil2d":
        alpha = p["alpha"]

        def primal():
            out = x.copy()
            out[1:-1, 1:-1] += alpha * (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2]
                                        + x[1:-1, 2:] - 4 * x[1:-1, 1:-1])
            return out

        def grad():
            g = w.copy()
            wi = alpha * w[1:-1, 1:-1]
            g[:-2, 1:-1] += wi
            g[2:, 1:-1] += wi
            g[1:-1, :-2] += wi
            g[1:-1, 2:] += wi
            g[1:-1, 1:-1] -= 4 * wi
            return g
        return primal, grad
    if kind == "gather":
        idx = p["idx"]

        def grad():
            v = x[idx]
            return np.bincount(idx, 2 * v * w, minlength=x.size).astype(x.dtype)
        return (lambda: x[idx] ** 2), grad
    if kind == "matmul":
        b = p["b"]
        return (lambda: x @ b), (lambda: (w @ b.T, x.T @ w))
    if kind == "heat":
        alpha, steps = p["alpha"], p["steps"]

        def step(t):
            out = t.copy()
            out[1:-1, 1:-1] += alpha * (t[:-2, 1:-1] + t[2:, 1:-1] + t[1:-1, :-2]
                                        + t[1:-1, 2:] - 4 * t[1:-1, 1:-1])
            return out

        def step_t(g):   # the transpose of one step
            out = g.copy()
            gi = alpha * g[1:-1, 1:-1]
            out[:-2, 1:-1] += gi
            out[2:, 1:-1] += gi
            out[1:-1, :-2] += gi
            out[1:-1, 2:] += gi
            out[1:-1, 1:-1] -= 4 * gi
            return out

        def primal():
            t = x
            for _ in range(steps):
                t = step(t)
            return t

        def grad():
            g = w
            for _ in range(steps):
                g = step_t(g)
            return g
        return primal, grad
    raise Unavailable(kind)


# -- JAX ----------------------------------------------------------------------------------

def make_jax(p: dict) -> Pair:
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        raise Unavailable("jax is not installed") from None
    jax.config.update("jax_platforms", "cpu")
    kind = p["kind"]
    x, w = jnp.asarray(p["x"]), jnp.asarray(p["w"])

    if kind == "sin":
        def f(x):
            return jnp.sin(x)
        args = (x,)
    elif kind == "saxpy":
        y, a = jnp.asarray(p["y"]), jnp.float32(p["a"])

        def f(x, y, a):
            return a * x + y
        args = (x, y, a)
    elif kind == "stencil1d":
        def f(x):
            return jnp.zeros_like(x).at[1:-1].set(x[:-2] - 2 * x[1:-1] + x[2:])
        args = (x,)
    elif kind in ("stencil2d", "heat"):
        alpha, steps = p["alpha"], p.get("steps", 1)

        def step(_, t):
            return t.at[1:-1, 1:-1].add(alpha * (t[:-2, 1:-1] + t[2:, 1:-1] + t[1:-1, :-2]
                                                 + t[1:-1, 2:] - 4 * t[1:-1, 1:-1]))

        def f(t):   # a rolled loop: unrolling 100 steps makes XLA compile for minutes
            return jax.lax.fori_loop(0, steps, step, t)
        args = (x,)
    elif kind == "gather":
        idx = jnp.asarray(p["idx"])

        def f(x):
            return x[idx] ** 2
        args = (x,)
    elif kind == "matmul":
        b = jnp.asarray(p["b"])

        def f(x, b):
            return x @ b
        args = (x, b)
    else:
        raise Unavailable(kind)
    primal = jax.jit(f)
    # w is an argument, not a captured constant: XLA would otherwise fold the gradient of a
    # linear problem into a constant at compile time
    grad = jax.jit(jax.grad(lambda w, *a: jnp.vdot(w, f(*a)),
                            argnums=tuple(range(1, len(args) + 1))))
    return (lambda: primal(*args).block_until_ready(),
            lambda: jax.block_until_ready(grad(w, *args)))


# -- PyTorch --------------------------------------------------------------------------------

def make_torch(p: dict) -> Pair:
    try:
        import torch
    except ImportError:
        raise Unavailable("torch is not installed") from None
    kind = p["kind"]
    x = torch.from_numpy(p["x"].copy()).requires_grad_(True)
    w = torch.from_numpy(p["w"].copy())
    leaves = [x]
    if kind == "sin":
        def f():
            return torch.sin(x)
    elif kind == "saxpy":
        y = torch.from_numpy(p["y"].copy()).requires_grad_(True)
        a = torch.tensor(p["a"], dtype=x.dtype, requires_grad=True)
        leaves += [y, a]

        def f():
            return a * x + y
    elif kind == "stencil1d":
        def f():
            return torch.nn.functional.pad(x[:-2] - 2 * x[1:-1] + x[2:], (1, 1))
    elif kind in ("stencil2d", "heat"):
        alpha, steps = p["alpha"], p.get("steps", 1)

        def f():
            t = x
            for _ in range(steps):
                inner = t[1:-1, 1:-1] + alpha * (t[:-2, 1:-1] + t[2:, 1:-1] + t[1:-1, :-2]
                                                 + t[1:-1, 2:] - 4 * t[1:-1, 1:-1])
                t = torch.cat([t[:1], torch.cat([t[1:-1, :1], inner, t[1:-1, -1:]], 1), t[-1:]])
            return t
    elif kind == "gather":
        idx = torch.from_numpy(p["idx"])

        def f():
            return x[idx] ** 2
    elif kind == "matmul":
        b = torch.from_numpy(p["b"].copy()).requires_grad_(True)
        leaves.append(b)

        def f():
            return x @ b
    else:
        raise Unavailable(kind)

    def primal():
        with torch.no_grad():
            return f()

    def grad():
        for leaf in leaves:
            leaf.grad = None
        f().backward(w)
        return [leaf.grad for leaf in leaves]
    return primal, grad


# -- NVIDIA Warp ------------------------------------------------------------------------------

_WARP: dict[str, Any] = {}


def _warp_kernels() -> dict[str, Any]:
    if _WARP:
        return _WARP
    try:
        import warp as wp
    except ImportError:
        raise Unavailable("warp-lang is not installed") from None
    wp.config.quiet = True
    wp.init()

    @wp.kernel
    def sin_k(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = wp.sin(x[i])

    @wp.kernel
    def saxpy_k(a: wp.array(dtype=float), x: wp.array(dtype=float), y: wp.array(dtype=float),
                z: wp.array(dtype=float)):
        i = wp.tid()
        z[i] = a[0] * x[i] + y[i]

    @wp.kernel
    def stencil1d_k(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        n = x.shape[0]
        if i > 0 and i < n - 1:
            y[i] = x[i - 1] - 2.0 * x[i] + x[i + 1]

    @wp.kernel
    def stencil2d_k(t: wp.array2d(dtype=float), out: wp.array2d(dtype=float), alpha: float):
        i, j = wp.tid()
        n = t.shape[0]
        m = t.shape[1]
        if i > 0 and j > 0 and i < n - 1 and j < m - 1:
            out[i, j] = t[i, j] + alpha * (t[i - 1, j] + t[i + 1, j] + t[i, j - 1]
                                           + t[i, j + 1] - 4.0 * t[i, j])
        else:
            out[i, j] = t[i, j]

    _WARP.update(wp=wp, sin=sin_k, saxpy=saxpy_k, stencil1d=stencil1d_k, stencil2d=stencil2d_k)
    return _WARP


def make_warp(p: dict) -> Pair:
    k = _warp_kernels()
    wp = k["wp"]
    kind = p["kind"]
    if kind not in ("sin", "saxpy", "stencil1d", "stencil2d"):
        raise Unavailable(f"no Warp version of {kind}")
    x = wp.array(p["x"], dtype=float, requires_grad=True, device="cpu")
    out = wp.zeros(p["x"].shape, dtype=float, requires_grad=True, device="cpu")
    seed = wp.array(p["w"], dtype=float, device="cpu")
    if kind == "saxpy":
        a = wp.array(np.array([p["a"]], np.float32), dtype=float, requires_grad=True, device="cpu")
        y = wp.array(p["y"], dtype=float, requires_grad=True, device="cpu")
        inputs, arrays = [a, x, y], [a, x, y]
    elif kind == "stencil2d":
        inputs, arrays = [x], [x]
    else:
        inputs, arrays = [x], [x]
    dim = p["x"].shape

    def launch():
        extra = [p["alpha"]] if kind == "stencil2d" else []
        wp.launch(k[kind], dim=dim, inputs=inputs + ([out] if kind != "stencil2d" else [out])
                  + extra, device="cpu")

    def primal():
        launch()
        wp.synchronize_device("cpu")

    def grad():
        tape = wp.Tape()
        with tape:
            launch()
        tape.backward(grads={out: seed})
        wp.synchronize_device("cpu")
        result = [a.grad for a in arrays]
        tape.zero()
        return result
    return primal, grad


# -- Taichi --------------------------------------------------------------------------------------

_TAICHI: dict[str, Any] = {}


def make_taichi(p: dict) -> Pair:
    try:
        import taichi as ti
    except ImportError:
        raise Unavailable("taichi is not installed") from None
    kind = p["kind"]
    if kind not in ("sin", "saxpy", "stencil1d", "stencil2d"):
        raise Unavailable(f"no Taichi version of {kind}")
    if not _TAICHI:
        ti.init(arch=ti.cpu, default_fp=ti.f32, log_level=ti.ERROR)
        _TAICHI["init"] = True
    shape = p["x"].shape
    x = ti.field(ti.f32, shape=shape, needs_grad=True)
    out = ti.field(ti.f32, shape=shape, needs_grad=True)
    w = ti.field(ti.f32, shape=shape)
    loss = ti.field(ti.f32, shape=(), needs_grad=True)
    x.from_numpy(p["x"])
    w.from_numpy(p["w"])
    y = ti.field(ti.f32, shape=shape, needs_grad=True)
    a = ti.field(ti.f32, shape=(), needs_grad=True)
    if kind == "saxpy":
        y.from_numpy(p["y"])
        a[None] = p["a"]
    alpha = p.get("alpha", 0.0)

    @ti.kernel
    def compute():
        if ti.static(kind == "sin"):
            for i in x:
                out[i] = ti.sin(x[i])
        elif ti.static(kind == "saxpy"):
            for i in x:
                out[i] = a[None] * x[i] + y[i]
        elif ti.static(kind == "stencil1d"):
            for i in range(1, shape[0] - 1):
                out[i] = x[i - 1] - 2.0 * x[i] + x[i + 1]
        else:
            for i, j in ti.ndrange((1, shape[0] - 1), (1, shape[1] - 1)):
                out[i, j] = x[i, j] + alpha * (x[i - 1, j] + x[i + 1, j] + x[i, j - 1]
                                               + x[i, j + 1] - 4.0 * x[i, j])

    @ti.kernel
    def reduce():
        for i in ti.grouped(out):
            loss[None] += w[i] * out[i]

    def primal():
        compute()
        ti.sync()

    def grad():
        with ti.ad.Tape(loss=loss):
            compute()
            reduce()
        ti.sync()
        return x.grad
    return primal, grad


PEERS: dict[str, Callable[[dict], Pair]] = {
    "numpy": make_numpy, "jax": make_jax, "torch": make_torch, "warp": make_warp,
    "taichi": make_taichi,
}
