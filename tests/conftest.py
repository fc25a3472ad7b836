"""Shared fixtures: one fixture parametrises the backend: the CPU, and OpenCL's printed C on
PoCL through NumPy arrays copied per launch; with ``TAPEGRAD_TEST_GPU=1`` (on a machine with an
NVIDIA GPU: tests/gpu/run_gpu_checks.sh) also CUDA's printed C on the GPU, the same way.
"""

from __future__ import annotations

import os

# PoCL runs a launch on every core; the suite runs two test processes side by side, so each
# OpenCL launch takes one core (as each process's share)
os.environ.setdefault("POCL_MAX_PTHREAD_COUNT", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import tapegrad as tg  # noqa: E402
from tapegrad.backends.cpu.arrays import NUMPY  # noqa: E402

# The files that take longest on a machine whose compile cache is empty (a minute or more
# each, most of it compiling), handed out first: with xdist's own order (files with the most
# tests first) they came last, where one process could be left running them alone.
LONGEST_FIRST = ("tests/test_cli.py", "tests/mpi/test_mpi.py", "tests/test_style.py",
                 "tests/docs/test_guides.py", "tests/ad/test_hvp.py",
                 "tests/backends/test_differential.py")


def pytest_collection_modifyitems(config, items):
    """The files of ``LONGEST_FIRST`` first, in that order; the rest as collected (pyproject's
    ``--no-loadscope-reorder`` keeps xdist to this order)."""
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def cuda_twin(tk):
    """Print ``tk`` as CUDA C++ too, compile that with NVRTC to an sm_90 cubin (no GPU needed;
    cached on disk), and check that it differs from the OpenCL C only where the languages must:
    every kernel the OpenCL tests launch (primal, tangent, adjoint) is thereby a CUDA kernel
    that compiles."""
    from tapegrad.backends.c.printer import CUDA, OPENCL, CPrinter
    from tapegrad.backends.cuda.nvrtc import compile_cuda
    from tapegrad.backends.structure import device_functions
    from tests.backends.dialects import as_cuda, without_atomic_helpers

    callees = device_functions(tk)
    printer = CPrinter(tk, CUDA)
    cuda = printer.module(callees)
    compile_cuda(cuda, tk.name, 90)
    if not printer.dynamic_bytes:
        opencl = CPrinter(tk, OPENCL).module(callees)
        assert as_cuda(without_atomic_helpers(opencl)).strip() == \
            without_atomic_helpers(cuda).strip()
    return printer, cuda


def _on_numpy(base, to_device, to_host, twin=None):
    """``base``'s kernels on NumPy arrays: each launch copies the arrays to the device and back
    (slow, and only for tests: the backend-parametrised tests pass NumPy arrays)."""

    class OnNumPy(base):
        arrays = NUMPY
        copies = True

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
            return f"{base.__name__}(on NumPy arrays)"

        def compile(self, tk):
            if twin is not None:
                twin(tk)
            run = super().compile(tk)

            def launch(args, ndrange):
                moved = [to_device(self, np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                         else a for a in args]
                run(tuple(moved), ndrange)
                for a, d in zip(args, moved):
                    if isinstance(a, np.ndarray) and a.flags.writeable:
                        a[...] = to_host(d)
            launch.source = run.source
            return launch

    return OnNumPy()


def _opencl_on_numpy():
    import pyopencl.array as cla

    from tapegrad.backends.opencl.backend import OpenCL
    return _on_numpy(OpenCL, lambda b, a: cla.to_device(b.queue, a), lambda d: d.get(),
                     twin=cuda_twin)


def _cuda_on_numpy():
    import cupy

    from tapegrad.backends.cuda.backend import CUDA
    return _on_numpy(CUDA, lambda b, a: cupy.asarray(a), cupy.asnumpy)


BACKENDS = {"cpu": tg.CPU, "opencl": _opencl_on_numpy}
if os.environ.get("TAPEGRAD_TEST_GPU") == "1":
    BACKENDS["cuda"] = _cuda_on_numpy


@pytest.fixture(params=sorted(BACKENDS), scope="session")
def backend(request):
    """Every backend: ``tg.CPU()``, OpenCL (PoCL) and, on a GPU machine, CUDA."""
    return BACKENDS[request.param]()


def copies(backend) -> bool:
    """Whether ``backend`` copies its arguments to a device and back at every launch."""
    return bool(getattr(backend, "copies", False))


@pytest.fixture(scope="session")
def size(backend):
    """``size(cpu, device)``: a problem size (or workgroup size) for this backend.

    The first value serves the CPU; the second, smaller one the devices' test harness, which
    copies every array at every launch (realistic sizes run in tests/backends/test_opencl.py on
    the device's own arrays).  Keep the same checks for both: pick the small size so that it
    still sees contention (few bins, several groups).
    """
    def pick(cpu, device):
        return device if copies(backend) else cpu
    return pick
