"""Processes of one node share its cores: each launches CPU kernels on its share of them.

``mpiexec -n 4`` on a 4-core node starts four processes, and Numba would give each a thread
per core: sixteen threads on four cores, every parallel launch waiting at its barrier for a
descheduled thread (measured: docs/performance.md, "Processes sharing a node").  So each
``Halo`` a process builds caps its launches at ``cores // (processes of the communicator on
this node)`` threads (the most of any such communicator), at least one.
``TAPEGRAD_CAP_THREADS=0`` keeps Numba's count, as for the other caps
(``tapegrad/backends/cpu/threads.py``).
"""

from __future__ import annotations

from typing import Any

from tapegrad.backends.cpu.threads import thread_count

_before: int | None = None     # the process's core count before any cap
_most = 1                      # the most processes on this node of one Halo's communicator


def share_cores(comm: Any, MPI: Any) -> None:
    """Cap this process's CPU threads at its share of the node: the cores before any cap
    over the most processes on this node of any ``Halo``'s communicator so far.  Collective
    on ``comm`` every time, as the ``Halo`` that calls it is (a split done only on a process's
    first ``Halo`` left the others of a later communicator waiting in theirs, where one
    process had built a ``Halo`` on ``MPI.COMM_SELF`` first)."""
    global _before, _most
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    neighbours = node.Get_size()
    node.Free()
    if _before is None:
        _before = thread_count.cores
    _most = max(_most, neighbours)
    thread_count.cores = max(1, _before // _most)
