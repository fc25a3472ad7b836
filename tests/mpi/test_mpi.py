"""tapegrad.mpi under ``mpiexec -n 1``, ``-n 2`` and ``-n 4`` (4 oversubscribes a 2-core
machine: fine for correctness): the checks in tests/mpi/ranks/checks.py run on every process,
the guards' checks in tests/mpi/ranks/guards.py on 2 and 4 (programs that differ from one
process to the next), and examples/heat_mpi.py runs on 4."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install 'tapegrad[mpi]')")

ROOT = Path(__file__).resolve().parents[2]
# (the mpich wheel puts mpiexec next to the interpreter, which need not be on PATH)
MPIEXEC = shutil.which("mpiexec") or shutil.which("mpiexec", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="no mpiexec on PATH (the mpich wheel "
                                "of the [mpi] extra installs one)")


def mpiexec(n: int, *args: str, timeout: int = 400, **env_vars: str
            ) -> subprocess.CompletedProcess:
    # (one thread per process: 4 processes on 2 cores; a process that fails while the
    # others wait in a collective would hang them: the timeout ends it)
    env = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env_vars)
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_gradients_on_p_processes_equal_one_process(processes):
    proc = mpiexec(processes, "-m", "pytest", "tests/mpi/ranks/checks.py", "-q", "-x",
                   "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=")
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" passed") == processes     # every process ran them all


@pytest.mark.parametrize("processes", [2, 4])
def test_the_guards_hold_on_p_processes(processes):
    # (a guard that fails may leave a process waiting for another's message: the timeout
    # ends it)
    proc = mpiexec(processes, "-m", "pytest", "tests/mpi/ranks/guards.py", "-q",
                   "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=", timeout=300)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert proc.stdout.count(" passed") == processes     # every process ran them all


def test_the_mpi_example_runs_on_4_processes():
    proc = mpiexec(4, "examples/heat_mpi.py", HEAT_MPI_N="48", HEAT_MPI_STEPS="60",
                   HEAT_MPI_ITERS="15")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 x 2 grid" in proc.stdout and "gradient check" in proc.stdout
