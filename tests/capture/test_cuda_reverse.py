"""A captured program on CUDA (without a GPU: the stand-in CuPy of
tapegrad/bench/standin_cupy.py, kernels compiled by the real NVRTC, nothing computed): its
forward replay and its written-down reverse call the same kernels, on the same grids, with
the same arrays and scalars where the call's arrays are read, as the plain tape's launches
and sweep.  (On a GPU, tests/gpu/test_gpu.py compares the gradients themselves.)"""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cuda.launches import LaunchList
from tapegrad.bench.standin_cupy import installed
from tapegrad.capturing.reverse import Reverse
from tests.capture.test_capture import diffuse
from tests.tape.test_host_code import sq

N, STEPS = 64, 6


@pytest.fixture
def cupy(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    for k in (diffuse, sq):
        monkeypatch.setattr(k, "cache", {})
        monkeypatch.setattr(k, "_configured", {})
    with installed() as module:
        yield module


def _launches(cupy, fn):
    """The (kernel, grid) of each launch ``fn`` hands the driver."""
    driver = cupy.cuda.driver
    driver.keep, driver.kept = True, []
    fn()
    driver.keep = False
    return [(f, grid) for f, grid, *_ in driver.kept]


def simulation(gpu, w):
    """``STEPS`` diffusion steps, a square, a dot with ``w`` (tests/capture/test_cuda_graphs.py
    takes it too)."""
    def simulate(u, kappa):
        for _ in range(STEPS):
            u_new = gpu.allocate(np.float64, (N,))
            diffuse(gpu)(u_new, u, kappa, ndrange=N)
            u = u_new
        y = gpu.allocate(np.float64, (N,))
        sq(gpu)(y, u, ndrange=N)
        return tg.dot(y, w)
    return simulate


def test_the_captured_forward_and_reverse_run_the_tapes_launches(cupy):
    simulate = simulation(tg.CUDA(), cupy.ones(N, np.float64))
    captured = tg.capture(simulate)
    u = cupy.asarray(np.linspace(0.0, 1.0, N))
    plain = _launches(cupy, lambda: tg.gradient(simulate, u, 0.1))
    for _ in range(3):          # records, writes the reverse down, runs it
        via_capture = _launches(cupy, lambda: tg.gradient(captured, u, 0.1))
    assert via_capture == plain and len(plain) == 2 * (STEPS + 1)
    (program,) = next(iter(captured.programs.values()))
    assert any(isinstance(what, LaunchList) for listed, what in program.compiled if listed)
    (reverse,) = program.reverses.values()
    assert isinstance(reverse, Reverse)
    assert any(isinstance(what, LaunchList) for listed, what in reverse.compiled if listed)
