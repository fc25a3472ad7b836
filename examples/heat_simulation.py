"""A time-stepping simulation differentiated end to end: how does the final heat in the middle
of a rod depend on the initial temperature and on the conductivity?
Run: python examples/heat_simulation.py"""

import numpy as np

import tapegrad as tg


@tg.kernel
def step(T_new, T, kappa):
    i = tg.index()
    n = T.size
    if i == 0 or i == n - 1:
        T_new[i] = T[i]                                   # fixed ends
    else:
        T_new[i] = T[i] + kappa * (T[i - 1] - 2.0 * T[i] + T[i + 1])


@tg.kernel
def window(out, T, lo, hi):
    i = tg.index()
    out[i] = T[i] if lo <= i < hi else 0.0


def middle_heat(T0, kappa, steps=200):
    T = tg.copy(T0)                  # a recorded copy: NumPy's T0.copy() would be invisible
    for _ in range(steps):
        T_new = np.empty_like(T)
        step(tg.CPU(), 64)(T_new, T, kappa, ndrange=T.size)
        T = T_new
    W = np.empty_like(T)
    n = T.size
    window(tg.CPU(), 64)(W, T, n // 3, 2 * n // 3, ndrange=n)
    return tg.sum(W)


if __name__ == "__main__":
    n = 90
    T0 = np.zeros(n)
    T0[:10] = 1.0                                         # a hot end
    dT0 = tg.make_zero(T0)
    (derivs,) = tg.autodiff(tg.Reverse, middle_heat, tg.Active, tg.Duplicated(T0, dT0),
                            tg.Active(0.2))
    eps = 1e-6
    fd = (middle_heat(T0, 0.2 + eps) - middle_heat(T0, 0.2 - eps)) / (2 * eps)
    print(f"d heat / d kappa = {derivs[1]:.6f} (finite differences: {fd:.6f})")
    print("sensitivity to the initial temperature, every 10th point:", np.round(dT0[::10], 4))
    assert abs(derivs[1] - fd) < 1e-6 * max(1.0, abs(fd))
    assert tg.testing.check_grad(lambda t: middle_heat(t, 0.2, 50), T0)
