"""Differentiable domain decomposition over MPI (mpi4py): a ghost-cell exchange for
Cartesian decompositions (``Halo``), ``allreduce`` of tape scalars and ``sendrecv`` of
arrays, each recorded on the tape with its adjoint, so that ``gradient()`` on every process
gives the gradient of one objective across all of them (docs/mpi.md).

>>> import tapegrad.mpi as tgm   # then: halo = tgm.Halo(MPI.COMM_WORLD, (n, n), width=1)
"""

from tapegrad.mpi.buffers import cuda_aware
from tapegrad.mpi.collectives import allreduce, sendrecv
from tapegrad.mpi.halo import Halo

__all__ = ["Halo", "allreduce", "cuda_aware", "sendrecv"]
