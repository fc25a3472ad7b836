"""Precision rules of the kernel language.

A float literal, a Python ``float`` argument and ``int / int`` are *weak*: they take the
precision of the float data they meet, so ``2.0 * A[i]`` stays float32 for float32 ``A``.
An int mixed with a float gives that float's type.  NumPy scalars and casts are strong.

Each test compares bit for bit against a NumPy computation done in the claimed precision, and
checks that the data is such that the other precision would give a different answer.
"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

N = 257


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(2024)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    return x, y


def differs(a, b):
    return bool(np.any(np.asarray(a) != np.asarray(b)))


@tg.kernel
def scale_shift(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i] + 0.1


def test_float_literals_are_weak_with_float32_data(backend, data):
    x, _ = data
    B = np.zeros(N, np.float32)
    scale_shift(backend, 64)(B, x, ndrange=N)
    expected = np.float32(2.0) * x + np.float32(0.1)
    np.testing.assert_array_equal(B, expected)
    # computing in float64 and rounding once would give other bits for some elements
    assert differs((2.0 * x.astype(np.float64) + 0.1).astype(np.float32), expected)
    src = scale_shift.source(backend=backend)
    if backend.name in ("opencl", "cuda"):        # C: float literals
        assert "2.0f" in src and "0.1f" in src
    else:
        assert "np.float32(2.0)" in src and "np.float32(0.1)" in src


def test_float64_data_stays_float64(backend, data):
    x, _ = data
    x64 = x.astype(np.float64) / 3.0
    B = np.zeros(N)
    scale_shift(backend, 64)(B, x64, ndrange=N)
    np.testing.assert_array_equal(B, 2.0 * x64 + 0.1)
    assert differs((np.float32(2.0) * x64.astype(np.float32) + np.float32(0.1)), B)
    assert "np.float32" not in scale_shift.source(backend=backend)


def test_weak_expression_is_float32_even_when_stored_into_float64(backend, data):
    x, _ = data
    B = np.zeros(N)
    scale_shift(backend, 64)(B, x, ndrange=N)
    expected = (np.float32(2.0) * x + np.float32(0.1)).astype(np.float64)
    np.testing.assert_array_equal(B, expected)
    assert differs(B, 2.0 * x.astype(np.float64) + 0.1)


@tg.kernel
def axpy(B, a, X, Y):
    i = tg.index()
    B[i] = a * X[i] + Y[i]


def test_python_float_scalar_argument_is_weak(backend, data):
    x, y = data
    B = np.zeros(N)                          # float64 output: the product's precision shows
    axpy(backend, 64)(B, 0.1, x, y, ndrange=N)
    expected32 = np.float32(0.1) * x + y
    np.testing.assert_array_equal(B, expected32.astype(np.float64))
    assert differs(B, 0.1 * x.astype(np.float64) + y)
    B32 = np.zeros(N, np.float32)
    axpy(backend, 64)(B32, 0.1, x, y, ndrange=N)
    np.testing.assert_array_equal(B32, expected32)


def test_numpy_float64_scalar_argument_is_strong(backend, data):
    x, y = data
    B = np.zeros(N)
    axpy(backend, 64)(B, np.float64(0.1), x, y, ndrange=N)
    np.testing.assert_array_equal(B, 0.1 * x.astype(np.float64) + y.astype(np.float64))
    assert differs(B, (np.float32(0.1) * x + y).astype(np.float64))


def test_numpy_float32_scalar_with_float64_data_is_float64(backend, data):
    x, y = data
    x64, y64 = x.astype(np.float64) / 3, y.astype(np.float64) / 7
    B = np.zeros(N)
    axpy(backend, 64)(B, np.float32(0.1), x64, y64, ndrange=N)
    np.testing.assert_array_equal(B, np.float64(np.float32(0.1)) * x64 + y64)


def test_int_times_float32_is_float32(backend, data):
    x, y = data
    B = np.zeros(N)
    axpy(backend, 64)(B, 3, x, y, ndrange=N)     # a Python int scalar
    expected = np.float32(3) * x + y
    np.testing.assert_array_equal(B, expected.astype(np.float64))
    assert differs(B, 3 * x.astype(np.float64) + y)


@tg.kernel
def index_times(B, A):
    i = tg.index()
    B[i] = i * A[i] + A[i] / 3


def test_index_times_float32_data_is_float32(backend, data):
    x, _ = data
    B = np.zeros(N)
    index_times(backend, 64)(B, x, ndrange=N)
    i32 = np.arange(N, dtype=np.float32)
    expected = i32 * x + x / np.float32(3)
    np.testing.assert_array_equal(B, expected.astype(np.float64))
    assert differs(B, np.arange(N) * x.astype(np.float64) + x.astype(np.float64) / 3)


@tg.kernel
def int_division(B, C, D, A, k):
    i = tg.index()
    B[i] = i / 3
    C[i] = A[i] / k
    D[i] = (i / 3) * A[i]


def test_int_over_int_is_a_weak_float(backend):
    A = np.arange(N, dtype=np.int32) - 100
    B, C = np.zeros(N), np.zeros(N)
    D = np.zeros(N)
    int_division(backend, 64)(B, C, D, A, 7, ndrange=N)
    np.testing.assert_array_equal(B, np.arange(N) / 3)
    np.testing.assert_array_equal(C, A / 7)                 # true division, not floor
    assert differs(C, A // 7)
    # a weak float meeting int32 data is float64: D is float64 computed exactly like NumPy
    np.testing.assert_array_equal(D, (np.arange(N) / 3) * A)


@tg.kernel
def weak_div_float32(B, A):
    i = tg.index()
    B[i] = (i / 3) * A[i]


def test_int_over_int_meeting_float32_is_float32(backend, data):
    x, _ = data
    B = np.zeros(N)
    weak_div_float32(backend, 64)(B, x, ndrange=N)
    expected = (np.arange(N) / 3).astype(np.float32) * x
    np.testing.assert_array_equal(B, expected.astype(np.float64))
    assert differs(B, (np.arange(N) / 3) * x.astype(np.float64))


@tg.kernel
def accumulate(B, A, scale):
    i = tg.index()
    s = 0.0
    for k in range(i + 1):
        s += A[k] * scale
    B[i] = s


def test_weak_local_accumulator_takes_data_precision(backend, data):
    x, _ = data
    B = np.zeros(N)
    accumulate(backend, 64)(B, x, 0.1, ndrange=N)
    expected = np.zeros(N)
    s = np.float32(0.0)
    for k in range(N):
        s = np.float32(s + x[k] * np.float32(0.1))
        expected[k] = s
    np.testing.assert_array_equal(B, expected)
    assert differs(B, np.cumsum(x.astype(np.float64) * 0.1))


@tg.kernel
def explicit_casts(B, C, A):
    i = tg.index()
    B[i] = float(i) * A[i]
    C[i] = np.float32(0.1) * np.float64(A[i])


def test_casts_are_strong(backend, data):
    x, _ = data
    B, C = np.zeros(N), np.zeros(N)
    explicit_casts(backend, 64)(B, C, x, ndrange=N)
    np.testing.assert_array_equal(B, np.arange(N) * x.astype(np.float64))
    np.testing.assert_array_equal(C, np.float64(np.float32(0.1)) * x.astype(np.float64))


@tg.kernel
def math_precision(B, A):
    i = tg.index()
    B[i] = tg.sqrt(i) * A[i] + abs(A[i]) ** 0.5


def test_math_of_int_is_weak(backend, data):
    x, _ = data
    B = np.zeros(N)
    math_precision(backend, 64)(B, x, ndrange=N)
    expected = np.sqrt(np.arange(N)).astype(np.float32) * x + np.abs(x) ** np.float32(0.5)
    np.testing.assert_allclose(B, expected.astype(np.float64), rtol=3e-7, atol=1e-7)
    assert not np.allclose(B, np.sqrt(np.arange(N)) * x.astype(np.float64)
                           + np.abs(x.astype(np.float64)) ** 0.5, rtol=1e-12, atol=0)


@tg.kernel
def compare_literal(B, C, A):
    i = tg.index()
    B[i] = A[i] == 0.1
    C[i] = A[i] > 0.1


def test_float_literal_in_comparison_takes_data_precision(backend):
    A = np.array([0.1, 0.2, -0.1, 0.1], np.float32)
    B = np.zeros(4, bool)
    C = np.zeros(4, bool)
    compare_literal(backend, 4)(B, C, A, ndrange=4)
    # NumPy (NEP 50) and tapegrad's weak literals: 0.1 becomes float32(0.1) next to float32 data
    np.testing.assert_array_equal(B, A == 0.1)
    np.testing.assert_array_equal(C, A > 0.1)
    assert B[0] and not C[0]


@tg.kernel
def minmax_where(B, A):
    i = tg.index()
    B[i] = max(A[i], 0.1) + min(A[i], -0.1) + tg.where(A[i] > 0, 0.3, A[i])


def test_min_max_where_with_weak_literals_stay_float32(backend, data):
    x, _ = data
    B = np.zeros(N)
    minmax_where(backend, 64)(B, x, ndrange=N)
    f = np.float32
    expected = np.maximum(x, f(0.1)) + np.minimum(x, f(-0.1)) + np.where(x > 0, f(0.3), x)
    np.testing.assert_array_equal(B, expected.astype(np.float64))
