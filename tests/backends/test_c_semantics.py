"""The C printer keeps Python's (and NumPy's) semantics where C's differ: 64-bit integer
literals and shifts, float floor division by zero, ``~`` of a bool, ``for k in range(...)``'s
variable (after the loop, assigned in the body, a step of 0 at run time), negative run-time
tuple indices, tuple locals inside an index, device functions assigning their parameters,
``math.isnan`` of an int, variables named like the generated code's names or C's macros, and
``max`` of many arguments printed once each.

Every kernel runs on each backend (``backend``: the CPU, OpenCL on PoCL, CUDA on a GPU) and is
compared element by element with plain Python or NumPy; the OpenCL harness also compiles each
kernel's CUDA C with NVRTC to an sm_90 cubin (``tests/conftest.py``'s ``cuda_twin``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg
from tests.conftest import copies

BIG = 100000
NAN = float("nan")


def same(got: np.ndarray, want: np.ndarray) -> None:
    """``got`` equals ``want`` element by element (NaN equal to NaN whatever its sign, the
    signs of zeros compared), naming every column that differs."""
    want = np.asarray(want, dtype=got.dtype)

    def sign(x: np.ndarray) -> np.ndarray:
        return np.signbit(x) & (x == x)
    bad = [c for c in range(got.shape[-1]) if not (
        np.array_equal(got[..., c], want[..., c], equal_nan=True)
        and np.array_equal(sign(got[..., c]), sign(want[..., c])))]
    assert not bad, "\n".join(f"column {c}: got {got[..., c].tolist()}, want "
                              f"{want[..., c].tolist()}" for c in bad)


# -- integers: 64-bit literals, shifts and ~ of a bool --------------------------------------


@tg.kernel
def integer_widths(Out, A, K, B):
    i = tg.index()
    Out[i, 0] = BIG * BIG + (1 << K[i])      # int64 literals, not C's 32-bit int
    Out[i, 1] = 65536 ** 2 + K[i]
    Out[i, 2] = A[i] << 20                   # an int32 shifted as an int64
    Out[i, 3] = ~B[i]                        # of a bool: not
    Out[i, 4] = ~A[i] + (A[i] & 7)


def test_integer_literals_and_shifts_are_64_bit_and_invert_of_a_bool_is_not(backend):
    A = np.array([1 << 20, -3], np.int32)
    K = np.array([0, 40])
    B = np.array([True, False])
    Out = np.zeros((2, 5), np.int64)
    integer_widths(backend, 2)(Out, A, K, B, ndrange=2)
    a = A.astype(np.int64)
    want = np.stack([BIG * BIG + (1 << K), 65536 ** 2 + K, a << 20,
                     np.invert(B), ~a + (a & 7)], 1)
    same(Out, want)


# -- floats: // and % by zero as NumPy's, max and min of many arguments ---------------------


@tg.kernel
def float_by_zero(Out, X, Z):
    i = tg.index()
    Out[i, 0] = X[i] // 0.0
    Out[i, 1] = X[i] % 0.0
    Out[i, 2] = X[i] // Z[i]
    Out[i, 3] = X[i] % Z[i]
    Out[i, 4] = max(X[i], 1.0, -2.0, Z[i], X[i] + 1.0, X[i] - 1.0, 3.0, X[i] * 2.0,
                    4.0, X[i] * 3.0, -X[i], 2.0, X[i] + 0.5, Z[i] - 1.0)
    Out[i, 5] = min(X[i], 1.0, Z[i], X[i] - 4.0)


def test_float_floor_division_by_zero_is_numpys_and_max_of_many_prints_each_once(backend):
    X = np.array([5.0, -5.0, 0.0, NAN])
    Z = np.array([0.0, -0.0, 0.0, 0.0])
    Out = np.zeros((4, 6))
    float_by_zero(backend, 4)(Out, X, Z, ndrange=4)
    with np.errstate(all="ignore"):
        want = np.stack([X // 0.0, X % 0.0, X // Z, X % Z], 1).tolist()
    for row, x, z in zip(want, X, Z):
        row.append(max(x, 1.0, -2.0, z, x + 1.0, x - 1.0, 3.0, x * 2.0, 4.0, x * 3.0, -x,
                       2.0, x + 0.5, z - 1.0))
        row.append(min(x, 1.0, z, x - 4.0))
    same(Out, np.array(want))
    if copies(backend):        # (a device's C: max of 14 was 2**13 copies of its first)
        assert len(float_by_zero.source(backend=backend)) < 20000


# -- for k in range(...): Python's loop variable ---------------------------------------------


@tg.kernel
def loop_variables(Out, N, S):
    i = tg.index()
    k = -1
    for k in range(N[i]):  # noqa: B007 (after the loop: its last value, or unchanged)
        pass
    Out[i, 0] = k
    total = 0
    j = 0
    for j in range(N[i]):                    # assigning it leaves the iteration alone
        j += 10
        total += j
    Out[i, 1] = total * 100 + j
    c = 0
    for m in range(5, 0, S[i]):              # a step known at run time: 0 runs none
        c += m
    Out[i, 2] = c
    acc = 0
    for a in range(N[i], -1, -2):            # counting down, with continue, break and nesting
        if a == 3:
            continue
        if a == 1:
            break
        for a2 in range(a):
            acc += a2
        acc += 100 * a
    Out[i, 3] = acc * 100 + a
    g = 0
    t = 0
    for g in range(3):                       # a loop holding a barrier (c/barriers.py)
        tg.synchronize()
        g += 10
        t += g
    Out[i, 4] = t * 100 + g


def _loop_reference(n: int, s: int) -> list[int]:
    k = -1
    for k in range(n):  # noqa: B007
        pass
    total, j = 0, 0
    for j in range(n):
        j += 10
        total += j
    c = 0 if s == 0 else sum(range(5, 0, s))        # (Python refuses a step of 0)
    acc, a = 0, 0
    for a in range(n, -1, -2):
        if a == 3:
            continue
        if a == 1:
            break
        acc += sum(range(a)) + 100 * a
    t, g = 0, 0
    for g in range(3):
        g += 10
        t += g
    return [k, total * 100 + j, c, acc * 100 + a, t * 100 + g]


def test_a_loop_variable_behaves_as_pythons(backend):
    N = np.array([5, 0, 8, 7])
    S = np.array([-1, 3, 2, -2])
    Out = np.zeros((4, 5), np.int64)
    loop_variables(backend, 4)(Out, N, S, ndrange=4)
    same(Out, np.array([_loop_reference(n, s) for n, s in zip(N, S)]))


def test_a_step_of_zero_known_at_run_time_runs_no_iteration(backend):
    # (Python raises ValueError; a kernel cannot: a device's loop ran forever, and Numba's
    # ValueError stopped the work-item and the rest of its task; both run none now)
    N = np.array([5, 0, 8, 7])
    S = np.array([0, 0, 0, -1])
    Out = np.zeros((4, 5), np.int64)
    loop_variables(backend, 4)(Out, N, S, ndrange=4)
    same(Out, np.array([_loop_reference(n, s) for n, s in zip(N, S)]))


# -- tuples, device functions, math of ints, names -------------------------------------------


@tg.func
def bumped(x, y):
    x += 1                                   # a device function's own copy of its argument
    y = y * 2
    return x * 10 + y


@tg.kernel
def tuples_and_names(Out, C, A, K):
    i = tg.index()
    t = (10, 20, 30)
    Out[i, 0] = t[K[i]]                      # negative run-time index: from the end
    A_shape0 = 99                            # named like A's extent, t's component, macros
    t_0 = 7
    INFINITY = 3
    NAN = 2
    M_PI = 1
    FLT_MAX = 5
    DBL_EPSILON = 6
    Out[i, 1] = (A.shape[0] * 1000 + A_shape0 + t[0] + t_0 + INFINITY + NAN + M_PI
                 + FLT_MAX + DBL_EPSILON)
    row = (i,)                               # a tuple local as part of an index
    Out[row, 2] = bumped(K[i], 3)
    Out[row, 3] = (math.isnan(K[i]) * 100 + math.isinf(A[i]) * 10 + math.isfinite(K[i]))
    J = (i, 1)
    C[J, 0] = A[i] + 0.5
    C[i, 0, 0] = -1.0


def test_tuples_device_functions_isnan_of_ints_and_names_as_generated_ones(backend):
    K = np.array([-2, -3, 1, 2])
    A = np.array([4, 5, 6, 7])
    Out = np.zeros((4, 4), np.int64)
    C = np.zeros((4, 2, 1))
    tuples_and_names(backend, 4)(Out, C, A, K, ndrange=4)
    t = (10, 20, 30)
    want = [[t[k], 4 * 1000 + 99 + 10 + 7 + 3 + 2 + 1 + 5 + 6, (k + 1) * 10 + 6,
             math.isnan(k) * 100 + math.isinf(a) * 10 + math.isfinite(k)]
            for k, a in zip(K, A)]
    same(Out, np.array(want))
    want_c = np.zeros((4, 2, 1))
    want_c[:, 1, 0] = A + 0.5
    want_c[:, 0, 0] = -1.0
    same(C[..., 0], want_c[..., 0])


@pytest.mark.parametrize("k", [3, -4])
def test_a_run_time_tuple_index_past_its_end_gives_no_value_of_another_component(backend, k):
    # (Python raises IndexError, a kernel cannot: a device's C read the last component, the
    # CPU's Numba raised inside the launch; both give 0 now)
    Out = np.full((4, 4), -1, np.int64)
    tuples_and_names(backend, 4)(Out, np.zeros((4, 2, 1)), np.zeros(4, np.int64),
                                 np.array([0, 1, 2, k]), ndrange=4)
    assert Out[:, 0].tolist() == [10, 20, 30, 0]
