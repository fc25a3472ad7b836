"""The kernel language, feature by feature, checked against NumPy (or plain Python) on every
backend.

Kernels are defined once at module level and reused across parametrised cases: each distinct
(kernel, argument types, rank, workgroup size) costs one Numba compilation.
"""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest

import tapegrad as tg

SENTINEL = -7


def run(kern, backend, wgs, *args, ndrange):
    kern(backend, wgs)(*args, ndrange=ndrange)


# -- work-item indices ------------------------------------------------------------------------

@tg.kernel
def index_probe(GL, LL, PL, GT, LT, PT, GS, ND, CNT):
    ix = tg.index(tg.Global, tg.NTuple)
    GL[ix] = tg.index(tg.Global, tg.Linear)
    LL[ix] = tg.index(tg.Local)
    PL[ix] = tg.index(tg.Group, tg.Linear)
    lt = tg.index(space=tg.Local, kind=tg.NTuple)
    pt = tg.index(tg.Group, tg.NTuple)
    gs = tg.groupsize()
    nd = tg.ndrange()
    a = 0
    b = 0
    c = 0
    d = 0
    e = 0
    for k in range(GL.ndim):
        a = a * 1000 + ix[k]
        b = b * 1000 + lt[k]
        c = c * 1000 + pt[k]
        d = d * 1000 + gs[k]
        e = e * 1000 + nd[k]
    GT[ix] = a
    LT[ix] = b
    PT[ix] = c
    GS[ix] = d
    ND[ix] = e
    CNT[ix] += 1


def _encode(parts):
    out = np.zeros_like(parts[0])
    for p in parts:
        out = out * 1000 + p
    return out


def _check_indices(backend, nd, wgs):
    """Launch index_probe over ``nd`` with workgroup size ``wgs`` (None: the default) on arrays
    covering the whole group grid, and compare every index kind with NumPy's."""
    W = backend.default_groupsize(len(nd)) if wgs is None else \
        ((wgs,) if isinstance(wgs, int) else tuple(wgs))
    groups = tuple(-(-n // w) for n, w in zip(nd, W))
    padded = tuple(g * w for g, w in zip(groups, W))
    outs = [np.full(padded, SENTINEL, np.int64) for _ in range(8)]
    cnt = np.zeros(padded, np.int32)
    index_probe(backend, wgs)(*outs, cnt, ndrange=nd)
    GL, LL, PL, GT, LT, PT, GS, ND = outs

    inside = np.zeros(padded, bool)
    inside[tuple(slice(0, n) for n in nd)] = True
    # work-items beyond the ndrange never run: nothing outside it was written
    for out in outs:
        assert (out[~inside] == SENTINEL).all()
    assert (cnt[~inside] == 0).all()
    assert (cnt[inside] == 1).all(), "every work-item inside the ndrange runs exactly once"

    ix = np.indices(nd)                                   # global NTuple, one array per dim
    loc = [ix[d] % W[d] for d in range(len(nd))]
    grp = [ix[d] // W[d] for d in range(len(nd))]
    sl = tuple(slice(0, n) for n in nd)
    np.testing.assert_array_equal(GL[sl], np.arange(math.prod(nd)).reshape(nd))  # row-major
    np.testing.assert_array_equal(GT[sl], _encode(list(ix)))
    np.testing.assert_array_equal(LT[sl], _encode(loc))
    np.testing.assert_array_equal(PT[sl], _encode(grp))
    np.testing.assert_array_equal(LL[sl], np.ravel_multi_index(loc, W))
    np.testing.assert_array_equal(PL[sl], np.ravel_multi_index(grp, groups))
    assert (GS[sl] == _encode([np.int64(w) for w in W])).all()
    assert (ND[sl] == _encode([np.int64(n) for n in nd])).all()


@pytest.mark.parametrize("nd, wgs", [
    ((10,), 4),                 # 1-D, last group partial
    ((3,), 8),                  # ndrange smaller than one group
    ((7, 10), (3, 4)),          # 2-D, partial groups in both dimensions
    ((9, 8), (4, 4)),           # 2-D, partial only in the first dimension
    ((5, 7, 9), (2, 3, 4)),     # 3-D
], ids=str)
def test_indices_global_local_group(backend, nd, wgs):
    _check_indices(backend, nd, wgs)


@pytest.mark.parametrize("nd", [(5,), (3, 70)], ids=str)
def test_default_workgroup_size(backend, nd):
    W = backend.default_groupsize(len(nd))
    assert isinstance(W, tuple) and len(W) == len(nd) and all(w > 0 for w in W)
    _check_indices(backend, nd, None)


@pytest.mark.parametrize("nd", [0, (0,), (4, 0)], ids=str)
def test_empty_ndrange_runs_nothing(backend, nd):
    rank = 1 if isinstance(nd, int) else len(nd)
    shape = (4,) * rank
    outs = [np.full(shape, SENTINEL, np.int64) for _ in range(8)]
    cnt = np.zeros(shape, np.int32)
    index_probe(backend, {1: 4, 2: (3, 4)}[rank])(*outs, cnt, ndrange=nd)
    assert (cnt == 0).all()
    assert all((o == SENTINEL).all() for o in outs)


def test_ndrange_accepts_numpy_ints_and_shape(backend):
    outs = [np.full((6, 5), SENTINEL, np.int64) for _ in range(8)]
    cnt = np.zeros((6, 5), np.int32)
    index_probe(backend, (3, 4))(*outs, cnt, ndrange=(np.int64(6), np.int32(5)))
    assert (cnt == 1).all()
    index_probe(backend, (3, 4))(*outs, cnt, ndrange=cnt.shape)
    assert (cnt == 2).all()


# -- scalar arguments ---------------------------------------------------------------------------

@tg.kernel
def scalar_args(B, a, b, flag):
    i = tg.index()
    if flag:
        B[i] = a * i + b
    else:
        B[i] = b - a


@pytest.mark.parametrize("a, b, flag", [
    (2, 3, True),                                   # Python int, int, bool
    (2.5, -0.25, False),                            # Python float (weak)
    (np.int32(-4), np.int64(9), np.bool_(True)),    # NumPy ints and bool
    (np.float32(1.5), np.float64(0.125), True),     # NumPy floats
    (3, 0.5, np.bool_(False)),
], ids=lambda v: type(v).__name__)
def test_scalar_arguments(backend, a, b, flag):
    n = 9
    B = np.full(n, SENTINEL, np.float64)
    scalar_args(backend, 4)(B, a, b, flag, ndrange=n)
    i = np.arange(n)
    expected = float(a) * i + float(b) if flag else np.full(n, float(b) - float(a))
    np.testing.assert_allclose(B, expected, rtol=1e-7)


# -- array dtypes and ranks ----------------------------------------------------------------------

@tg.kernel
def all_dtypes(F32, F64, I32, I64, BL, OUT):
    ix = tg.index(tg.Global, tg.NTuple)
    F32[ix] = F32[ix] * 2.0 + 1.0
    F64[ix] = F64[ix] * 2.0 + 1.0
    I32[ix] = I32[ix] * 3 - 7
    I64[ix] = I64[ix] // 2 + I64[ix] % 5
    flipped = not BL[ix]
    BL[ix] = flipped
    if BL[ix]:
        OUT[ix] = F32[ix] + F64[ix] + I32[ix] + I64[ix]
    else:
        OUT[ix] = -1.0


@pytest.mark.parametrize("shape", [(11,), (5, 6), (3, 4, 5)], ids=str)
def test_every_dtype_in_every_rank(backend, shape):
    rng = np.random.default_rng(len(shape))
    F32 = rng.standard_normal(shape).astype(np.float32)
    F64 = rng.standard_normal(shape)
    I32 = rng.integers(-1000, 1000, shape).astype(np.int32)
    I64 = rng.integers(-10**12, 10**12, shape)
    BL = rng.random(shape) < 0.5
    OUT = np.zeros(shape)
    ref = (F32 * np.float32(2) + np.float32(1), F64 * 2 + 1, (I32 * 3 - 7).astype(np.int32),
           I64 // 2 + I64 % 5, ~BL)
    wgs = {1: 4, 2: (2, 4), 3: (2, 2, 4)}[len(shape)]
    all_dtypes(backend, wgs)(F32, F64, I32, I64, BL, OUT, ndrange=shape)
    for got, want in zip((F32, F64, I32, I64, BL), ref):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    expected_out = np.where(ref[4], ref[0].astype(np.float64) + ref[1] + ref[2] + ref[3], -1.0)
    np.testing.assert_array_equal(OUT, expected_out)


@tg.kernel
def copy2d(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = A[i, j]


def test_non_contiguous_arrays(backend):
    base = np.arange(40.0).reshape(5, 8)
    A = base.T                       # Fortran-ordered view
    out = np.full((16, 5), -1.0)
    B = out[::2]                     # strided view with shape (8, 5)
    copy2d(backend, (4, 4))(B, A, ndrange=B.shape)
    np.testing.assert_array_equal(B, A)
    assert (out[1::2] == -1.0).all()


# -- math --------------------------------------------------------------------------------------

UNARY = ["sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
         "atanh", "exp", "expm1", "log", "log1p", "log2", "log10", "sqrt", "erf", "erfc", "fabs",
         "floor", "ceil", "trunc", "isnan", "isinf", "isfinite"]
BINARY = ["atan2", "hypot", "pow", "copysign", "fmod"]


@tg.kernel
def unary_math(B, A, which):
    i = tg.index()
    x = A[i]
    if which == 0:
        B[i] = math.sin(x)
    elif which == 1:
        B[i] = math.cos(x)
    elif which == 2:
        B[i] = math.tan(x)
    elif which == 3:
        B[i] = math.asin(x)
    elif which == 4:
        B[i] = math.acos(x)
    elif which == 5:
        B[i] = math.atan(x)
    elif which == 6:
        B[i] = math.sinh(x)
    elif which == 7:
        B[i] = math.cosh(x)
    elif which == 8:
        B[i] = math.tanh(x)
    elif which == 9:
        B[i] = math.asinh(x)
    elif which == 10:
        B[i] = math.acosh(x)
    elif which == 11:
        B[i] = math.atanh(x)
    elif which == 12:
        B[i] = math.exp(x)
    elif which == 13:
        B[i] = math.expm1(x)
    elif which == 14:
        B[i] = math.log(x)
    elif which == 15:
        B[i] = math.log1p(x)
    elif which == 16:
        B[i] = math.log2(x)
    elif which == 17:
        B[i] = math.log10(x)
    elif which == 18:
        B[i] = math.sqrt(x)
    elif which == 19:
        B[i] = math.erf(x)
    elif which == 20:
        B[i] = math.erfc(x)
    elif which == 21:
        B[i] = math.fabs(x)
    elif which == 22:
        B[i] = math.floor(x)
    elif which == 23:
        B[i] = math.ceil(x)
    elif which == 24:
        B[i] = math.trunc(x)
    elif which == 25:
        B[i] = tg.where(math.isnan(x), 1.0, 0.0)
    elif which == 26:
        B[i] = tg.where(math.isinf(x), 1.0, 0.0)
    else:
        B[i] = tg.where(math.isfinite(x), 1.0, 0.0)


@tg.kernel
def binary_math(C, A, B, which):
    i = tg.index()
    if which == 0:
        C[i] = math.atan2(A[i], B[i])
    elif which == 1:
        C[i] = math.hypot(A[i], B[i])
    elif which == 2:
        C[i] = math.pow(A[i], B[i])
    else:
        C[i] = math.copysign(A[i], B[i])


@tg.kernel
def fmod_kernel(C, A, B, which):
    # kept apart from binary_math so that a failure of fmod alone cannot hide the others
    i = tg.index()
    C[i] = math.fmod(A[i], B[i])


def _domain(name, n, rng):
    if name in ("asin", "acos", "atanh"):
        return rng.uniform(-0.95, 0.95, n)
    if name == "acosh":
        return rng.uniform(1.0, 4.0, n)
    if name in ("log", "log1p", "log2", "log10", "sqrt"):
        return rng.uniform(0.05, 5.0, n)
    if name in ("isnan", "isinf", "isfinite"):
        return np.array([0.0, -1.5, np.nan, np.inf, -np.inf, 3.0, np.nan, 1e30] * (n // 8))
    return rng.uniform(-3.0, 3.0, n)


def _reference(name, *args):
    if name in ("erf", "erfc"):
        return np.vectorize(getattr(math, name))(*args)
    npname = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
              "acosh": "arccosh", "atanh": "arctanh", "atan2": "arctan2", "pow": "power"}
    out = getattr(np, npname.get(name, name))(*args)
    return out.astype(np.float64)


def _tolerances(dtype):
    return dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", UNARY)
def test_unary_math_matches_numpy(backend, name, dtype):
    rng = np.random.default_rng(UNARY.index(name))
    A = _domain(name, 64, rng).astype(dtype)
    B = np.full(64, SENTINEL, dtype)
    unary_math(backend, 16)(B, A, UNARY.index(name), ndrange=A.size)
    expected = _reference(name, A.astype(np.float64))
    np.testing.assert_allclose(B.astype(np.float64), expected, **_tolerances(dtype))


@tg.kernel
def negated(B, J, M):
    i = tg.index()
    B[i] = -J[i] + -M[i]


def test_negating_an_int32_or_a_bool_gives_an_int64(backend):
    """The types say -int32 and -bool are int64 (as NumPy's scalar rules give for -bool's
    arithmetic); the negation itself must happen in int64, or -(-2**31) wraps."""
    J = np.array([-2 ** 31, 5, 0], np.int32)
    M = np.array([True, False, True])
    B = np.zeros(3, np.int64)
    negated(backend, 4)(B, J, M, ndrange=3)
    np.testing.assert_array_equal(B, -J.astype(np.int64) - M.astype(np.int64))


@tg.kernel
def widened(P, F, J, B, E, X, N):
    i = tg.index()
    P[i, 0] = abs(J[i])
    P[i, 1] = B[i] ** E[i]
    F[i] = X[i] ** N[i]


def _int_power(b, e):
    """docs/language.md: NumPy's int power; a negative exponent gives 0 unless the base is
    1 or -1."""
    if e >= 0:
        return b ** e
    return 1 if b == 1 else (-1) ** (-e) if b == -1 else 0


def test_int32_abs_int_powers_and_float32_integer_powers(backend):
    """abs of an int32 is an int64 (abs(-2**31) must not wrap); 0 ** -1 is 0 as the docs say
    (the CPU gave the most negative int64); a float32 to an integer power is within one ulp
    of the exact power rounded once (the CPU multiplied in float32: 121 ulp off at x**194),
    and a zero to a negative one is an infinity (the CPU raised inside its task: the
    launch wrote nothing, without an error, or stopped as a "tapegrad bug")."""
    J = np.array([-2 ** 31, -5, 7, 0, 3, -1, 2, 9, 1, 1], np.int32)
    B = np.array([0, 0, 0, 2, 1, -1, -1, 3, 1, 1], np.int64)
    E = np.array([-1, 0, 3, -1, -5, -3, -2, 4, 1, 1], np.int64)
    X = np.array([1.0023643, 0.9993, 1.5, -1.25, 3.0, 0.5, -0.75, 1.0001, 0.0, -0.0],
                 np.float32)
    N = np.array([194, 301, 17, 9, -7, 40, 33, 1000, -2, -3], np.int64)
    P, F = np.zeros((10, 2), np.int64), np.zeros(10, np.float32)
    widened(backend, 4)(P, F, J, B, E, X, N, ndrange=10)
    np.testing.assert_array_equal(P[:, 0], np.abs(J.astype(np.int64)))
    np.testing.assert_array_equal(P[:, 1], [_int_power(b, e) for b, e in zip(B.tolist(),
                                                                               E.tolist())])
    exact = np.array([float(x) ** n for x, n in zip(X[:8].tolist(), N[:8].tolist())],
                     np.float32)
    np.testing.assert_array_max_ulp(F[:8], exact, maxulp=1)
    np.testing.assert_array_equal(F[8:], [np.inf, -np.inf])


@tg.kernel
def rounding(B, A):
    i = tg.index()
    B[i, 0] = np.floor(A[i])
    B[i, 1] = math.ceil(A[i])
    B[i, 2] = tg.trunc(A[i])


@tg.kernel
def rounded_index(K, A):
    i = tg.index()
    K[i] = int(math.floor(A[i] + 0.5))     # an int from a rounded float: int(...) says so


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_rounding_keeps_the_float_type_as_numpy_does(backend, dtype):
    """floor/ceil/trunc of a float is a float (nan, inf, 1e20 and the sign of a zero kept):
    as an int64, which Python's math.floor gives, nan and inf had no value and 1e20 wrapped."""
    A = np.array([np.nan, np.inf, -np.inf, 1e20, -2.5, 2.5, -0.5, 0.5, -0.0, 3.0,
                  2.0 ** 60 + 2.0 ** 9, -7.25], dtype)
    B = np.zeros((A.size, 3), dtype)
    rounding(backend, 4)(B, A, ndrange=A.size)
    expected = np.stack([np.floor(A), np.ceil(A), np.trunc(A)], axis=1)
    np.testing.assert_array_equal(B, expected)
    np.testing.assert_array_equal(np.signbit(B), np.signbit(expected))
    finite = A[np.isfinite(A) & (np.abs(A) < 2.0 ** 50)]
    K = np.zeros(finite.size, np.int64)
    rounded_index(backend, 4)(K, finite, ndrange=finite.size)
    np.testing.assert_array_equal(K, np.floor(finite + dtype(0.5)).astype(np.int64))


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
@pytest.mark.parametrize("name", BINARY)
def test_binary_math_matches_numpy(backend, name, dtype):
    rng = np.random.default_rng(7 + BINARY.index(name))
    A = rng.uniform(-3.0, 3.0, 64)
    Bv = rng.uniform(-3.0, 3.0, 64)
    if name == "pow":
        A = np.abs(A) + 0.1
    if name == "fmod":
        Bv = np.where(np.abs(Bv) < 0.2, 0.7, Bv)
    A, Bv = A.astype(dtype), Bv.astype(dtype)
    C = np.full(64, SENTINEL, dtype)
    kern = fmod_kernel if name == "fmod" else binary_math
    kern(backend, 16)(C, A, Bv, BINARY.index(name), ndrange=A.size)
    expected = _reference(name, A.astype(np.float64), Bv.astype(np.float64))
    np.testing.assert_allclose(C.astype(np.float64), expected, **_tolerances(dtype))


@tg.kernel
def math_spellings(B, A):
    i = tg.index()
    x = A[i]
    B[i, 0] = np.sin(x) + tg.cos(x)
    B[i, 1] = np.arctan2(x, 2.0) + tg.atan2(1.0, x)
    B[i, 2] = np.power(abs(x), 1.5) + tg.sqrt(abs(x))
    B[i, 3] = np.absolute(x) + np.minimum(x, 0.25) + np.maximum(x, -0.25)
    B[i, 4] = np.where(x > 0.0, np.exp(x), tg.log1p(x * x))


def test_numpy_and_tg_spellings_of_math(backend):
    A = np.linspace(-2.0, 2.0, 13)
    B = np.zeros((13, 5))
    math_spellings(backend, 8)(B, A, ndrange=13)
    expected = np.stack([
        np.sin(A) + np.cos(A),
        np.arctan2(A, 2.0) + np.arctan2(1.0, A),
        np.abs(A) ** 1.5 + np.sqrt(np.abs(A)),
        np.abs(A) + np.minimum(A, 0.25) + np.maximum(A, -0.25),
        np.where(A > 0, np.exp(A), np.log1p(A * A)),
    ], axis=1)
    np.testing.assert_allclose(B, expected, rtol=1e-13, atol=1e-15)


# -- abs / min / max / where / casts --------------------------------------------------------------

@tg.kernel
def select_ops(B, C, D, E, A):
    i = tg.index()
    B[i] = abs(A[i])
    C[i] = min(A[i], 1)
    D[i] = max(A[i], -1, A[i] * 2)
    E[i] = tg.where(A[i] > 0, A[i], -1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64],
                         ids=lambda d: d.__name__)
def test_abs_min_max_where(backend, dtype):
    A = np.array([-3.5, -1.0, -0.25, 0.0, 0.5, 1.0, 2.75, 7.0, -8.0]).astype(dtype)
    B, C, D, E = (np.full(A.shape, SENTINEL, dtype) for _ in range(4))
    select_ops(backend, 4)(B, C, D, E, A, ndrange=A.size)
    np.testing.assert_array_equal(B, np.abs(A))
    np.testing.assert_array_equal(C, np.minimum(A, 1))
    np.testing.assert_array_equal(D, np.maximum(np.maximum(A, -1), A * 2))
    np.testing.assert_array_equal(E, np.where(A > 0, A, -1))


@tg.kernel
def casts(F32, F64, I32, I64, BL, G, A):
    i = tg.index()
    F32[i] = np.float32(A[i])
    F64[i] = float(np.float32(A[i]))
    I32[i] = np.int32(A[i])
    I64[i] = int(A[i])
    BL[i] = bool(A[i])
    G[i] = np.float64(i) / 4 + float(int(A[i]) + np.int64(1))


def test_casts(backend):
    A = np.array([-2.75, -1.5, -0.5, 0.0, 0.1, 0.5, 1.99, 3.0, 1e8 + 0.5])
    n = A.size
    outs = (np.zeros(n, np.float32), np.zeros(n), np.zeros(n, np.int32),
            np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n))
    casts(backend, 4)(*outs, A, ndrange=n)
    F32, F64, I32, I64, BL, G = outs
    np.testing.assert_array_equal(F32, A.astype(np.float32))
    np.testing.assert_array_equal(F64, A.astype(np.float32).astype(np.float64))
    np.testing.assert_array_equal(I32, A.astype(np.int32))        # truncation toward zero
    np.testing.assert_array_equal(I64, A.astype(np.int64))
    np.testing.assert_array_equal(BL, A != 0)
    np.testing.assert_array_equal(G, np.arange(n) / 4 + (A.astype(np.int64) + 1))


# -- arithmetic ---------------------------------------------------------------------------------

@tg.kernel
def int_ops(Q, R, P, X, A, b):
    i = tg.index()
    a = A[i]
    Q[i] = a // b
    R[i] = a % b
    P[i] = a ** 2 + (a & 6) + (a | 1) - (a ^ 3) + (a << 2) - (a >> 1)
    X[i] = -a + (~a) + abs(a) * 2
    y = a
    y += 3
    y -= b
    y *= 2
    y //= b
    y %= 7
    y **= 2
    y &= 13
    y |= 16
    y ^= 5
    y <<= 1
    y >>= 2
    X[i] += y


@pytest.mark.parametrize("b", [3, -3, 1])
def test_integer_arithmetic_python_semantics(backend, b):
    A = np.arange(-10, 11, dtype=np.int64)
    Q, R, P, X = (np.zeros_like(A) for _ in range(4))
    int_ops(backend, 8)(Q, R, P, X, A, b, ndrange=A.size)
    np.testing.assert_array_equal(Q, A // b)          # floor division, like Python
    np.testing.assert_array_equal(R, A % b)           # sign of the divisor, like Python
    np.testing.assert_array_equal(P, A ** 2 + (A & 6) + (A | 1) - (A ^ 3) + (A << 2) - (A >> 1))
    np.testing.assert_array_equal(X, -A + ~A + np.abs(A) * 2 + [_aug_ref(a, b) for a in A.tolist()])


def _aug_ref(a, b):
    y = a
    y += 3
    y -= b
    y *= 2
    y //= b
    y %= 7
    y **= 2
    y &= 13
    y |= 16
    y ^= 5
    y <<= 1
    y >>= 2
    return y


@tg.kernel
def dtype_edges(K, L, R, Q, B, Y, A, N, M, D, S, IA, IB):
    i = tg.index()
    K[i, 0] = A[i] < N[i] < M[i]
    K[i, 1] = A[i] < D[i] < 0.1
    L[i] = IA[i] << S[i]
    R[i] = IA[i] >> S[i]
    Q[i] = IA[i] // IB[i]
    B[i] += D[i]
    Y[i, 0] = A[i] ** 3
    Y[i, 1] = A[i] * 1e39
    Y[i, 2] = A[i] + 1e-50
    Y[i, 3] = A[i] * 1e-40


def test_dtype_edges_as_numpy_and_python_on_every_backend(backend):
    """Each pair of a chained comparison decides its own types (A32 < N < M compared the ints
    in float32); a shift by 64 or more, or by a negative count, is NumPy's (the CPU's value
    changed with the array's length); the most negative int // -1 wraps (the CPU gave 0);
    B32 += D64 rounds once (the CPU rounded D first); a float32 x ** 3 is rounded once (it
    multiplied in float32); float literals past float32's range become inf, 0 or a
    subnormal (NVRTC refused 1e39f and 1e-50f)."""
    big = 2 ** 25
    A = np.array([-1.0, 0.1, 1.1229205, -2.5, 3.0, 0.75, 1e-3, -0.0], np.float32)
    N = np.array([big + 1, 0, 1, -3, 3, 1, 0, 0], np.int64)
    M = np.array([big + 2, 1, 1, -2, 4, 1, 1, 0], np.int64)
    D = np.array([0.1000000001, 0.1000000001, 2.0 ** -24 + 2.0 ** -50, 0.05,
                  3 * 2.0 ** -23 + 2.0 ** -48, 1.0, 0.099, -1.0])
    S = np.array([64, 65, -1, 63, 1, 0, 100, 2], np.int64)
    IA = np.array([1, -8, 5, -8, 3, -2 ** 63, -2 ** 63, 7], np.int64)
    IB = np.array([-1, 3, -1, 2, 0, -1, 1, -2], np.int64)
    B0 = np.array([1.0, 1.0, 1.0, 0.5, -3.0, 2.0, 1.0, 0.0], np.float32)
    K, L, R, Q = np.zeros((8, 2), bool), *(np.zeros(8, np.int64) for _ in range(3))
    B, Y = B0.copy(), np.zeros((8, 4), np.float32)
    dtype_edges(backend, 4)(K, L, R, Q, B, Y, A, N, M, D, S, IA, IB, ndrange=8)
    a = A.tolist()
    np.testing.assert_array_equal(K[:, 0], [np.float32(x) < np.float32(n) and n < m
                                            for x, n, m in zip(a, N.tolist(), M.tolist())])
    np.testing.assert_array_equal(K[:, 1], [x < d < 0.1 for x, d in zip(a, D.tolist())])
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(L, np.left_shift(IA, S))
        np.testing.assert_array_equal(R, np.right_shift(IA, S))
        np.testing.assert_array_equal(Q, np.floor_divide(IA, IB))
        np.testing.assert_array_equal(B, (B0.astype(np.float64) + D).astype(np.float32))
        wide = A.astype(np.float64)
        np.testing.assert_array_equal(Y[:, 0], (wide * wide * wide).astype(np.float32))
        np.testing.assert_array_equal(Y[:, 1], A * np.float32(1e39))
        np.testing.assert_array_equal(Y[:, 2], A + np.float32(1e-50))
        np.testing.assert_array_equal(Y[:, 3], A * np.float32(1e-40))


@tg.kernel
def augmented_edges(L, R, Q, B, W, S, IB, J, K):
    i = tg.index()
    L[i] <<= S[i]
    R[i] >>= S[i]
    Q[i] //= IB[i]
    B[i] **= 3
    W[i] = J[i] // K[i]


def test_augmented_array_targets_and_int32_as_numpy_on_every_backend(backend):
    """The same rules through A[i] op= v (the CPU's went to Numba's own <<=, >>=, //=, **=:
    1 << 64 gave 1, the float32 cube 1 ulp off) and for int32 operands (-(-2**31) is an
    int64's)."""
    S = np.array([64, 65, -1, 3, 0, 1, 70, 2], np.int64)
    IB = np.array([-1, 3, -1, 2, 0, -1, 1, -2], np.int64)
    L0 = np.array([1, -8, 5, -8, 3, 1, 1, 7], np.int64)
    Q0 = np.array([-2 ** 63, 7, 5, -7, 3, -2 ** 63, 9, 7], np.int64)
    B0 = np.array([1.1229205, -2.5, 0.75, 3.0, 1e-3, -1.0, 0.1, 1.7], np.float32)
    J = np.array([-2 ** 31, 7, -7, 5, 0, -2 ** 31, 1, 3], np.int32)
    K = np.array([-1, -1, 2, 0, 3, 1, -1, -2], np.int32)
    L, R, Q, B, W = L0.copy(), L0.copy(), Q0.copy(), B0.copy(), np.zeros(8, np.int64)
    augmented_edges(backend, 4)(L, R, Q, B, W, S, IB, J, K, ndrange=8)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(L, np.left_shift(L0, S))
        np.testing.assert_array_equal(R, np.right_shift(L0, S))
        np.testing.assert_array_equal(Q, np.floor_divide(Q0, IB))
        wide = B0.astype(np.float64)
        np.testing.assert_array_equal(B, (wide * wide * wide).astype(np.float32))
        np.testing.assert_array_equal(W, np.floor_divide(J.astype(np.int64), K.astype(np.int64)))


@tg.kernel
def float_ops(F, G, A, d):
    i = tg.index()
    x = A[i]
    F[i] = x // d + x % d
    G[i] = x ** 2 + x ** 3 + abs(x) ** 0.5 - (-x) / d
    y = x
    y += 1.5
    y -= d
    y *= 3.0
    y /= d
    y **= 2
    G[i] += y


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_float_arithmetic(backend, dtype):
    A = np.linspace(-3.0, 3.0, 17).astype(dtype)
    d = 0.75
    F = np.zeros_like(A)
    G = np.zeros_like(A)
    float_ops(backend, 8)(F, G, A, d, ndrange=A.size)
    A64 = A.astype(np.float64)
    np.testing.assert_allclose(F, A64 // d + A64 % d, **_tolerances(dtype))
    y = ((A64 + 1.5 - d) * 3.0 / d) ** 2
    expected = A64 ** 2 + A64 ** 3 + np.abs(A64) ** 0.5 + A64 / d + y
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-12)
    np.testing.assert_allclose(G, expected, **tol)


# -- control flow ------------------------------------------------------------------------------

@tg.kernel
def branches(B, C, A):
    i = tg.index()
    x = A[i]
    if x < -1.0:
        B[i] = 1
    elif x < 0.0:
        B[i] = 2
    elif x == 0.0:
        B[i] = 3
    else:
        if x > 2.0 and not x > 3.0:
            B[i] = 4
        elif 0.0 < x <= 1.0 or x > 3.0:
            B[i] = 5
        else:
            B[i] = 6
    C[i] = 7 if x > 0.5 else -7


def _branches_ref(x):
    if x < -1.0:
        return 1
    if x < 0.0:
        return 2
    if x == 0.0:
        return 3
    if 2.0 < x <= 3.0:
        return 4
    if 0.0 < x <= 1.0 or x > 3.0:
        return 5
    return 6


def test_if_elif_else(backend):
    A = np.array([-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 10.0])
    B = np.zeros(A.size, np.int64)
    C = np.zeros(A.size, np.int64)
    branches(backend, 4)(B, C, A, ndrange=A.size)
    np.testing.assert_array_equal(B, [_branches_ref(x) for x in A])
    np.testing.assert_array_equal(C, np.where(A > 0.5, 7, -7))
    assert set(B.tolist()) == {1, 2, 3, 4, 5, 6}


@tg.kernel
def truths(B, X, Y):
    i = tg.index()
    b = 0.0
    if X[i] and not (Y[i] or X[i] > 1):
        b += 1.0 if (X[i] or Y[i]) else 2.0
    B[i] = b + tg.where(X[i] or Y[i], 10.0, 20.0) + (X[i] > 0 or Y[i] > 0)


def test_and_or_of_numbers_by_their_truth(backend):
    """Numbers in `and`/`or` count by their truth wherever only that is used (tests, `not`,
    tg.where's condition, inside another `and`/`or` there); as a value they are refused
    (test_errors: or-value)."""
    X = np.array([0.0, 0.5, 2.5, 0.0, -1.0, np.nan])
    Y = np.array([0.0, 0.0, 0.0, 3.0, 0.0, 0.0])
    B = np.zeros(6)
    truths(backend, 4)(B, X, Y, ndrange=6)
    want = [(1.0 if x and not (y or x > 1) else 0.0) + (10.0 if (x or y) else 20.0)
            + (x > 0 or y > 0) for x, y in zip(X.tolist(), Y.tolist())]
    np.testing.assert_array_equal(B, want)


@tg.kernel
def unassigned(Out, F, N, A):
    i = tg.index()
    for j in range(N[i]):  # noqa: B007
        pass
    if A[i] > 0.0:
        x = A[i] * 2.0
    Out[i] = j
    F[i] = x


def test_a_local_no_path_assigned_reads_zero_in_every_work_item(backend):
    """Python would raise UnboundLocalError; a kernel reads 0 on every backend, in every
    work-item (the CPU read an earlier work-item's value, or garbage after a loop that ran
    no iteration)."""
    N = np.array([3, 0, 5, 0, 0, 2])
    A = np.array([1.0, 2.0, -1.0, -2.0, 3.0, -4.0], np.float32)
    Out, F = np.full(6, -7, np.int64), np.full(6, -7.0, np.float32)
    unassigned(backend, 3)(Out, F, N, A, ndrange=6)
    np.testing.assert_array_equal(Out, np.where(N > 0, N - 1, 0))
    np.testing.assert_array_equal(F, np.where(A > 0, 2 * A, 0))


@tg.kernel
def range_sums(S, C, start, stop, step):
    i = tg.index()
    s = 0
    c = 0
    for k in range(start + i, stop, step):
        s += k
        c += 1
    S[i] = s
    C[i] = c


@pytest.mark.parametrize("start, stop, step", [
    (0, 10, 1), (2, 30, 3), (-5, 5, 2), (10, 0, -1), (20, -7, -3), (5, 5, 1), (5, 0, 1),
    (0, 3, -1),
])
def test_for_runtime_bounds_and_steps(backend, start, stop, step):
    n = 6
    S = np.full(n, SENTINEL, np.int64)
    C = np.full(n, SENTINEL, np.int64)
    range_sums(backend, 4)(S, C, start, stop, step, ndrange=n)
    np.testing.assert_array_equal(S, [sum(range(start + i, stop, step)) for i in range(n)])
    np.testing.assert_array_equal(C, [len(range(start + i, stop, step)) for i in range(n)])


@tg.kernel
def range_forms(S, n, a, b):
    i = tg.index()
    s = 0
    for _k in range(n + i):
        s += 1
    for k in range(a, b - i):
        s += 100 * k
    for k in range(b, a, -1):
        s -= k * i
    for _k in range(3):
        s += 10000
    S[i] = s


def test_for_range_forms(backend):
    n, a, b = 2, -3, 6
    S = np.zeros(8, np.int64)
    range_forms(backend, 4)(S, n, a, b, ndrange=8)
    expected = [(n + i) + sum(100 * k for k in range(a, b - i))
                - sum(k * i for k in range(b, a, -1)) + 30000 for i in range(8)]
    np.testing.assert_array_equal(S, expected)


@tg.kernel
def collatz(S, A, limit):
    i = tg.index()
    x = A[i]
    steps = 0
    while x != 1:
        if steps >= limit:
            break
        if x % 2 == 0:
            x = x // 2
        else:
            x = 3 * x + 1
        steps += 1
    S[i] = steps


def _collatz_ref(x, limit):
    steps = 0
    while x != 1 and steps < limit:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        steps += 1
    return steps


@pytest.mark.parametrize("limit", [1000, 10])
def test_while_with_break(backend, limit):
    A = np.arange(1, 40, dtype=np.int64)
    S = np.zeros_like(A)
    collatz(backend, 8)(S, A, limit, ndrange=A.size)
    np.testing.assert_array_equal(S, [_collatz_ref(x, limit) for x in A.tolist()])


@tg.kernel
def skip_multiples(S, n):
    i = tg.index()
    s = 0
    k = 0
    while True:
        k += 1
        if k > n:
            break
        if k % (i + 2) == 0:
            continue
        s += k
    S[i] = s


def test_while_true_continue_break(backend):
    S = np.zeros(7, np.int64)
    skip_multiples(backend, 4)(S, 30, ndrange=7)
    np.testing.assert_array_equal(
        S, [sum(k for k in range(1, 31) if k % (i + 2) != 0) for i in range(7)])


@tg.kernel
def nested_break_continue(S, n):
    i = tg.index()
    s = 0
    for a in range(n):
        if a == i:
            continue
        for b in range(n):
            if b > a:
                break
            if (a + b) % 3 == 0:
                continue
            s += a * 10 + b
    S[i] = s


def test_nested_loops_break_continue(backend):
    n = 9
    S = np.zeros(n, np.int64)
    nested_break_continue(backend, 4)(S, n, ndrange=n)
    expected = [sum(a * 10 + b for a in range(n) if a != i for b in range(a + 1)
                    if (a + b) % 3 != 0) for i in range(n)]
    np.testing.assert_array_equal(S, expected)


@tg.kernel
def early_return(B, C, A, n):
    i = tg.index()
    if i >= n:
        return
    B[i] = -1
    for k in range(A.shape[0]):
        j = 0
        while j < 3:
            if A[k] == i + j:
                B[i] = k * 10 + j
                return
            j += 1
    C[i] = 1


def test_early_return_top_level_and_nested(backend):
    A = np.array([5, 9, 1, 3, 20, 14], np.int64)
    n, total = 12, 16
    B = np.full(total, SENTINEL, np.int64)
    C = np.full(total, SENTINEL, np.int64)
    early_return(backend, 4)(B, C, A, n, ndrange=total)
    expB, expC = [], []
    for i in range(total):
        if i >= n:
            expB.append(SENTINEL)
            expC.append(SENTINEL)
            continue
        found = next((k * 10 + j for k in range(A.size) for j in range(3) if A[k] == i + j), None)
        expB.append(-1 if found is None else found)
        expC.append(1 if found is None else SENTINEL)
    np.testing.assert_array_equal(B, expB)
    np.testing.assert_array_equal(C, expC)


@tg.kernel
def early_return_2d(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    if j > i:
        return
    for k in range(A.shape[1]):
        if A[i, k] < 0.0:
            B[i, j] = k
            return
    B[i, j] = 100 + j


def test_early_return_in_2d_kernel_moves_to_next_item(backend):
    A = np.array([[1.0, -1.0, 2.0], [3.0, 4.0, 5.0], [-2.0, 0.0, 0.0], [0.0, 1.0, -9.0]])
    B = np.full((4, 4), SENTINEL, np.int64)
    early_return_2d(backend, (2, 3))(B, A, ndrange=(4, 4))
    expected = np.full((4, 4), SENTINEL)
    for i in range(4):
        neg = [k for k in range(3) if A[i, k] < 0]
        for j in range(i + 1):
            expected[i, j] = neg[0] if neg else 100 + j
    np.testing.assert_array_equal(B, expected)


# -- tuples -------------------------------------------------------------------------------------

@tg.kernel
def tuple_ops(B, A):
    i = tg.index()
    a, b = A[i], 2.0 * A[i]
    a, b = b, a
    x, y, z = a, b, i
    x, y, z = z, x, y
    t = (x, y + 1.0, 5)
    B[i, 0] = a
    B[i, 1] = b
    B[i, 2] = x
    B[i, 3] = y
    B[i, 4] = z
    B[i, 5] = t[0] + t[1] * t[2] + t[2]


def test_tuple_assignment_and_swaps(backend):
    A = np.arange(1.0, 8.0)
    B = np.zeros((7, 6))
    tuple_ops(backend, 4)(B, A, ndrange=7)
    i = np.arange(7)
    a, b = 2 * A, A
    x, y, z = i, a, b
    np.testing.assert_array_equal(B, np.stack([a, b, x, y, z, x + (y + 1) * 5 + 5], axis=1))


@tg.kernel
def tuple_negative_index(B, A):
    same = (3, 4, 5)
    mixed = (7, A[0], 2.5)
    B[0] = same[-1]
    B[1] = same[-3]
    B[2] = mixed[-1]
    B[3] = mixed[-2]
    B[4] = mixed[-3]


def test_negative_constant_index_into_tuples(backend):
    B = np.zeros(5)
    tuple_negative_index(backend, 1)(B, np.array([1.25]), ndrange=1)
    np.testing.assert_array_equal(B, [5, 3, 2.5, 1.25, 7])


# -- module-level and closure constants ------------------------------------------------------------

SCALE = 3
OFFSET = 0.5
PAIR = (2, 5)
ENABLED = True
NP_INT = np.int64(7)
FROZEN = 10.0


@tg.kernel
def use_constants(B, A):
    i = tg.index()
    if ENABLED:
        B[i] = SCALE * A[i] + OFFSET + PAIR[1] * PAIR[0] + NP_INT + math.pi
    else:
        B[i] = -1.0


@tg.kernel
def use_frozen(B):
    i = tg.index()
    B[i] = FROZEN


def test_module_constants(backend):
    A = np.arange(5.0)
    B = np.zeros(5)
    use_constants(backend, 4)(B, A, ndrange=5)
    np.testing.assert_array_equal(B, 3 * A + 0.5 + 10 + 7 + math.pi)


def test_module_constants_are_frozen_at_compile_time(backend, monkeypatch):
    B = np.zeros(4)
    use_frozen(backend, 4)(B, ndrange=4)
    assert (B == 10.0).all()
    monkeypatch.setattr(sys.modules[__name__], "FROZEN", 99.0)
    B[:] = 0
    use_frozen(backend, 4)(B, ndrange=4)
    assert (B == 10.0).all()


def test_closure_constants(backend):
    factor = 4
    shift = (1.5, -2.0)

    @tg.kernel
    def closure_kernel(B, A):
        i = tg.index()
        B[i] = factor * A[i] + shift[1]

    A = np.arange(6.0)
    B = np.zeros(6)
    closure_kernel(backend, 4)(B, A, ndrange=6)
    np.testing.assert_array_equal(B, 4 * A - 2.0)


# -- device functions -------------------------------------------------------------------------

@tg.func
def square(x):
    return x * x


@tg.func
def poly(x):
    return square(x) + 2.0 * x + 1.0


@tg.func
def floor_divmod(a, b):
    return a // b, a % b


@tg.func
def clamp(x, lo, hi):
    if x < lo:
        return lo
    if x > hi:
        return hi
    return x


@tg.func
def first_above(A, t):
    for k in range(A.shape[0]):
        if A[k] > t:
            return k
    return -1


@tg.kernel
def use_funcs(P32, P64, Q, R, CL, FA, X32, X64, T):
    i = tg.index()
    P32[i] = poly(X32[i])
    P64[i] = poly(X64[i])
    q, r = floor_divmod(i - 5, 3)
    Q[i] = q
    R[i] = r
    CL[i] = clamp(X64[i], -1.0, 1.0)
    FA[i] = first_above(T, X64[i])


def test_device_functions(backend):
    n = 11
    X64 = np.linspace(-2.0, 2.0, n)
    X32 = (X64 * 1.1).astype(np.float32)
    T = np.array([-1.5, 0.0, 1.0, 1.9])
    P32 = np.zeros(n, np.float32)
    P64, CL = np.zeros(n), np.zeros(n)
    Q, R, FA = (np.zeros(n, np.int64) for _ in range(3))
    use_funcs(backend, 4)(P32, P64, Q, R, CL, FA, X32, X64, T, ndrange=n)
    # the float32 specialisation computes in float32 (bit for bit)
    np.testing.assert_array_equal(P32, X32 * X32 + np.float32(2) * X32 + np.float32(1))
    np.testing.assert_array_equal(P64, X64 * X64 + 2 * X64 + 1)
    i = np.arange(n)
    np.testing.assert_array_equal(Q, (i - 5) // 3)
    np.testing.assert_array_equal(R, (i - 5) % 3)
    np.testing.assert_array_equal(CL, np.clip(X64, -1, 1))
    np.testing.assert_array_equal(FA, [next((k for k in range(4) if T[k] > x), -1) for x in X64])
    src = use_funcs.source(backend=backend)
    # poly (and square, through it) specialised once for float32 and once for float64
    # one specialisation per argument type, defined as a Python or a C function
    define = r"^static [\w ]* {}\(" if backend.name in ("opencl", "cuda") else r"^def {}\("
    for symbol in ("poly__f32", "poly__f64", "square__f32", "square__f64"):
        assert re.search(define.format(symbol), src, re.M), symbol


@tg.func
def flat_index(ix, shape):
    return ix[0] * shape[1] + ix[1]


@tg.func
def three_values(x):
    return x, x * 2.0, int(x) + 1


@tg.kernel
def funcs_with_tuples(B, C, A):
    ix = tg.index(tg.Global, tg.NTuple)
    B[ix] = flat_index(ix, B.shape)
    a, b, c = three_values(A[ix])
    C[ix] = a + b + c


def test_device_functions_take_and_return_tuples(backend):
    A = np.arange(12, dtype=np.float32).reshape(3, 4) / 2
    B = np.zeros((3, 4), np.int64)
    C = np.zeros((3, 4), np.float32)
    funcs_with_tuples(backend, (2, 2))(B, C, A, ndrange=B.shape)
    np.testing.assert_array_equal(B, np.arange(12).reshape(3, 4))
    np.testing.assert_array_equal(C, A + A * np.float32(2) + (A.astype(np.int64) + 1))


@tg.func
def add_into(A, i, v):
    A[i] += v


@tg.func
def is_positive(x):
    return x > 0.0


@tg.kernel
def func_statements(B, A):
    i = tg.index()
    add_into(B, i, 2.0)
    if is_positive(A[i]):
        add_into(B, i, 10.0)


def test_device_function_called_as_statement(backend):
    A = np.array([1.0, -1.0, 2.0, 0.0, 3.0])
    B = np.zeros(5)
    func_statements(backend, 2)(B, A, ndrange=5)
    np.testing.assert_array_equal(B, np.where(A > 0, 12.0, 2.0))


@tg.func
def offset(x):
    return x + 1


def _make_other_offset():
    @tg.func
    def offset(x):       # same __name__ as the module-level offset, different body
        return x + 100
    return offset


other_offset = _make_other_offset()


@tg.kernel
def two_funcs_same_name(B):
    i = tg.index()
    B[i] = offset(i) * 1000 + other_offset(i)


def test_device_functions_sharing_a_name_stay_distinct(backend):
    B = np.zeros(4, np.int64)
    two_funcs_same_name(backend, 2)(B, ndrange=4)
    i = np.arange(4)
    np.testing.assert_array_equal(B, (i + 1) * 1000 + (i + 100))


# -- shapes, sizes, len ----------------------------------------------------------------------

@tg.kernel
def shape_info(S, A):
    S[0] = A.shape[0]
    S[1] = A.shape[1]
    S[2] = A.shape[2]
    S[3] = A.shape[-1]
    S[4] = A.size
    S[5] = len(A)
    S[6] = A.ndim
    for k in range(A.ndim):
        S[7 + k] = A.shape[k]


@tg.kernel
def row_sums(B, A):
    i = tg.index()
    s = 0.0
    for j in range(A.shape[1]):
        s += A[i, j]
    B[i] = s / len(B) + A.size


def test_shape_size_len(backend):
    A = np.zeros((3, 5, 7), np.float32)
    S = np.full(10, SENTINEL, np.int64)
    shape_info(backend, 1)(S, A, ndrange=1)
    np.testing.assert_array_equal(S, [3, 5, 7, 7, 105, 3, 3, 3, 5, 7])
    M = np.arange(12.0).reshape(3, 4)
    B = np.zeros(3)
    row_sums(backend, 2)(B, M, ndrange=3)
    np.testing.assert_allclose(B, M.sum(1) / 3 + 12)


@tg.kernel
def underscored_locals(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    _acc = 0.0
    if 0 < j < m - 1:                      # rows split at the boundary, with a loop `_k`
        for _k in range(3):
            _acc += X[i, j + _k - 1]
    Y[i, j] = _acc


def test_locals_named_like_generated_code_get_names_of_their_own(backend):
    """`_k` and `_acc` are also names in the generated code (a loop over a split row, an
    adjoint's sum); the user's get their own."""
    x = np.random.default_rng(3).random((6, 40))
    y = tg.asarray(backend, np.zeros_like(x))
    underscored_locals(backend, (2, 8))(y, tg.asarray(backend, x), ndrange=x.shape)
    expected = np.zeros_like(x)
    expected[:, 1:-1] = x[:, :-2] + x[:, 1:-1] + x[:, 2:]
    np.testing.assert_allclose(tg.to_numpy(y), expected, rtol=1e-14)


@tg.kernel
def add_length(out, A):
    i = tg.index()
    n, = A.shape                 # one element unpacked (it became `n = A.shape`: a tuple)
    if i < n:
        out[i] = A[i] + n


def test_a_one_element_tuple_unpack(backend):
    A, out = np.arange(4.0), np.zeros(4)
    add_length(backend, 4)(out, A, ndrange=4)
    np.testing.assert_array_equal(out, A + 4)


@tg.kernel
def powers(Z, X, Y):
    i = tg.index()
    Z[i] = X[i] ** Y[i] + tg.pow(X[i], 0.5) * 0.25


def test_float32_powers_and_their_gradients(backend):
    """float32 ``x ** y`` (and tg.pow) runs vectorised on the CPU (vmath.pow) and libdevice's
    pow on CUDA; values and both partial derivatives against float64 closed forms."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 3.0, 64).astype(np.float32)
    y = rng.uniform(-2.0, 2.0, 64).astype(np.float32)
    w = rng.uniform(-1.0, 1.0, 64).astype(np.float32)
    xd, yd, wd = x.astype(np.float64), y.astype(np.float64), w.astype(np.float64)
    X, Y, Z = (tg.asarray(backend, a) for a in (x, y, np.zeros(64, np.float32)))
    dX, dY = (tg.asarray(backend, np.zeros(64, np.float32)) for _ in range(2))
    tg.autodiff(tg.Reverse, powers(backend, 32), tg.Const,
                tg.Duplicated(Z, tg.asarray(backend, w)), tg.Duplicated(X, dX),
                tg.Duplicated(Y, dY), ndrange=64)
    np.testing.assert_allclose(tg.to_numpy(Z), xd ** yd + 0.25 * np.sqrt(xd), rtol=2e-7)
    np.testing.assert_allclose(tg.to_numpy(dX), wd * (yd * xd ** (yd - 1) + 0.125 / np.sqrt(xd)),
                               rtol=2e-6)
    np.testing.assert_allclose(tg.to_numpy(dY), wd * xd ** yd * np.log(xd), rtol=2e-6,
                               atol=1e-7)
    if backend.name == "cpu":
        assert powers.source(backend=backend).count("vmath.pow(") == 2
