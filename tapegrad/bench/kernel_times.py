"""The bench's kernel tables: tapegrad's kernels against the same loops written by hand with
``numba.njit(parallel=True)`` and against NumPy (``_cases``, with the copy bandwidth measured
on the spot, ``_bandwidth_gbs``), and its adjoint and tangent launches against the primal and
against adjoints written by hand (``_gradient_cases``)."""

from __future__ import annotations

import math

import numba
import numpy as np

import tapegrad as tg
from tapegrad.backends.numba_cache import njit
from tapegrad.bench.problems import TILE
from tapegrad.bench.problems import matmul_k as matmul
from tapegrad.bench.problems import saxpy_k as axpy
from tapegrad.bench.problems import sin_k as sin_kernel
from tapegrad.bench.problems import stencil2d_k as stencil
from tapegrad.bench.timing import _median_ms


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


@njit(parallel=True)
def _numba_saxpy(Y, a, X):
    for i in numba.prange(X.size):
        Y[i] = a * X[i] + Y[i]


@njit(parallel=True)
def _numba_sin(B, A):
    for i in numba.prange(A.size):
        B[i] = math.sin(A[i])


@njit(parallel=True)
def _numba_stencil(T_new, T, alpha):
    n, m = T.shape
    for i in numba.prange(1, n - 1):
        for j in range(1, m - 1):
            T_new[i, j] = T[i, j] + alpha * (T[i - 1, j] + T[i + 1, j] + T[i, j - 1]
                                             + T[i, j + 1] - 4.0 * T[i, j])


@njit(parallel=True)
def _numba_matmul(C, A, B):
    n, k = A.shape
    m = B.shape[1]
    for i in numba.prange(n):
        for j in range(m):
            C[i, j] = 0.0
        for p in range(k):
            a = A[i, p]
            for j in range(m):
                C[i, j] += a * B[p, j]


@njit(parallel=True)
def _numba_sin_adjoint(B_bar, A, A_bar):
    for i in numba.prange(A.size):
        g = B_bar[i]
        B_bar[i] = 0.0
        A_bar[i] += g * math.cos(A[i])


@njit(parallel=True)
def _numba_axpy_adjoint(Z_bar, a, X, X_bar, Y_bar):
    a_bar = 0.0
    for i in numba.prange(X.size):
        g = Z_bar[i]
        Z_bar[i] = 0.0
        a_bar += g * X[i]
        X_bar[i] += g * a
        Y_bar[i] += g
    return a_bar


def _gradient_cases(quick: bool) -> list[dict]:
    """Adjoint launches against the primal and against the adjoint written by hand."""
    rng = np.random.default_rng(1)
    cpu = tg.CPU()
    n = 1 << (18 if quick else 22)
    A, B, dA, dB = rng.random(n), np.zeros(n), np.zeros(n), np.ones(n)
    X, Y, Z = rng.random(n), rng.random(n), np.zeros(n)
    dX, dY, dZ = np.zeros(n), np.zeros(n), np.ones(n)
    tg.autodiff(tg.Reverse, sin_kernel(cpu), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=n)
    sin_adjoint = sin_kernel.cache[("last", "reverse", cpu)]
    tg.autodiff(tg.Reverse, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ), tg.Active(2.0),
                tg.Duplicated(X, dX), tg.Duplicated(Y, dY), ndrange=n)
    axpy_adjoint = axpy.cache[("last", "reverse", cpu)]
    tA = rng.random(n)
    tg.autodiff(tg.Forward, sin_kernel(cpu), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, tA), ndrange=n)
    sin_tangent = sin_kernel.cache[("last", "forward", cpu)]
    tg.autodiff(tg.Forward, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ), tg.Duplicated(2.0, 1.0),
                tg.Duplicated(X, dX), tg.Duplicated(Y, dY), ndrange=n)
    axpy_tangent = axpy.cache[("last", "forward", cpu)]
    a_out = np.zeros(1)
    return [
        dict(name=f"sin, {n} float64",
             primal=lambda: sin_kernel(cpu)(B, A, ndrange=n),
             adjoint=lambda: sin_adjoint((B, A, dB, dA), (n,)),
             autodiff=lambda: tg.autodiff(tg.Reverse, sin_kernel(cpu), tg.Const,
                                          tg.Duplicated(B, dB), tg.Duplicated(A, dA), ndrange=n),
             hand=lambda: _numba_sin_adjoint(dB, A, dA),
             tangent=lambda: sin_tangent((B, A, dB, tA), (n,))),
        dict(name=f"z = a x + y, Active a, {n} float64",
             primal=lambda: axpy(cpu)(Z, 2.0, X, Y, ndrange=n),
             adjoint=lambda: axpy_adjoint((Z, 2.0, X, Y, dZ, dX, dY, a_out), (n,)),
             autodiff=lambda: tg.autodiff(tg.Reverse, axpy(cpu), tg.Const, tg.Duplicated(Z, dZ),
                                          tg.Active(2.0), tg.Duplicated(X, dX),
                                          tg.Duplicated(Y, dY), ndrange=n),
             hand=lambda: _numba_axpy_adjoint(dZ, 2.0, X, dX, dY),
             tangent=lambda: axpy_tangent((Z, 2.0, X, Y, dZ, 1.0, dX, dY), (n,))),
    ]


def _numpy_stencil(T_new, T, alpha):
    T_new[1:-1, 1:-1] = T[1:-1, 1:-1] + alpha * (T[:-2, 1:-1] + T[2:, 1:-1] + T[1:-1, :-2]
                                                 + T[1:-1, 2:] - 4.0 * T[1:-1, 1:-1])


def _cases(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    cpu = tg.CPU()
    n = 1 << (18 if quick else 22)            # 4M float64 elements in the full run
    side = 512 if quick else 2048
    mm = 128 if quick else 512
    X, Y, B = rng.random(n), rng.random(n), np.empty(n)
    T, T_new = rng.random((side, side)), np.zeros((side, side))
    A1, B1, C1 = rng.random((mm, mm)), rng.random((mm, mm)), np.zeros((mm, mm))
    return [
        dict(name=f"saxpy, {n} float64", bytes=3 * n * 8,
             tapegrad=lambda: saxpy(cpu)(Y, 2.0, X, ndrange=n),
             numba=lambda: _numba_saxpy(Y, 2.0, X),
             numpy=lambda: np.add(2.0 * X, Y, out=Y)),
        dict(name=f"sin, {n} float64", bytes=2 * n * 8,
             tapegrad=lambda: sin_kernel(cpu)(B, X, ndrange=n),
             numba=lambda: _numba_sin(B, X),
             numpy=lambda: np.sin(X, out=B)),
        dict(name=f"5-point stencil, {side}x{side} float64", bytes=2 * side * side * 8,
             tapegrad=lambda: stencil(cpu, (4, 256))(T_new, T, 0.1, ndrange=T.shape),
             numba=lambda: _numba_stencil(T_new, T, 0.1),
             numpy=lambda: _numpy_stencil(T_new, T, 0.1)),
        dict(name=f"tiled matmul, {mm}x{mm} float64", bytes=3 * mm * mm * 8,
             tapegrad=lambda: matmul(cpu, (TILE, TILE))(C1, A1, B1, ndrange=C1.shape),
             numba=lambda: _numba_matmul(C1, A1, B1),
             numpy=lambda: np.matmul(A1, B1, out=C1)),
    ]


def _bandwidth_gbs(quick: bool) -> float:
    """Copy bandwidth measured now: the floor a memory-bound kernel could reach."""
    src = np.ones(1 << (22 if quick else 24))
    dst = np.empty_like(src)
    ms = _median_ms(lambda: np.copyto(dst, src), 5)
    return 2 * src.nbytes / (ms * 1e-3) / 1e9
