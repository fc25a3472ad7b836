"""Shared fixtures: one fixture parametrises the backend.

The CUDA backend runs on Numba's CUDA simulator here (no GPU on development machines or in
CI); ``TAPEGRAD_TEST_GPU=1`` runs it on a real GPU instead (tests/gpu/run_gpu_checks.sh).
"""

from __future__ import annotations

import os

if os.environ.get("TAPEGRAD_TEST_GPU") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")   # before numba.cuda is imported

import pytest  # noqa: E402

import tapegrad as tg  # noqa: E402

BACKENDS = {"cpu": tg.CPU, "cuda": tg.CUDA}


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
