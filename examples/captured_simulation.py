"""A nonlinear reaction-diffusion simulation captured with tg.capture: its first call records
the 300 launches, later calls replay them (and their reverse sweep) without the Python loop.
Here a gradient descent fits the initial state to an observed final state.
Run: python examples/captured_simulation.py"""

import time

import numpy as np

import tapegrad as tg


@tg.kernel
def react_diffuse(u_new, u, rate):
    i = tg.index()
    n = u.size
    if i == 0 or i == n - 1:
        u_new[i] = u[i]
    else:
        lap = u[i - 1] - 2.0 * u[i] + u[i + 1]
        u_new[i] = u[i] + 0.2 * lap - rate * u[i] * u[i] * u[i]   # diffusion, cubic damping


def simulate(u, rate, steps=300):
    for _ in range(steps):
        u_new = np.empty_like(u)
        react_diffuse(tg.CPU())(u_new, u, rate, ndrange=u.size)
        u = u_new
    return u


captured = tg.capture(simulate)       # the same function, replayed after its first call


def misfit(run, u0, observed):
    d = tg.copy(run(u0, 0.05))
    return tg.dot(d, d) - 2.0 * tg.dot(d, observed)   # |d - observed|^2 less a constant


if __name__ == "__main__":
    x = np.linspace(0.0, 1.0, 200)
    truth = 2.0 * np.exp(-((x - 0.4) / 0.05) ** 2)
    observed = simulate(truth, 0.05)
    u0 = np.zeros_like(x)
    (g_plain,) = tg.gradient(lambda u: misfit(simulate, u, observed), u0)
    for _ in range(3):    # records, writes its reverse down, then replays both compiled
        (g,) = tg.gradient(lambda u: misfit(captured, u, observed), u0)
    assert np.allclose(g, g_plain, rtol=1e-12, atol=1e-14)
    for label, run in (("uncaptured", simulate), ("captured", captured)):
        t = time.perf_counter()
        tg.gradient(lambda u, run=run: misfit(run, u, observed), u0)
        print(f"{label}: one gradient of 300 steps in {(time.perf_counter() - t) * 1e3:.1f} ms")
    first = float(np.sum((captured(u0, 0.05) - observed) ** 2))
    for _ in range(200):                                  # plain gradient descent
        (g,) = tg.gradient(lambda u: misfit(captured, u, observed), u0)
        u0 = u0 - 0.1 * g
    last = float(np.sum((captured(u0, 0.05) - observed) ** 2))
    print(f"final-state misfit {first:.3e} -> {last:.3e} after 200 captured gradients")
    assert last < 0.02 * first
