"""Compile generated CUDA kernels to PTX without a GPU (needs NVVM and NVRTC, which the
``cuda12``/``cuda13`` extras and the ``test`` extra install).

``PTXTarget`` stands in for a backend in the pipeline (``launch.compile_kernel``,
``compile_adjoint``, ``compile_tangent``): its ``compile`` returns PTX text instead of a
launcher, so every primal, tangent and adjoint kernel can be checked to compile for a GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

from tapegrad.backends.cache import load_source
from tapegrad.backends.cuda.lower import lower_kernel, simulated
from tapegrad.errors import BackendError
from tapegrad.frontend.types import Array, Scalar, Type, TypedKernel


class PTXTarget:
    """A pseudo-backend whose ``compile`` yields PTX for compute capability ``cc``."""

    name = "ptx"

    def __init__(self, cc: tuple[int, int] = (9, 0)):
        if simulated():
            raise BackendError("PTX cannot be produced under the CUDA simulator; unset "
                               "NUMBA_ENABLE_CUDASIM")
        self.cc = cc

    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return {1: (256,), 2: (16, 16), 3: (4, 8, 8)}[rank]

    def tune_adjoint(self, ir: Any, argtypes: tuple, groupsize: tuple[int, ...]
                     ) -> tuple[Any, tuple]:
        return ir, argtypes        # as the CUDA backend: no rewrite of its own

    def owns(self, x: Any) -> bool:
        return True

    def compile(self, tk: TypedKernel) -> str:
        from numba import cuda
        lowered = lower_kernel(tk)
        module, _ = load_source(lowered.source, f"cuda_{tk.name}")
        kernel = getattr(module, lowered.symbol)
        signature = tuple(numba_type(t) for t in tk.argtypes) + (numba_type(Scalar("int64")),) * tk.rank
        with _device_functions_for(self.cc):
            ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=self.cc)
        return ptx


@contextlib.contextmanager
def _device_functions_for(cc: tuple[int, int]) -> Any:
    """numba-cuda compiles device functions for the current device's compute capability, which
    needs a driver; for PTX alone, tell it the capability we target instead."""
    from numba.cuda import dispatcher

    class _Device:
        compute_capability = cc

    real = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Device()
    try:
        yield
    finally:
        dispatcher.get_current_device = real


def numba_type(t: Type) -> Any:
    from numba import types
    if isinstance(t, Array):
        return types.Array(getattr(types, t.dtype if t.dtype != "bool" else "boolean"), t.ndim,
                           "A")
    if isinstance(t, Scalar):
        return getattr(types, t.dtype if t.dtype != "bool" else "boolean")
    raise TypeError(f"no numba type for {t}")
