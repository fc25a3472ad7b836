"""Atomic read-modify-write operations: no lost updates under contention, correct old values."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

N_HEAVY = 1_000_000       # the CPU: a million updates into 16 bins
BINS = 16
N_DEVICE = 1 << 16        # the devices' test harness (copies per launch): 65,536 updates into 4 bins
BINS_DEVICE = 4


@tg.kernel
def histogram(H, keys, weights):
    i = tg.index()
    tg.atomic_add(H, keys[i], weights[i])


@tg.kernel
def histogram_literal(H, keys):
    i = tg.index()
    tg.atomic_add(H, keys[i], 1)


@pytest.fixture(scope="module")
def heavy_keys(size):
    """Random bin numbers: many updates per bin, from every workgroup."""
    rng = np.random.default_rng(1234)
    return rng.integers(0, size(BINS, BINS_DEVICE), size(N_HEAVY, N_DEVICE))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32, np.int64],
                         ids=lambda d: d.__name__)
def test_histogram_under_heavy_contention_loses_nothing(backend, size, heavy_keys, dtype):
    n, bins = heavy_keys.size, size(BINS, BINS_DEVICE)
    rng = np.random.default_rng(99)
    weights = rng.integers(0, 4, n).astype(dtype)   # small integers: sums are exact
    H = np.zeros(bins, dtype)
    histogram(backend, size(256, 64))(H, heavy_keys, weights, ndrange=n)
    expected = np.bincount(heavy_keys, weights=weights.astype(np.float64), minlength=bins)
    assert H.dtype == dtype
    np.testing.assert_array_equal(H.astype(np.float64), expected)
    # and again on top of existing contents (atomics add to what is there)
    histogram(backend, size(256, 64))(H, heavy_keys, weights, ndrange=n)
    np.testing.assert_array_equal(H.astype(np.float64), 2 * expected)


@pytest.mark.parametrize("dtype", [np.float32, np.int32], ids=lambda d: d.__name__)
def test_histogram_counts_with_int_literal_increment(backend, size, heavy_keys, dtype):
    H = np.zeros(size(BINS, BINS_DEVICE), dtype)
    histogram_literal(backend, size(1024, 128))(H, heavy_keys, ndrange=heavy_keys.size)
    np.testing.assert_array_equal(H, np.bincount(heavy_keys, minlength=H.size).astype(dtype))


@tg.kernel
def single_counter(C, Old, Slot):
    i = tg.index()
    old = tg.atomic_add(C, 0, 1)
    Old[i] = old
    Slot[old] = i


def test_atomic_add_returns_unique_old_values(backend, size):
    n = size(200_000, 300)   # not a multiple of the workgroup size
    C = np.zeros(1, np.int64)
    Old = np.full(n, -1, np.int64)
    Slot = np.full(n, -1, np.int64)
    single_counter(backend, size(128, 64))(C, Old, Slot, ndrange=n)
    assert C[0] == n
    np.testing.assert_array_equal(np.sort(Old), np.arange(n))     # a permutation of range(n)
    np.testing.assert_array_equal(Slot[Old], np.arange(n))        # each slot went to one item


@tg.kernel
def counter_sub(C, Old, start):
    i = tg.index()
    Old[i] = tg.atomic_sub(C, 0, 1) - start


@pytest.mark.parametrize("dtype", [np.int32, np.float64], ids=lambda d: d.__name__)
def test_atomic_sub(backend, size, dtype):
    n = size(100_000, 300)
    C = np.array([n], dtype)
    Old = np.zeros(n, dtype)
    counter_sub(backend, size(256, 64))(C, Old, n, ndrange=n)
    assert C[0] == 0
    # the old values are n, n-1, ..., 1 in some order
    np.testing.assert_array_equal(np.sort(Old), np.arange(-n + 1, 1).astype(dtype))


@tg.kernel
def extremes(Mn, Mx, OldMn, OldMx, A):
    i = tg.index()
    OldMn[i] = tg.atomic_min(Mn, i % 4, A[i])
    OldMx[i] = tg.atomic_max(Mx, i % 4, A[i])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64],
                         ids=lambda d: d.__name__)
def test_atomic_min_max(backend, size, dtype):
    rng = np.random.default_rng(5)
    n = size(50_000, 400)   # a multiple of the 4 lanes
    A = rng.integers(-10**6, 10**6, n).astype(dtype)
    Mn = np.full(4, 10**7, dtype)
    Mx = np.full(4, -10**7, dtype)
    OldMn, OldMx = np.zeros(n, dtype), np.zeros(n, dtype)
    extremes(backend, size(256, 64))(Mn, Mx, OldMn, OldMx, A, ndrange=n)
    lanes = A.reshape(-1, 4)
    np.testing.assert_array_equal(Mn, lanes.min(0))
    np.testing.assert_array_equal(Mx, lanes.max(0))
    # every returned old value is one the element held: the initial value or an input before it
    lane = np.arange(n) % 4
    assert (OldMn >= Mn[lane]).all() and (OldMx <= Mx[lane]).all()
    assert np.isin(OldMn, np.concatenate([A, [10**7]])).all()
    assert np.isin(OldMx, np.concatenate([A, [-10**7]])).all()
    # exactly one work-item per lane saw the initial value (every input beats it)
    assert (OldMn == 10**7).sum() == 4 and (OldMx == -10**7).sum() == 4


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: d.__name__)
def test_atomic_min_max_keep_pythons_rule_for_nan(backend, dtype):
    """The element becomes the value only where it is smaller (min) / larger (max), as
    Python's min(old, v) / max(old, v) and the GPUs' compare-and-swap do: a NaN already
    there stays, a NaN value changes nothing.  (The CPU used LLVM's fmin/fmax, which replace
    a stored NaN: atomic_max into [nan] gave 1.0.)"""
    A = np.array([1.0, np.nan, -2.0, 3.0, np.nan, 0.5, -4.0, 2.0], dtype)
    Mn = np.array([np.nan, 0.0, np.nan, 1.0], dtype)
    Mx = Mn.copy()
    want_mn, want_mx = Mn.tolist(), Mx.tolist()
    for i, a in enumerate(A.tolist()):
        want_mn[i % 4], want_mx[i % 4] = min(want_mn[i % 4], a), max(want_mx[i % 4], a)
    OldMn, OldMx = np.zeros(8, dtype), np.zeros(8, dtype)
    extremes(backend, 1)(Mn, Mx, OldMn, OldMx, A, ndrange=8)
    np.testing.assert_array_equal(Mn, np.array(want_mn, dtype))
    np.testing.assert_array_equal(Mx, np.array(want_mx, dtype))


@tg.kernel
def scatter_2d(H, R, C, V):
    i = tg.index()
    tg.atomic_add(H, (R[i], C[i]), V[i])


@tg.kernel
def self_index_2d(H, G, M):
    ix = tg.index(tg.Global, tg.NTuple)
    r, c = ix
    tg.atomic_add(H, ix, 1.0)
    tg.atomic_add(G, (r % 2, c % 3), 1)
    tg.atomic_max(M, (r % 2, 0), r * 100 + c)


def test_2d_atomics_with_tuple_indices(backend, size):
    rng = np.random.default_rng(3)
    n = size(300_000, 400)
    R = rng.integers(0, 5, n)
    C = rng.integers(0, 7, n)
    V = rng.integers(1, 3, n).astype(np.float64)
    H = np.zeros((5, 7))
    scatter_2d(backend, size(256, 64))(H, R, C, V, ndrange=n)
    expected = np.zeros((5, 7))
    np.add.at(expected, (R, C), V)
    np.testing.assert_array_equal(H, expected)


def test_atomics_with_index_tuple_from_ntuple(backend):
    nd = (6, 9)
    H = np.zeros(nd)
    G = np.zeros((2, 3), np.int32)
    M = np.full((2, 2), -1, np.int64)
    self_index_2d(backend, (4, 4))(H, G, M, ndrange=nd)
    np.testing.assert_array_equal(H, np.ones(nd))
    np.testing.assert_array_equal(G, np.full((2, 3), 9))
    np.testing.assert_array_equal(M, [[408, -1], [508, -1]])


def _copies_kept(kernel) -> list:
    """The per-task copies the kernel's compiled primal launchers keep (large launches run in
    the CPU's own rows, smaller ones in the launch's groups: two compiled variants)."""
    entries = [v[0] for k, v in kernel.cache.items()     # (launcher, launch range check)
               if isinstance(k, tuple) and k[0] == "primal"]
    return [pool for v in entries
            for launcher in {id(x): x for x in (getattr(v, "launch_groups", v),
                                                 getattr(v, "rows", v))}.values()
            for pool in getattr(launcher, "pool_cache", {}).values()]


def test_per_thread_copies_are_reused_and_left_zero():
    """On the CPU, atomics into a small array add into one copy per task, merged after the
    launch. The copies are the launcher's, reused by the next launch (new memory each time
    would take a page fault per 4 KiB), so the merge must leave them zero: repeated and
    differently sized launches keep counting exactly."""
    rng = np.random.default_rng(5)
    kernel = tg.kernel(histogram.pyfunc)     # its own compiled launchers, only these launches
    cfg = kernel(tg.CPU(), 256)
    for n in (50_000, 50_000, 3_000, 50_000):
        keys = rng.integers(0, BINS, n)
        weights = rng.integers(0, 4, n).astype(np.float64)
        H = np.zeros(BINS)
        cfg(H, keys, weights, ndrange=n)
        np.testing.assert_array_equal(H, np.bincount(keys, weights=weights, minlength=BINS))
    pools = _copies_kept(kernel)
    assert pools, "the copies are kept for the next launch"
    assert all(not pool.any() for pool in pools)
    # the large launches (the CPU's rows) and the small one (the launch's groups) are two
    # compiled variants; they share one copy per thread and shape
    assert len({id(pool) for pool in pools}) == 1


def test_launches_from_two_threads_do_not_share_copies():
    import threading

    keys = np.random.default_rng(6).integers(0, BINS, 200_000)
    expected = np.bincount(keys, minlength=BINS).astype(np.float64)
    results, errors = [], []

    def count():
        try:
            for _ in range(20):
                H = np.zeros(BINS)
                histogram(tg.CPU(), 256)(H, keys, np.ones(keys.size), ndrange=keys.size)
                results.append(H)
        except Exception as exc:   # reported below
            errors.append(exc)

    threads = [threading.Thread(target=count) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 40
    for H in results:
        np.testing.assert_array_equal(H, expected)


def test_launches_follow_numba_set_num_threads():
    """A launch splits its groups into one task per Numba thread, read at every launch (not
    once): after numba.set_num_threads(1) the per-task copies shrink to one, and counting
    stays exact either way."""
    import numba

    from tapegrad.backends.cpu.backend import _thread_count

    keys = np.random.default_rng(7).integers(0, BINS, 40_000)
    expected = np.bincount(keys, minlength=BINS).astype(np.float64)
    before = numba.get_num_threads()
    try:
        for threads in (1, before, 1):
            numba.set_num_threads(threads)
            assert _thread_count() == threads
            H = np.zeros(BINS)
            histogram(tg.CPU(), 256)(H, keys, np.ones(keys.size), ndrange=keys.size)
            np.testing.assert_array_equal(H, expected)
    finally:
        numba.set_num_threads(before)
    assert {pool.shape[0] for pool in _copies_kept(histogram)} >= {1, before}
