"""Launch plans (tapegrad/runtime/plans.py) and the CUDA launch written out per kernel
(tapegrad/backends/cuda/plan.py).

The CUDA side runs on the stand-in CuPy (tapegrad/bench/standin_cupy.py): kernels are compiled
by the real NVRTC, and the driver keeps the bytes each launch hands it, which must be what
CuPy's own launcher would have passed for the same arguments (the packer of
tapegrad/backends/c/arguments.py) and the grid ``launch_shape`` computes.  The plans' guards
are checked where they matter: whatever a plan does not cover takes the general path, which
compiles, refuses or merges exactly as before."""

from __future__ import annotations

import math
import struct
import threading

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cuda.limits import launch_shape
from tapegrad.bench.standin_cupy import _cupy_bytes, installed
from tapegrad.runtime.launch import prepare
from tapegrad.runtime.plans import MAX_PLANS, plans_of
from tests.backends.test_atomics import histogram


@tg.kernel
def scaled(B, A, a):
    i = tg.index()
    B[i] = a * A[i]


@tg.kernel
def mixed(Out, X, n, k, flag, c):
    i, j = tg.index(tg.Global, tg.NTuple)
    v = X[i, j] * c + n
    if flag:
        v = v + k
    Out[i, j] = v


@tg.kernel
def cube(Out, X):
    i, j, k = tg.index(tg.Global, tg.NTuple)
    Out[i, j, k] = X[i, j, k] + 1.0


@tg.kernel
def add_into(Z, X):
    i = tg.index()
    Z[i] += X[i]


@tg.kernel
def sine(Y, X):
    i = tg.index()
    Y[i] = math.sin(X[i])


@pytest.fixture
def cupy(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    for k in (scaled, mixed, cube, add_into, sine, histogram):
        monkeypatch.setattr(k, "cache", {})
        monkeypatch.setattr(k, "_configured", {})
    with installed() as module:
        module.cuda.driver.keep = True
        yield module


def _sizes(cupy, cfg, args, nd):
    """Compile ``cfg`` for ``args`` (both variants) and tell the stand-in driver how many
    bytes each argument has, from what CuPy's launcher would pass; returns those bytes."""
    launcher, nd, _ = prepare(cfg, args, nd)
    expected = [_cupy_bytes(v) if not isinstance(v, np.uint64) else v.tobytes()
                for v in launcher.pack(args, nd)]
    for restrict in {False, launcher.restricts}:
        cupy.cuda.driver.sizes[launcher.variant(restrict).function.ptr] = tuple(
            len(e) for e in expected)
    return launcher, nd, expected


def _launch_and_compare(cupy, cfg, args, nd):
    """Launch, and compare what the driver was handed with what CuPy's launcher would have
    passed (each argument's bytes) and the grid ``launch_shape`` computes."""
    launcher, nd, expected = _sizes(cupy, cfg, args, nd)
    cfg(*args, ndrange=nd)
    f, grid, block, shared, stream, got = cupy.cuda.driver.kept[-1]
    assert got == expected
    assert grid == launch_shape(nd, launcher.groupsize, launcher.limits, launcher.items)
    assert block == (tuple(reversed(launcher.groupsize)) + (1, 1))[:3]
    assert f == launcher.last.function.ptr
    return f


def test_the_driver_gets_what_cupys_launcher_would_pass(cupy):
    gpu = tg.CUDA()
    A = cupy.asarray(np.arange(1000.0, dtype=np.float32))
    B = cupy.zeros(1000, np.float32)
    for n, a in ((1000, 0.5), (999, 2.0), (1, -3.0), (257, np.float32(0.25))):
        _launch_and_compare(cupy, scaled(gpu), (B, A, a), n)
    X = cupy.asarray(np.ones((33, 17)))
    Out = cupy.zeros((33, 17), np.float64)
    for flag in (True, False):
        _launch_and_compare(cupy, mixed(gpu), (Out, X, np.int32(7), 123456789012, flag, 1.5),
                            (33, 17))
    Y = cupy.asarray(np.ones((3, 5, 70), np.float32))
    _launch_and_compare(cupy, cube(gpu), (cupy.zeros((3, 5, 70), np.float32), Y), (3, 5, 70))
    assert cupy.cuda.driver.launches == 7


@pytest.mark.parametrize("flag", [True, np.True_, np.False_, False])
def test_scalars_as_numpy_makes_them_bools_infinities_and_int32s(cupy, flag):
    X, Out = cupy.asarray(np.ones((4, 4), np.float32)), cupy.zeros((4, 4), np.float32)
    args = (Out, X, np.int32(-7), -(2**40), flag, np.float32(np.inf))
    _launch_and_compare(cupy, mixed(tg.CUDA()), args, (4, 4))
    slots = cupy.cuda.driver.kept[-1][-1]
    assert np.frombuffer(slots[-4], np.int32)[0] == bool(flag)     # (then c, then the ndrange)
    assert np.frombuffer(slots[-3], np.float32)[0] == np.inf


def test_the_exact_packing_writes_the_slots_the_fast_one_does(cupy, monkeypatch):
    """(Where ``struct`` refuses a value, a launch packs as NumPy converts: arrays their
    addresses, 4-byte scalars padded to their 8-byte slots.)"""
    X, Out = cupy.asarray(np.ones((4, 4), np.float32)), cupy.zeros((4, 4), np.float32)
    args = (Out, X, np.int32(-7), -(2**40), True, np.float32(2.5))
    _launch_and_compare(cupy, mixed(tg.CUDA()), args, (4, 4))
    fast = cupy.cuda.driver.kept[-1]
    launcher, _, _ = prepare(mixed(tg.CUDA()), args, (4, 4))

    def refuse(*a):
        raise struct.error("refused")
    monkeypatch.setitem(launcher.code.launch.__globals__, "PACK", refuse)
    mixed(tg.CUDA())(*args, ndrange=(4, 4))
    assert cupy.cuda.driver.kept[-1] == fast


def test_an_int_past_int64_is_refused_by_name(cupy):
    A, B = cupy.zeros(8, np.float32), cupy.zeros(8, np.float32)
    _launch_and_compare(cupy, mixed(tg.CUDA()), (B.reshape(2, 4), A.reshape(2, 4), np.int32(1),
                                                 5, True, np.float32(1)), (2, 4))
    with pytest.raises(tg.LaunchError, match="argument k = 18446744073709551616 does not fit"):
        mixed(tg.CUDA())(B.reshape(2, 4), A.reshape(2, 4), np.int32(1), 2**64, True,
                         np.float32(1), ndrange=(2, 4))


def test_overlapping_arrays_launch_the_plain_variant(cupy):
    gpu = tg.CUDA()
    X = cupy.zeros(64, np.float64)
    restrict = _launch_and_compare(cupy, add_into(gpu), (cupy.zeros(64, np.float64), X), 64)
    assert "__restrict__" in add_into.source(backend=gpu)
    plain = _launch_and_compare(cupy, add_into(gpu), (X[8:40], X[0:32]), 32)   # overlapping
    assert plain != restrict and "__restrict__" not in add_into.source(backend=gpu)
    adjacent = _launch_and_compare(cupy, add_into(gpu), (X[32:64], X[0:32]), 32)
    assert adjacent == restrict


def test_threads_launching_one_kernel_each_hand_the_driver_their_own_arguments(cupy):
    cfg = scaled(tg.CUDA())
    arrays = [(cupy.zeros(100 + t, np.float64), cupy.zeros(100 + t, np.float64))
              for t in range(4)]
    _sizes(cupy, cfg, (*arrays[0], 1.0), 100)

    def run(t: int) -> None:
        B, A = arrays[t]
        for _ in range(300):
            cfg(B, A, float(t), ndrange=100 + t)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    kept = cupy.cuda.driver.kept
    assert len(kept) == 4 * 300
    for *_, slots in kept:
        B_ptr, n_B, A_ptr, n_A, a, n = (np.frombuffer(b, np.float64 if k == 4 else np.int64)[0]
                                        for k, b in enumerate(slots))
        t = int(a)
        B, A = arrays[t]
        assert (B_ptr, A_ptr, n_B, n_A, n) == (B.data.ptr, A.data.ptr, 100 + t, 100 + t,
                                                100 + t)


# -- the plans' guards, on the CPU: whatever a plan does not cover takes the general path ----

@pytest.fixture
def cpu_scaled(monkeypatch):
    monkeypatch.setattr(scaled, "cache", {})
    monkeypatch.setattr(scaled, "_configured", {})
    cfg = scaled(tg.CPU())
    A, B = np.arange(8.0), np.zeros(8)
    cfg(B, A, 2.0, ndrange=8)
    assert len(plans_of(cfg)) == 1 and "def plan(args, ndrange):" in plans_of(cfg)[0].source
    return cfg


def test_a_planned_launch_computes_what_the_general_path_does(cpu_scaled):
    A, B = np.arange(8.0), np.zeros(8)
    cpu_scaled(B, A, 3.0, ndrange=8)
    np.testing.assert_array_equal(B, 3.0 * A)
    cpu_scaled(B, A, 0.5, ndrange=np.int64(5))          # (a NumPy int: the general path)
    np.testing.assert_array_equal(B, np.r_[0.5 * A[:5], 3.0 * A[5:]])
    cpu_scaled(B, A, 2, ndrange=(8,))                   # an int scalar: a signature of its own
    np.testing.assert_array_equal(B, 2 * A)
    assert len(plans_of(cpu_scaled)) == 2


def test_a_plans_guards_leave_refusals_to_the_general_path(cpu_scaled):
    A, B = np.arange(8.0), np.zeros(8)
    readonly = np.zeros(8)
    readonly.flags.writeable = False
    with pytest.raises(tg.LaunchError, match="read-only"):
        cpu_scaled(readonly, A, 2.0, ndrange=8)
    with pytest.raises(tg.KernelIndexError):
        cpu_scaled(B, A, 2.0, ndrange=9)
    with pytest.raises(tg.LaunchError, match="takes 3 argument"):
        cpu_scaled(B, A, ndrange=8)
    cpu_scaled(A, A, 2.0, ndrange=8)                    # one array twice: merged, in place
    np.testing.assert_array_equal(A, 2.0 * np.arange(8.0))
    F = np.zeros(8, np.float32)
    cpu_scaled(F, np.ones(8, np.float32), 2.0, ndrange=8)     # another dtype: compiled
    np.testing.assert_array_equal(F, 2.0)


def test_a_tape_records_through_plans_and_never_takes_one_for_its_scalar(cpu_scaled):
    A = np.arange(1.0, 9.0)
    with tg.Tape() as old:
        s = old.watch(2.0)
    B = np.zeros(8)
    cpu_scaled(B, A, s, ndrange=8)      # (a tape scalar outside its tape: a plan for its type)
    assert not all(p.plain_scalars for p in plans_of(cpu_scaled))
    with tg.Tape() as tape:
        a = tape.watch(3.0)
        B, C = np.zeros(8), np.zeros(8)
        cpu_scaled(B, A, a, ndrange=8)            # the tape's scalar: recorded
        cpu_scaled(C, B, 2.0, ndrange=8)          # a plan's launch, recorded through it
        cpu_scaled(C, C, 0.5, ndrange=8)          # one array twice: merged, recorded in place
        loss = tg.dot(C, A)
    assert plans_of(cpu_scaled)[0].recording is not None
    (ga,) = tape.gradient(loss, [a])
    np.testing.assert_allclose(ga, A @ A, rtol=1e-12)       # d/da (a A * 2 * 0.5) . A


def test_a_kernel_keeps_at_most_max_plans(monkeypatch):
    monkeypatch.setattr(scaled, "cache", {})
    monkeypatch.setattr(scaled, "_configured", {})
    cfg = scaled(tg.CPU())
    for dtype in (np.float64, np.float32):
        for a in (2.0, 3, np.float32(2.0), np.float64(2.5), np.int32(3)):
            B = np.zeros(4, dtype)
            cfg(B, np.ones(4, dtype), a, ndrange=4)
            assert B[0] == a
    assert len(plans_of(cfg)) == MAX_PLANS


def _six_steps(gpu, step):
    """A loss over six steps ``step(out, u)`` from a copy of its argument, on new states."""
    def loss(u):
        u = tg.copy(u)
        for _ in range(6):
            out = gpu.allocate(np.float64, (64,))
            step(out, u)
            u = out
        return tg.sum(u)
    return loss


def _adjoint_launchers(kernel):
    """The kernel's compiled adjoints, and the CUDA launchers of those and their variants."""
    from tapegrad.runtime.adjoint import CompiledAdjoint
    compiled = [v for v in kernel.cache.values() if isinstance(v, CompiledAdjoint)]
    launchers = [c.launcher for c in compiled] + [
        variant for c in compiled if c.storing is not None
        for variant in c.storing.compiled.values()]
    return compiled, [o for o in launchers if hasattr(o, "code")]


def test_a_tapes_chain_on_cuda_runs_the_launches_record_by_record_would(cupy, monkeypatch):
    """(tapegrad/backends/launch_chain.py) the same adjoint on the same grids, the two
    shadow buffers swapped launch by launch.  (Record by record, the freed states' stand-ins,
    one array for both, pick the adjoint's plain variant; the chain passes the last step's
    arrays, which pick its restrict variant: the adjoint reads neither.)"""
    from tapegrad.tape import chains
    gpu = tg.CUDA()
    driver = cupy.cuda.driver
    u0 = cupy.asarray(np.linspace(0.0, 1.0, 64))
    loss = _six_steps(gpu, lambda out, u: scaled(gpu)(out, u, 0.5, ndrange=64))
    seen, runs = {}, []
    extend = chains.extend
    monkeypatch.setattr(chains, "extend", lambda *a: runs.append(extend(*a)) or runs[-1])
    for enabled in (False, True):
        monkeypatch.setattr(chains, "enabled", enabled)
        with tg.Tape() as tape:
            s = loss(u0)
        driver.keep, driver.kept = True, []
        tape.gradient(s, [u0])
        driver.keep = False
        seen[enabled] = [(f, grid) for f, grid, *_ in driver.kept]
    assert [g for _, g in seen[True]] == [g for _, g in seen[False]] and len(seen[True]) >= 6
    assert {f for f, _ in seen[True]} <= {f for f, _ in seen[False]}
    assert 5 in runs        # (the chain ran: the last step's record heads the other five)
    # packed once: from one launch of the chain to the next, two addresses swap places and
    # nothing else changes (every slot of a written-out launch is 8 bytes)
    for launcher in _adjoint_launchers(scaled)[1]:
        for variant in launcher.variants.values():
            driver.sizes[variant.function.ptr] = (8,) * len(launcher.code.params)
    driver.keep, driver.kept = True, []
    tape.gradient(s, [u0])
    slots = [kept[-1] for kept in driver.kept]
    chain = [p for p in slots if len(p) == len(slots[1])][-5:]
    for a, b in zip(chain, chain[1:]):
        changed = [k for k in range(len(a)) if a[k] != b[k]]
        assert len(changed) == 2 and (a[changed[0]], a[changed[1]]) == (b[changed[1]],
                                                                          b[changed[0]])



def test_a_nonlinear_chain_on_cuda_passes_each_records_own_state(cupy, monkeypatch):
    """sin's adjoint reads each step's input: the chain rewrites that address per launch,
    and hands the driver what the record-by-record sweep does (but for the output state's
    address, which the adjoint does not read: the chain passes the last step's)."""
    from tapegrad.tape import chains
    gpu = tg.CUDA()
    driver = cupy.cuda.driver
    u0 = cupy.asarray(np.linspace(0.0, 1.0, 64))
    loss = _six_steps(gpu, lambda out, u: sine(gpu)(out, u, ndrange=64))
    runs = []
    extend = chains.extend
    monkeypatch.setattr(chains, "extend", lambda *a: runs.append(extend(*a)) or runs[-1])
    with tg.Tape() as tape:
        s = loss(u0)
    tape.gradient(s, [u0])         # (compiles the adjoint)
    compiled, launchers = _adjoint_launchers(sine)
    adjoint = {}
    for launcher in launchers:
        for variant in launcher.variants.values():
            driver.sizes[variant.function.ptr] = (8,) * len(launcher.code.params)
            adjoint[variant.function.ptr] = launcher.code.offsets
    seen = {}
    for enabled in (False, True):
        monkeypatch.setattr(chains, "enabled", enabled)
        driver.keep, driver.kept, runs[:] = True, [], []
        tape.gradient(s, [u0])
        seen[enabled] = [(f, grid, slots) for f, grid, *_, slots in driver.kept
                         if f in adjoint]
    assert runs.count(5) == 1 and len(seen[True]) == len(seen[False]) == 6
    # (the shadows' parameters, after Y and X, in the order of shadow_of's values)
    (shadow_of,) = {tuple(c.adjoint.shadow_of.values()) for c in compiled}
    states = [r.values[1].data.ptr for r in tape.records if r.name == "sine"]
    for enabled in (False, True):
        def address(launch, param):
            f, _, slots = launch
            return int.from_bytes(slots[adjoint[f][param] // 8], "little")
        launches = seen[enabled]
        assert [address(m, 1) for m in launches] == states[::-1]    # X: the record's own
        y_bar, x_bar = (2 + shadow_of.index(p) for p in ("Y", "X"))
        # each launch reads the shadow the one before stored (of the state between them)
        assert [address(m, x_bar) for m in launches[:-1]] == \
            [address(m, y_bar) for m in launches[1:]]
    for (f, grid, slots), (f2, grid2, slots2) in zip(seen[True], seen[False]):
        pointers = {at // 8 for at in adjoint[f] if at is not None}
        assert grid == grid2 and adjoint[f] == adjoint[f2]
        assert [v for k, v in enumerate(slots) if k not in pointers] == \
            [v for k, v in enumerate(slots2) if k not in pointers]


def test_a_chain_of_a_kernel_whose_atomics_order_shows_goes_launch_by_launch(cupy):
    """(under tg.deterministic() its launch is the ordered variant's, which the packed chain
    would skip: backends/cuda/backend.py maybe_ordered)"""
    gpu = tg.CUDA()
    args = (cupy.zeros(4, np.float64), cupy.asarray(np.array([0, 1, 1, 3], np.int64)),
            cupy.asarray(np.ones(4)))
    launcher, _, _ = prepare(histogram(gpu), args, 4)
    assert launcher.launch == launcher.maybe_ordered
    assert launcher.chain_runner(3, 0, 2).chain is None
    packed, _, _ = prepare(scaled(gpu), (cupy.zeros(4, np.float64), cupy.zeros(4), 0.5), 4)
    assert packed.chain_runner(3, 0, 1).chain is not None
