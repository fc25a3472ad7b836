"""Several work-items per thread and restrict pointers (tapegrad/backends/c/items.py): which
kernels qualify, and, on PoCL, element by element, the same results as one work-item per
thread (bit for bit) and as the CPU, for primals, adjoints and tangents, at ndranges that are
not multiples of the items per thread or of the workgroup; every variant's CUDA C compiles
with NVRTC to an sm_90 cubin."""

from __future__ import annotations

import math

import numpy as np
import pyopencl.array as cla
import pytest

import tapegrad as tg
from tapegrad.backends.c.items import disjoint, independent_items, items_per_thread
from tapegrad.backends.c.printer import CUDA, OPENCL, CPrinter, kernel_symbol
from tapegrad.backends.cuda.limits import launch_shape
from tapegrad.backends.cuda.nvrtc import compile_cuda
from tapegrad.backends.opencl.backend import OpenCL
from tapegrad.backends.structure import device_functions
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import specialize
from tapegrad.runtime.arguments import check_args
from tests.backends import test_opencl as corpus
from tests.backends.dialects import as_cuda, without_atomic_helpers
from tests.backends.test_cuda import H200

CPU = tg.CPU()
# (label, items per thread, restrict variant allowed): the first is the code before items.py
SETTINGS = [("one", 1, False), ("four", 4, False), ("four_restrict", 4, True),
            ("three_restrict", 3, True)]


@pytest.fixture(scope="module")
def cl():
    return tg.OpenCL()


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


@tg.kernel
def stencil_1d(B, A):
    """A guarded stencil whose edges leave early."""
    i = tg.index()
    n = A.shape[0]
    if i == 0 or i == n - 1:
        B[i] = A[i]
        return
    B[i] = A[i - 1] - 2.0 * A[i] + A[i + 1] * A[i]


@tg.kernel
def stencil_2d(B, A, alpha):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = A.shape
    if i == 0 or j == 0 or i == n - 1 or j == m - 1:
        return
    B[i, j] = A[i, j] + alpha * (A[i - 1, j] + A[i + 1, j] + A[i, j - 1] * A[i, j + 1]
                                 - 4.0 * math.sin(A[i, j]))


@tg.kernel
def early_exit(Y, X):
    """A loop left by ``return``: one work-item's return must not end its thread's others."""
    i = tg.index()
    x = X[i]
    for _ in range(12):
        if x > 4.0:
            Y[i] = x
            return
        x = x * 1.5 + 0.25
    Y[i] = -x


@tg.kernel
def coordinates(C):
    """Every index a work-item can ask for, written where it is (2-D and 3-D)."""
    g = tg.index()
    C[g, 0] = g
    C[g, 1] = tg.index(tg.Local)
    C[g, 2] = tg.index(tg.Group)
    C[g, 3] = tg.groupsize()[0] * 1000 + tg.ndrange()[0]


@tg.kernel
def histogram(H, idx):
    i = tg.index()
    tg.atomic_add(H, idx[i] % H.shape[0], i + 1)


def _run(backend, move, kernel, args, ndrange, groupsize=None, wrt=(), forward=False):
    """The primal's first argument, then the adjoint's shadows of ``wrt`` (ones seeding
    argument 0), then (``forward``) the tangent of argument 0 with v = 1 in ``wrt[0]``; as
    NumPy arrays."""
    cfg = kernel(backend, groupsize)
    first = move(args[0].copy())
    cfg(first, *[move(a.copy()) if isinstance(a, np.ndarray) else a for a in args[1:]],
        ndrange=ndrange)
    out = [tg.to_numpy(first)]
    if wrt:
        shadows, annotated = {}, []
        for k, a in enumerate(args):
            if k == 0 or k in wrt:
                shadows[k] = move(np.ones(a.shape) if k == 0 else np.zeros(a.shape))
                annotated.append(tg.Duplicated(move(a.copy()), shadows[k]))
            else:
                annotated.append(move(a.copy()) if isinstance(a, np.ndarray) else a)
        tg.autodiff(tg.Reverse, cfg, tg.Const, *annotated, ndrange=ndrange)
        out += [tg.to_numpy(shadows[k]) for k in wrt]
    if forward:
        tangent = move(np.zeros(args[0].shape))
        annotated = [tg.Duplicated(move(args[0].copy()), tangent)] + [
            tg.Duplicated(move(a.copy()), move(np.ones(a.shape))) if k == wrt[0] else
            move(a.copy()) if isinstance(a, np.ndarray) else a
            for k, a in enumerate(args) if k > 0]
        tg.autodiff(tg.Forward, cfg, tg.Const, *annotated, ndrange=ndrange)
        out.append(tg.to_numpy(tangent))
    return out


def _under(monkeypatch, items, restrict, fn):
    """``fn()`` with kernels compiled afresh for ``items`` per thread and restrict or not."""
    monkeypatch.setenv("TAPEGRAD_ITEMS_PER_THREAD", str(items))
    monkeypatch.setenv("TAPEGRAD_RESTRICT", "1" if restrict else "0")
    for k in (sin_k, saxpy, stencil_1d, stencil_2d, early_exit, coordinates, histogram,
              corpus.tree_sums):
        k.cache.clear()
    return fn()


rng = np.random.default_rng(44)
CASES = {
    # name: (kernel, args, ndrange, groupsize, wrt, forward)
    "sin_f32_1": (sin_k, (np.zeros(1, np.float32), rng.random(1, np.float32)), 1, None, (),
                  False),
    "sin_f32_ragged": (sin_k, (np.zeros(3 * 4 * 256 + 17, np.float32),
                               rng.random(3 * 4 * 256 + 17, np.float32)), 3 * 4 * 256 + 17,
                       None, (), False),
    "sin_exact_blocks": (sin_k, (np.zeros(2048), rng.random(2048)), 2048, None, (1,), True),
    "saxpy_ragged_groups": (saxpy, (rng.random(1000), 2.5, rng.random(1000)), 1000, None,
                            (2,), True),
    "saxpy_part_of_a_block": (saxpy, (rng.random(300), -1.5, rng.random(300)), 300, 64,
                              (2,), True),
    "stencil_1d": (stencil_1d, (np.zeros(777), rng.random(777)), 777, 32, (1,), True),
    "stencil_2d": (stencil_2d, (np.zeros((37, 53)), rng.random((37, 53)), 0.2), (37, 53),
                   (4, 8), (1,), True),
    "stencil_2d_default_groups": (stencil_2d, (np.zeros((70, 20)), rng.random((70, 20)), 0.1),
                                  (70, 20), None, (1,), True),
    "early_exit": (early_exit, (np.zeros(999), 4 * rng.random(999)), 999, 16, (1,), True),
    "coordinates_2d": (coordinates, (np.zeros((37 * 53, 4), np.int64),), (37, 53), (4, 8),
                       (), False),
    "coordinates_3d": (coordinates, (np.zeros((9 * 7 * 5, 4), np.int64),), (9, 7, 5),
                       (2, 4, 4), (), False),
    "histogram": (histogram, (np.zeros(7, np.int64), rng.integers(0, 100, 1500)), 1500, 64,
                  (), False),
    "barriers_not_independent": (corpus.tree_sums, (np.zeros(2), rng.random(128)), 128, 64,
                                 (), False),
}


@pytest.mark.parametrize("name", CASES)
def test_every_setting_agrees_with_one_item_per_thread_bit_for_bit_and_with_the_cpu(
        cl, monkeypatch, name):
    kernel, args, ndrange, groupsize, wrt, forward = CASES[name]
    results = {}
    for label, items, restrict in SETTINGS:
        results[label] = _under(monkeypatch, items, restrict, lambda: _run(
            cl, lambda x: cla.to_device(cl.queue, x), kernel, args, ndrange, groupsize, wrt,
            forward))
    cpu = _run(CPU, lambda x: x, kernel, args, ndrange, groupsize, wrt, forward)
    for label, got in results.items():
        for k, (a, b) in enumerate(zip(got, results["one"])):
            np.testing.assert_array_equal(a, b, err_msg=f"{label}, result {k}")
        for k, (a, b) in enumerate(zip(got, cpu)):
            np.testing.assert_allclose(a, b, rtol=1e-6 if a.dtype == np.float32 else 1e-13,
                                       err_msg=f"{label} vs the CPU, result {k}")
    source = kernel.source(backend=cl)
    assert ("tg_item(" in source) == independent_items(_typed(kernel, args, ndrange,
                                                              groupsize))


def test_an_active_scalars_sum_over_several_items_per_thread(cl, monkeypatch):
    """An Active scalar's adjoint adds per work-item into 64 slots (in another order with
    several work-items per thread: the same sum to rounding)."""
    X, Y = rng.random(1000), rng.random(1000)

    def da():
        Yd = cla.to_device(cl.queue, Y)
        ((_, got, _),) = tg.autodiff(
            tg.Reverse, saxpy(cl), tg.Const, tg.Duplicated(Yd, cla.to_device(
                cl.queue, np.ones(1000))), tg.Active(2.0),
            tg.Duplicated(cla.to_device(cl.queue, X), cla.zeros(cl.queue, 1000, np.float64)),
            ndrange=1000)
        return got
    for _, items, restrict in SETTINGS:
        assert _under(monkeypatch, items, restrict, da) == pytest.approx(X.sum(), rel=1e-13)


def test_overlapping_arrays_run_the_plain_variant_and_disjoint_views_the_restrict_one(
        cl, monkeypatch):
    monkeypatch.delenv("TAPEGRAD_ITEMS_PER_THREAD", raising=False)
    monkeypatch.delenv("TAPEGRAD_RESTRICT", raising=False)
    sin_k.cache.clear()
    xn = rng.random(600)
    x = cla.to_device(cl.queue, xn)
    sin_k(cl)(x[:300], x[300:], ndrange=300)          # one buffer, disjoint halves
    assert "*restrict B" in sin_k.source(backend=cl)
    sin_k(cl)(x[:300], x[:300], ndrange=300)          # two views of the same elements
    assert "restrict" not in sin_k.source(backend=cl).split("\n", 1)[1]
    want = xn.copy()
    want[:300] = np.sin(xn[300:])
    want[:300] = np.sin(want[:300])
    np.testing.assert_allclose(x.get(), want, rtol=1e-15)
    sin_k(cl)(x[:300], x[299:599], ndrange=300)       # one element shared: plain
    assert "restrict" not in sin_k.source(backend=cl).split("\n", 1)[1]


def test_disjoint_spans():
    assert disjoint([]) and disjoint([(0, 5, 5), (0, 0, 10)])        # (an empty one)
    assert disjoint([(1, 0, 8), (2, 0, 8), (1, 8, 16)])
    assert not disjoint([(1, 0, 8), (2, 0, 8), (1, 7, 16)])
    assert not disjoint([(0, 0, 100), (0, 40, 48)])


def _typed(kernel, args, ndrange, groupsize):
    rank = len(ndrange) if isinstance(ndrange, tuple) else 1
    wgs = groupsize or {1: (256,), 2: (16, 16), 3: (4, 8, 8)}[rank]
    wgs = (wgs,) if isinstance(wgs, int) else wgs
    return specialize(kernel_ir(kernel), check_args(kernel, CPU, args), rank, wgs, kernel_ir)


def test_which_kernels_have_independent_work_items():
    assert independent_items(_typed(saxpy, CASES["saxpy_ragged_groups"][1], 1000, None))
    assert independent_items(_typed(early_exit, CASES["early_exit"][1], 999, 16))
    assert independent_items(_typed(histogram, CASES["histogram"][1], 1500, 64))
    assert independent_items(_typed(corpus.private_slots, (np.zeros(3), np.zeros(3)), 3, 64))
    assert not independent_items(_typed(corpus.tree_sums, (np.zeros(2), np.zeros(128)), 128,
                                        64))


def test_the_switches(monkeypatch):
    monkeypatch.delenv("TAPEGRAD_ITEMS_PER_THREAD", raising=False)
    assert items_per_thread() == 4
    tk = _typed(saxpy, CASES["saxpy_ragged_groups"][1], 1000, None)
    monkeypatch.setenv("TAPEGRAD_ITEMS_PER_THREAD", "1")
    one = CPrinter(tk, CUDA).module([])
    assert "tg_item" not in one and "if (!(_g0 * 256 + _l0 < _n0)) return;" in one
    monkeypatch.setenv("TAPEGRAD_ITEMS_PER_THREAD", "17")
    with pytest.raises(ValueError, match="TAPEGRAD_ITEMS_PER_THREAD='17'"):
        items_per_thread()
    monkeypatch.setenv("TAPEGRAD_ITEMS_PER_THREAD", "4")
    monkeypatch.setenv("TAPEGRAD_RESTRICT", "0")
    launcher = OpenCL().compile(tk)
    assert "restrict" not in launcher.source.split("\n", 1)[1] and "tg_item(" in launcher.source
    assert list(launcher.variants) == [False]


def test_the_grid_shrinks_along_dimension_0(monkeypatch):
    assert launch_shape((1000,), (256,), H200, 4) == (1, 1, 1)
    assert launch_shape((4096,), (256,), H200, 4) == (4, 1, 1)
    assert launch_shape((4097,), (256,), H200, 4) == (5, 1, 1)      # 17 workgroups
    assert launch_shape((37, 53), (4, 8), H200, 3) == (7, 4, 1)      # 10 groups along y: 4
    assert launch_shape((9, 7, 5), (2, 4, 4), H200, 4) == (2, 2, 2)
    monkeypatch.setenv("TAPEGRAD_ITEMS_PER_THREAD", "3")
    launcher = OpenCL().compile(_typed(stencil_2d, CASES["stencil_2d"][1], (37, 53), (4, 8)))
    assert launcher.sizes((37, 53)) == ((56, 16), (8, 4))
    with pytest.raises(tg.LaunchError, match="65536 blocks of 4 workgroups along its "
                                             "dimension 0"):
        launch_shape((65536 * 4 * 16, 4), (16, 4), H200, 4)


class _Recording(OpenCL):
    """The OpenCL backend, keeping each typed kernel it compiles (primal, adjoint, tangent)."""

    compiled: list = []

    def compile(self, tk):
        self.compiled.append(tk)
        return super().compile(tk)


@pytest.fixture(scope="module")
def every_kernel():
    """The typed kernels the cases above compile: primals, adjoints and tangents."""
    mp = pytest.MonkeyPatch()
    _Recording.compiled = []
    cl = _Recording()
    try:
        for case in CASES.values():
            _under(mp, 4, True, lambda case=case: _run(
                cl, lambda x: cla.to_device(cl.queue, x), *case))
    finally:
        mp.undo()
    return {f"{tk.name}_{k}": tk for k, tk in enumerate(_Recording.compiled)}


@pytest.mark.parametrize("restrict", [False, True], ids=["plain", "restrict"])
def test_every_variant_of_every_kernel_compiles_to_an_sm90_cubin(every_kernel, restrict):
    assert len(every_kernel) > 20
    for tk in every_kernel.values():
        callees = device_functions(tk)
        printer = CPrinter(tk, CUDA, items=4, restrict=restrict)
        cuda = printer.module(callees)
        assert ("tg_item(" in cuda) == independent_items(tk) and (
            "__restrict__" in cuda) == (restrict and independent_items(tk))
        binary = compile_cuda(cuda, kernel_symbol(tk.name), 90)
        assert binary.kind == "cubin" and binary.data[:4] == b"\x7fELF"
        opencl = CPrinter(tk, OPENCL, items=4, restrict=restrict).module(callees)
        assert as_cuda(without_atomic_helpers(opencl)).strip() == \
            without_atomic_helpers(cuda).strip()
