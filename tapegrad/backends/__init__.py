"""Backends and the host-side array helpers that dispatch on them."""

from __future__ import annotations

from typing import Any

import numpy as np

# first: every dispatcher tapegrad creates then caches in tapegrad's folder, not the package
from tapegrad.backends import (
    numba_cache,  # noqa: F401
    registry,
)
from tapegrad.backends.base import Backend
from tapegrad.backends.cpu.arrays import NUMPY
from tapegrad.backends.cpu.backend import CPU
from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
from tapegrad.backends.opencl.arrays import OPENCL_ARRAYS
from tapegrad.errors import TapegradError
from tapegrad.tracebacks import api_boundary

# each backend's kind of array, and the backend such an array is on: a new backend is its
# folder and one line here
registry.register(NUMPY, lambda x: CPU())
registry.register(CUDA_ARRAYS, lambda x: CUDA(CUDA_ARRAYS.device(x)))
registry.register(OPENCL_ARRAYS, lambda x: OpenCL(index_of(OPENCL_ARRAYS.device(x))))

__all__ = ["Backend", "CPU", "CUDA", "OpenCL", "get_backend", "allocate", "zeros", "ones", "asarray",
           "to_numpy", "synchronize_backend"]


@api_boundary
def get_backend(x: Any) -> Backend:
    """The backend an array lives on: ``tg.CPU()`` for NumPy arrays, ``tg.CUDA(device)`` for
    CuPy arrays and other ``__cuda_array_interface__`` arrays (e.g. PyTorch CUDA tensors).

    >>> import numpy as np, tapegrad as tg
    >>> tg.get_backend(np.zeros(3))
    CPU()
    """
    return registry.backend_of(x, "tg.get_backend")


@api_boundary
def CUDA(device: int = 0) -> Backend:  # noqa: N802 - the public name is tg.CUDA
    """An NVIDIA GPU backend: ``tg.CUDA()`` (needs a GPU, CuPy and NVRTC: the [cuda13] extra)."""
    from tapegrad.backends.cuda.backend import CUDA as _CUDA  # imports cupy
    return _CUDA(device)


@api_boundary
def OpenCL(device: int = 0) -> Backend:  # noqa: N802 - the public name is tg.OpenCL
    """An OpenCL device: ``tg.OpenCL()`` (needs PyOpenCL and a driver, PoCL on the CPU)."""
    from tapegrad.backends.opencl.backend import OpenCL as _OpenCL  # imports pyopencl
    return _OpenCL(device)


def index_of(device: Any) -> int:
    from tapegrad.backends.opencl.device import index_of as _index_of
    return _index_of(device)


def _shape(shape: Any) -> tuple[int, ...]:
    return (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)


def _backend(backend: Any, fn: str) -> Backend:
    if not isinstance(backend, Backend):
        raise TapegradError(f"tg.{fn} takes a backend first (tg.CPU(), tg.OpenCL(), tg.CUDA(), "
                            f"or tg.get_backend(x)), got {backend!r}")
    return backend


@api_boundary
def allocate(backend: Backend, dtype: Any, shape: Any) -> Any:
    """An uninitialised array on ``backend``: ``tg.allocate(tg.CPU(), np.float32, (4, 4))``."""
    return _backend(backend, "allocate").allocate(np.dtype(dtype), _shape(shape))


@api_boundary
def zeros(backend: Backend, dtype: Any, shape: Any) -> Any:
    """A zero-filled array on ``backend``: ``tg.zeros(tg.CPU(), np.float64, 10)``."""
    return _backend(backend, "zeros").zeros(np.dtype(dtype), _shape(shape))


@api_boundary
def ones(backend: Backend, dtype: Any, shape: Any) -> Any:
    """An array of ones on ``backend``: ``tg.ones(tg.CPU(), np.float64, 10)``."""
    return _backend(backend, "ones").ones(np.dtype(dtype), _shape(shape))


@api_boundary
def asarray(backend: Backend, x: Any) -> Any:
    """Copy host data to ``backend``: ``tg.asarray(tg.CPU(), [1.0, 2.0])``."""
    return _backend(backend, "asarray").asarray(x)


@api_boundary
def to_numpy(x: Any) -> np.ndarray:
    """A NumPy array with ``x``'s data (a copy when ``x`` lives on a GPU)."""
    kind = registry.kind_of(x)
    if kind is not None:
        return kind.to_numpy(x)
    return x.get() if hasattr(x, "get") else np.asarray(x)
