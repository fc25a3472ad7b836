"""Derivatives on the CUDA backend (the simulator here, a GPU with TAPEGRAD_TEST_GPU=1):
adjoints and tangents of kernels with barriers, shared memory, atomics and Active scalars,
and the tape, all checked against the CPU backend's results and closed forms."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tapegrad as tg
from tests.ad.test_reverse import (
    TILE,
    block_sum_of_squares,
    gather,
    loops,
    matmul,
    mul,
    stencil,
    uses_softplus,
)

rng = np.random.default_rng(11)


@pytest.fixture(scope="module")
def gpu():
    return tg.CUDA()


def run_both(kernel, wgs, args, nd, annotate):
    """Reverse mode on the CPU and on CUDA with the same data; returns both shadow sets."""
    out = []
    for backend in (tg.CPU(), tg.CUDA()):
        vals = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        ann, shadows = annotate(vals)
        derivs = tg.autodiff(tg.Reverse, kernel(backend, wgs), tg.Const, *ann, ndrange=nd)
        out.append((derivs, shadows, vals))
    return out


def test_matmul_adjoint_with_shared_memory_and_barriers(gpu):
    A, B = rng.random((8, 8)), rng.random((8, 4))
    W = rng.random((8, 4))
    C, dA, dB = np.zeros((8, 4)), np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul(gpu, (TILE, TILE)), tg.Const, tg.Duplicated(C, W.copy()),
                tg.Duplicated(A, dA), tg.Duplicated(B, dB), ndrange=(8, 4))
    np.testing.assert_allclose(C, A @ B, rtol=1e-12)
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)
    src = matmul.source(mode="reverse", backend=gpu)
    assert "cuda.syncthreads()" in src and "cuda.shared.array" in src
    assert "cuda.atomic.add(tile_a_bar" not in src   # gathered: tapegrad/ad/localgather.py


def test_tree_reduction_adjoint_shares_loop_control(gpu):
    x = rng.random(32)
    out, dx = np.zeros(4), np.zeros(32)
    tg.autodiff(tg.Reverse, block_sum_of_squares(gpu, 8), tg.Const,
                tg.Duplicated(out, np.ones(4)), tg.Duplicated(x, dx), ndrange=32)
    np.testing.assert_allclose(dx, 2 * x, rtol=1e-12)
    assert "_group_values" in block_sum_of_squares.source(mode="reverse", backend=gpu)


def test_active_scalar_block_reduction(gpu):
    B = np.arange(1.0, 70.0)
    (derivs,) = tg.autodiff(tg.Reverse, mul(gpu, 16), tg.Const,
                            tg.Duplicated(np.zeros(69), np.ones(69)), B, tg.Active(2.0),
                            ndrange=69)
    assert derivs[2] == pytest.approx(B.sum())


@pytest.mark.parametrize("case", ["stencil", "gather", "loops", "softplus"])
def test_cuda_adjoints_equal_cpu_adjoints(case):
    if case == "stencil":
        kernel, args, nd = stencil, [np.zeros(20), rng.random(20)], 20
    elif case == "gather":
        kernel, args, nd = gather, [np.zeros(40), rng.random(5),
                                    rng.integers(0, 5, 40).astype(np.int64)], 40
    elif case == "loops":
        kernel, args, nd = loops, [np.zeros(12), rng.random(12), 4], 12
    else:
        kernel, args, nd = uses_softplus, [np.zeros(12), rng.uniform(-2, 2, 12)], 12
    w = rng.random(args[0].shape)

    def annotate(vals):
        dx = np.zeros_like(vals[1])
        return [tg.Duplicated(vals[0], w.copy()), tg.Duplicated(vals[1], dx)] + vals[2:], dx

    (_, cpu_dx, cpu_vals), (_, gpu_dx, gpu_vals) = run_both(kernel, 8, args, nd, annotate)
    np.testing.assert_allclose(gpu_vals[0], cpu_vals[0], rtol=1e-12)
    np.testing.assert_allclose(gpu_dx, cpu_dx, rtol=1e-12, atol=1e-14)
    assert np.abs(cpu_dx).sum() > 0


def test_forward_mode_batch_on_cuda(gpu):
    B = np.arange(1.0, 33.0)
    A, dA1, dA3 = np.zeros(32), np.zeros(32), np.zeros(32)
    tg.autodiff(tg.Forward, mul(gpu, 8), tg.Const, tg.BatchDuplicated(A, (dA1, dA3)), B,
                tg.BatchDuplicated(2.0, (1.0, 3.0)), ndrange=32)
    np.testing.assert_allclose(A, 2 * B)
    np.testing.assert_allclose(dA1, B)
    np.testing.assert_allclose(dA3, 3 * B)


def test_tape_on_the_cuda_backend(gpu):
    x = rng.random(16)

    def f(x):
        y = tg.zeros(gpu, np.float64, 16)
        stencil(gpu, 8)(y, x, ndrange=16)
        return tg.dot(y, y)

    (g,) = tg.gradient(f, x)
    assert tg.testing.check_grad(f, x)
    (g_cpu,) = tg.gradient(lambda x: _f_cpu(x), x)
    np.testing.assert_allclose(g, g_cpu, rtol=1e-12)


def _f_cpu(x):
    y = np.zeros(16)
    stencil(tg.CPU(), 8)(y, x, ndrange=16)
    return tg.dot(y, y)


@tg.kernel
def fill_1d(B, v):
    i = tg.index()
    B[i] = v


@tg.kernel
def fill_2d(B, v):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = v


@pytest.mark.parametrize("kernel, wgs, suggestion", [(fill_2d, (64, 32), "(16, 16)"),
                                                     (fill_1d, 2048, "256")])
def test_a_workgroup_larger_than_cuda_allows_is_refused(gpu, kernel, wgs, suggestion):
    """CUDA runs at most 1024 threads per block; the simulator runs more, a GPU fails the
    launch with a driver error: refused before either, with the array untouched."""
    B = np.zeros((64, 32)) if isinstance(wgs, tuple) else np.zeros(2048)
    with pytest.raises(tg.LaunchError, match="at most 1024 per workgroup.*" + re.escape(suggestion)):
        kernel(gpu, wgs)(B, 2.0, ndrange=B.shape)
    assert not B.any()
    kernel(tg.CPU(), wgs)(B, 2.0, ndrange=B.shape)     # the CPU has no such limit
    assert (B == 2.0).all()
