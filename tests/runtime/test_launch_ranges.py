"""Out-of-range launches are refused before anything runs (tapegrad/runtime/bounds.py): by
default, at the user's line, with the array untouched; correct programs never are."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.runtime.launch import prepare

CPU = tg.CPU()


@tg.kernel
def double(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i]


@tg.kernel
def left_neighbour(B, A):
    i = tg.index()
    B[i] = A[i - 1]


@tg.kernel
def guarded_stencil(B, A):
    i = tg.index()
    if 0 < i < A.shape[0] - 1:
        B[i] = A[i - 1] + A[i + 1]


@tg.kernel
def matvec(y, M, x):
    i = tg.index()
    acc = 0.0
    for k in range(M.shape[1]):
        acc += M[i, k] * x[k]
    y[i] = acc


@tg.kernel
def flat_rows(B, A, m):
    i, j = tg.index(kind=tg.NTuple)
    B[i, j] = A[i * m + j]


@tg.kernel
def early_exit(B, A, n):
    i = tg.index()
    if i >= n:
        return
    B[i] = A[i + 1]


@tg.kernel
def gather(B, A, idx):
    i = tg.index()
    B[i] = A[idx[i]]


@tg.kernel
def by_group(B, A):
    g = tg.index(tg.Group)
    lo = tg.index(tg.Local)
    B[g * 4 + lo] = A[lo]


def _line(kernel, code: str) -> str:
    src = open(__file__).read().splitlines()
    return f"{__file__}:{src.index('    ' + code) + 1}:"


def test_a_launch_past_the_arrays_is_an_error_and_touches_nothing(backend):
    """The issue's case: ndrange=100 on 64-element arrays (a segfault before)."""
    A, B = np.arange(64.0), np.full(64, -1.0)
    with pytest.raises(tg.KernelIndexError) as info:
        double(backend)(B, A, ndrange=100)
    msg = str(info.value)
    assert msg.startswith(_line(double, "B[i] = 2.0 * A[i]"))
    assert "from 0 to 99" in msg and "shape is (64,)" in msg and "ndrange (100,)" in msg
    assert "TAPEGRAD_BOUNDSCHECK=1" in msg
    assert (B == -1.0).all() and (A == np.arange(64.0)).all()
    double(backend)(B, A, ndrange=64)           # the right launch still runs
    assert np.array_equal(B, 2.0 * A)


def test_a_negative_index_is_an_error_with_the_guard_to_write(backend):
    A, B = np.arange(8.0), np.zeros(8)
    with pytest.raises(tg.KernelIndexError, match=r"A\[i - 1\] would index A from -1 to 6.*"
                       r"if i - 1 >= 0:"):
        left_neighbour(backend)(B, A, ndrange=8)
    assert (B == 0.0).all()


def test_correct_programs_pass_guards_loops_early_returns_and_gathers(backend):
    A = np.arange(10.0)
    B = np.zeros(10)
    guarded_stencil(backend)(B, A, ndrange=10)          # the guarded reads are not checked
    assert np.array_equal(B[1:-1], A[:-2] + A[2:])
    B = np.zeros(10)
    early_exit(backend)(B, A, 9, ndrange=10)            # reads after a return: not checked
    assert np.array_equal(B[:9], A[1:])
    idx = np.array([9, 0, 3, 3])
    B = np.zeros(4)
    gather(backend)(B, A, idx, ndrange=4)               # a gather: left to BOUNDSCHECK
    assert np.array_equal(B, A[idx])
    M, x, y = np.arange(12.0).reshape(3, 4), np.arange(4.0), np.zeros(3)
    matvec(backend)(y, M, x, ndrange=3)
    assert np.allclose(y, M @ x)


def test_loops_int_arguments_and_2d_shapes_are_checked():
    M, y = np.ones((3, 4)), np.zeros(3)
    with pytest.raises(tg.KernelIndexError, match=r"x\[k\] would index x from 0 to 3, but "
                       r"x.shape is \(3,\)"):
        matvec(CPU)(y, M, np.ones(3), ndrange=3)
    A, B = np.arange(12.0), np.zeros((3, 4))
    flat_rows(CPU)(B, A, 4, ndrange=(3, 4))
    assert np.array_equal(B, A.reshape(3, 4))
    with pytest.raises(tg.KernelIndexError, match=r"A\[i \* m \+ j\] would index A from 0 to 13"):
        flat_rows(CPU)(B, A, 5, ndrange=(3, 4))         # the int argument moves the range
    with pytest.raises(tg.KernelIndexError, match=r"in dimension 1 from 0 to 4"):
        flat_rows(CPU)(np.zeros((3, 4)), np.arange(15.0), 5, ndrange=(3, 5))


def test_group_and_local_indices_use_the_workgroup_size():
    """B[g * 4 + lo] over 10 work-items in groups of 4 reaches 0..9 (the last group's items
    past ndrange never run); A[lo] reaches 0..3."""
    B, A = np.zeros(10), np.arange(4.0)
    by_group(CPU, 4)(B, A, ndrange=10)
    assert np.array_equal(B, np.tile(A, 3)[:10])
    with pytest.raises(tg.KernelIndexError, match=r"A\[lo\] would index A from 0 to 3"):
        by_group(CPU, 4)(B, np.arange(3.0), ndrange=10)
    by_group(CPU, 4)(np.zeros(2), np.arange(2.0), ndrange=2)   # one partial group: lo < 2


@tg.kernel
def shifted_read(B, A, off):
    i = tg.index()
    off = off + 3
    B[i] = A[i + off]


@tg.kernel
def shifted_write(B, A, off):
    i = tg.index()
    off += 5
    B[i + off] = A[i]


@tg.kernel
def loop_named_as_an_argument(B, A, k):
    i = tg.index()
    for k in range(4):
        B[i] += A[i + k]


@tg.kernel
def rebound_down_then_unknown(B, A, off, idx):
    i = tg.index()
    off = off - 2
    B[i] = A[i + off]             # checked: i + 2 - 2
    off = idx[i]
    B[i] += A[off]                # a gather now: left to BOUNDSCHECK
    for off in range(idx[0]):     # noqa: B007  (bounds from memory: not followed, nor after)
        B[i] += 0.0
    B[i] += A[off]


@pytest.mark.parametrize("kernel, line", [(shifted_read, "A[i + off] would index A from 3 to 12"),
                                          (shifted_write, "B[i + off] would index B from 5 to 14"),
                                          (loop_named_as_an_argument,
                                           "A[i + k] would index A from 0 to 12")])
def test_an_argument_the_kernel_rebinds_is_followed(backend, kernel, line):
    """(An index through an int argument the kernel assigns again went unchecked: reads past
    A, writes past B into the memory beyond; an adjoint then corrupted the heap.)"""
    A, B = np.arange(10.0), np.zeros(10)
    with pytest.raises(tg.KernelIndexError, match=re.escape(line)):
        kernel(backend)(B, A, 0, ndrange=10)
    assert not B.any() and (A == np.arange(10.0)).all()
    with pytest.raises(tg.KernelIndexError, match="would index"):
        tg.autodiff(tg.Reverse, kernel(backend), tg.Const, tg.DuplicatedNoNeed(B, np.ones(10)),
                    tg.Duplicated(A, np.zeros(10)), 0, ndrange=10)
    kernel(backend)(B, A, 0, ndrange=5)             # in range: runs
    assert B.any()


def test_an_argument_rebound_to_what_launch_cannot_know_is_not_followed(backend):
    A, B = np.arange(10.0), np.zeros(10)
    idx = np.array([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])
    rebound_down_then_unknown(backend)(B, A, 2, idx, ndrange=10)
    np.testing.assert_array_equal(B, A + A[idx] + A[idx[0] - 1])
    with pytest.raises(tg.KernelIndexError, match=r"A\[i \+ off\] would index A from 1 to 10"):
        rebound_down_then_unknown(backend)(B, A, 3, idx, ndrange=10)


def test_recorded_and_differentiated_launches_are_checked():
    A, B = np.ones(8), np.zeros(8)
    with tg.Tape():
        with pytest.raises(tg.KernelIndexError):
            double(CPU)(B, A, ndrange=9)
    dA, dB = np.zeros(8), np.ones(8)
    for mode in (tg.Reverse, tg.Forward):
        with pytest.raises(tg.KernelIndexError):
            tg.autodiff(mode, double(CPU), tg.Const, tg.Duplicated(B, dB),
                        tg.Duplicated(A, dA), ndrange=9)
    assert (dA == 0.0).all() and (dB == 1.0).all()


def test_an_empty_launch_is_never_refused():
    double(CPU)(np.zeros(0), np.zeros(0), ndrange=0)


def test_the_check_is_one_expression_per_array_dimension():
    """What a launch pays: the generated test reads the shapes once per dimension."""
    A, B = np.ones(8), np.zeros(8)
    cfg = guarded_stencil(CPU)
    cfg(B, A, ndrange=8)
    _, check = cfg.kernel.cache[prepare(cfg, (B, A), 8)[2]]
    assert check is None                   # nothing certain to check
    cfg = double(CPU)
    cfg(B, A, ndrange=8)
    _, check = cfg.kernel.cache[prepare(cfg, (B, A), 8)[2]]
    assert check.source.count(".shape[0]") == 2


@tg.kernel
def fill_with(B, n):
    i = tg.index()
    B[i] = n * 1.0


@pytest.mark.parametrize("n", [2**64, 2**63, -(2**63) - 1])
def test_an_int_past_64_bits_is_refused_by_name_and_nothing_runs(backend, n):
    B = np.full(4, 7.0)
    fill_with(backend)(B, 5, ndrange=4)                         # (compiled, and a plan made)
    B[:] = 7.0
    with pytest.raises(tg.LaunchError, match=f"argument n = {n} does not fit in a 64-bit"):
        fill_with(backend)(B, n, ndrange=4)
    assert B.tolist() == [7.0] * 4
    fill_with(backend)(B, 2**63 - 1, ndrange=4)                 # the largest one fits
    assert B[0] == float(2**63 - 1)


@tg.kernel
def count_from(K, n):
    i = tg.index()
    K[i] = n + i


@pytest.mark.parametrize("n", [2**63, -(2**63) - 1])
def test_an_int_past_64_bits_is_refused_on_a_first_launch_and_by_autodiff(backend, n):
    """A kernel's first launch with such an int (no plan yet): the CPU typed 2**63 as an
    unsigned int and wrapped it (K = [-2**63, ...]), or stopped in Numba's typing; the same
    through tg.autodiff raised a bare OverflowError."""
    K = np.full(2, 7, np.int64)
    with pytest.raises(tg.LaunchError, match=f"argument n = {n} does not fit in a 64-bit"):
        count_from(backend)(K, n, ndrange=2)
    with pytest.raises(tg.LaunchError, match=f"argument n = {n} does not fit in a 64-bit"):
        tg.autodiff(tg.Reverse, fill_with(backend), tg.Const, tg.Duplicated(np.zeros(2),
                    np.ones(2)), n, ndrange=2)
    assert K.tolist() == [7, 7]
