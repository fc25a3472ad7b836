"""Workgroup settings and local memory at their edges (a review of workgroup kernels and
their derivatives found each case here)."""

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def doubled(B, A):
    i = tg.index()
    B[i] = A[i] * 2.0


@tg.kernel
def tiled_copy(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    tile = tg.localmem(A.dtype, tg.groupsize())
    tile[li] = A[i]
    tg.synchronize()
    B[i] = tile[li]


@tg.kernel
def count_in_group(out, X):
    i = tg.index()
    li = tg.index(tg.Local)
    c = tg.localmem(np.int64, (1,))
    if li == 0:
        c[0] = 0
    tg.synchronize()
    if X[i] > 0.0:
        tg.atomic_add(c, 0, 1)
    tg.synchronize()
    out[i] = X[i] * X[i] * c[0]


def test_a_float_workgroupsize_is_refused_and_spoils_nothing():
    # a bare TypeError, and the configuration cached under 4.0 == 4 failed for 4 afterwards
    A = np.arange(8.0)
    for wgs in (4.0, (4.0,), True):
        with pytest.raises(tg.LaunchError, match="workgroupsize must be an int"):
            doubled(tg.CPU(), wgs)
    for wgs in (4, np.int64(4), [4]):
        B = np.zeros(8)
        doubled(tg.CPU(), wgs)(B, A, ndrange=8)
        np.testing.assert_array_equal(B, 2 * A)
    assert doubled(tg.CPU(), np.int64(4)) is doubled(tg.CPU(), 4)


def test_a_cpu_workgroup_past_its_limit_is_refused_before_anything_runs():
    # its local memory failed to allocate inside Numba: "a tapegrad bug"
    A, B = np.arange(16.0), np.zeros(16)
    with pytest.raises(tg.LaunchError, match="at most 1048576 per workgroup"):
        tiled_copy(tg.CPU(), 2 ** 40)(B, A, ndrange=16)
    assert not B.any()


def test_an_integer_count_in_local_memory_is_differentiated_around(backend):
    # reverse mode refused the kernel ("atomics on local memory cannot be differentiated")
    # though nothing in the count is differentiated; d out / d X = 2 X c
    X = np.random.default_rng(8).standard_normal(16)
    count = (X.reshape(4, 4) > 0).sum(1).repeat(4)
    dX = np.zeros(16)
    tg.autodiff(tg.Reverse, count_in_group(backend, 4), tg.Const,
                tg.Duplicated(np.zeros(16), np.ones(16)), tg.Duplicated(X.copy(), dX),
                ndrange=16)
    np.testing.assert_allclose(dX, 2 * X * count, rtol=1e-13)
    out, tangent = np.zeros(16), np.zeros(16)
    tg.autodiff(tg.Forward, count_in_group(backend, 4), tg.Const,
                tg.Duplicated(out, tangent), tg.Duplicated(X.copy(), np.ones(16)), ndrange=16)
    np.testing.assert_allclose(out, X * X * count, rtol=1e-13)
    np.testing.assert_allclose(tangent, 2 * X * count, rtol=1e-13)
