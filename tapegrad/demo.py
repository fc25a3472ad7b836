"""``tapegrad demo``: recover the initial temperature of a 2-D plate from its temperature 100
time steps later, by gradient descent through the whole simulation.

Each loss evaluation runs 100 kernel launches under a tape; ``tg.gradient`` runs their adjoint
kernels backwards.  The demo prints the loss falling, checks the gradient against central
finite differences, reports timings, and (with matplotlib) writes a PNG of the fields.
Exits non-zero if a check fails.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import tapegrad as tg

N = 48          # grid points per side
STEPS = 100     # explicit time steps per simulation (= kernel launches)
ALPHA = 0.2     # diffusion number (stable below 0.25)


@tg.kernel
def heat_step(T_new, T, alpha):
    """One explicit step of the 2-D heat equation; the border is held at 0."""
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = T.shape
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        T_new[i, j] = 0.0
    else:
        T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                         + T[i, j + 1] - 4.0 * T[i, j])


@tg.kernel
def misfit(R, T, observed):
    """R = T - observed, element by element."""
    i, j = tg.index(tg.Global, tg.NTuple)
    R[i, j] = T[i, j] - observed[i, j]


def simulate(T0: np.ndarray) -> np.ndarray:
    """The temperature after STEPS steps (each a kernel launch)."""
    cpu = tg.get_backend(T0)
    T = tg.copy(T0)                       # recorded: the tape sees T0 flow into T
    for _ in range(STEPS):
        T_next = np.empty_like(T)
        heat_step(cpu, (8, 16))(T_next, T, ALPHA, ndrange=T.shape)
        T = T_next
    return T


def make_loss(observed: np.ndarray):
    def loss(T0: np.ndarray):
        R = np.empty_like(observed)
        misfit(tg.get_backend(R), (8, 16))(R, simulate(T0), observed, ndrange=R.shape)
        return tg.dot(R, R)
    return loss


def true_initial_field() -> np.ndarray:
    y, x = np.mgrid[0:N, 0:N] / (N - 1)
    blobs = ((0.3, 0.3, 0.08, 1.0), (0.7, 0.6, 0.12, 0.7), (0.45, 0.75, 0.05, 1.2))
    T = sum(a * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * s ** 2)) for cx, cy, s, a in blobs)
    T[0, :] = T[-1, :] = T[:, 0] = T[:, -1] = 0.0
    return T


def value_and_gradient(loss, T0: np.ndarray) -> tuple[float, np.ndarray]:
    """One recorded simulation gives both (Enzyme's ReverseWithPrimal)."""
    g = tg.make_zero(T0)
    _, value = tg.autodiff(tg.ReverseWithPrimal, loss, tg.Active, tg.Duplicated(T0, g))
    return float(value), g


def gradient_check(loss, T0: np.ndarray, grad: np.ndarray, probes: int = 6) -> float:
    """Largest relative error of the gradient against central differences at a few points."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(probes):
        idx = (int(rng.integers(1, N - 1)), int(rng.integers(1, N - 1)))
        eps = 1e-4
        plus, minus = T0.copy(), T0.copy()
        plus[idx] += eps
        minus[idx] -= eps
        fd = (float(loss(plus)) - float(loss(minus))) / (2 * eps)
        worst = max(worst, abs(grad[idx] - fd) / max(abs(fd), 1e-12))
    return worst


def main() -> int:
    print(f"tapegrad {tg.__version__} demo: recover a {N}x{N} plate's initial temperature from "
          f"its temperature {STEPS} time steps later ({STEPS} kernel launches per simulation)")
    truth = true_initial_field()
    observed = simulate(truth)
    loss = make_loss(observed)

    T0 = np.zeros((N, N))
    t0 = time.perf_counter()
    (g,) = tg.gradient(loss, T0)              # first call compiles (or loads) the kernels
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    value = float(loss(T0))
    forward_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    (g,) = tg.gradient(loss, T0)
    gradient_ms = (time.perf_counter() - t0) * 1e3
    check = gradient_check(loss, T0, g)
    print(f"gradient check against central finite differences: max relative error {check:.1e} "
          f"({'ok' if check < 1e-6 else 'FAILED'})")
    print(f"timings: first gradient {first:.2f} s (compiling or loading kernels), then "
          f"simulation + loss {forward_ms:.1f} ms, gradient {gradient_ms:.1f} ms "
          f"({gradient_ms / forward_ms:.1f}x)")

    # conjugate gradients: the problem is linear least squares, so an exact line search only
    # needs one more simulation of the search direction (with no observation subtracted)
    zero_obs = np.zeros_like(observed)
    print(f"{'iter':>5} {'loss':>12} {'|grad|':>10} {'error vs truth':>15}")
    direction, g_prev = -g, g
    start = value
    iterations = 30
    t0 = time.perf_counter()
    for it in range(iterations + 1):
        if it % 5 == 0:
            err = np.linalg.norm(T0 - truth) / np.linalg.norm(truth)
            print(f"{it:>5} {value:>12.4e} {np.linalg.norm(g):>10.3e} {err:>14.1%}")
        if it == iterations:
            break
        Ad_norm2 = float(make_loss(zero_obs)(direction))          # |A d|^2: one simulation
        step = -float(np.vdot(g, direction)) / (2 * Ad_norm2)
        T0 = T0 + step * direction
        value, g = value_and_gradient(loss, T0)
        beta = float(np.vdot(g, g) / np.vdot(g_prev, g_prev))
        direction, g_prev = -g + beta * direction, g
    solve_s = time.perf_counter() - t0
    print(f"loss fell from {start:.3e} to {value:.3e} in {iterations} iterations "
          f"({solve_s:.1f} s: {iterations * 2 * STEPS} kernel launches and "
          f"{iterations * STEPS} adjoint launches)")
    _plot(truth, observed, T0)
    ok = check < 1e-6 and value < 1e-3 * start
    print("all checks passed" if ok else "SOME CHECKS FAILED")
    return 0 if ok else 1


def _plot(truth: np.ndarray, observed: np.ndarray, recovered: np.ndarray) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(install matplotlib to get a picture of the fields)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6))
    for ax, field, title in zip(axes, (truth, observed, recovered),
                                ("true initial temperature", f"observed after {STEPS} steps",
                                 "recovered initial temperature")):
        im = ax.imshow(field, cmap="inferno")
        ax.set_title(title)
        ax.axis("off")
        fig.colorbar(im, ax=ax, shrink=0.8)
    fig.tight_layout()
    fig.savefig("tapegrad_demo.png", dpi=100)
    print("wrote tapegrad_demo.png")


if __name__ == "__main__":
    sys.exit(main())
