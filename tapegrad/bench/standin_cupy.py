"""A stand-in for CuPy on a machine without a GPU: arrays in host memory that look like
CuPy's, and a driver whose kernel launch does nothing but count (and, when asked, keep what
it was given).  ``tg.CUDA()`` compiles its kernels with the real NVRTC and runs its whole
host path on it, so ``python -m tapegrad bench --backend cuda-standin`` measures what a
launch costs tapegrad on the host, in the development machine's terms, and tests check what
a launch hands the driver.  Nothing computes: the arrays' contents after a launch are
whatever they were.

>>> from tapegrad.bench.standin_cupy import installed
>>> import numpy as np
>>> with installed() as cupy:
...     x = cupy.zeros(4, np.float32)
...     (type(x).__module__, x.device.id, x.get().tolist())
('cupy', 0, [0.0, 0.0, 0.0, 0.0])
"""

from __future__ import annotations

import ctypes
import struct
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import numpy as np

H100_ATTRIBUTES = {1: 1024, 2: 1024, 3: 1024, 4: 64, 5: 2**31 - 1, 6: 65535, 7: 65535,
                   75: 9, 76: 0, 97: 232448}     # (cudaDeviceAttr numbers, as an H100's)


class _Device:
    """CuPy's ``cupy.cuda.Device``: its index, and a context that makes it current."""

    def __init__(self, id: int = 0):
        self.id = id

    def __enter__(self) -> _Device:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


_DEVICE = _Device(0)


class ndarray:
    """A C-contiguous array in host memory that tapegrad takes for a CuPy array."""

    flags = SimpleNamespace(c_contiguous=True, f_contiguous=False)
    _c_contiguous = True
    base = None           # (as CuPy's arrays that own their memory)
    driver: Driver | None = None      # (the last module()'s: fill tells it, where asked)

    def __init__(self, host: np.ndarray):
        # (plain attributes: reading one costs about what reading CuPy's does)
        self._host = host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.ndim, self.size = host.shape, host.dtype, host.ndim, host.size
        self.nbytes, self.strides = host.nbytes, host.strides
        self.data = SimpleNamespace(ptr=host.ctypes.data)
        self.device = _DEVICE

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": None,
                "data": (self._host.ctypes.data, False), "version": 3, "stream": 1}

    def get(self) -> np.ndarray:
        return self._host.copy()

    def copy(self) -> ndarray:
        return ndarray(self._host.copy())

    def fill(self, value: Any) -> None:
        self._host.fill(value)
        if self.driver is not None and self.driver.keep_fills:
            self.driver.kept.append(("fill", self.data.ptr, self.nbytes, value))

    def astype(self, dtype: Any, copy: bool = True) -> ndarray:
        return ndarray(self._host.astype(dtype))

    def reshape(self, *shape: Any) -> ndarray:
        return ndarray(self._host.reshape(*shape))

    def ravel(self) -> ndarray:
        return ndarray(self._host.ravel())

    def sum(self, *args: Any, **kwargs: Any) -> ndarray:
        return ndarray(np.asarray(self._host.sum(*args, **kwargs)))

    def item(self) -> Any:
        return self._host.item()

    def __len__(self) -> int:
        return len(self._host)

    def __bool__(self) -> bool:
        return bool(self._host)

    def __int__(self) -> int:
        return int(self._host)

    def __float__(self) -> float:
        return float(self._host)

    def __getitem__(self, index: Any) -> ndarray:
        return ndarray(self._host[_host(index)])

    def __setitem__(self, index: Any, value: Any) -> None:
        self._host[_host(index)] = _host(value)

    def __repr__(self) -> str:
        return f"standin_cupy.ndarray({self._host!r})"


def _host(x: Any) -> Any:
    return x._host if isinstance(x, ndarray) else x


def _binary(name: str) -> Any:
    op = getattr(np.ndarray, name)

    def method(self: ndarray, other: Any) -> Any:
        out = op(self._host, _host(other))
        if name.startswith("__i"):
            return self
        return ndarray(out) if isinstance(out, np.ndarray) else out
    return method


for _name in ("add", "sub", "mul", "truediv", "radd", "rsub", "rmul", "rtruediv", "iadd",
              "isub", "imul", "itruediv", "eq", "ne", "lt", "le", "gt", "ge", "neg"):
    if _name == "neg":
        setattr(ndarray, "__neg__", lambda self: ndarray(-self._host))
    else:
        setattr(ndarray, f"__{_name}__", _binary(f"__{_name}__"))
ndarray.__module__ = "cupy"
ndarray.__hash__ = object.__hash__     # (an array is hashed by identity, as CuPy's)


class Driver:
    """The driver calls tapegrad makes; ``launchKernel`` counts, and keeps the arguments'
    bytes where ``keep`` is set (see :meth:`parameters`); with ``keep_fills`` too, every
    fill of an array (``ndarray.fill``, a graph's memset) is kept beside the launches."""

    class CUDADriverError(RuntimeError):
        pass

    def __init__(self) -> None:
        self.launches = 0
        self.keep = self.keep_fills = False
        self.kept: list[tuple] = []
        self.sizes: dict[int, tuple[int, ...]] = {}     # function pointer -> argument sizes

    def launchKernel(self, f: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int,
                     shared: int, stream: int, kernel_params: int, extra: int) -> None:
        self.launches += 1
        if self.keep:
            self.kept.append((f, (gx, gy, gz), (bx, by, bz), shared, stream,
                              self.parameters(f, kernel_params)))

    def parameters(self, f: int, kernel_params: int) -> list[bytes]:
        """The bytes each of ``f``'s arguments points to (``sizes[f]``: how many each)."""
        sizes = self.sizes.get(f, ())
        pointers = (ctypes.c_void_p * len(sizes)).from_address(kernel_params)
        return [ctypes.string_at(p, n) for p, n in zip(pointers, sizes)]

    @staticmethod
    def funcGetAttribute(attribute: int, f: int) -> int:
        return 1024 if attribute == 0 else 32

    @staticmethod
    def funcSetAttribute(f: int, attribute: int, value: int) -> None:
        pass


class GraphDriver:
    """The calls of ``cuda.bindings.driver`` that CUDA graphs make (``backends/cuda/graphs.py``):
    a graph keeps its nodes' parameters as the driver does (the values copied when a node is
    added or updated); a graph launch counts each kernel node, in order, in ``driver``'s
    launches (and keeps it there, as ``launchKernel`` does) and sets each memset node's bytes.
    ``refuse``: names of calls that return an error instead; ``calls``: calls by name."""

    class CUDA_KERNEL_NODE_PARAMS(SimpleNamespace):
        func = gridDimX = gridDimY = gridDimZ = blockDimX = blockDimY = blockDimZ = 0
        sharedMemBytes = kernelParams = 0

    class CUDA_MEMSET_NODE_PARAMS(SimpleNamespace):
        dst = pitch = value = elementSize = width = height = 0

    CUfunction = CUstream = int
    CU_STREAM_LEGACY = 1

    def __init__(self, driver: Driver) -> None:
        self.driver = driver
        self.refuse: set[str] = set()
        self.calls: dict[str, int] = {}
        self.nodes: dict[tuple[int, int], tuple] = {}    # (graph, node) -> what it holds

    def _result(self, call: str, *value: Any) -> tuple:
        self.calls[call] = self.calls.get(call, 0) + 1
        return (1,) if call in self.refuse else (0, *value)   # (1: CUDA_ERROR_INVALID_VALUE)

    def _kept(self, p: Any) -> tuple:
        if isinstance(p, self.CUDA_MEMSET_NODE_PARAMS):
            assert p.height == 1 and p.elementSize in (1, 2, 4) and p.value == 0
            return ("fill", p.dst, p.width * p.elementSize, p.value)
        return (p.func, (p.gridDimX, p.gridDimY, p.gridDimZ),
                (p.blockDimX, p.blockDimY, p.blockDimZ), p.sharedMemBytes,
                self.driver.parameters(p.func, p.kernelParams))

    def cuInit(self, flags: int) -> tuple:
        return self._result("cuInit")

    def cuCtxGetCurrent(self) -> tuple:
        return self._result("cuCtxGetCurrent", 1)       # (a context's handle, not 0)

    def cuGraphCreate(self, flags: int) -> tuple:
        return self._result("cuGraphCreate", [])

    def cuGraphAddKernelNode(self, graph: list, before: list, count: int, p: Any) -> tuple:
        assert before == graph[-1:] and count == len(before)      # (a chain)
        graph.append(len(graph))
        self.nodes[id(graph), graph[-1]] = self._kept(p)
        return self._result("cuGraphAddKernelNode", graph[-1])

    def cuGraphAddMemsetNode(self, graph: list, before: list, count: int, p: Any,
                             ctx: int) -> tuple:
        assert before == graph[-1:] and count == len(before) and ctx == 1
        graph.append(len(graph))
        self.nodes[id(graph), graph[-1]] = self._kept(p)
        return self._result("cuGraphAddMemsetNode", graph[-1])

    def cuGraphExecMemsetNodeSetParams(self, instance: list, node: int, p: Any,
                                       ctx: int) -> tuple:
        return self._set("cuGraphExecMemsetNodeSetParams", instance, node, p)

    def cuGraphInstantiate(self, graph: list, flags: int) -> tuple:
        return self._result("cuGraphInstantiate", [self.nodes[id(graph), k] for k in graph])

    def cuGraphExecKernelNodeSetParams(self, instance: list, node: int, p: Any) -> tuple:
        return self._set("cuGraphExecKernelNodeSetParams", instance, node, p)

    def _set(self, call: str, instance: list, node: int, p: Any) -> tuple:
        result = self._result(call)
        if result[0] == 0:
            instance[node] = self._kept(p)
        return result

    def cuGraphLaunch(self, instance: list, stream: int) -> tuple:
        result = self._result("cuGraphLaunch")
        stream = 0 if stream == self.CU_STREAM_LEGACY else stream   # (the stand-in's own 0)
        if result[0] == 0:
            driver = self.driver
            for f, *rest in instance:
                if f == "fill":
                    address, nbytes, value = rest
                    ctypes.memset(address, value, nbytes)
                    if driver.keep_fills:
                        driver.kept.append(("fill", address, nbytes, value))
                    continue
                grid, block, shared, slots = rest      # (the bytes copied when set)
                driver.launches += 1
                if driver.keep:
                    driver.kept.append((f, grid, block, shared, stream, slots))
        return result

    def cuGraphExecDestroy(self, instance: list) -> tuple:
        return (0,)

    def cuGraphDestroy(self, graph: list) -> tuple:
        return (0,)


class Function:
    """A loaded kernel: its address, and CuPy's own launch (which packs as CuPy does)."""

    def __init__(self, driver: Driver, ptr: int):
        self.driver, self.ptr = driver, ptr

    def __call__(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0,
                 stream: Any = None) -> None:
        driver = self.driver
        if not driver.keep:         # (CuPy's own packing is not tapegrad's host time)
            driver.launches += 1
            return
        slots = [_cupy_bytes(a) for a in args]
        driver.sizes[self.ptr] = tuple(len(s) for s in slots)
        storage = [ctypes.create_string_buffer(s, len(s)) for s in slots]
        pointers = (ctypes.c_void_p * len(slots))(*(ctypes.addressof(s) for s in storage))
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        driver.launchKernel(self.ptr, *grid, *block, shared_mem, 0, ctypes.addressof(pointers), 0)


def _cupy_bytes(a: Any) -> bytes:
    """What CuPy's ``Function.__call__`` passes for one argument."""
    if isinstance(a, ndarray):
        return struct.pack("<Q", a.data.ptr)
    if isinstance(a, np.generic):
        return a.tobytes()
    raise TypeError(f"the stand-in CuPy takes arrays and NumPy scalars, got {type(a)}")


def module() -> types.ModuleType:
    """A fresh stand-in ``cupy`` module with one GPU (an H100's limits)."""
    cupy = types.ModuleType("cupy")
    driver = Driver()
    functions: list[Function] = []

    class Module:
        def load(self, data: bytes) -> None:
            pass

        def get_function(self, name: str) -> Function:
            functions.append(Function(driver, 0x1000 + len(functions)))
            return functions[-1]

    class CUDARuntimeError(RuntimeError):
        pass

    runtime = SimpleNamespace(
        CUDARuntimeError=CUDARuntimeError, getDevice=lambda: 0, getDeviceCount=lambda: 1,
        deviceGetAttribute=lambda number, device: H100_ATTRIBUTES.get(number, 0),
        getDeviceProperties=lambda device: {"name": b"stand-in H100 (no GPU)"},
        pointerGetAttributes=lambda pointer: SimpleNamespace(device=0, type=2),
        memGetInfo=lambda: (80 << 30, 80 << 30),
        eventCreateWithFlags=lambda flags: 1, eventRecord=lambda event, stream: None,
        streamWaitEvent=lambda stream, event, flags: None, free=lambda pointer: None)

    stream = SimpleNamespace(ptr=0, synchronize=lambda: None)
    cupy.ndarray = ndarray
    cupy.graph_driver = GraphDriver(driver)     # (no CuPy name: installed() hands it over)
    ndarray.driver = driver
    cupy.cuda = SimpleNamespace(
        runtime=runtime, driver=driver, Device=_Device, function=SimpleNamespace(Module=Module),
        get_current_stream=lambda device_id=-1: stream)
    # (new arrays hold zeros, not whatever memory held: nothing computes them, and host
    # reductions of garbage would warn of overflows)
    cupy.empty = lambda shape, dtype=np.float64: ndarray(np.zeros(shape, dtype))
    cupy.zeros = lambda shape, dtype=np.float64: ndarray(np.zeros(shape, dtype))
    cupy.ones = lambda shape, dtype=np.float64: ndarray(np.ones(shape, dtype))
    cupy.empty_like = lambda x, dtype=None: ndarray(np.zeros_like(_host(x), dtype))
    cupy.zeros_like = lambda x, dtype=None: ndarray(np.zeros_like(_host(x), dtype))
    cupy.array = lambda x, dtype=None, copy=True: ndarray(np.array(_host(x), dtype))
    cupy.asarray = lambda x, dtype=None: x if isinstance(x, ndarray) and dtype is None \
        else ndarray(np.asarray(_host(x), dtype))
    cupy.ascontiguousarray = cupy.asarray
    cupy.asnumpy = lambda x: np.array(_host(x))
    cupy.__getattr__ = _numpy_function      # (cupy.sum, cupy.dot, ...: NumPy's, on the host)
    return cupy


def _numpy_function(name: str) -> Any:
    fn = getattr(np, name)
    if not callable(fn):
        return fn

    def on_host(*args: Any, **kwargs: Any) -> Any:
        out = fn(*map(_host, args), **{k: _host(v) for k, v in kwargs.items()})
        return ndarray(out) if isinstance(out, np.ndarray) else out
    return on_host


@contextmanager
def installed() -> Iterator[types.ModuleType]:
    """The stand-in as ``cupy`` in ``sys.modules`` (its graph driver as CUDA graphs' driver,
    tapegrad's per-GPU caches emptied) for the ``with`` block; what was there before comes
    back after."""
    from tapegrad.backends import registry
    from tapegrad.backends.cuda import device as cuda_device
    from tapegrad.backends.cuda import graphs
    saved = sys.modules.get("cupy"), dict(cuda_device._LIMITS), dict(registry._BACKENDS), \
        graphs.DRIVER
    sys.modules["cupy"] = cupy = module()
    cuda_device._LIMITS.clear()
    registry._BACKENDS.clear()
    graphs.DRIVER = cupy.graph_driver
    try:
        yield cupy
    finally:
        graphs.DRIVER = saved[3]
        if saved[0] is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved[0]
        cuda_device._LIMITS.clear()
        cuda_device._LIMITS.update(saved[1])
        registry._BACKENDS.clear()
        registry._BACKENDS.update(saved[2])
