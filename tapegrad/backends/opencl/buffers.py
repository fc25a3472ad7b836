"""The memory behind a PyOpenCL array: its buffer, and its values read to the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.errors import LaunchError


def buffer_of(x: Any, name: str = "") -> Any:
    """The OpenCL buffer holding ``x``'s elements (``name``: the kernel argument it is);
    None for an empty array (PyOpenCL gives it no buffer)."""
    buffer = x.base_data
    if buffer is not None and not hasattr(buffer, "get_info"):
        raise LaunchError(f"{'argument ' + name + ': ' if name else ''}a PyOpenCL array on a "
                          f"{type(buffer).__name__} (shared virtual memory): tapegrad takes "
                          "arrays on OpenCL buffers; allocate it with PyOpenCL's default "
                          "allocator or a MemoryPool")
    return buffer


def to_host(x: Any) -> np.ndarray:
    """``x``'s values as a NumPy array, a view that skips elements too (PyOpenCL's ``get()``
    takes none): the bytes it spans, read in one copy, seen through its strides."""
    if x.flags.forc or not x.size:
        return x.get()
    import pyopencl as cl
    first = sum((n - 1) * st for n, st in zip(x.shape, x.strides) if st < 0)
    last = sum((n - 1) * st for n, st in zip(x.shape, x.strides) if st > 0)
    span = np.empty(last - first + x.dtype.itemsize, np.uint8)
    cl.enqueue_copy(x.queue, span, buffer_of(x), src_offset=x.offset + first)
    return np.ndarray(x.shape, x.dtype, span, -first, x.strides).copy()
