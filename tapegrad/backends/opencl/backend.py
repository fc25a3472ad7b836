"""``tg.OpenCL()``: kernels printed as OpenCL C (``tapegrad.backends.c.printer``) and run by
PyOpenCL on AMD, Intel and Apple GPUs, or on the CPU through PoCL."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.base import Backend, host_fma
from tapegrad.backends.c.arguments import packer
from tapegrad.backends.c.items import (
    disjoint,
    independent_items,
    items_per_thread,
    restrict_allowed,
)
from tapegrad.backends.c.printer import SCALAR_SUM_SIZE, kernel_symbol
from tapegrad.backends.determinism import DETERMINISTIC, unordered_atomics
from tapegrad.backends.launch_chain import LaunchChain
from tapegrad.backends.opencl.arrays import OPENCL_ARRAYS
from tapegrad.backends.opencl.buffers import buffer_of, to_host
from tapegrad.backends.opencl.device import arrays_on, devices, queue
from tapegrad.backends.opencl.printer import OpenCLPrinter
from tapegrad.backends.ordered import OrderedLaunch
from tapegrad.backends.registry import ArrayKind
from tapegrad.backends.structure import device_functions
from tapegrad.errors import KernelCompileError, LaunchError
from tapegrad.frontend.types import Array, TypedKernel

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

    @property
    def fast_fma(self) -> bool:
        """A GPU's; a CPU device's (PoCL) as the host's."""
        import pyopencl as cl
        return bool(self.queue.device.type & cl.device_type.GPU) or host_fma()

    def __repr__(self) -> str:
        return f"OpenCL({self.device}: {self.queue.device.name.strip()})"

    def owns(self, x: Any) -> bool:
        return OPENCL_ARRAYS.owns(x) and x.queue == self.queue

    def not_here(self, name: str, x: Any) -> str | None:
        if not OPENCL_ARRAYS.owns(x) or x.queue is not None and \
                x.queue.device != self.queue.device:
            return None
        return (f"argument {name} is a PyOpenCL array on another queue than {self!r}'s "
                f"(or on none): tapegrad builds and launches kernels in its own context, on "
                f"tg.OpenCL({self.device}).queue, and could neither use another context's "
                f"buffers nor order its launches after another queue's work. Make the array "
                f"on that queue (cla.zeros(tg.OpenCL({self.device}).queue, shape, dtype), "
                f"cla.to_device(tg.OpenCL({self.device}).queue, host)), or copy it there: "
                f"tg.asarray(tg.OpenCL({self.device}), {name})")

    def allocate(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).empty(shape, dtype)

    def zeros(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).zeros(shape, dtype)

    def ones(self, dtype: Any, shape: Any) -> Any:
        return arrays_on(self.device).ones(shape, dtype)

    def asarray(self, x: Any) -> Any:
        import pyopencl.array as cla
        host = to_host(x) if OPENCL_ARRAYS.owns(x) else \
            x.get() if hasattr(x, "get") else np.array(x, copy=True)
        return cla.to_device(self.queue, np.ascontiguousarray(host))

    def synchronize(self) -> None:
        self.queue.finish()

    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return _DEFAULT_GROUPSIZE[rank]

    def compile(self, tk: TypedKernel) -> _Launcher:
        items = items_per_thread()
        restricts = restrict_allowed() and independent_items(tk)
        return _Launcher(tk, self.queue, lambda restrict: self._build(tk, items, restrict),
                         restricts, lambda: OrderedLaunch(tk, self.compile, OPENCL_ARRAYS))

    def _build(self, tk: TypedKernel, items: int, restrict: bool) -> tuple[Any, str, int]:
        """One variant of ``tk``: its kernel, source and work-items per thread."""
        printer = OpenCLPrinter(tk, items=items, restrict=restrict)
        source = printer.module(device_functions(tk))
        import pyopencl as cl
        try:
            # (-w: a warning about generated code, such as a constant operand of &&, is
            # nothing a user can act on; PyOpenCL would pass it on as a CompilerWarning)
            program = cl.Program(self.queue.context, source).build(options=["-w"])
        except cl.RuntimeError as e:
            raise KernelCompileError(
                f"{tk.name}: the OpenCL compiler refused the generated code ({e}); this is "
                f"tapegrad's bug: please report it with kern.source(backend=...)") from None
        return getattr(program, kernel_symbol(tk.name)), source, printer.items


def opencl_devices() -> list[str]:
    """The names of the OpenCL devices ``tg.OpenCL(k)`` can take, in order."""
    return [d.name.strip() for d in devices()]


class _Launcher:
    """Sets a compiled kernel's arguments and enqueues it (no wait for it to finish).

    A kernel of independent work-items has two variants (``c/items.py``): with restrict
    pointers, launched where the arrays' bytes are pairwise disjoint (the usual case, compiled
    first), and plain, compiled on the first launch whose arrays overlap."""

    def __init__(self, tk: TypedKernel, q: Any, build: Any, restricts: bool, ordered: Any):
        self.queue, self.build, self.make_ordered = q, build, ordered
        self.ordered: OrderedLaunch | None = None
        self.groupsize, self.params = tk.groupsize, tk.ir.params
        self.pack = packer(tk.ir.params, tk.argtypes, _buffer, element_offset)
        self.arrays = [k for k, t in enumerate(tk.argtypes) if isinstance(t, Array)]
        self.restricts = restricts and bool(self.arrays)
        self.variants: dict[bool, tuple[Any, str]] = {}
        self.last = self.restricts
        self.variant(self.restricts)
        self.name, self.float_adds = tk.name, unordered_atomics(tk, spaces=("global", "local"))

    def variant(self, restrict: bool) -> Any:
        """The kernel with (or without) restrict pointers, compiled on first use."""
        found = self.variants.get(restrict)
        if found is None:
            kernel, source, self.items = self.build(restrict)
            found = self.variants[restrict] = (kernel, source)
        return found[0]

    @property
    def source(self) -> str:
        """The source of the variant the last launch ran."""
        if self.last is None:
            return self.ordered.launch.source
        return self.variants[self.last][1]

    def pick(self, arrays: list[Any]) -> Any:
        """The variant a launch on ``arrays`` (its array arguments) may run."""
        self.last = self.restricts and _disjoint(arrays)
        return self.variant(self.last)

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        if self.float_adds and DETERMINISTIC.on:
            if self.ordered is None:         # (its atomics' adds in order: ordered.py)
                self.ordered = self.make_ordered()
            self.ordered(args, ndrange)
            self.last = None                 # (its source is the one shown)
            return
        global_, local = self.sizes(ndrange)
        values = self.pack(args, ndrange)
        kernel = self.pick([args[k] for k in self.arrays])
        kernel(self.queue, global_, local, *values)

    def chain_runner(self, n_args: int, x_slot: int, y_slot: int,
                     states: tuple[int, ...] = ()) -> LaunchChain:
        """This kernel launched along a chain of states, two arguments swapped each step and
        those at ``states`` given per step (a tape's sweep: ``tapegrad/tape/chains.py``)."""
        return LaunchChain(self, n_args, x_slot, y_slot, states=states)

    def sizes(self, ndrange: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The global and local sizes of a launch over ``ndrange``: the ndrange's last
        dimension is the device's first (consecutive work-items touch consecutive elements
        of row-major arrays); a thread of ``items`` work-items takes ``items`` workgroups
        of dimension 0, the device's last (``c/items.py``)."""
        r, W = len(ndrange), self.groupsize
        local = tuple(W[r - 1 - k] for k in range(r))
        groups = [-(-ndrange[k] // W[k]) for k in range(r)]
        groups[0] = -(-groups[0] // self.items)
        global_ = tuple(groups[r - 1 - k] * W[r - 1 - k] for k in range(r))
        return global_, local


def _disjoint(arrays: list[Any]) -> bool:
    """Whether no two of ``arrays`` share a byte: each buffer is memory of its own (as the
    tape takes it, ``OpenCLArrays.address``) unless it is a sub-buffer or wraps host memory,
    which another buffer may share (then: not known to be disjoint).  An empty array shares
    nothing (PyOpenCL gives it no buffer)."""
    import pyopencl as cl
    spans = []
    for a in arrays:
        if not a.nbytes:
            continue
        buffer = buffer_of(a)
        if (buffer.get_info(cl.mem_info.ASSOCIATED_MEMOBJECT) is not None
                         or buffer.get_info(cl.mem_info.FLAGS) & cl.mem_flags.USE_HOST_PTR):
            return False
        spans.append((buffer.int_ptr, a.offset, a.offset + a.nbytes))
    return disjoint(spans)


def _buffer(name: str, a: Any) -> Any:
    if not a.flags.c_contiguous:
        raise LaunchError(f"argument {name}: OpenCL kernels take C-contiguous arrays; a view "
                          f"may start anywhere in its buffer (x[3:], A[1]) but not skip "
                          f"elements (x[::2], A[:, 1]), and PyOpenCL copies no such view on "
                          f"the device: pass the whole array and index it in the kernel, or "
                          f"a contiguous array made on the host, tg.asarray(backend, "
                          f"np.ascontiguousarray(host_view))")
    return buffer_of(a, name)


def element_offset(name: str, a: Any) -> int:
    """Where ``a``'s first element lies in its buffer, in elements (its kernel parameter
    ``<name>__offset``: ``tapegrad/backends/opencl/printer.py``)."""
    at, rest = divmod(a.offset, a.dtype.itemsize)
    if rest:
        raise LaunchError(f"argument {name}: its first element lies {a.offset} bytes into its "
                          f"buffer, not a multiple of its {a.dtype.itemsize}-byte elements; "
                          f"pass an aligned copy, {name}.copy()")
    return at
