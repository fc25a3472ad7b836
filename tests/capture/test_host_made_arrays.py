"""Arrays a captured function makes with host code (np.zeros, np.ones, np.full, tg.zeros) that
a kernel updates in place, with an atomic or ``+=``: such an update reads what is there, so a
replay, which does not run the host code, would hand the kernel other contents (it handed a
scatter's output np.empty's garbage instead of zeros). The kernel analysis counts those
updates as reads (tapegrad/ad/access.py), so the capture refuses them at the first call, as it
refuses other reads of arrays its host code made; zeroed by a kernel, they replay exactly.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.runtime.arguments import access, write_only

M, N = 16, 64


@tg.kernel
def scatter_add(out, u, idx):
    i = tg.index()
    tg.atomic_add(out, idx[i], u[i] * u[i])


@tg.kernel
def add_square(out, u):
    i = tg.index()
    out[i] += u[i] * u[i]


@tg.kernel
def fill_zero(out):
    i = tg.index()
    out[i] = 0.0


def _data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    # (small integers: their squares' sums are exact in any order the atomics add them)
    rng = np.random.default_rng(seed)
    return rng.integers(-4, 5, N).astype(np.float64), rng.integers(0, M, N)


def test_atomics_and_updates_in_place_read_their_target():
    for kernel in (scatter_add, add_square):
        reads, writes = access(kernel)
        assert "out" in reads and "out" in writes, kernel.name
        assert write_only(kernel) == frozenset(), kernel.name   # (old values matter)
    assert write_only(fill_zero) == frozenset({0})


def _made(how: str, backend, m: int) -> np.ndarray:
    if how == "zeros":
        return np.zeros(m)
    if how == "ones":
        return np.ones(m)
    if how == "full":
        return np.full(m, 2.0)
    return tg.zeros(backend, np.float64, m)


@pytest.mark.parametrize("how", ["zeros", "tg.zeros"])
def test_a_scatter_into_an_array_made_on_the_host_is_refused(backend, how):
    u, idx = _data(0)

    def histogram(u):
        out = _made(how, backend, M)
        scatter_add(backend)(out, u, idx, ndrange=N)
        return out

    np.testing.assert_array_equal(histogram(u), np.bincount(idx, u * u, M))  # (uncaptured)
    with pytest.raises(tg.CaptureError, match=re.escape(
            "histogram reads an array of shape (16,) that no recorded operation wrote") +
            ".*A kernel updates it in place \\(an atomic, \\+=\\), which reads what is there"):
        tg.capture(histogram)(u)


@pytest.mark.parametrize("how", ["ones", "full"])
def test_an_update_in_place_of_an_array_made_on_the_host_is_refused(backend, how):
    u, _ = _data(1)

    def accumulate(u):
        out = _made(how, backend, N)
        add_square(backend)(out, u, ndrange=N)
        return tg.dot(out, u)

    with pytest.raises(tg.CaptureError, match="accumulate reads an array of shape \\(64,\\) "
                       ".*made by host code inside the function"):
        tg.capture(accumulate)(u)


def test_zeroed_by_a_kernel_a_scatter_replays_exactly(backend):
    def histogram(u, w, idx):
        out = np.empty(M)
        fill_zero(backend)(out, ndrange=M)
        scatter_add(backend)(out, u, idx, ndrange=N)
        add_square(backend)(out, w, ndrange=M)
        return out

    captured = tg.capture(histogram)
    for seed in range(4):
        u, idx = _data(seed)
        w = u[:M] + 1.0
        np.full(M, 1e300)                    # (freed memory that np.empty may hand out)
        got = captured(u, w, idx)
        np.testing.assert_array_equal(got, histogram(u, w, idx))
        np.testing.assert_array_equal(got, np.bincount(idx, u * u, M) + w * w)
    assert captured.recordings == 1
