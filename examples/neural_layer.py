"""A small neural network layer written as kernels and trained with tg.gradient.
Run: python examples/neural_layer.py"""

import math

import numpy as np

import tapegrad as tg


@tg.kernel
def dense_tanh(H, W, X, b):
    """H[s, j] = tanh(sum_k W[j, k] X[s, k] + b[j]) for sample s, unit j."""
    s, j = tg.index(tg.Global, tg.NTuple)
    acc = b[j]
    for k in range(X.shape[1]):
        acc += W[j, k] * X[s, k]
    H[s, j] = math.tanh(acc)


@tg.kernel
def readout_error(E, H, v, y):
    """E[s] = (sum_j v[j] H[s, j] - y[s])^2."""
    s = tg.index()
    out = 0.0
    for j in range(H.shape[1]):
        out += v[j] * H[s, j]
    E[s] = (out - y[s]) ** 2


def loss(W, b, v, X, y):
    cpu = tg.CPU()
    H = np.empty((X.shape[0], W.shape[0]))
    dense_tanh(cpu, (16, 8))(H, W, X, b, ndrange=H.shape)
    E = np.empty(X.shape[0])
    readout_error(cpu, 64)(E, H, v, y, ndrange=E.size)
    return tg.mean(E)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, (256, 2))
    y = np.sin(2 * X[:, 0]) * np.cos(X[:, 1])             # the function to learn
    W, b, v = rng.normal(0, 1, (16, 2)), np.zeros(16), rng.normal(0, 0.3, 16)
    assert tg.testing.check_grad(lambda W, b, v: loss(W, b, v, X[:8], y[:8]), W, b, v,
                                 max_elements=8)
    first = float(loss(W, b, v, X, y))
    lr = 0.2
    for epoch in range(301):
        gW, gb, gv = tg.gradient(lambda W, b, v: loss(W, b, v, X, y), W, b, v)
        W -= lr * gW
        b -= lr * gb
        v -= lr * gv
        if epoch % 100 == 0:
            print(f"epoch {epoch:3d}  mean squared error {float(loss(W, b, v, X, y)):.5f}")
    final = float(loss(W, b, v, X, y))
    assert final < 0.2 * first, (first, final)
    print(f"trained: {first:.4f} -> {final:.4f}")
