"""Backends and the host-side array helpers that dispatch on them."""

from __future__ import annotations

from typing import Any

import numpy as np

# first: every dispatcher tapegrad creates then caches in tapegrad's folder, not the package
from tapegrad.backends import numba_cache  # noqa: F401
from tapegrad.backends.base import Backend
from tapegrad.backends.cpu.backend import CPU
from tapegrad.errors import BackendError

__all__ = ["Backend", "CPU", "CUDA", "get_backend", "allocate", "zeros", "ones", "asarray",
           "to_numpy", "synchronize_backend"]


def get_backend(x: Any) -> Backend:
    """The backend an array lives on: ``tg.CPU()`` for NumPy arrays, ``tg.CUDA(device)`` for
    CuPy arrays and other ``__cuda_array_interface__`` arrays (e.g. PyTorch CUDA tensors).

    >>> import numpy as np, tapegrad as tg
    >>> tg.get_backend(np.zeros(3))
    CPU()
    """
    if isinstance(x, np.ndarray):
        return CPU()
    if hasattr(x, "__cuda_array_interface__"):
        device = getattr(x, "device", None)
        index = getattr(device, "id", getattr(device, "index", 0)) or 0
        return CUDA(index)
    raise BackendError(f"tg.get_backend expects an array (numpy.ndarray, or a GPU array), got "
                       f"{type(x).__name__}")


def CUDA(device: int = 0) -> Backend:  # noqa: N802 - the public name is tg.CUDA
    """An NVIDIA GPU backend: ``tg.CUDA()`` (needs numba-cuda and CuPy, or the simulator)."""
    from tapegrad.backends.cuda.backend import CUDA as _CUDA  # imports numba.cuda lazily
    return _CUDA(device)


def _shape(shape: Any) -> tuple[int, ...]:
    return (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)


def allocate(backend: Backend, dtype: Any, shape: Any) -> Any:
    """An uninitialised array on ``backend``: ``tg.allocate(tg.CPU(), np.float32, (4, 4))``."""
    return backend.allocate(np.dtype(dtype), _shape(shape))


def zeros(backend: Backend, dtype: Any, shape: Any) -> Any:
    """A zero-filled array on ``backend``: ``tg.zeros(tg.CPU(), np.float64, 10)``."""
    return backend.zeros(np.dtype(dtype), _shape(shape))


def ones(backend: Backend, dtype: Any, shape: Any) -> Any:
    """An array of ones on ``backend``: ``tg.ones(tg.CPU(), np.float64, 10)``."""
    return backend.ones(np.dtype(dtype), _shape(shape))


def asarray(backend: Backend, x: Any) -> Any:
    """Copy host data to ``backend``: ``tg.asarray(tg.CPU(), [1.0, 2.0])``."""
    return backend.asarray(x)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array with ``x``'s data (a copy when ``x`` lives on a GPU)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "get"):
        return x.get()
    return np.asarray(x)
