"""``tg.CUDA(device=0)``: kernels printed as CUDA C++ (``tapegrad.backends.c.printer``),
compiled by NVRTC (``nvrtc.py``) and launched on CuPy's current stream, on CuPy arrays or any
``__cuda_array_interface__`` array (a PyTorch CUDA tensor, say) without copies.

A launch packs its arguments (the packer is made once per compiled kernel) and calls CuPy's
compiled launcher; nothing in it waits for the GPU.  An array on another GPU is refused before
anything runs (``CUDA.owns``, asked once per launch key, which holds each array's GPU); an
array from another library is ordered after the stream that made it (``streams.py``).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from tapegrad.backends.base import Backend
from tapegrad.backends.c.arguments import packer
from tapegrad.backends.c.items import (
    independent_items,
    items_per_thread,
    restrict_allowed,
)
from tapegrad.backends.c.printer import CUDA as CUDA_DIALECT
from tapegrad.backends.c.printer import SCALAR_SUM_SIZE, CPrinter, kernel_symbol
from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
from tapegrad.backends.cuda.arrays import interface as cuda_interface
from tapegrad.backends.cuda.device import cupy_module, limits_of, load_function
from tapegrad.backends.cuda.limits import check_function, launch_shape
from tapegrad.backends.cuda.nvrtc import compile_cuda
from tapegrad.backends.cuda.plan import LaunchCode
from tapegrad.backends.cuda.streams import follow
from tapegrad.backends.determinism import DETERMINISTIC, unordered_atomics
from tapegrad.backends.launch_chain import LaunchChain
from tapegrad.backends.ordered import OrderedLaunch
from tapegrad.backends.registry import ArrayKind
from tapegrad.backends.structure import device_functions
from tapegrad.errors import LaunchError
from tapegrad.frontend.types import Array, TypedKernel

_DEFAULT_GROUPSIZE = {1: (256,), 2: (16, 16), 3: (4, 8, 8)}
# cuFuncGetAttribute / cuFuncSetAttribute's attribute numbers (CUfunction_attribute)
_MAX_THREADS_PER_BLOCK, _NUM_REGS, _MAX_DYNAMIC_SHARED = 0, 4, 8


class CUDA(Backend):
    """An NVIDIA GPU (``device`` is its index, as CuPy's ``cupy.cuda.Device(device)``).

    Needs CuPy and NVRTC (``pip install 'tapegrad[cuda13]'``) and a GPU; arrays are CuPy
    arrays or other ``__cuda_array_interface__`` arrays, C-contiguous.
    """

    name = "cuda"
    scalar_sum_size = SCALAR_SUM_SIZE
    arrays: ArrayKind = CUDA_ARRAYS

    def __init__(self, device: int = 0):
        self.device = int(device)
        self.cupy = cupy_module()
        self.limits = limits_of(self.device)
        self.max_group_items = self.limits.max_threads

    def key(self) -> tuple:
        return (self.device,)

    def __repr__(self) -> str:
        return f"CUDA({self.device}: {self.limits.name})"

    def owns(self, x: Any) -> bool:
        """Whether ``x`` is a CUDA array this GPU may use; a CUDA array on another GPU is a
        LaunchError (a kernel reading another GPU's memory faults with an illegal address,
        which leaves the CUDA context unusable), not a conversion."""
        if not CUDA_ARRAYS.owns(x):
            return False
        on = CUDA_ARRAYS.device_of(x)
        if on is None or on == self.device:
            return True
        what = f"{type(x).__module__}.{type(x).__name__}"
        raise LaunchError(
            f"a {what} of shape {tuple(x.shape)} lives on GPU {on}, but the launch is on "
            f"tg.CUDA({self.device}) (GPU {self.device}: {self.limits.name}): launch on the "
            f"arrays' GPU, kern(tg.get_backend(x)) or kern(tg.CUDA({on})), or copy the array "
            f"to GPU {self.device} first, tg.asarray(tg.CUDA({self.device}), x) (for a torch "
            f"tensor, x.to('cuda:{self.device}'))")

    def allocate(self, dtype: Any, shape: Any) -> Any:
        if self.cupy.cuda.runtime.getDevice() == self.device:     # (the common case)
            return self.cupy.empty(shape, dtype)
        with self.cupy.cuda.Device(self.device):
            return self.cupy.empty(shape, dtype)

    def zeros(self, dtype: Any, shape: Any) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.zeros(shape, dtype)

    def ones(self, dtype: Any, shape: Any) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.ones(shape, dtype)

    def asarray(self, x: Any) -> Any:
        with self.cupy.cuda.Device(self.device):
            return self.cupy.array(x.get() if hasattr(x, "get") else x, copy=True)

    def synchronize(self) -> None:
        with self.cupy.cuda.Device(self.device):
            self.cupy.cuda.get_current_stream().synchronize()

    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return _DEFAULT_GROUPSIZE[rank]

    def compile(self, tk: TypedKernel) -> _Launcher:
        items = items_per_thread()
        restricts = restrict_allowed() and independent_items(tk)
        return _Launcher(tk, self, lambda restrict: self._build(tk, items, restrict), restricts,
                         lambda: OrderedLaunch(tk, self.compile, CUDA_ARRAYS))

    def _build(self, tk: TypedKernel, items: int, restrict: bool) -> _Variant:
        """One variant of ``tk``, compiled, loaded and checked against the GPU's limits."""
        printer = CPrinter(tk, CUDA_DIALECT, items=items, restrict=restrict)
        source = printer.module(device_functions(tk))
        binary = compile_cuda(source, kernel_symbol(tk.name), self.limits.arch)
        driver = self.cupy.cuda.driver
        with self.cupy.cuda.Device(self.device):
            function = load_function(self.cupy, binary, kernel_symbol(tk.name))
            dynamic = printer.dynamic_bytes
            check_function(tk, self.limits, printer.shared_bytes,
                           driver.funcGetAttribute(_MAX_THREADS_PER_BLOCK, function.ptr),
                           driver.funcGetAttribute(_NUM_REGS, function.ptr))
            if dynamic:
                driver.funcSetAttribute(function.ptr, _MAX_DYNAMIC_SHARED, dynamic)
        return _Variant(function, source, dynamic, printer.items)


class _Variant(NamedTuple):
    function: Any
    source: str
    shared: int          # bytes of dynamic shared memory
    items: int           # work-items per thread


class _Launcher:
    """Launches a compiled kernel on CuPy's current stream of its GPU.

    A kernel of independent work-items has two variants (``c/items.py``): with restrict
    pointers, launched where the arrays' bytes are pairwise disjoint (the usual case, compiled
    first), and plain, compiled on the first launch whose arrays overlap."""

    def __init__(self, tk: TypedKernel, backend: CUDA, build: Any, restricts: bool,
                 ordered: Any):
        self.build, self.name, self.make_ordered = build, tk.name, ordered
        self.ordered: OrderedLaunch | None = None
        self.groupsize, self.limits = tk.groupsize, backend.limits
        self.block = tuple(reversed(tk.groupsize))     # the last dimension runs along x
        self.device, self.cupy = backend.device, backend.cupy
        self.pack = packer(tk.ir.params, tk.argtypes, self.buffer)
        self.arrays = [k for k, t in enumerate(tk.argtypes) if isinstance(t, Array)]
        self.restricts = restricts and bool(self.arrays)
        self.variants: dict[bool, _Variant] = {}
        self.last = self.variant(self.restricts)
        self.items = self.last.items
        self.code = LaunchCode(self, tk.ir.params, tk.argtypes, len(tk.groupsize))
        self.launch = self.code.launch       # launch(args, ndrange): what a launch runs
        if unordered_atomics(tk, spaces=("global", "local")):
            self.launch = self.maybe_ordered

    def maybe_ordered(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        """A launch of a kernel whose atomics' order shows in its results: under
        tg.deterministic(), of its variant that adds in order (``ordered.py``)."""
        if not DETERMINISTIC.on:
            self.code.launch(args, ndrange)
            return
        if self.ordered is None:
            self.ordered = self.make_ordered()
        self.ordered(args, ndrange)
        self.last = self.ordered.launch.last          # (its source is the one shown)

    def variant(self, restrict: bool) -> _Variant:
        """The kernel with (or without) restrict pointers, compiled on first use."""
        found = self.variants.get(restrict)
        if found is None:
            found = self.variants[restrict] = self.build(restrict)
        return found

    @property
    def source(self) -> str:
        """The source of the variant the last launch ran."""
        return self.last.source

    @property
    def function(self) -> Any:
        return self.last.function

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        self.launch(args, ndrange)

    def chain_runner(self, n_args: int, x_slot: int, y_slot: int,
                     states: tuple[int, ...] = ()) -> LaunchChain:
        """This kernel launched along a chain of states, two arguments swapped each step and
        those at ``states`` given per step (a tape's sweep: ``tapegrad/tape/chains.py``):
        packed once, but launch by launch for a kernel whose atomics' order shows (under
        tg.deterministic() its launch is another kernel's: ``maybe_ordered``)."""
        packed = self.code.chain if self.launch == self.code.launch else None
        return LaunchChain(self.launch, n_args, x_slot, y_slot, packed, states)

    def shape(self, ndrange: tuple[int, ...]) -> tuple[int, int, int]:
        """The launch's grid; a LaunchError past the GPU's limits."""
        return launch_shape(ndrange, self.groupsize, self.limits, self.items)

    def address(self, name: str, a: Any) -> int:
        """The address of an array that is not a C-contiguous CuPy array (a LaunchError where
        the kernel cannot read it)."""
        return int(self.buffer(name, a).data.ptr if type(a).__module__.startswith("cupy")
                   else self.buffer(name, a))

    @staticmethod
    def nbytes(a: Any) -> int:
        """The bytes of a C-contiguous CUDA array (of another library: by its CUDA Array
        Interface)."""
        if type(a).__module__.startswith("cupy"):
            return a.size * a.dtype.itemsize
        interface = cuda_interface(a)
        return math.prod(interface["shape"]) * np.dtype(interface["typestr"]).itemsize

    def buffer(self, name: str, a: Any) -> Any:
        """What CuPy's launcher takes for an array: a CuPy array itself, else its address
        (with the launch stream ordered after the stream that made it)."""
        if type(a).__module__.startswith("cupy"):
            if not a.flags.c_contiguous:
                raise _strided(name)
            return a
        interface = cuda_interface(a)
        strides = interface.get("strides")
        if strides is not None and tuple(strides) != _c_strides(
                tuple(interface["shape"]), np.dtype(interface["typestr"])):
            raise _strided(name)
        follow(self.cupy, self.device, a, interface)
        return np.uint64(interface["data"][0])


def _c_strides(shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, ...]:
    strides, step = [], dtype.itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def _strided(name: str) -> LaunchError:
    return LaunchError(f"argument {name}: CUDA kernels take C-contiguous arrays; pass "
                       f"cupy.ascontiguousarray({name}) (and copy results back to a view)")
