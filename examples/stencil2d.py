"""A 2-D five-point stencil (explicit heat equation), ping-ponging two buffers, and the
vector-Jacobian product of one step.
Run: python examples/stencil2d.py"""

import numpy as np

import tapegrad as tg


@tg.kernel
def heat_step(T_new, T, alpha):
    i, j = tg.index(tg.Global, tg.NTuple)          # one work-item per grid point
    n, m = T.shape
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        T_new[i, j] = T[i, j]                       # fixed border
    else:
        T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                         + T[i, j + 1] - 4.0 * T[i, j])


if __name__ == "__main__":
    n = 64
    T = np.zeros((n, n))
    T[n // 2 - 4: n // 2 + 4, n // 2 - 4: n // 2 + 4] = 1.0
    ref = T.copy()
    T_new = T.copy()
    step = heat_step(tg.CPU(), (8, 16))            # workgroups of 8 x 16 work-items
    for _ in range(50):
        step(T_new, T, 0.2, ndrange=T.shape)
        T, T_new = T_new, T
        ref[1:-1, 1:-1] = ref[1:-1, 1:-1] + 0.2 * (ref[:-2, 1:-1] + ref[2:, 1:-1] + ref[1:-1, :-2]
                                                   + ref[1:-1, 2:] - 4.0 * ref[1:-1, 1:-1])
    print(f"after 50 steps: peak {T.max():.4f}, max |T - numpy| = {np.abs(T - ref).max():.1e}")
    assert np.allclose(T, ref)

    # The vector-Jacobian product of one step, functional form: w is read and left as it is,
    # dT is overwritten (no make_zero_ first), and only the adjoint runs (T_new is not wanted).
    w = np.random.default_rng(0).random((n, n))
    dT = np.empty((n, n))
    tg.autodiff(tg.Reverse, step, tg.Const, tg.DuplicatedNoNeed(T_new, w), tg.Duplicated(T, dT),
                0.2, ndrange=T.shape, accumulate=False)
    expected = np.zeros((n, n))                     # the step's transpose, written by hand
    inner = w[1:-1, 1:-1]
    expected[1:-1, 1:-1] += (1 - 4 * 0.2) * inner
    for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        expected[1 + di:n - 1 + di, 1 + dj:n - 1 + dj] += 0.2 * inner
    border = np.ones((n, n), bool)
    border[1:-1, 1:-1] = False
    expected[border] += w[border]
    print(f"J^T w: max |dT - by hand| = {np.abs(dT - expected).max():.1e}")
    assert np.allclose(dT, expected)
