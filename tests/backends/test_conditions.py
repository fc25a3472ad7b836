"""``and`` / ``or`` chains on the CPU: tests of indices and shapes are evaluated without a
branch per operand (``&``, ``|``); chains that load from arrays keep short-circuiting, which
may be what keeps a load inside the array."""

import numpy as np

import tapegrad as tg


@tg.kernel
def edges(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if (i == 0 or j == 0 or i == n - 1 or j == m - 1) and not (i == j and i < 3):
        Y[i, j] = X[i, j] + 1.0
    elif i > 0 and i < n - 1 and (j > 1 or j * 2 == 2):
        Y[i, j] = 2.0 * X[i, j]
    else:
        Y[i, j] = 0.0


@tg.kernel
def guarded(Y, X):
    i = tg.index()
    # the load is evaluated only when the index is inside the array
    if i + 1 < X.size and X[i + 1] > X[i]:
        Y[i] = 1.0
    else:
        Y[i] = 0.0


def _edges_reference(x: np.ndarray) -> np.ndarray:
    n, m = x.shape
    y = np.zeros_like(x)
    for i in range(n):
        for j in range(m):
            if (i == 0 or j == 0 or i == n - 1 or j == m - 1) and not (i == j and i < 3):
                y[i, j] = x[i, j] + 1.0
            elif 0 < i < n - 1 and (j > 1 or j * 2 == 2):
                y[i, j] = 2.0 * x[i, j]
    return y


def test_index_tests_evaluate_without_branches():
    x = np.random.default_rng(0).random((9, 13))
    y = np.full_like(x, np.nan)
    cpu = tg.CPU()
    edges(cpu, (4, 8))(y, x, ndrange=x.shape)
    np.testing.assert_array_equal(y, _edges_reference(x))
    source = edges.source(backend=cpu)
    assert " | " in source and " & " in source
    body = [ln for ln in source.splitlines() if not ln.strip().startswith("#")]
    assert not any(" or " in ln for ln in body)


def test_a_chain_with_a_load_keeps_short_circuiting():
    x = np.array([3.0, 1.0, 2.0, 5.0, 4.0])
    y = np.full_like(x, np.nan)
    cpu = tg.CPU()
    guarded(cpu, 4)(y, x, ndrange=x.size)
    np.testing.assert_array_equal(y, [0.0, 1.0, 1.0, 0.0, 0.0])
    body = [ln for ln in guarded.source(backend=cpu).splitlines()
            if not ln.strip().startswith("#")]
    assert any(" and " in ln and "X[" in ln for ln in body)
