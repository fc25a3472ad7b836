"""The OpenCL backend's arrays: PyOpenCL's ``pyopencl.array.Array``, on the backend's queue."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import ArrayKind


class OpenCLArrays(ArrayKind):
    name = "opencl"

    def owns(self, x: Any) -> bool:
        # (by module, so that asking costs no import of pyopencl where it is not installed)
        return type(x).__module__.startswith("pyopencl") and hasattr(x, "base_data")

    def device(self, x: Any) -> Any:
        """The OpenCL device ``x`` lives on (its queue's)."""
        return x.queue.device

    def module(self) -> Any:
        from tapegrad.backends.opencl.device import default_arrays
        return default_arrays()

    def address(self, x: Any) -> int:
        # OpenCL 1.2 shows no device addresses: each buffer gets a range of its own (its
        # handle times 2**48, wider than any buffer), offsets within it are real, so that
        # arrays overlap exactly when they share memory (a tape's identities, the shadows'
        # overlap check)
        return (x.base_data.int_ptr << 48) + x.offset

    def to_numpy(self, x: Any) -> np.ndarray:
        return x.get()


OPENCL_ARRAYS = OpenCLArrays()
