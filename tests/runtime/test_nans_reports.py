"""tg.debug_nans's reports (a review of them): no statement or inputs are named for an element
whose work-item is not known, the statement is where a local first overflows, and inside
tg.hvp a tangent is named as tg.jvp names it."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg


def raised(call) -> str:
    with tg.debug_nans(), pytest.raises(tg.NonFiniteError) as info:
        call()
    return str(info.value)


@tg.func
def put(x, j, v):
    x[j] = v


@tg.kernel
def kept_and_moved(kept, moved, a, b, c):
    i = tg.index()
    n = a.shape[0]
    put(kept, i, c * a[i] * a[i])       # its own index (through a device function)
    moved[(i + 1) % n] = a[i] / b[i]    # the next work-item's element


def test_an_element_another_work_item_wrote_gets_no_statement_or_inputs(backend):
    kept, moved = np.zeros(3), np.zeros(3)
    message = raised(lambda: kept_and_moved(backend)(kept, moved, np.array([1.0, 1e200, 1.0]),
                                                     np.ones(3), 2.0, ndrange=3))
    line = put.pyfunc.__code__.co_firstlineno + 2     # kept[1] is work-item 1's: named
    assert "wrote inf into kept[1]" in message and "a[1] = 1e+200" in message
    assert f"test_nans_reports.py:{line}: x[j] = v" in message
    a, b = np.array([1.0, 0.0, 1.0]), np.array([1.0, 0.0, 1.0])   # 0/0 in work-item 1
    message = raised(lambda: kept_and_moved(backend)(kept, moved, a, b, 2.0, ndrange=3))
    assert "wrote nan into moved[2] (tg.debug_nans). The work-item that wrote it is not " \
           "known (not every write into moved is at a work-item's own index), so neither " \
           "its statement nor its inputs are named. Its numbers: c = 2.0. Every input " \
           "was finite" in message
    assert "a[2]" not in message and "run again in Python" not in message
    assert moved.tolist() == [0.0] * 3 and kept.tolist() == [0.0] * 3


@tg.func
def lowest():
    return -math.inf                    # meant: not the statement


@tg.kernel
def overflowing(B, A):
    i = tg.index()
    m = lowest()
    t = A[i] * A[i] * A[i]              # inf for A = 1e200: the statement
    u = max(m, t) + 1.0
    B[i] = 2.0 * u


def test_the_statement_is_where_a_local_first_overflows(backend):
    A, B = np.array([1.0, 1e200]), np.zeros(2)
    message = raised(lambda: overflowing(backend)(B, A, ndrange=2))
    line = overflowing.pyfunc.__code__.co_firstlineno + 4
    assert "wrote inf into B[1]" in message
    assert f"run again in Python for that element: test_nans_reports.py:{line}: " \
           "t = A[i] * A[i] * A[i]." in message


@tg.kernel
def root(B, A):
    i = tg.index()
    B[i] = math.sqrt(A[i])              # its tangent is inf at 0


def test_inside_hvp_a_tangent_is_named_as_jvp_names_it(backend):
    def f(A):
        B = np.empty_like(A)
        root(backend)(B, A, ndrange=A.size)
        return tg.sum(B)

    A, v = np.array([1.0, 0.0]), np.ones(2)
    by_jvp = raised(lambda: tg.jvp(f, A, v))
    by_hvp = raised(lambda: tg.hvp(f, A, v))
    line = f.__code__.co_firstlineno + 2
    assert by_hvp.startswith(f"test_nans_reports.py:{line}: the forward-mode launch (values "
                             "and tangents) of kernel root wrote inf into the tangent of B[1]")
    assert by_hvp == by_jvp and "_dot" not in by_hvp
