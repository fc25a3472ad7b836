"""``tg.CUDA(device=0)``: kernels compiled by numba-cuda, launched on CuPy arrays (or any
``__cuda_array_interface__`` array) on CuPy's current stream.

Without a GPU, set ``NUMBA_ENABLE_CUDASIM=1``: the same kernels then run on Numba's CUDA
simulator, on NumPy arrays (slowly: keep grids to hundreds of work-items).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.base import Backend
from tapegrad.backends.cache import load_source
from tapegrad.backends.cpu.arrays import NUMPY
from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
from tapegrad.backends.cuda.lower import lower_kernel, simulated
from tapegrad.backends.numba_lower import Lowered, compile_error
from tapegrad.backends.registry import ArrayKind
from tapegrad.errors import BackendError, KernelCompileError
from tapegrad.frontend.types import TypedKernel

_DEFAULT_GROUPSIZE = {1: (256,), 2: (16, 16), 3: (4, 8, 8)}
_INSTALL = ("install the CUDA extra matching your driver: pip install 'tapegrad[cuda13]' "
            "(or 'tapegrad[cuda12]')")


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


class CUDA(Backend):
    """An NVIDIA GPU (``device`` is its index).

    >>> import os, tapegrad as tg
    >>> os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or True   # a GPU, or the simulator
    True
    """

    name = "cuda"
    max_group_items = 1024      # threads per block on every CUDA GPU since compute 2.0

    def __init__(self, device: int = 0):
        self.device = int(device)
        try:
            from numba import cuda
        except ImportError:
            raise BackendError(f"tg.CUDA() needs numba-cuda: {_INSTALL}") from None
        self.sim = simulated()
        if not self.sim:
            if _cupy() is None:
                raise BackendError(f"tg.CUDA() needs CuPy for its arrays: {_INSTALL}")
            if not cuda.is_available():
                raise BackendError("tg.CUDA(): no CUDA GPU or driver was found. To run the "
                                   "CUDA path without a GPU, set NUMBA_ENABLE_CUDASIM=1 "
                                   "(Numba's simulator, slow) before importing tapegrad")

    def key(self) -> tuple:
        return (self.device,)

    def __repr__(self) -> str:
        return f"CUDA({self.device}{', simulated' if self.sim else ''})"

    # arrays: NumPy's on the simulator, else CuPy's (and other CUDA arrays)
    @property
    def arrays(self) -> ArrayKind:
        return NUMPY if self.sim else CUDA_ARRAYS

    def allocate(self, dtype: Any, shape: Any) -> Any:
        with self._on_device():
            return super().allocate(dtype, shape)

    def zeros(self, dtype: Any, shape: Any) -> Any:
        with self._on_device():
            return super().zeros(dtype, shape)

    def ones(self, dtype: Any, shape: Any) -> Any:
        with self._on_device():
            return super().ones(dtype, shape)

    def asarray(self, x: Any) -> Any:
        if self.sim:
            return np.array(x.get() if hasattr(x, "get") else x, copy=True)
        with self._on_device():
            return _cupy().array(x, copy=True)

    def synchronize(self) -> None:
        if not self.sim:
            _cupy().cuda.get_current_stream().synchronize()

    def _on_device(self) -> Any:
        if self.sim:
            import contextlib
            return contextlib.nullcontext()
        return _cupy().cuda.Device(self.device)

    # kernels
    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return _DEFAULT_GROUPSIZE[rank]

    def compile(self, tk: TypedKernel) -> _Launcher:
        lowered = lower_kernel(tk)
        module, path = load_source(lowered.source, f"cuda_{tk.name}")
        return _Launcher(getattr(module, lowered.symbol), lowered, str(path), tk.groupsize, self)


class _Launcher:
    """Launches a compiled CUDA kernel on CuPy's current stream; the first launch compiles it
    and reports failures at the user's line."""

    def __init__(self, kernel: Any, lowered: Lowered, path: str, groupsize: tuple[int, ...],
                 backend: CUDA):
        self.kernel = kernel
        self.lowered = lowered
        self.path = path
        self.block = tuple(reversed(groupsize))    # the last dimension runs along x
        self.groupsize = groupsize
        self.backend = backend
        self.compiled = False

    @property
    def source(self) -> str:
        return self.lowered.source

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        if self.backend.sim and any(isinstance(a, np.ndarray) and not (
                a.flags.c_contiguous or a.flags.f_contiguous) for a in args):
            self.strided(args, ndrange)
            return
        grid = tuple(-(-n // w) for n, w in zip(reversed(ndrange), self.block))
        if self.backend.sim:
            configured = self.kernel[grid, self.block]
        else:
            from numba import cuda
            stream = cuda.external_stream(_cupy().cuda.get_current_stream().ptr)
            configured = self.kernel[grid, self.block, stream]
        if self.compiled:
            configured(*args, *ndrange)
            return
        try:
            configured(*args, *ndrange)
        except Exception as exc:
            from numba.core.errors import NumbaError
            if not isinstance(exc, NumbaError):
                raise
            raise self.translate(exc) from None
        self.compiled = True

    def strided(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        """The simulator takes only contiguous buffers: run on contiguous copies of strided
        arrays and write the results back (real GPUs take strided CuPy views directly)."""
        copies = [np.ascontiguousarray(a) if isinstance(a, np.ndarray) else a for a in args]
        self(tuple(copies), ndrange)
        for a, c in zip(args, copies):
            if isinstance(a, np.ndarray) and c is not a and a.flags.writeable:
                a[...] = c

    def translate(self, exc: Exception) -> KernelCompileError:
        return compile_error(exc, self.lowered, self.path, "numba-cuda")
