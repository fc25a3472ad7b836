"""The CUDA backend where no GPU is needed: its launch limits (checked with tapegrad's errors
before the driver's), dynamic shared memory for adjoints past 48 KiB (printed, compiled to an
sm_90 cubin), NVRTC's on-disk cache, and what ``tg.CUDA()`` says without a GPU.  Kernels run
on a GPU in tests/gpu/ (and every backend-parametrised test, on a GPU machine)."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.c.printer import CUDA, STATIC_SHARED_LIMIT, CPrinter, local_bytes
from tapegrad.backends.cuda import nvrtc
from tapegrad.backends.cuda.device import device_limits
from tapegrad.backends.cuda.limits import DeviceLimits, check_function, launch_shape
from tapegrad.backends.structure import device_functions
from tapegrad.errors import CacheWarning
from tests.conftest import BACKENDS, _opencl_on_numpy

H200 = DeviceLimits("NVIDIA H200", 90, 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535),
                    232448)
TILE = 32


@tg.kernel
def dense(C, A, B, bias, s):
    """A dense layer's 32 x 32 float64 tiled matmul, scaled by an Active scalar, plus a bias
    kept in local memory: its adjoint holds the tiles, their shadows and more, past CUDA's
    48 KiB of static shared memory."""
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    row = tg.localmem(A.dtype, TILE)
    if li == 0:
        row[lj] = bias[j]
    acc = 0.0
    for t in range(A.shape[1] // TILE):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()
        for k in range(TILE):
            acc += tile_a[li, k] * tile_b[k, lj]
        tg.synchronize()
    C[i, j] = s * acc + row[lj]


@pytest.mark.parametrize("ndrange, groupsize, grid", [
    ((1000,), (256,), (4, 1, 1)), ((1000, 3), (16, 16), (1, 63, 1)),
    ((5, 6, 7), (4, 8, 8), (1, 1, 2)), ((0, 7), (16, 16), (1, 0, 1)),
    ((2**33,), (256,), (2**25, 1, 1))])
def test_the_grid_covers_the_ndrange_with_its_last_dimension_along_x(ndrange, groupsize, grid):
    assert launch_shape(ndrange, groupsize, H200) == grid


def test_a_grid_past_the_gpus_y_limit_is_a_tapegrad_error():
    with pytest.raises(tg.LaunchError, match=r"65537 workgroups along its dimension 0, which "
                       r"runs along CUDA's grid y: NVIDIA H200 allows 65535.*longest dimension "
                       r"last"):
        launch_shape((65537 * 16, 4), (16, 4), H200)
    assert launch_shape((4, 65537 * 16), (4, 16), H200) == (65537, 1, 1)   # transposed: fine


def _adjoints(kernel, ndrange, groupsize, annotated):
    """The typed kernels a reverse-mode launch compiles, recorded on the GPU where the tests
    have one, else on the OpenCL harness (PoCL)."""
    compiled = []
    harness = BACKENDS.get("cuda", _opencl_on_numpy)()
    run = type(harness).compile

    class Recording(type(harness)):
        def compile(self, tk):
            compiled.append(tk)
            return run(self, tk)
    tg.autodiff(tg.Reverse, kernel(Recording(), groupsize), tg.Const, *annotated,
                ndrange=ndrange)
    return compiled


@pytest.fixture(scope="module")
def dense_adjoint():
    rng = np.random.default_rng(5)
    A, B, bias = rng.random((TILE, 2 * TILE)), rng.random((2 * TILE, TILE)), rng.random(TILE)
    C, W = np.zeros((TILE, TILE)), rng.random((TILE, TILE))
    dA, dB, dbias = np.zeros_like(A), np.zeros_like(B), np.zeros_like(bias)

    kernels = _adjoints(dense, (TILE, TILE), (TILE, TILE),
                        (tg.Duplicated(C, W.copy()), tg.Duplicated(A, dA),
                         tg.Duplicated(B, dB), tg.Duplicated(bias, dbias), tg.Active(1.5)))
    # (the harness ran it, on PoCL or the GPU: the adjoint is right, not merely compiled)
    np.testing.assert_allclose(dA, 1.5 * W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, 1.5 * A.T @ W, rtol=1e-12)
    np.testing.assert_allclose(dbias, W.sum(axis=0), rtol=1e-12)
    return max(kernels, key=lambda tk: local_bytes(tk))


def test_an_adjoint_past_48_kib_of_shared_memory_takes_dynamic_shared_memory(
        dense_adjoint):
    printer = CPrinter(dense_adjoint, CUDA)
    source = printer.module(device_functions(dense_adjoint))
    assert printer.shared_bytes > STATIC_SHARED_LIMIT and printer.dynamic_bytes == local_bytes(
        dense_adjoint)
    assert "extern __shared__ __align__(16) unsigned char _tg_shared[];" in source
    # the Active scale's sum: one atomic per full warp, after shuffles
    assert "tg_group_add_float64_global(&s_bar_out[(0)], s_bar)" in source
    assert "__shfl_down_sync(all, v, o)" in source
    binary = nvrtc.compile_cuda(source, dense_adjoint.name, 90)
    assert binary.kind == "cubin"
    # the same arrays declared statically: NVRTC refuses them, as the issue reported
    static = CPrinter(dense_adjoint, CUDA, dynamic_shared=False).module(
        device_functions(dense_adjoint))
    with pytest.raises(tg.KernelCompileError, match="too much shared data"):
        nvrtc.compile_cuda(static, dense_adjoint.name, 90)


def test_shared_memory_or_registers_past_the_gpus_are_tapegrad_errors(dense_adjoint):
    tk = dense_adjoint
    small = DeviceLimits("a small GPU", 75, 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535),
                         49152)
    printer = CPrinter(tk, CUDA)
    printer.module(device_functions(tk))
    bytes_ = printer.shared_bytes
    check_function(tk, H200, bytes_, 1024, 64)
    with pytest.raises(tg.KernelCompileError, match=rf"needs {bytes_} bytes of local memory.*"
                       r"a small GPU gives a workgroup at most 49152.*smaller groupsize"):
        check_function(tk, small, bytes_, 1024, 64)
    with pytest.raises(tg.KernelCompileError, match=r"uses 128 registers per work-item, so a "
                       r"workgroup may have at most 512 work-items, not 1024"):
        check_function(tk, H200, bytes_, 512, 128)


def test_binaries_come_from_the_cache_and_a_damaged_one_is_compiled_again(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    source = 'extern "C" __global__ void twice(double *x) { x[threadIdx.x] *= 2.0; }\n'
    first = nvrtc.compile_cuda(source, "twice", 90)
    (path,) = tmp_path.rglob("cuda_twice_*.cubin")
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    calls = []
    monkeypatch.setattr(nvrtc, "_compile", lambda *a: calls.append(a) or first.data)
    assert nvrtc.compile_cuda(source, "twice", 90) == first and not calls
    path.write_bytes(path.read_bytes()[:-7])               # truncated
    with pytest.warns(CacheWarning, match="damaged"):
        assert nvrtc.compile_cuda(source, "twice", 90) == first
    assert len(calls) == 1


def test_a_gpu_newer_than_nvrtc_gets_ptx_for_the_newest_architecture_it_knows():
    newest = max(nvrtc.supported_archs())
    assert nvrtc.target(90) == ("cubin", 90)
    assert nvrtc.target(newest + 1) == ("ptx", newest)
    binary = nvrtc.compile_cuda('extern "C" __global__ void k(float *x) { x[0] = 1.0f; }',
                                "k", newest + 1)
    assert binary.kind == "ptx" and b".entry k" in binary.data


def test_cuda_without_cupy_or_a_gpu_says_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(tg.BackendError, match=r"needs CuPy.*pip install 'tapegrad\[cuda13\]'"):
        tg.CUDA()

    class NoGPU:        # what CuPy's runtime answers on a machine without a GPU driver
        class CUDARuntimeError(RuntimeError):
            pass

        @staticmethod
        def getDeviceCount():
            raise NoGPU.CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device")
    cupy = SimpleNamespace(cuda=SimpleNamespace(runtime=NoGPU))
    with pytest.raises(tg.BackendError, match=r"no CUDA GPU or driver was found "
                       r"\(cudaErrorNoDevice.*tg.OpenCL\(\)"):
        device_limits(cupy, 0)


def test_a_block_past_the_gpus_z_limit_is_a_tapegrad_error():
    tk = SimpleNamespace(name="fill", groupsize=(128, 2, 2),
                         ir=SimpleNamespace(filename="model.py", lineno=3))
    with pytest.raises(tg.KernelCompileError, match=r"model.py:3.*128 work-items along "
                       r"dimension 0, which runs along CUDA's block z: NVIDIA H200 allows 64"):
        check_function(tk, H200, 0, 1024, 32)
    check_function(SimpleNamespace(**{**vars(tk), "groupsize": (2, 2, 128)}), H200, 0, 1024, 32)


@tg.kernel
def non_finite(B, A):
    i = tg.index()
    B[i] = tg.where(A[i] > 0.0, math.inf, -math.inf) + (math.nan if A[i] == 0.0 else 0.0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_inf_and_nan_constants_compile_for_cuda(dtype):
    from tapegrad.backends.c.printer import CPrinter
    from tapegrad.frontend import kernel_ir
    from tapegrad.frontend.types import specialize
    from tapegrad.runtime.arguments import check_args
    args = (np.zeros(4, dtype), np.zeros(4, dtype))
    tk = specialize(kernel_ir(non_finite), check_args(non_finite, tg.CPU(), args), 1, (64,),
                    kernel_ir)
    source = CPrinter(tk, CUDA).module([])
    assert "INFINITY" in source and "NAN" in source
    assert nvrtc.compile_cuda(source, tk.name, 90).kind == "cubin"
    assert b" " == bytes([32])      # (NVRTC's log was once written into the shared b" ")


def test_a_binary_the_driver_refuses_names_the_extra_that_matches_it():
    from tapegrad.backends.cuda.device import load_function

    class CUDADriverError(RuntimeError):
        pass

    class Module:
        def load(self, data):
            raise CUDADriverError("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
    cupy = SimpleNamespace(cuda=SimpleNamespace(
        function=SimpleNamespace(Module=Module),
        driver=SimpleNamespace(CUDADriverError=CUDADriverError)))
    binary = nvrtc.Binary("cubin", 90, b"\x7fELF")
    with pytest.raises(tg.BackendError, match=r"saxpy: the CUDA driver refused the kernel NVRTC "
                       r"compiled for sm_90 \(CUDA_ERROR_UNSUPPORTED_PTX_VERSION\).*"
                       r"tapegrad\[cuda12\]"):
        load_function(cupy, binary, "saxpy")
