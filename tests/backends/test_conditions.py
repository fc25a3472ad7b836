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
def guarded_shape(Y, X):
    i = tg.index()
    # a tuple element at an index the first test keeps in range
    if i < 2 and X.shape[i] > 3:
        Y[i] = 1.0
    else:
        Y[i] = 0.0


@tg.kernel
def count_positive_indices(Y):
    i, j = tg.index(tg.Global, tg.NTuple)
    ij = tg.index(tg.Global, tg.NTuple)
    k = 0
    while k < 2 and ij[k] > 0:
        k += 1
    Y[i, j] = k


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


def test_a_tuple_index_an_earlier_test_keeps_in_range_is_not_evaluated_early():
    y = np.full(5, np.nan)
    guarded_shape(tg.CPU(), 4)(y, np.zeros((3, 4)), ndrange=5)
    np.testing.assert_array_equal(y, [0.0, 1.0, 0.0, 0.0, 0.0])
    y2 = np.full((3, 4), np.nan)
    count_positive_indices(tg.CPU(), (2, 2))(y2, ndrange=y2.shape)
    i, j = np.indices(y2.shape)
    np.testing.assert_array_equal(y2, np.where(i > 0, np.where(j > 0, 2, 1), 0))
