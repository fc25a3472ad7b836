"""Checks on a real NVIDIA GPU with CuPy arrays (run by tests/gpu/run_gpu_checks.sh with
TAPEGRAD_TEST_GPU=1, which also runs every backend-parametrised test on the GPU).  Without a
GPU these tests are skipped: the CUDA kernels are compiled to sm_90 cubins everywhere else
(tests/backends/test_cuda.py, and every kernel the OpenCL tests launch: tests/conftest.py)."""

from __future__ import annotations

import math
import os
import time
import warnings

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.bench.problems import TILE
from tapegrad.bench.problems import matmul_k as matmul  # the benchmark's tiled matmul
from tests.backends.test_cuda import TILE as DENSE_TILE
from tests.backends.test_cuda import dense
from tests.capture.test_capture import diffuse

pytestmark = pytest.mark.skipif(os.environ.get("TAPEGRAD_TEST_GPU") != "1",
                                reason="needs an NVIDIA GPU (set TAPEGRAD_TEST_GPU=1 there)")


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def mark(B):
    i = tg.index()
    B[i] = True


@tg.kernel
def histogram(H, keys, weights):
    i = tg.index()
    tg.atomic_add(H, keys[i], weights[i])


@tg.kernel
def spin(B, n):
    """Busy work: ``n`` dependent steps per work-item (to see a launch return before it ends)."""
    i = tg.index()
    x = B[i]
    for _ in range(n):
        x = x * 0.999999 + 1e-6
    B[i] = x


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


def test_autodiff_by_its_plan_on_cupy_arrays_matches_the_general_path(cp, monkeypatch):
    """The second tg.autodiff on the same kinds of arrays runs by its autodiff plan
    (tapegrad/api/autodiff_plans.py), the general path turned into an error."""
    import tapegrad.api
    from tapegrad.api.autodiff_plans import plans_of
    cfg = sin_kernel(tg.CUDA(0), 256)
    A = cp.random.rand(100_003)
    for k in range(2):
        if k == 1:
            monkeypatch.setattr(tapegrad.api, "autodiff_kernel", None)
        B, dA, dB = cp.zeros_like(A), cp.zeros_like(A), cp.ones_like(A)
        tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA),
                    ndrange=A.size)
        cp.testing.assert_allclose(B, cp.sin(A), rtol=1e-12)
        cp.testing.assert_allclose(dA, cp.cos(A), rtol=1e-12)
    assert len(plans_of(cfg)) == 1


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


def test_an_adjoint_with_more_than_48_kib_of_shared_memory_runs(cp):
    T = DENSE_TILE
    A, B, bias = cp.random.rand(2 * T, 3 * T), cp.random.rand(3 * T, 2 * T), cp.random.rand(2 * T)
    C, W = cp.zeros((2 * T, 2 * T)), cp.random.rand(2 * T, 2 * T)
    dA, dB, dbias = cp.zeros_like(A), cp.zeros_like(B), cp.zeros_like(bias)
    (derivs,) = tg.autodiff(tg.Reverse, dense(tg.CUDA(), (T, T)), tg.Const,
                            tg.Duplicated(C, W.copy()), tg.Duplicated(A, dA),
                            tg.Duplicated(B, dB), tg.Duplicated(bias, dbias), tg.Active(1.5),
                            ndrange=C.shape)
    cp.testing.assert_allclose(C, 1.5 * A @ B + bias, rtol=1e-12)
    cp.testing.assert_allclose(dA, 1.5 * W @ B.T, rtol=1e-12)
    cp.testing.assert_allclose(dbias, W.sum(axis=0), rtol=1e-12)
    assert derivs[4] == pytest.approx(float((W * (A @ B)).sum()), rel=1e-12)


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


def test_more_than_2_to_the_31_work_items_index_with_64_bits(cp):
    n = 2**31 + 5
    B = cp.zeros(n, dtype=cp.bool_)
    mark(tg.CUDA())(B, ndrange=n)
    assert bool(B[-6:].all()) and int(cp.count_nonzero(B)) == n


def test_ten_million_atomic_adds_into_16_bins(cp):
    n = 10**7
    keys = cp.random.randint(0, 16, n).astype(cp.int64)
    weights = cp.random.rand(n)
    H = cp.zeros(16)
    histogram(tg.CUDA())(H, keys, weights, ndrange=n)
    cp.testing.assert_allclose(H, cp.bincount(keys, weights, minlength=16), rtol=1e-9)


@tg.kernel
def scaled(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i]


def test_an_active_scalars_sum_over_many_blocks_and_a_ragged_edge(cp):
    """Warps' sums spread over the 64 slots (one per block mod 64), partial warps at the
    edge adding one by one: the sum is the closed form's."""
    n = 10**6 + 7
    X = cp.random.rand(n)
    (_, da, _) = tg.autodiff(tg.Reverse, scaled(tg.CUDA()), tg.Const,
                             tg.Duplicated(cp.zeros(n), cp.ones(n)), tg.Active(2.0), X,
                             ndrange=n)[0]
    assert da == pytest.approx(float(X.sum()), rel=1e-11)


def test_a_captured_simulation_replays_as_cuda_graphs(cp, monkeypatch):
    """The 50 launches replay as one CUDA graph whose nodes are updated for each call's new
    arrays and float values (no second graph), the reverse as another (its zeroings memset
    nodes); results and gradients equal the uncaptured ones, and the driver refuses nothing
    (a refusal would warn and fall back)."""
    from tapegrad.backends.cuda.graphs import LaunchGraph
    monkeypatch.setenv("TAPEGRAD_CAPTURE_CUDA_GRAPHS", "1")      # (off until run on a GPU)

    def sim(u, kappa):
        for _ in range(50):
            u_new = cp.empty_like(u)
            diffuse(tg.CUDA())(u_new, u, kappa, ndrange=u.size)
            u = u_new
        return u

    captured = tg.capture(sim)
    u0, w = cp.random.rand(1000), cp.random.rand(1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tg.errors.CaptureWarning)
        for kappa in (0.2, 0.1, 0.2, 0.1):
            cp.testing.assert_array_equal(captured(u0, kappa), sim(u0, kappa))
        for kappa in (0.2, 0.2, 0.3):
            g = tg.gradient(lambda u, k: tg.dot(captured(u, k), w), u0, kappa)
            g_plain = tg.gradient(lambda u, k: tg.dot(sim(u, k), w), u0, kappa)
            cp.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12)
            assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    (program,) = next(iter(captured.programs.values()))
    ((graph, stretch),) = program.compiled
    assert isinstance(stretch, LaunchGraph) and stretch.failed is None and stretch.updates
    assert captured.recordings == 1
    reversed_as_graphs = [what for r in program.reverses.values() if r
                          for listed, what in r.compiled if listed]
    assert reversed_as_graphs and all(isinstance(g, LaunchGraph) and g.failed is None
                                      for g in reversed_as_graphs)


def test_a_captured_gradient_runs_its_written_down_reverse_on_the_gpu(cp):
    """Without graphs: the forward and the reverse called from lists of launches
    (backends/cuda/launches.py); gradients equal the uncaptured ones, call after call."""
    from tapegrad.capturing.reverse import Reverse

    def sim(u, kappa):
        for _ in range(20):
            u_new = cp.empty_like(u)
            diffuse(tg.CUDA())(u_new, u, kappa, ndrange=u.size)
            u = u_new
        return tg.dot(u, u)

    captured = tg.capture(sim)
    u0 = cp.random.rand(1000)
    for kappa in (0.2, 0.1, 0.2, 0.3):
        g = tg.gradient(captured, u0, kappa)
        g_plain = tg.gradient(sim, u0, kappa)
        cp.testing.assert_allclose(g[0], g_plain[0], rtol=1e-12)
        assert g[1] == pytest.approx(g_plain[1], rel=1e-12)
    (program,) = next(iter(captured.programs.values()))
    assert any(isinstance(r, Reverse) for r in program.reverses.values())


def test_launches_go_on_cupys_current_stream_without_waiting(cp):
    B = cp.zeros(1 << 16)
    gpu = tg.CUDA()
    spin(gpu)(B, 10, ndrange=B.size)             # compiled
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        t0 = time.perf_counter()
        spin(gpu)(B, 200_000, ndrange=B.size)
        launched = time.perf_counter() - t0
        pending = not stream.done
    stream.synchronize()
    took = time.perf_counter() - t0
    assert pending and launched < took / 10, (launched, took)
    assert float(B[0]) > 0.0


def test_workgroup_and_grid_limits_are_tapegrad_errors(cp):
    B = cp.zeros(4096)
    with pytest.raises(tg.LaunchError, match="at most 1024"):
        sin_kernel(tg.CUDA(), 2048)(B, B, ndrange=4096)
    sin_kernel(tg.CUDA(), 1024)(B, cp.ones(4096), ndrange=4096)
    cp.testing.assert_allclose(B, math.sin(1.0))

    @tg.kernel
    def fill(C):
        i, j = tg.index(tg.Global, tg.NTuple)
        C[i, j] = 1.0

    # (up to 16 workgroups of dimension 0 share a thread block: tapegrad/backends/c/items.py)
    C = cp.zeros((65536 * 17, 2))
    with pytest.raises(tg.LaunchError, match="CUDA's grid y"):
        fill(tg.CUDA(), (1, 2))(C, ndrange=C.shape)
    assert not bool(C.any())


def test_the_tapes_fingerprints_are_computed_on_the_gpu(cp):
    from tapegrad.backends.cuda.fingerprint import fingerprint as on_gpu
    from tapegrad.tape.fingerprint import fingerprint
    x = cp.random.rand(1_000_003)
    h = on_gpu(x)
    assert isinstance(h, cp.ndarray) and int(h[0]) == fingerprint(cp.asnumpy(x))
    assert bool(fingerprint(x) == h)
    x[17] += 1.0
    assert not bool(fingerprint(x) == h)
    odd = cp.arange(13, dtype=cp.uint8)      # 13 bytes: a padded last word
    assert bool(on_gpu(odd) == on_gpu(odd.copy())) and not bool(on_gpu(odd) == on_gpu(odd[::-1]))


def test_a_cupy_array_changed_after_recording_is_refused_at_gradient(cp):
    x, w = cp.random.rand(256), cp.random.rand(256)

    def f(x):
        y = tg.zeros(tg.get_backend(x), np.float64, 256)
        sin_kernel(tg.get_backend(x))(y, x, ndrange=256)
        return tg.dot(y, w)

    with tg.Tape() as tape:
        loss = f(x)
    x[3] = 7.0
    with pytest.raises(tg.TapegradError, match="changed after recording"):
        tape.gradient(loss, x)


@tg.kernel
def softplus_kernel(out, x):
    i = tg.index()
    out[i] = tg.logaddexp(x[i], 0.0)


def test_torch_cuda_tensors_zero_copy_and_gradcheck(cp):
    """tapegrad.torch on CUDA tensors: CuPy views of torch's memory, launches on torch's
    current stream, torch.autograd.gradcheck in float64."""
    torch = pytest.importorskip("torch", reason="PyTorch is not installed on the GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch is a CPU build")
    import tapegrad.torch as tgt

    @tgt.function
    def softplus(x):
        assert isinstance(x, cp.ndarray)
        y = cp.empty_like(x)
        softplus_kernel(tg.CUDA())(y, x, ndrange=x.size)
        return y

    x = torch.linspace(-3.0, 3.0, 1000, dtype=torch.float64, device="cuda", requires_grad=True)
    with torch.cuda.stream(torch.cuda.Stream()):         # a side stream: launches follow it
        y = softplus(x)
        torch.testing.assert_close(y, torch.nn.functional.softplus(x))
        y.sum().backward()
    torch.cuda.synchronize()
    torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()))
    small = torch.linspace(-2.0, 2.0, 7, dtype=torch.float64, device="cuda", requires_grad=True)
    assert torch.autograd.gradcheck(softplus, (small,))


def test_a_halo_exchange_on_cupy_arrays_and_its_gradient_match_numpy(cp):
    """tapegrad.mpi on GPU arrays (one process, periodic: it exchanges with itself; staged
    through the host unless the MPI library is CUDA-aware)."""
    pytest.importorskip("mpi4py", reason="mpi4py is not installed on the GPU machine")
    from mpi4py import MPI

    import tapegrad.mpi as tgm
    halo = tgm.Halo(MPI.COMM_SELF, (40, 24), width=2, periodic=True)
    host = halo.local(np.random.default_rng(3).random((40, 24)))
    results = []
    for u0 in (host.copy(), cp.asarray(host)):
        with tg.Tape() as tape:
            u = tg.copy(u0)
            halo.exchange(u)
            flat = tg.reshape(u, (-1,))
            out = cp.empty_like(flat) if isinstance(flat, cp.ndarray) else np.empty_like(flat)
            sin_kernel(tg.get_backend(flat))(out, flat, ndrange=flat.size)
            total = tgm.allreduce(tg.dot(out, out), MPI.COMM_SELF)
        (g,) = tape.gradient(total, [u0])
        results.append(g if isinstance(g, np.ndarray) else cp.asnumpy(g))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12, atol=1e-14)


class Foreign:
    """Another library's CUDA array over a CuPy array's memory: its interface names the
    stream it was written on (CUDA Array Interface v3)."""

    def __init__(self, x, stream=None, pointer=None):
        self.x, self.shape, self.dtype, self.ndim = x, x.shape, x.dtype, x.ndim
        self.strides, self.size, self.nbytes = x.strides, x.size, x.nbytes
        self.pointer, self.stream = (x.data.ptr if pointer is None else pointer), stream

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self.pointer, False), "version": 3, "stream": self.stream}


@tg.kernel
def twice(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i]


def test_a_foreign_array_is_placed_by_its_pointer_and_waited_for_on_its_stream(cp):
    """docs/gpu.md, arrays from other libraries: the pointer's GPU from the CUDA runtime,
    host memory refused, and a launch on CuPy's stream after the work on the array's own."""
    from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
    gpu = tg.CUDA()
    A = cp.zeros(1 << 16)
    assert CUDA_ARRAYS.device_of(Foreign(A)) == 0
    host = np.zeros(1 << 16)
    with pytest.raises(tg.LaunchError, match="host memory"):
        twice(gpu)(cp.zeros_like(A), Foreign(A, pointer=host.ctypes.data), ndrange=A.size)
    spin(gpu)(A, 10, ndrange=A.size)             # compiled
    twice(gpu)(cp.zeros_like(A), Foreign(A), ndrange=A.size)
    cp.cuda.Device().synchronize()
    A[...] = 0.0
    cp.cuda.Device().synchronize()
    side = cp.cuda.Stream(non_blocking=True)
    with side:                                  # long work on the array's own stream
        spin(gpu)(A, 200_000, ndrange=A.size)
    B = cp.zeros_like(A)
    twice(gpu)(B, Foreign(A, stream=side.ptr), ndrange=A.size)   # on the null stream
    assert not side.done                         # (the host did not wait)
    cp.cuda.Device().synchronize()
    cp.testing.assert_array_equal(B, 2.0 * A)
    assert float(A[0]) > 0.0


def test_torch_tensors_that_require_grad_are_told_to_detach(cp):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed on the GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    x = torch.ones(8, dtype=torch.float64, device="cuda", requires_grad=True)
    assert tg.get_backend(x) == tg.CUDA(0)
    assert tg.get_backend(torch.ones(2, device="cuda")) is tg.get_backend(x)
    with pytest.raises(tg.LaunchError, match=r"pass t.detach\(\)"):
        twice(tg.CUDA())(cp.zeros(8), x, ndrange=8)
    with pytest.raises(tg.BackendError, match="a CPU torch.Tensor"):
        tg.get_backend(torch.ones(2))


def test_a_torch_tensor_launched_directly_follows_torchs_stream(cp):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed on the GPU machine")
    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    gpu = tg.CUDA()
    A = torch.zeros(1 << 16, dtype=torch.float64, device="cuda")
    B = torch.zeros_like(A)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):                # torch's current stream: the side stream
        A.add_(1.0)
        for _ in range(50):
            A.mul_(1.000001)
        twice(gpu)(B, A, ndrange=A.numel())       # CuPy's null stream waits for it
    torch.cuda.synchronize()
    torch.testing.assert_close(B, 2.0 * A)


def test_debug_nans_and_check_tape_on_cupy_arrays(cp):
    """tg.debug_nans on CuPy arrays (the check on the GPU: ArrayKind's defaults through CuPy),
    the arrays put back; check_tape of a GPU program names a planted wrong rule."""
    from tests.runtime.test_nans import ratio, root
    from tests.testing.test_check_tape import BAD_LINE, simulate
    cuda = tg.CUDA()
    A, B = cp.asarray([1.0, 0.0, 2.0, 3.0]), cp.full(4, cp.nan)
    with tg.debug_nans(), pytest.raises(tg.NonFiniteError, match="wrote nan into B\\[1\\]"):
        ratio(cuda)(B, A, ndrange=4)
    assert bool(cp.isnan(B).all())                              # put back (old NaNs kept)
    w = cp.asarray([1.0, 0.0, 1.0, 1.0])
    with tg.debug_nans(), pytest.raises(tg.NonFiniteError, match="the adjoint of kernel root"):
        def loss(A):
            out = cp.empty_like(A)
            root(cuda)(out, A, ndrange=A.size)
            return tg.dot(out, w)
        tg.gradient(loss, A)
    u = cp.asarray(np.random.default_rng(1).random(16))
    with pytest.raises(AssertionError, match=f"launch 57 of 100: .*:{BAD_LINE}"):
        tg.testing.check_tape(lambda u: simulate(cuda, u, 0.2, bad_at=56), u)


def test_the_same_gradient_bits_in_twenty_runs_under_tg_deterministic(cp):
    """(tests/backends/test_ordered.py does the same on PoCL: a gather's gradient, an Active
    scalar's and a scatter on the device's own arrays)"""
    from tests.backends.test_ordered import digests_on
    with tg.deterministic():
        runs = set(digests_on(tg.CUDA()))
    plain = set(digests_on(tg.CUDA(), 5))
    assert len(runs) == 1, f"{len(runs)} different results in 20 runs ({len(plain)} in 5 " \
                           f"without tg.deterministic())"
