"""``tg.fma(x, y, z)``: ``x * y + z`` rounded once, the same bits on every backend and on the
host, checked against exact rational arithmetic (the reference rounds a ``Fraction`` to the
nearest float of the type here, ties to even: no floating-point step in it)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.errors import TapegradError
from tapegrad.lang import hostfma


@tg.kernel
def fma_k(R, A, B, C):
    i = tg.index()
    R[i] = tg.fma(A[i], B[i], C[i])


@tg.kernel
def product_error(E, A, B):
    i = tg.index()
    p = A[i] * B[i]
    E[i] = tg.fma(A[i], B[i], -p)      # the product's rounding error, exactly


def _rounded(exact: Fraction, dtype) -> float:
    """``exact`` rounded to the nearest ``dtype``, ties to even (a float64 holding it)."""
    finfo = np.finfo(dtype)
    half_ulp_of_max = Fraction(2) ** (finfo.maxexp - 1 - finfo.nmant) / 2
    if abs(exact) >= Fraction(float(finfo.max)) + half_ulp_of_max:     # (a tie goes up: even)
        return math.inf if exact > 0 else -math.inf
    guess = dtype(float(exact)) if abs(exact) <= float(finfo.max) else dtype(finfo.max)
    guess = guess if exact >= 0 else -abs(guess)
    with np.errstate(over="ignore"):
        candidates = [c for c in (np.nextafter(guess, dtype(-np.inf)), guess,
                                  np.nextafter(guess, dtype(np.inf))) if np.isfinite(c)]
    distance = [abs(Fraction(float(c)) - exact) for c in candidates]
    best = min(distance)
    nearest = [c for c, d in zip(candidates, distance) if d == best]
    if len(nearest) > 1:         # a tie: the even one
        nearest = [c for c in nearest if int(c.view(np.int64 if dtype == np.float64 else
                                                     np.int32)) % 2 == 0]
    return float(nearest[0])


def _exact(x, y, z) -> Fraction:
    return Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))


# float32 triples whose exact x * y + z lies just off a float32 midpoint: rounded to float64
# first, they land on it, and the tie then rounds the wrong way
DOUBLE_ROUNDING = [tuple(map(float.fromhex, t)) for t in [
    ("0x1.79949cp+0", "0x1.92582ap-1", "-0x1.980002p-41"),
    ("0x1.4d885ap+0", "0x1.63c02ep+0", "-0x1.600002p-43"),
    ("0x1.619636p+0", "0x1.50430ap+0", "-0x1.c00002p-44")]]


# float64 triples whose fl(z + fl(x y)) plus the rounded sum of the product's and the sum's
# errors is a tie the exact result is not on
TIES_IN_THE_ERRORS = [tuple(map(float.fromhex, t)) for t in [
    ("0x1.ffffffffffc6ep-1", "0x1.00000000001c9p-53", "0x1.00000001f3b29p+0"),
    ("0x1.00000000002f4p+0", "0x1.ffffffffffa18p-54", "0x1.00000001473c5p+0"),
    ("-0x1.0000000000223p+0", "0x1.ffffffffffbbap-54", "-0x1.000000014143fp+0")]]


def _hard_cases(dtype, n, seed):
    """Triples whose exact result lies near a rounding boundary of ``dtype``: z cancels most
    of the product, or sits a tiny amount off it, or brings it just off a float32 midpoint
    (``DOUBLE_ROUNDING``), plus products that overflow while the fma does not, and subnormal
    results."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(1.0, 2.0, n).astype(dtype)
    y = rng.uniform(1.0, 2.0, n).astype(dtype)
    z = np.empty(n, dtype)
    quarter = n // 4
    z[:quarter] = -(x[:quarter] * y[:quarter])                      # the product's error
    eps = np.finfo(dtype).eps
    tiny = dtype(eps) * dtype(eps) * rng.choice([-1.0, 1.0], quarter).astype(dtype)
    z[quarter:2 * quarter] = tiny * rng.uniform(0.5, 1.0, quarter).astype(dtype)
    z[2 * quarter:3 * quarter] = rng.uniform(-4.0, 4.0, quarter).astype(dtype)
    hard = DOUBLE_ROUNDING + (TIES_IN_THE_ERRORS if dtype == np.float64 else [])
    for k, triple in enumerate(hard):
        x[2 * quarter + k], y[2 * quarter + k], z[2 * quarter + k] = triple
    big = np.finfo(dtype).max
    x[3 * quarter:3 * quarter + 4] = dtype(2.0)
    y[3 * quarter:3 * quarter + 4] = big
    z[3 * quarter:3 * quarter + 4] = -big                             # 2 max - max = max
    small = dtype(np.finfo(dtype).tiny)
    x[3 * quarter + 4:] = small * dtype(0.75)
    y[3 * quarter + 4:] = dtype(0.5)
    z[3 * quarter + 4:] = small * dtype(-0.25)                        # subnormal results
    return x, y, z


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_fma_rounds_once_on_every_backend_and_on_the_host(backend, dtype):
    x, y, z = _hard_cases(dtype, 64, seed=3)
    R = np.full(x.size, np.nan, dtype)
    fma_k(backend, 16)(R, x, y, z, ndrange=x.size)
    expected = np.array([_rounded(_exact(*t), dtype) for t in zip(x, y, z)], dtype)
    np.testing.assert_array_equal(R, expected)
    np.testing.assert_array_equal(tg.fma(x, y, z), expected)          # the host, vectorised
    assert tg.fma(x, y, z).dtype == dtype
    for k in (0, 20, 40, 50, 63):                                        # the host, scalars
        assert tg.fma(x[k], y[k], z[k]) == expected[k]
    # the rounded operations differ from it where z cancels the product, and so does a sum
    # rounded to float64 first where it is rounded to float32 in the end
    with np.errstate(over="ignore"):
        assert (x * y + z != expected).any()
        if dtype == np.float32:
            twice = (x.astype(np.float64) * y + z).astype(np.float32)
            assert (twice != expected).sum() >= len(DOUBLE_ROUNDING)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_the_rounding_error_of_a_product_is_exact(backend, dtype):
    """``fma(a, b, -(a * b))`` is exactly ``a * b - fl(a * b)`` (Dekker's TwoProduct with one
    instruction)."""
    rng = np.random.default_rng(5)
    A = (rng.standard_normal(48) * 2.0 ** rng.integers(-20, 20, 48)).astype(dtype)
    B = (rng.standard_normal(48) * 2.0 ** rng.integers(-20, 20, 48)).astype(dtype)
    E = np.zeros_like(A)
    product_error(backend, 16)(E, A, B, ndrange=A.size)
    for a, b, e in zip(A, B, E):
        assert Fraction(float(e)) == _exact(a, b, 0) - Fraction(float(a * b))
    assert E.any()


def test_special_values_and_signed_zeros_follow_ieee(backend):
    inf, nan = np.inf, np.nan
    cases = [(inf, 0.0, 1.0), (inf, 2.0, -inf), (inf, 2.0, 1.0), (nan, 1.0, 1.0),
             (1.0, 1.0, nan), (-0.0, 1.0, -0.0), (0.0, -1.0, 0.0), (-0.0, 1.0, 0.0),
             (2.0, 1e308, -1e308), (1e308, 10.0, 0.0), (1e308, 10.0, -inf), (1e308, -10.0, nan)]
    x, y, z = (np.array(c, np.float64) for c in zip(*cases))
    R = np.zeros(x.size)
    fma_k(backend, 4)(R, x, y, z, ndrange=x.size)
    expected = np.array([nan, nan, inf, nan, nan, -0.0, 0.0, 0.0, 1e308, inf, -inf, nan])
    numbers = ~np.isnan(expected)                # (a NaN's sign bit means nothing)
    for got in (R, tg.fma(x, y, z)):
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(expected[numbers]))


def test_fma_takes_three_numbers():
    @tg.kernel
    def two(R, A):
        i = tg.index()
        R[i] = tg.fma(A[i], A[i])

    with pytest.raises(TapegradError, match=r"tg.fma takes 3 argument\(s\), got 2"):
        two(tg.CPU())(np.zeros(4), np.ones(4), ndrange=4)


def test_a_kernels_fma_has_its_derivatives_in_both_modes():
    """tangent of fma(x, y, z) = y dx + x dy + dz; the adjoint against the tangent and the
    closed form (every row's finite differences: tests/test_primitives.py)."""
    @tg.kernel
    def poly(R, X, C):
        i = tg.index()
        R[i] = tg.fma(tg.fma(C[0], X[i], C[1]), X[i], C[2])          # Horner: c0 x^2 + c1 x + c2

    rng = np.random.default_rng(2)
    X, C = rng.standard_normal(8), rng.standard_normal(3)
    R, W = np.zeros(8), rng.standard_normal(8)
    dX, dC = np.zeros(8), np.zeros(3)
    kernel = poly(tg.CPU(), 4)
    tg.autodiff(tg.Reverse, kernel, tg.Const, tg.Duplicated(R, W.copy()), tg.Duplicated(X, dX),
                tg.Duplicated(C, dC), ndrange=8)
    np.testing.assert_allclose(dX, W * (2 * C[0] * X + C[1]), rtol=1e-13)
    np.testing.assert_allclose(dC, [W @ X ** 2, W @ X, W.sum()], rtol=1e-13)
    R_dot = np.zeros(8)
    v = rng.standard_normal(8)
    tg.autodiff(tg.Forward, kernel, tg.Const, tg.Duplicated(R, R_dot), tg.Duplicated(X, v),
                tg.Const(C), ndrange=8)
    np.testing.assert_allclose(R_dot @ W, dX @ v, rtol=1e-13)


def test_the_host_follows_ieee_where_pythons_math_fma_raises(monkeypatch):
    """Python 3.13's math.fma raises OverflowError where the result overflows (and
    ValueError on inf * 0): the host answers inf and nan as the kernels do, whichever Python
    runs it."""
    def raising_fma(x, y, z):
        if not all(map(math.isfinite, (x, y, z))):
            raise ValueError("invalid operation in fma")
        exact = _exact(x, y, z)
        if abs(exact) > Fraction(float(np.finfo(np.float64).max)):
            raise OverflowError("overflow in fma")
        return _rounded(exact, np.float64)

    monkeypatch.setattr(hostfma, "_MATH_FMA", raising_fma)
    x = np.array([np.inf, 1e308, 1e308, 2.0, 0.1])
    y = np.array([0.0, 10.0, 10.0, 1e308, 10.0])
    z = np.array([1.0, 0.0, -np.inf, -1e308, -1.0])
    np.testing.assert_array_equal(tg.fma(x, y, z), [np.nan, np.inf, -np.inf, 1e308,
                                                    5.551115123125783e-17])


@tg.kernel
def fma_int(R, A, K, C):
    i = tg.index()
    R[i] = tg.fma(A[i], K[i], C[i]) + math.fma(A[i], C[i], -(A[i] * C[i]))


def test_an_integer_takes_the_floats_type_on_the_host_as_in_a_kernel(backend):
    """tg.fma(float32, int32, float32) is float32 in a kernel (the integer converted), so on
    the host too: rounded once to float32, not to float64 and then float32 (which gives
    0x1.800004p+1 here, where the exact result rounds to 0x1.800002p+1).  ``math.fma`` in a
    kernel is tg.fma on every Python."""
    A = np.array([float.fromhex("0x1.000002p0")] * 4, np.float32)
    K = np.array([3, 3, -7, 2 ** 20], np.int32)
    C = np.array([-(2.0 ** -60), 0.5, 1.0, -3.0], np.float32)
    R = np.zeros(4, np.float32)
    fma_int(backend, 4)(R, A, K, C, ndrange=4)
    host = tg.fma(A, K, C)
    assert host.dtype == np.float32
    assert host[0] == float.fromhex("0x1.800002p+1")
    np.testing.assert_array_equal(R, host + tg.fma(A, C, -(A * C)))
    assert tg.fma(A[0], K[0], C[0]) == host[0] and tg.fma(A[0], 3, C[0]) == host[0]


def test_numpy_has_no_fma_and_the_message_says_what_to_write():
    @tg.kernel
    def np_fma(R, A):
        i = tg.index()
        R[i] = np.fma(A[i], A[i], A[i])

    with pytest.raises(TapegradError, match=r"np.fma does not exist; write tg.fma"):
        np_fma(tg.CPU())(np.zeros(4), np.ones(4), ndrange=4)


def test_math_spells_only_its_own_functions():
    """math.fma is tg.fma on every Python; math.logaddexp, which no Python has, is refused
    with the spelling that works."""
    @tg.kernel
    def math_logaddexp(R, A):
        i = tg.index()
        R[i] = math.logaddexp(A[i], A[i])

    with pytest.raises(TapegradError, match=r"math.logaddexp does not exist; write "
                                            r"tg.logaddexp"):
        math_logaddexp(tg.CPU())(np.zeros(4), np.ones(4), ndrange=4)


def test_the_fma_instruction_is_asked_of_the_cpu_numba_compiles_for():
    """NUMBA_CPU_FEATURES without +fma: no FMA instruction on x86-64 (tiled adjoints then
    multiply and add); AArch64 and the others always have one."""
    import os
    import platform
    import subprocess
    import sys
    code = "from tapegrad.backends.base import host_fma; print(host_fma())"
    env = dict(os.environ, NUMBA_CPU_FEATURES="+sse2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
    assert out == str(not x86)


def test_the_hosts_float64_fma_is_exact_in_bulk():
    """The host's vectorised float64 path (an exact product and sum, a sum rounded to odd)
    and its element-wise one (huge and tiny products), against exact rational arithmetic."""
    rng = np.random.default_rng(17)
    n = 3000
    x = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    y = rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)
    z = rng.standard_normal(n) * 2.0 ** rng.integers(-120, 120, n)
    k = n // 6
    z[:k] = -(x[:k] * y[:k])                                        # the product's error
    z[k:2 * k] = -(x[k:2 * k] * y[k:2 * k]) * (1 + rng.choice([-1, 1], k) * 2.0 ** -52)
    x[2 * k:3 * k] *= 2.0 ** 940                                    # huge products
    y[3 * k:4 * k] *= 2.0 ** -990                                   # tiny ones
    # where the sum of the two errors, rounded to nearest, lands on a tie of the last rounding
    # that the exact sum misses: only that sum rounded to odd gives the right result
    for at, triple in enumerate(TIES_IN_THE_ERRORS):
        x[-1 - at], y[-1 - at], z[-1 - at] = triple
    got = tg.fma(x, y, z)
    expected = np.array([_rounded(_exact(*t), np.float64) for t in zip(x, y, z)])
    np.testing.assert_array_equal(got, expected)
    with np.errstate(over="ignore"):
        assert (x * y + z != expected).sum() > k
