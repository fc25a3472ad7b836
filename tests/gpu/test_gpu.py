"""Checks on a real NVIDIA GPU with CuPy arrays (run by tests/gpu/run_gpu_checks.sh with
TAPEGRAD_TEST_GPU=1).  Without a GPU these tests are skipped: the CUDA code path is tested
everywhere else under the simulator and compiled to PTX (tests/backends/test_ptx.py)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import TILE
from tapegrad.bench.problems import matmul_k as matmul  # the benchmark's tiled matmul

pytestmark = pytest.mark.skipif(os.environ.get("TAPEGRAD_TEST_GPU") != "1",
                                reason="needs an NVIDIA GPU (set TAPEGRAD_TEST_GPU=1 there)")


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy", reason="CuPy is needed on the GPU machine")


def test_get_backend_of_a_cupy_array_is_cuda(cp):
    x = cp.zeros(4)
    assert tg.get_backend(x) == tg.CUDA(0)


def test_sin_and_its_adjoint_on_the_gpu(cp):
    A = cp.random.rand(1 << 20)
    B = cp.zeros_like(A)
    dA, dB = tg.make_zero(A), cp.ones_like(A)
    tg.autodiff(tg.Reverse, sin_kernel(tg.get_backend(A)), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=A.size)
    cp.testing.assert_allclose(B, cp.sin(A), rtol=1e-12)
    cp.testing.assert_allclose(dA, cp.cos(A), rtol=1e-12)
    assert not bool(dB.any())


def test_tiled_matmul_and_adjoint_on_the_gpu(cp):
    A, B = cp.random.rand(64, 48), cp.random.rand(48, 32)
    C = cp.zeros((64, 32))
    W = cp.random.rand(64, 32)
    dA, dB = cp.zeros_like(A), cp.zeros_like(B)
    tg.autodiff(tg.Reverse, matmul(tg.CUDA(), (TILE, TILE)), tg.Const, tg.Duplicated(C, W.copy()),
                tg.Duplicated(A, dA), tg.Duplicated(B, dB), ndrange=C.shape)
    cp.testing.assert_allclose(C, A @ B, rtol=1e-12)
    cp.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)
    cp.testing.assert_allclose(dB, A.T @ W, rtol=1e-12)


def test_tape_on_cupy_arrays_matches_the_cpu(cp):
    A_host = np.random.default_rng(0).random(1000)

    def run(A):
        B = tg.zeros(tg.get_backend(A), np.float64, A.size)
        sin_kernel(tg.get_backend(A))(B, A, ndrange=A.size)
        return tg.dot(B, B)

    (g_gpu,) = tg.gradient(run, cp.asarray(A_host))
    (g_cpu,) = tg.gradient(run, A_host)
    np.testing.assert_allclose(cp.asnumpy(g_gpu), g_cpu, rtol=1e-12)


def test_host_array_on_the_gpu_backend_is_a_clear_error(cp):
    with pytest.raises(tg.LaunchError, match="argument B"):
        sin_kernel(tg.CUDA())(np.zeros(4), cp.zeros(4), ndrange=4)
