"""Derivative rules at the edges of their domains (docs/autodiff.md, "Conventions at
non-differentiable points"), in both modes, on every backend and on the host's scalars: each
against exact arithmetic (fractions, 60-digit decimals) or the documented closed form.

- ``max``/``min`` (2 and 3 arguments) and ``np.maximum``/``np.minimum`` send the derivative to
  the argument whose value they return, NaNs and ties included (the expected argument comes
  from Python's own ``max``/``min`` and NumPy's values);
- ``logaddexp`` at infinite arguments and ties, ``fmod``/``%``'s d/dy where ``x / y`` rounds
  to the next integer, ``atan2``/``asinh``/``acosh`` where ``x * x`` over- or underflows,
  ``expm1`` where ``exp(x) - 1`` loses ``exp(x)``, d/dx ``x ** 0`` at +-inf and nan.
"""

from __future__ import annotations

import decimal
import math
from fractions import Fraction

import numpy as np
import pytest

import tapegrad as tg

nan, inf = math.nan, math.inf
_D = decimal.Context(prec=60)


# -- max, min, np.maximum, np.minimum -------------------------------------------------------

@tg.kernel
def selections(B, A):
    i = tg.index()
    B[i, 0] = max(A[i, 0], A[i, 1])
    B[i, 1] = min(A[i, 0], A[i, 1])
    B[i, 2] = max(A[i, 0], A[i, 1], A[i, 2])
    B[i, 3] = min(A[i, 0], A[i, 1], A[i, 2])
    B[i, 4] = np.maximum(A[i, 0], A[i, 1])
    B[i, 5] = np.minimum(A[i, 0], A[i, 1])


SELECTION_ROWS = [(1.0, nan, 0.5), (nan, 1.0, 2.0), (2.0, 2.0, 1.0), (1.5, nan, 2.5),
                  (3.0, nan, nan), (nan, nan, 1.0), (0.5, 1.0, 1.0), (-1.0, -2.0, -3.0),
                  (1.0, 1.0, 1.0), (0.0, -0.0, 0.0)]


def _numpy_pick(value, args):
    """The argument NumPy's maximum/minimum returned: the first NaN where the value is NaN,
    else the first of those equal to it."""
    if math.isnan(value):
        return next(k for k, a in enumerate(args) if math.isnan(a))
    return next(k for k, a in enumerate(args) if a == value)


def _selected(row):
    """Per output column: (the value, the index of the argument whose value it is)."""
    out = []
    for fn, n in ((max, 2), (min, 2), (max, 3), (min, 3)):
        k = fn(range(n), key=lambda j: row[j])       # Python's own choice among the arguments
        out.append((fn(row[:n]), k))
    for ufunc in (np.maximum, np.minimum):
        value = float(ufunc(row[0], row[1]))
        out.append((value, _numpy_pick(value, row[:2])))
    return out


def test_max_min_derivative_goes_to_the_argument_returned(backend):
    A = np.array(SELECTION_ROWS)
    n, cols = len(A), 6
    expected = [_selected(row) for row in SELECTION_ROWS]
    B = np.zeros((n, cols))
    selections(backend, 4)(B, A.copy(), ndrange=n)
    np.testing.assert_array_equal(B, [[v for v, _ in e] for e in expected])

    weights = 2.0 ** np.arange(cols)               # column j's seed 2**j: each sum unique
    dA = np.zeros_like(A)
    tg.autodiff(tg.Reverse, selections(backend, 4), tg.Const,
                tg.Duplicated(np.zeros((n, cols)), np.tile(weights, (n, 1))),
                tg.Duplicated(A.copy(), dA), ndrange=n)
    want = np.zeros_like(A)
    for r, e in enumerate(expected):
        for j, (_, k) in enumerate(e):
            want[r, k] += weights[j]
    np.testing.assert_array_equal(dA, want)

    units = tuple(np.eye(3)[[k] * n] for k in range(3))   # d/dA[:, k], one direction each
    tangents = tuple(np.zeros((n, cols)) for _ in range(3))
    tg.autodiff(tg.Forward, selections(backend, 4), tg.Const,
                tg.BatchDuplicated(np.zeros((n, cols)), tangents),
                tg.BatchDuplicated(A.copy(), units), ndrange=n)
    for k in range(3):
        np.testing.assert_array_equal(
            tangents[k], [[1.0 if sel == k else 0.0 for _, sel in e] for e in expected])


@tg.kernel
def nan_dropping(B, A):
    i = tg.index()
    B[i] = np.fmax(A[i], 0.0)


def test_np_fmax_is_refused_with_the_way_out():
    """np.fmax skips a NaN, which neither max nor np.maximum does: refused at its line."""
    with pytest.raises(tg.KernelSyntaxError, match=r"np\.fmax .*max\(a, b\).*np\.maximum") \
            as info:
        nan_dropping(tg.CPU(), 4)(np.zeros(4), np.ones(4), ndrange=4)
    with open(__file__) as f:
        line = next(k for k, text in enumerate(f, 1) if "B[i] = np.fmax(" in text)
    assert info.value.lineno == line


# -- rows at the edges ----------------------------------------------------------------------

@tg.kernel
def edge_rows(B, A, C, E):
    i = tg.index()
    B[i, 0] = tg.logaddexp(A[i, 0], C[i, 0])
    B[i, 1] = math.fmod(A[i, 1], C[i, 1])
    B[i, 2] = A[i, 2] % C[i, 2]
    B[i, 3] = math.atan2(A[i, 3], C[i, 3])
    B[i, 4] = math.asinh(A[i, 4])
    B[i, 5] = math.acosh(A[i, 5])
    B[i, 6] = math.expm1(A[i, 6])
    B[i, 7] = math.pow(A[i, 7], E[i, 0])         # E: 0, a run-time exponent, Const
    B[i, 8] = A[i, 8] ** E[i, 1]


def _dec(x) -> decimal.Decimal:
    return decimal.Decimal(float(x))               # (exact)


def _logaddexp(x, y):
    if x == y:
        return 0.5, 0.5                            # the documented tie, infinite ones too
    if x == inf or y == -inf:
        return 1.0, 0.0
    if y == inf or x == -inf:
        return 0.0, 1.0
    px = float(_D.divide(1, _D.add(1, _D.exp(_D.subtract(_dec(y), _dec(x))))))
    return px, float(_D.divide(1, _D.add(1, _D.exp(_D.subtract(_dec(x), _dec(y))))))


def _quotient(x, y, rounding):
    """Minus the exact integer quotient: r = x - q * y holds exactly (IEEE remainders)."""
    return 1.0, -float(rounding(Fraction(float(x)) / Fraction(float(y))))


def _atan2(x, y):
    fx, fy = Fraction(float(x)), Fraction(float(y))
    h2 = fx * fx + fy * fy
    return float(fy / h2), float(-fx / h2)


def _inv_sqrt(v: decimal.Decimal) -> float:
    return float(_D.divide(1, _D.sqrt(v)))


def _cases(dtype):
    """Per column: (x, y) pairs; the expected partials are computed from the dtype's values."""
    tiny, huge = (1e-200, 1e200) if dtype == np.float64 else (1e-23, 1e20)
    remainders = [(1.0, 0.1), (2.0, 0.1), (1.0, 0.2), (-1.0, 0.1), (1.0, -0.1), (7.0, 3.0),
                  (5.0, 0.1), (-7.5, 2.0)]
    return [
        [(inf, 0.0), (0.0, inf), (-inf, -inf), (inf, inf), (3.0, -inf), (-inf, 2.0),
         (1.5, 1.5), (0.3, -0.4)],
        remainders,
        remainders,
        [(tiny, tiny), (huge, huge), (3 * tiny, -4 * tiny), (0.5, 2.0), (-2.5 * huge, huge)],
        [(huge, 0.0), (-huge / 3, 0.0), (0.5, 0.0), (-2.0, 0.0)],
        [(huge, 0.0), (1.5, 0.0), (3.0, 0.0)],
        [(-20.0, 0.0), (-40.0, 0.0), (1.0, 0.0), (-1e-3, 0.0)],
        [(inf, 0.0), (-inf, 0.0), (nan, 0.0), (2.0, 0.0), (0.0, 0.0)],
        [(inf, 0.0), (-inf, 0.0), (nan, 0.0), (2.0, 0.0), (0.0, 0.0)],
    ]


def _partials(col, x, y):
    x, y = float(x), float(y)
    if col == 0:
        return _logaddexp(x, y)
    if col == 1:
        return _quotient(x, y, math.trunc)
    if col == 2:
        return _quotient(x, y, math.floor)
    if col == 3:
        return _atan2(x, y)
    if col == 4:
        return _inv_sqrt(_D.add(_D.multiply(_dec(x), _dec(x)), 1)), 0.0
    if col == 5:
        return _inv_sqrt(_D.subtract(_D.multiply(_dec(x), _dec(x)), 1)), 0.0
    if col == 6:
        return float(_D.exp(_dec(x))), 0.0
    return 0.0, 0.0                                # x ** 0 == 1 for every x


def _edge_inputs(dtype):
    cases = _cases(dtype)
    n = max(len(c) for c in cases)
    A, C = np.zeros((n, len(cases)), dtype), np.ones((n, len(cases)), dtype)
    for col, pairs in enumerate(cases):
        pairs = pairs + [pairs[-1]] * (n - len(pairs))     # (padded with the last case)
        A[:, col] = [x for x, _ in pairs]
        C[:, col] = [y for _, y in pairs]
    dx = np.array([[_partials(c, A[r, c], C[r, c])[0] for c in range(len(cases))]
                   for r in range(n)])
    dy = np.array([[_partials(c, A[r, c], C[r, c])[1] for c in range(len(cases))]
                   for r in range(n)])
    return A, C, np.zeros((n, 2), dtype), dx, dy


def _close(got, want, dtype, what):
    rtol = 1e-13 if dtype == np.float64 else 2e-6
    got = np.asarray(got, np.float64)
    bad = ~((got == want) | (np.abs(got - want) <= rtol * np.abs(want)))
    assert not bad.any(), f"{what}: at {np.argwhere(bad).tolist()}: got {got[bad]}, " \
                          f"expected {want[bad]}"


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
def test_edge_partials_in_both_modes(backend, dtype):
    A, C, E, dx, dy = _edge_inputs(dtype)
    n, cols = A.shape
    dA, dC = np.zeros_like(A), np.zeros_like(C)
    tg.autodiff(tg.Reverse, edge_rows(backend, 4), tg.Const,
                tg.Duplicated(np.zeros((n, cols), dtype), np.ones((n, cols), dtype)),
                tg.Duplicated(A.copy(), dA), tg.Duplicated(C.copy(), dC), E, ndrange=n)
    _close(dA, dx, dtype, "reverse d/dx")
    _close(dC, dy, dtype, "reverse d/dy")

    # forward: d/dx along (1, 0), d/dy along (0, 1), in one launch
    ones, zeros = np.ones_like(A), np.zeros_like(A)
    tangents = (np.zeros((n, cols), dtype), np.zeros((n, cols), dtype))
    tg.autodiff(tg.Forward, edge_rows(backend, 4), tg.Const,
                tg.BatchDuplicated(np.zeros((n, cols), dtype), tangents),
                tg.BatchDuplicated(A.copy(), (ones, zeros)),
                tg.BatchDuplicated(C.copy(), (zeros.copy(), ones.copy())), E, ndrange=n)
    _close(tangents[0], dx, dtype, "forward d/dx")
    _close(tangents[1], dy, dtype, "forward d/dy")


def test_host_scalars_edge_partials():
    """The host's tape (reverse) and forward-mode scalars evaluate the same rows (and
    Python's own max and min of tape scalars follow the value)."""
    for row in SELECTION_ROWS:
        for fn, n in ((max, 2), (min, 2), (max, 3), (min, 3)):
            grads = tg.gradient(lambda *s, fn=fn: fn(s), *row[:n])
            k = fn(range(n), key=lambda j: row[j])
            assert list(grads) == [1.0 if j == k else 0.0 for j in range(n)], (fn, row)
    functions = [tg.logaddexp, tg.fmod, lambda a, b: a % b, tg.atan2,
                 lambda a, b: tg.asinh(a) + 0.0 * b, lambda a, b: tg.acosh(a) + 0.0 * b,
                 lambda a, b: tg.expm1(a) + 0.0 * b, lambda a, b: tg.pow(a, 0.0) + 0.0 * b,
                 lambda a, b: a ** 0.0 + 0.0 * b]
    for col, pairs in enumerate(_cases(np.float64)):
        for x, y in pairs:
            want = _partials(col, x, y)
            f = functions[col]
            got = tg.gradient(f, x, y)
            _close(got, np.array(want), np.float64, f"host reverse, column {col} at {(x, y)}")
            if col < 4:       # forward: one argument at a time (the other a plain number)
                _, tx = tg.jvp(lambda s, f=f, y=y: f(s, y), x, 1.0)
                _, ty = tg.jvp(lambda s, f=f, x=x: f(x, s), y, 1.0)
                _close([tx, ty], np.array(want), np.float64,
                       f"host forward, column {col} at {(x, y)}")
