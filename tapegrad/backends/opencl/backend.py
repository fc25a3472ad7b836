"""``tg.OpenCL()``: kernels printed as OpenCL C (``tapegrad.backends.c.printer``) and run by
PyOpenCL on AMD, Intel and Apple GPUs, or on the CPU through PoCL."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.base import Backend
from tapegrad.backends.c.arguments import packer
from tapegrad.backends.c.printer import SCALAR_SUM_SIZE, kernel_symbol
from tapegrad.backends.opencl.arrays import OPENCL_ARRAYS
from tapegrad.backends.opencl.device import arrays_on, devices, queue
from tapegrad.backends.opencl.printer import OpenCLPrinter
from tapegrad.backends.registry import ArrayKind
from tapegrad.backends.structure import device_functions
from tapegrad.errors import KernelCompileError, LaunchError
from tapegrad.frontend.types import TypedKernel

_DEFAULT_GROUPSIZE = {1: (256,), 2: (16, 16), 3: (4, 8, 8)}


class OpenCL(Backend):
    """An OpenCL device: ``tg.OpenCL()`` is the first GPU, else the first device (PoCL's CPU
    device where no GPU driver is installed); ``tg.OpenCL(k)`` the k-th of
    ``tapegrad.backends.opencl.device.devices()``.  Arrays are ``pyopencl.array.Array``.
    """

    name = "opencl"
    scalar_sum_size = SCALAR_SUM_SIZE
    arrays: ArrayKind = OPENCL_ARRAYS

    def __init__(self, device: int = 0):
        self.device = int(device)
        self.queue = queue(self.device)
        self.max_group_items = self.queue.device.max_work_group_size

    def key(self) -> tuple:
        return (self.device,)

    def __repr__(self) -> str:
        return f"OpenCL({self.device}: {self.queue.device.name.strip()})"

    def owns(self, x: Any) -> bool:
        return OPENCL_ARRAYS.owns(x) and x.queue.device == self.queue.device

    def allocate(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).empty(shape, dtype)

    def zeros(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).zeros(shape, dtype)

    def ones(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).ones(shape, dtype)

    def asarray(self, x: Any) -> Any:
        import pyopencl.array as cla
        host = x.get() if hasattr(x, "get") else np.array(x, copy=True)
        return cla.to_device(self.queue, np.ascontiguousarray(host))

    def synchronize(self) -> None:
        self.queue.finish()

    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return _DEFAULT_GROUPSIZE[rank]

    def compile(self, tk: TypedKernel) -> _Launcher:
        source = OpenCLPrinter(tk).module(device_functions(tk))
        import pyopencl as cl
        try:
            program = cl.Program(self.queue.context, source).build()
        except cl.RuntimeError as e:
            raise KernelCompileError(
                f"{tk.name}: the OpenCL compiler refused the generated code ({e}); this is "
                f"tapegrad's bug: please report it with kern.source(backend=...)") from None
        return _Launcher(getattr(program, kernel_symbol(tk.name)), source, tk, self.queue)


def opencl_devices() -> list[str]:
    """The names of the OpenCL devices ``tg.OpenCL(k)`` can take, in order."""
    return [d.name.strip() for d in devices()]


class _Launcher:
    """Sets a compiled kernel's arguments and enqueues it (no wait for it to finish)."""

    def __init__(self, kernel: Any, source: str, tk: TypedKernel, q: Any):
        self.kernel, self.source, self.queue = kernel, source, q
        self.groupsize, self.params = tk.groupsize, tk.ir.params
        self.pack = packer(tk.ir.params, tk.argtypes, _buffer, element_offset)

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        global_, local = self.sizes(ndrange)
        self.kernel(self.queue, global_, local, *self.pack(args, ndrange))

    def sizes(self, ndrange: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The global and local sizes of a launch over ``ndrange``: the ndrange's last
        dimension is the device's first (consecutive work-items touch consecutive elements
        of row-major arrays)."""
        r, W = len(ndrange), self.groupsize
        local = tuple(W[r - 1 - k] for k in range(r))
        global_ = tuple(-(-ndrange[r - 1 - k] // W[r - 1 - k]) * W[r - 1 - k] for k in range(r))
        return global_, local


def _buffer(name: str, a: Any) -> Any:
    if not a.flags.c_contiguous:
        raise LaunchError(f"argument {name}: OpenCL kernels take C-contiguous arrays; a view "
                          f"may start anywhere in its buffer (x[3:], A[1]) but not skip "
                          f"elements (x[::2], A[:, 1]), and PyOpenCL copies no such view on "
                          f"the device: pass the whole array and index it in the kernel, or "
                          f"a contiguous array made on the host, tg.asarray(backend, "
                          f"np.ascontiguousarray(host_view))")
    return a.base_data


def element_offset(name: str, a: Any) -> int:
    """Where ``a``'s first element lies in its buffer, in elements (its kernel parameter
    ``<name>__offset``: ``tapegrad/backends/opencl/printer.py``)."""
    at, rest = divmod(a.offset, a.dtype.itemsize)
    if rest:
        raise LaunchError(f"argument {name}: its first element lies {a.offset} bytes into its "
                          f"buffer, not a multiple of its {a.dtype.itemsize}-byte elements; "
                          f"pass an aligned copy, {name}.copy()")
    return at
