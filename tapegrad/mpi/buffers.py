"""What MPI is handed: NumPy arrays as they are; CuPy arrays as they are where the MPI library
is CUDA-aware, else staged through host copies; the GPU's stream finished before every MPI
call (MPI reads and writes the memory directly, outside the stream's order).  Also where
mpi4py comes from, with the error that says how to install it."""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError, optional_module


def mpi() -> Any:
    """mpi4py's ``MPI`` module."""
    return optional_module("mpi4py.MPI", "tapegrad.mpi needs mpi4py and an MPI library: pip "
                           "install 'tapegrad[mpi]' (mpi4py with the MPICH wheel), or mpi4py "
                           "built against your cluster's MPI")


@functools.cache
def cuda_aware() -> bool:
    """Whether the MPI library takes GPU memory (``MPIX_Query_cuda_support``: Open MPI and
    MPICH); ``TAPEGRAD_MPI_CUDA_AWARE=0`` or ``1`` overrides (a cluster's MPI may support it
    without that function)."""
    forced = os.environ.get("TAPEGRAD_MPI_CUDA_AWARE")
    if forced in ("0", "1"):
        return forced == "1"
    try:
        library = ctypes.CDLL(mpi().__file__)      # (its symbols include the MPI library's)
        return bool(library.MPIX_Query_cuda_support())
    except (OSError, AttributeError):
        return False


def check_array(x: Any, who: str) -> Any:
    """``x``'s array module (NumPy or CuPy), or the error naming what to pass."""
    if isinstance(x, np.ndarray):
        return np
    if type(x).__module__.startswith("cupy"):
        import cupy
        return cupy
    raise TapegradError(f"{who} takes NumPy or CuPy arrays, got {type(x).__module__}."
                        f"{type(x).__name__}; copy other arrays to the host first (x.get())")


def outgoing(x: Any) -> Any:
    """A contiguous buffer of ``x``'s values that MPI can send: ``x`` itself where it can."""
    if isinstance(x, np.ndarray):
        return np.ascontiguousarray(x)
    import cupy
    if cuda_aware():
        y = cupy.ascontiguousarray(x)
        cupy.cuda.get_current_stream().synchronize()
        return y
    return cupy.asnumpy(x)             # (waits for the stream)


def incoming(like: Any, shape: tuple, dtype: Any) -> Any:
    """A buffer MPI can receive into, for values that go into arrays like ``like``."""
    if isinstance(like, np.ndarray) or not cuda_aware():
        return np.empty(shape, dtype)
    import cupy
    y = cupy.empty(shape, dtype)
    cupy.cuda.get_current_stream().synchronize()
    return y


def on_device_of(like: Any, buffer: Any) -> Any:
    """A received ``buffer`` as an array of ``like``'s kind (no copy where it is one)."""
    if isinstance(like, np.ndarray) or not isinstance(buffer, np.ndarray):
        return buffer
    import cupy
    return cupy.asarray(buffer)


def checked_sendrecv(comm: Any, send: Any, dest: int, buffer: Any, source: int, tag: int,
                     who: str, what: str) -> None:
    """``comm.Sendrecv`` of ``send`` to ``dest`` and from ``source`` into ``buffer``, the
    message's size checked against the buffer's (MPI's status): a shorter one would leave
    part of the buffer uninitialised, a longer one is cut short; each is a TapegradError
    here, on the receiving process (``who`` made the call, ``what`` says what to do).  (A
    message of the right size in another dtype or shape cannot be told apart.)"""
    MPI = mpi()
    status = MPI.Status()
    expected = int(buffer.nbytes)
    try:
        # (as bytes: MPICH aborts on a message that is no whole number of the receiving
        # buffer's elements, a float32 slab into a float64 one)
        comm.Sendrecv([send, MPI.BYTE], dest=dest, sendtag=tag, recvbuf=[buffer, MPI.BYTE],
                      source=source, recvtag=tag, status=status)
    except MPI.Exception as e:
        if e.Get_error_class() != MPI.ERR_TRUNCATE:
            raise
        raise TapegradError(f"{who}: {_mismatch(source, f'more than {expected}', buffer)}"
                            f"{what}") from None
    if source != MPI.PROC_NULL and status.Get_count(MPI.BYTE) != expected:
        got = status.Get_count(MPI.BYTE)
        raise TapegradError(f"{who}: {_mismatch(source, str(got), buffer)}{what}")


def _mismatch(source: int, got: str, buffer: Any) -> str:
    return (f"process {source} sent {got} bytes, but this process expects "
            f"{int(buffer.nbytes)} bytes from it (an array of shape {tuple(buffer.shape)}, "
            f"{buffer.dtype}); ")
