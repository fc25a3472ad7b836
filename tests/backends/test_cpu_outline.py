"""The parallel loop's body as a function of its own (tapegrad/backends/cpu/outline.py): the
kernel's ``prange`` loop only calls ``<kernel>__task``, which Numba compiles once, serially;
results, compile errors at the user's line and bounds-checked runs are as before."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def shifted_sum(S, X, a):
    i = tg.index()
    n = X.size
    s = 0.0
    for k in range(3):
        if i + k < n:
            s = s + a * X[i + k]
    S[i] = s


@tg.kernel
def histogram(H, X):
    i = tg.index()
    tg.atomic_add(H, int(X[i]), 1.0)      # per-thread copies, merged after the tasks


def test_the_parallel_loop_calls_the_task_and_results_match_numpy():
    X = np.random.default_rng(0).random(100)
    S = np.zeros(100)
    shifted_sum(CPU, 16)(S, X, 2.0, ndrange=100)
    expect = 2.0 * np.array([X[i:i + 3].sum() for i in range(100)])
    np.testing.assert_allclose(S, expect)
    source = shifted_sum.source(backend=CPU)
    assert "def shifted_sum__task(_c, " in source
    loop = source.split("numba.prange(_nchunks):")[1].splitlines()
    body = [line.strip() for line in loop[1:] if line.startswith(" " * 8)]
    assert body[-1].startswith("shifted_sum__task(np.int64(_c), ")   # the loop's only call
    assert "# shifted_sum" not in source.split("def shifted_sum(")[1]  # no user code left in it


def test_the_task_compiles_once():
    """Numba types the loop index int64 in the kernel and uint64 in the parallel function it
    builds; the call's int64 cast makes both the same signature.  (The generated module is
    run here without the disk cache, which would have nothing to compile.)"""
    shifted_sum(CPU, 16)(np.zeros(40), np.ones(40), 1.0, ndrange=40)
    source = shifted_sum.source(backend=CPU).replace("cache=True", "cache=False")
    namespace: dict = {}
    exec(compile(source, "<generated shifted_sum>", "exec"), namespace)
    kernel = namespace["shifted_sum"]
    values = {"S": np.zeros(40), "X": np.ones(40), "a": 1.0, "_n0": 40, "_groups0": 3,
              "_nchunks": 2}
    kernel(*[values[p] for p in kernel.py_func.__code__.co_varnames[
        :kernel.py_func.__code__.co_argcount]])
    np.testing.assert_array_equal(values["S"], [3.0] * 38 + [2.0, 1.0])
    assert len(namespace["shifted_sum__task"].signatures) == 1


def test_per_thread_copies_and_their_merge_stay_right():
    X = np.random.default_rng(1).integers(0, 8, 5000).astype(np.float64)
    H = np.zeros(8)
    histogram(CPU, 64)(H, X, ndrange=X.size)
    np.testing.assert_array_equal(H, np.bincount(X.astype(int), minlength=8))
    assert "def histogram__task(" in histogram.source(backend=CPU)


def test_the_adjoint_is_outlined_and_right():
    X = np.random.default_rng(2).random(50)
    dX, dS = np.zeros(50), np.random.default_rng(3).random(50)
    tg.autodiff(tg.Reverse, shifted_sum(CPU, 16), tg.Const, tg.Duplicated(np.zeros(50), dS.copy()),
                tg.Duplicated(X, dX), 2.0, ndrange=50)
    expect = np.zeros(50)
    for i in range(50):                       # S[i] = 2 * (X[i] + X[i+1] + X[i+2])
        expect[i:i + 3] += 2.0 * dS[i]
    np.testing.assert_allclose(dX, expect[:50])


def test_bounds_checked_kernels_are_not_outlined(monkeypatch):
    """(they run serially and are replayed in Python to name the failing line)"""
    monkeypatch.setenv("TAPEGRAD_BOUNDSCHECK", "1")

    @tg.kernel
    def past_the_end(B, A):
        i = tg.index()
        if A[i] > 0.0:                 # (out of sight of the launch's range check)
            B[i] = A[i + 1]

    with pytest.raises(tg.KernelIndexError, match=r"A\[i \+ 1\] with index 8"):
        past_the_end(CPU, 4)(np.zeros(8), np.ones(8), ndrange=8)
    assert "__task" not in past_the_end.source(backend=CPU)


# -- a launch of one workgroup: its task called in the launching thread -------------------

@tg.kernel
def block_sums(S, X, a):
    """Local memory and barriers: each group's sum, and every element scaled in place."""
    i = tg.index()
    li = tg.index(tg.Local)
    buf = tg.localmem(np.float64, (32,))
    buf[li] = X[i] * a
    tg.synchronize()
    if li == 0:
        s = 0.0
        for k in range(32):
            s += buf[k]
        S[tg.index(tg.Group)] = s
    X[i] = buf[(li + 1) % 32]


@tg.kernel
def plane(B, A, a):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = a * A[i, j] - math.sin(A[j % A.shape[0], i % A.shape[1]])


def _launcher(kernel, ndrange):
    found = kernel.cache[("last", "primal", CPU)]
    return found.variant(ndrange) if hasattr(found, "variant") else found


class _Refused:
    """A dispatcher that must not be called (the launch was to call the task)."""

    def __init__(self, dispatcher):
        self.dispatcher = dispatcher

    def __call__(self, *args):
        raise AssertionError("the parallel kernel ran a launch of one workgroup")


def _special(rng, shape):
    x = rng.standard_normal(shape)
    x.flat[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324]
    return x


def test_a_launch_of_one_workgroup_calls_its_task_here_with_the_parallel_kernels_results(
        monkeypatch):
    rng = np.random.default_rng(4)
    cases = [(shifted_sum(CPU, 128), lambda: (np.zeros(100), _special(rng, 100), 2.0), 100),
             (block_sums(CPU, 32), lambda: (np.zeros(1), _special(rng, 32), 0.5), 32),
             (plane(CPU, (8, 16)), lambda: (np.zeros((8, 16)), _special(rng, (8, 16)), -1.5),
              (8, 16))]
    for cfg, make, nd in cases:
        args = make()
        cfg(*[a.copy() if isinstance(a, np.ndarray) else a for a in args], ndrange=nd)
        launcher = _launcher(cfg.kernel, nd if isinstance(nd, tuple) else (nd,))
        assert launcher.one_group is not None
        direct = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        monkeypatch.setattr(launcher, "dispatcher", _Refused(launcher.dispatcher))
        cfg(*direct, ndrange=nd)
        monkeypatch.undo()
        parallel = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        monkeypatch.setattr(launcher, "one_group", None)
        cfg(*parallel, ndrange=nd)
        monkeypatch.undo()
        for d, p in zip(direct, parallel):   # (bit for bit, but a NaN's sign and payload:
            if isinstance(d, np.ndarray):     # LLVM may inline the task into the kernel)
                assert np.array_equal(d, p, equal_nan=True)
                assert np.array_equal(np.signbit(d)[~np.isnan(d)], np.signbit(p)[~np.isnan(p)])


def test_an_active_scalars_group_sum_and_deterministic_runs_take_the_parallel_kernel(
        monkeypatch):
    X = np.random.default_rng(5).random(64)
    cfg = shifted_sum(CPU, 64)
    (_, _, da) = tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(np.zeros(64),
                                                                      np.ones(64)),
                             tg.Duplicated(X, np.zeros(64)), tg.Active(2.0), ndrange=64)[0]
    expect = sum(X[i:i + 3].sum() for i in range(64))
    assert da == pytest.approx(expect, rel=1e-13)         # (one group: its task, here)
    cfg(np.zeros(64), X, 2.0, ndrange=64)
    launcher = _launcher(shifted_sum, (64,))
    calls = []
    run = launcher.dispatcher
    monkeypatch.setattr(launcher, "dispatcher", lambda *a: calls.append(1) or run(*a))
    with tg.deterministic():
        cfg(np.zeros(64), X, 2.0, ndrange=64)
    assert calls == [1]


def test_a_kernel_adding_into_per_thread_copies_has_no_call_of_one_group():
    X = np.random.default_rng(6).integers(0, 8, 64).astype(np.float64)
    H = np.zeros(8)
    histogram(CPU, 64)(H, X, ndrange=64)
    np.testing.assert_array_equal(H, np.bincount(X.astype(int), minlength=8))
    assert _launcher(histogram, (64,)).one_group is None


@tg.kernel
def diffuse(U, V, k):
    i = tg.index()
    n = V.shape[0]
    U[i] = V[i] + k * (V[(i + 1) % n] - 2.0 * V[i] + V[(i - 1) % n])


def test_an_active_scalars_sum_is_the_same_whether_a_launch_was_its_kernels_first(
        monkeypatch):
    """The task a launch of one group calls is the one the parallel kernel would run it in
    (the last), so its sums go to the same slots: the first gradient (each adjoint's first
    launch through the parallel kernel) and the next are equal bit for bit (PyTorch's
    gradcheck found them an ulp apart when the call took the first task)."""
    monkeypatch.setattr(diffuse, "cache", {})
    monkeypatch.setattr(diffuse, "_configured", {})

    def simulate(u, k):
        for _ in range(30):
            v = np.empty_like(u)
            diffuse(CPU)(v, u, k, ndrange=u.size)
            u = v
        return tg.dot(u, u)

    u0 = np.random.default_rng(7).random(12)
    first = tg.gradient(simulate, u0, 0.15)
    again = tg.gradient(simulate, u0, 0.15)
    assert first[1] == again[1] and first[0].tobytes() == again[0].tobytes()
    h = 1e-6                                                # and right: central differences
    fd = (float(simulate(u0, 0.15 + h)) - float(simulate(u0, 0.15 - h))) / (2 * h)
    assert first[1] == pytest.approx(fd, rel=1e-7)
