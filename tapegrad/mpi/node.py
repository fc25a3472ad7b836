"""Processes of one node share its cores: each launches CPU kernels on its share of them.

``mpiexec -n 4`` on a 4-core node starts four processes, and Numba would give each a thread
per core: sixteen threads on four cores, every parallel launch waiting at its barrier for a
descheduled thread (measured: docs/performance.md, "Processes sharing a node").  So the first ``Halo`` of a process caps its
launches at ``cores // (processes of the communicator on this node)`` threads, at least one.
``TAPEGRAD_CAP_THREADS=0`` keeps Numba's count, as for the other caps
(``tapegrad/backends/cpu/threads.py``).
"""

from __future__ import annotations

from typing import Any

from tapegrad.backends.cpu.threads import thread_count

_shared = False


def share_cores(comm: Any, MPI: Any) -> None:
    """Cap this process's CPU threads at its share of the node (once; collective on
    ``comm``)."""
    global _shared
    if _shared:
        return
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    neighbours = node.Get_size()
    node.Free()
    if neighbours > 1:
        thread_count.cores = max(1, thread_count.cores // neighbours)
    _shared = True
