"""The backend interface: the few things that differ between devices.

Everything else (parsing, types, differentiation, launching, the tape) is shared.
"""

from __future__ import annotations

import functools
import platform
from typing import Any

from tapegrad.backends.registry import ArrayKind
from tapegrad.frontend.types import TypedKernel


class Backend:
    """A device that runs kernels.  Subclasses implement the methods below."""

    name = "backend"
    max_group_items: int | None = None   # the most work-items a workgroup may have, if limited
    # float64 elements of the array an Active scalar's adjoint sums into (the runtime adds
    # them up): C backends spread the sum's atomics over slots (tapegrad.backends.c.helpers)
    scalar_sum_size = 1
    # whether the device multiplies and adds in one instruction: the adjoint then sums the
    # products it gathers for tiles with tg.fma (ad/localgather.py); GPUs all do
    fast_fma = True

    # arrays: by default those of its kind of array (backends/registry.py)
    arrays: ArrayKind

    def owns(self, x: Any) -> bool:
        """True if ``x`` is an array living on this backend."""
        return self.arrays.owns(x)

    def not_here(self, name: str, x: Any) -> str | None:
        """Why an array that ``owns`` refuses is not on this backend, and what to do, where
        the general advice (``tg.asarray``, ``tg.get_backend``) would not help; else None."""
        return None

    def allocate(self, dtype: Any, shape: tuple[int, ...]) -> Any:
        return self.arrays.new(shape, dtype, zeroed=False)

    def zeros(self, dtype: Any, shape: tuple[int, ...]) -> Any:
        return self.arrays.new(shape, dtype, zeroed=True)

    def ones(self, dtype: Any, shape: tuple[int, ...]) -> Any:
        return self.arrays.module().ones(shape, dtype)

    def asarray(self, x: Any) -> Any:
        """Copy host data (anything ``numpy.asarray`` accepts) to this backend."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> Any:
        return self.arrays.to_numpy(x)

    def synchronize(self) -> None:
        """Wait for everything launched on this backend."""

    # kernels
    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        raise NotImplementedError

    def compile(self, tk: TypedKernel) -> Any:
        """Lower and compile a specialised kernel; return ``launch(args, ndrange)``."""
        raise NotImplementedError

    def tune_adjoint(self, ir: Any, argtypes: tuple, groupsize: tuple[int, ...]
                     ) -> tuple[Any, tuple]:
        """This backend's own rewrite of an adjoint launched in full workgroups, with the
        argument types of its parameters (it may add parameters it computes itself); by
        default none."""
        return ir, argtypes

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.key() == other.key()

    def __hash__(self) -> int:
        # every launch looks its compiled kernel up under a key holding the backend
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = self.__dict__["_hash"] = hash((type(self), self.key()))
        return cached

    def key(self) -> tuple:
        return ()


@functools.cache
def host_fma() -> bool:
    """Whether the CPU that Numba compiles for has fused multiply-add instructions (on x86-64:
    the ``fma`` feature, which NUMBA_CPU_FEATURES may leave out; elsewhere, as on AArch64, part
    of the base instruction set).  Without them ``tg.fma`` is a call into libm per element."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else \
        get_host_cpu_features()
    return "+fma" in features.split(",")
