"""Shared fixtures: one fixture parametrises the backend (the CPU, CUDA, and OpenCL's printed C
on PoCL through NumPy arrays copied per launch).

The CUDA backend runs on Numba's CUDA simulator here (no GPU on development machines or in
CI); ``TAPEGRAD_TEST_GPU=1`` runs it on a real GPU instead (tests/gpu/run_gpu_checks.sh).
"""

from __future__ import annotations

import os

if os.environ.get("TAPEGRAD_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")   # before numba.cuda is imported
# PoCL runs a launch on every core; the suite runs two test processes side by side, so each
# OpenCL launch takes one core (as each process's share)
os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tapegrad as tg  # noqa: E402


def _opencl_on_numpy():
    """tg.OpenCL's printed C on NumPy arrays: each launch copies the arrays to the device and
    back (slow, and only for tests: the backend-parametrised tests pass NumPy arrays)."""
    import pyopencl.array as cla

    from tapegrad.backends.cpu.arrays import NUMPY
    from tapegrad.backends.opencl.backend import OpenCL

    class OpenCLOnNumPy(OpenCL):
        arrays = NUMPY
        sim = False

        def owns(self, x):
            return isinstance(x, np.ndarray)

        def allocate(self, dtype, shape):
            return np.empty(shape, dtype)

        def zeros(self, dtype, shape):
            return np.zeros(shape, dtype)

        def ones(self, dtype, shape):
            return np.ones(shape, dtype)

        def asarray(self, x):
            return np.array(x, copy=True)

        def __repr__(self):
            return "OpenCL(on NumPy arrays)"

        def compile(self, tk):
            run = super().compile(tk)
            q = self.queue

            def launch(args, ndrange):
                moved = [cla.to_device(q, np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                         else a for a in args]
                run(tuple(moved), ndrange)
                for a, d in zip(args, moved):
                    if isinstance(a, np.ndarray) and a.flags.writeable:
                        a[...] = d.get()
            launch.source = run.source
            return launch

    return OpenCLOnNumPy()


BACKENDS = {"cpu": tg.CPU, "cuda": tg.CUDA, "opencl": _opencl_on_numpy}


@pytest.fixture(params=sorted(BACKENDS), scope="session")
def backend(request):
    """Every backend: ``tg.CPU()`` and ``tg.CUDA()`` (simulated unless on a GPU)."""
    return BACKENDS[request.param]()


def simulated(backend) -> bool:
    """Whether ``backend`` runs on Numba's CUDA simulator (slow: tiny grids only)."""
    return bool(getattr(backend, "sim", False))


@pytest.fixture(scope="session")
def size(backend):
    """``size(cpu, cuda)``: a problem size (or workgroup size) for this backend.

    The first value serves the CPU and a real GPU; the second, small one serves the CUDA
    simulator, which takes roughly 0.1 ms per work-item.  Keep the same checks for both: pick
    the small size so that the simulator still sees contention (few bins, several groups).
    """
    def pick(cpu, cuda):
        return cuda if simulated(backend) else cpu
    return pick
