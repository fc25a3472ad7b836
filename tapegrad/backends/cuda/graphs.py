"""A captured program's runs of CUDA launches as CUDA graphs whose nodes are updated per
call (``tapegrad/capturing``: its forward replay and its written-down reverse).

Each run of two or more launches, with the zeroings between them (a reverse sets a shadow to
0 before an adjoint adds into it), becomes one CUDA graph, built once node by node: a kernel
node per launch, a memset node per zeroing, each after the one before (the order a stream
gives them), instantiated once.  A call stages every launch into its node's own parameter
buffer (``plan.py``'s ``stage``: the arguments, grid and variant the launch itself would
take), updates the nodes whose kernel, grid, argument bytes or zeroed array differ from what
the graph holds (``cuGraphExec{Kernel,Memset}NodeSetParams``: the driver copies the values),
and launches the graph once on CuPy's current stream.  So a call's new arrays (its results,
the states a recording tape keeps) and new float values cost an update of the nodes that
read them: no copy in or out, no second graph; a call on the same arrays and values updates
nothing.

Guard model: a graph runs exactly the launches and zeroings the run would make one by one,
in the same order, on the same stream, with the same bytes; staging raises what a launch
raises.  A call runs the run one by one (each launch its written-out launch) where a zeroed
array is not one stretch of bytes, and so does every call under ``tg.deterministic()`` where
a kernel's atomics' order shows in its results (it then has a variant of its own), and of a
run whose launches are on several GPUs.  Whatever the driver refuses (building,
instantiating, an update, the launch), and a ``cuda.bindings`` missing or unable to reach the
driver, warns once (``CaptureWarning``), and that run runs one by one from then on.

Not yet run on a GPU (none was lent after it was written): off unless
``TAPEGRAD_CAPTURE_CUDA_GRAPHS=1``; without it each run of launches is called from one list
(``launches.py``).  ``tests/gpu/test_gpu.py`` turns it on and checks it against the
uncaptured function; ``tests/capture/test_cuda_graphs.py`` checks, on the stand-in CuPy,
that a graph hands the driver what the run one by one does.
"""

from __future__ import annotations

import ctypes
import os
import warnings
from typing import Any

from tapegrad.backends.cuda.launches import listed
from tapegrad.backends.determinism import DETERMINISTIC
from tapegrad.backends.stretches import stretches
from tapegrad.errors import CaptureWarning

# NVIDIA's cuda.bindings.driver, imported on first use (the stand-in CuPy of
# tapegrad/bench/standin_cupy.py puts its own here)
DRIVER: Any = None


class _Refused(Exception):
    """A driver call that did not return CUDA_SUCCESS."""


def _driver() -> Any:
    global DRIVER
    if DRIVER is None:
        try:
            from cuda.bindings import driver
            _checked(driver.cuInit(0), "cuInit")
        except _Refused:
            raise
        except Exception as e:   # (no cuda-bindings; a driver it cannot load or call)
            raise _Refused(f"cuda.bindings' driver calls are not available: {e}") from e
        DRIVER = driver
    return DRIVER


def _checked(result: tuple, call: str) -> Any:
    """``result``'s value (a cuda.bindings call returns (error, value...)); ``_Refused``
    where the error is not CUDA_SUCCESS."""
    if int(result[0]) != 0:
        raise _Refused(f"{call} returned {result[0]!r}")
    return result[1] if len(result) > 1 else None


class _Kernel:
    """A launch's node: where its arguments come from, its own parameter buffer and the
    pointers to its slots (the node's ``kernelParams``)."""

    def __init__(self, op: Any):
        launcher = op.fn
        self.stage, self.refs, self.nd, self.run = launcher.code.stage, op.refs, op.nd, launcher
        self.block = (tuple(launcher.block) + (1, 1))[:3]
        self.buffer = ctypes.create_string_buffer(max(launcher.code.size, 8))
        base = ctypes.addressof(self.buffer)
        count = max(launcher.code.slots, 1)
        self.pointers = (ctypes.c_void_p * count)(*(base + 8 * n for n in range(count)))
        self.head: tuple | None = None           # (variant, grid) of the parameters ``p``
        self.p: Any = None

    def args(self, arrays: list, scalars: dict) -> tuple:
        return tuple([arrays[what] if kind == "a" else scalars[what] if kind == "s" else what
                      for kind, what in self.refs])

    def staged(self, arrays: list, scalars: dict) -> tuple:
        """What the node holds for this call: (variant, grid) and its arguments' bytes."""
        return self.stage(self.args(arrays, scalars), self.nd, self.buffer), self.buffer.raw

    def params(self, driver: Any, staged: tuple) -> Any:
        """The node's parameters (one struct, made again only for another variant or grid:
        the arguments' bytes are the buffer's, which the driver reads when given them)."""
        if staged[0] != self.head:
            variant, gx, gy, gz = self.head = staged[0]
            p = self.p = driver.CUDA_KERNEL_NODE_PARAMS()
            p.func = driver.CUfunction(variant.function.ptr)
            p.gridDimX, p.gridDimY, p.gridDimZ = gx, gy, gz
            p.blockDimX, p.blockDimY, p.blockDimZ = self.block
            p.sharedMemBytes = variant.shared
            p.kernelParams = ctypes.addressof(self.pointers)
        return self.p

    def add(self, driver: Any, graph: Any, before: list, staged: tuple, ctx: Any) -> Any:
        return _checked(driver.cuGraphAddKernelNode(graph, before, len(before),
                                                    self.params(driver, staged)),
                        "cuGraphAddKernelNode")

    def update(self, driver: Any, instance: Any, node: Any, staged: tuple, ctx: Any) -> None:
        _checked(driver.cuGraphExecKernelNodeSetParams(instance, node,
                                                       self.params(driver, staged)),
                 "cuGraphExecKernelNodeSetParams")

    def one(self, arrays: list, scalars: dict) -> None:
        self.run(self.args(arrays, scalars), self.nd)


class _Zero:
    """A zeroing's node (a shadow set to 0 before an adjoint adds into it): a memset of the
    array's bytes, 4 at a time where they divide by 4."""

    def __init__(self, op: Any):
        self.slot = op.refs[0][1]
        self.size = 0                   # bytes set at a time: fixed by the first call
        self.p: Any = None

    def staged(self, arrays: list, scalars: dict) -> tuple | None:
        """(address, bytes); None where the array is not one stretch of bytes to set in the
        node's steps (a node's element size cannot change)."""
        a = arrays[self.slot]
        if not (a._c_contiguous and a.nbytes):
            return None
        address, nbytes = a.data.ptr, a.nbytes
        size = self.size or (4 if address % 4 == 0 and nbytes % 4 == 0 else 1)
        if address % size or nbytes % size:
            return None
        self.size = size
        return address, nbytes

    def params(self, driver: Any, staged: tuple) -> Any:
        address, nbytes = staged
        p = self.p
        if p is None or p.width * self.size != nbytes:
            p = self.p = driver.CUDA_MEMSET_NODE_PARAMS()
            p.value, p.elementSize = 0, self.size
            p.width, p.height, p.pitch = nbytes // self.size, 1, nbytes
        p.dst = address
        return p

    def add(self, driver: Any, graph: Any, before: list, staged: tuple, ctx: Any) -> Any:
        return _checked(driver.cuGraphAddMemsetNode(graph, before, len(before),
                                                    self.params(driver, staged), ctx),
                        "cuGraphAddMemsetNode")

    def update(self, driver: Any, instance: Any, node: Any, staged: tuple, ctx: Any) -> None:
        _checked(driver.cuGraphExecMemsetNodeSetParams(instance, node,
                                                       self.params(driver, staged), ctx),
                 "cuGraphExecMemsetNodeSetParams")

    def one(self, arrays: list, scalars: dict) -> None:
        arrays[self.slot].fill(0)


class LaunchGraph:
    """Ops ``[start, stop)`` of ``program`` (CUDA launches and zeroings) as one CUDA graph
    (see the module's docstring); ``updates`` counts the node updates calls made."""

    def __init__(self, program: Any, start: int, stop: int):
        self.start, self.stop = start, stop
        ops = program.ops[start:stop]
        self.nodes = [_Kernel(op) if op.kind == "launch" else _Zero(op) for op in ops]
        launchers = [op.fn for op in ops if op.kind == "launch"]
        self.cupy, self.device = launchers[0].cupy, launchers[0].device
        self.name = getattr(program, "name", "")
        self.handles: list = []
        self.held: list = [None] * len(ops)     # what each node holds now
        self.graph: Any = None
        self.exec: Any = None
        self.ctx: Any = None
        self.driver: Any = None         # (the driver that made them, to destroy them)
        self.updates = 0
        self.failed = None if all(k.device == self.device for k in launchers) else \
            "its launches are on several GPUs"
        # (a kernel launched under maybe_ordered: its atomics' order shows in its results)
        self.ordered = any(k.launch is not k.code.launch for k in launchers)

    def __call__(self, frame: Any) -> None:
        if self.failed is None and not (self.ordered and DETERMINISTIC.on):
            cupy = self.cupy
            try:
                if cupy.cuda.runtime.getDevice() == self.device:
                    done = self.run(frame)
                else:
                    with cupy.cuda.Device(self.device):
                        done = self.run(frame)
                if done:
                    return
            except _Refused as e:
                self.failed = str(e)
                warnings.warn(f"tg.capture: ops {self.start} to {self.stop - 1} of {self.name} "
                              f"could not run as a CUDA graph ({e}); they run one at a time",
                              CaptureWarning, stacklevel=2)
        self.one_by_one(frame)

    def one_by_one(self, frame: Any) -> None:
        for node in self.nodes:
            node.one(frame.arrays, frame.scalars)

    def run(self, frame: Any) -> bool:
        """The graph's launch for ``frame``, after updating the nodes that changed; False
        (nothing run) where a zeroing's array is not one stretch of bytes."""
        driver = _driver()
        arrays, scalars = frame.arrays, frame.scalars
        staged = [node.staged(arrays, scalars) for node in self.nodes]
        if None in staged:
            return False
        if self.exec is None:
            self.build(driver, staged)
        else:
            held, ctx, instance = self.held, self.ctx, self.exec
            for k, (node, now) in enumerate(zip(self.nodes, staged)):
                if now != held[k]:
                    held[k] = None          # (until the driver has taken it)
                    node.update(driver, instance, self.handles[k], now, ctx)
                    held[k] = now
                    self.updates += 1
        # (CuPy's handle 0 is the legacy default stream, as CuPy launches on it; to
        # cuda.bindings 0 may mean the per-thread one: CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM)
        ptr = self.cupy.cuda.get_current_stream().ptr or int(driver.CU_STREAM_LEGACY)
        _checked(driver.cuGraphLaunch(self.exec, driver.CUstream(ptr)), "cuGraphLaunch")
        return True

    def build(self, driver: Any, staged: list) -> None:
        """The graph of every node as staged (a chain, in order) and its instance."""
        self.driver = driver
        self.ctx = _checked(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if not int(self.ctx):           # (a thread that has not used the runtime yet)
            self.cupy.cuda.runtime.free(0)
            self.ctx = _checked(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        self.graph = _checked(driver.cuGraphCreate(0), "cuGraphCreate")
        before: list = []
        for node, now in zip(self.nodes, staged):
            self.handles.append(node.add(driver, self.graph, before, now, self.ctx))
            before = [self.handles[-1]]
        self.exec = _checked(driver.cuGraphInstantiate(self.graph, 0), "cuGraphInstantiate")
        self.held = list(staged)

    def __del__(self) -> None:
        try:
            if self.exec is not None:
                self.driver.cuGraphExecDestroy(self.exec)
            if self.graph is not None:
                self.driver.cuGraphDestroy(self.graph)
        except Exception:          # (at the interpreter's exit the driver may be gone)
            pass


def _graphable(op: Any) -> bool:
    """A launch of a compiled CUDA kernel on a nonempty ndrange, or a zeroing."""
    return listed(op) or op.kind == "zero"


def plan(program: Any) -> list[tuple[bool, Any]] | None:
    """``program``'s ops as (graph, what): a ``LaunchGraph`` for each run of two or more
    CUDA launches, else the op's index; None where there is none, or where
    ``TAPEGRAD_CAPTURE_CUDA_GRAPHS`` is not ``1``."""
    if os.environ.get("TAPEGRAD_CAPTURE_CUDA_GRAPHS") != "1":
        return None
    return stretches(program.ops, _graphable,
                     lambda start, stop: LaunchGraph(program, start, stop))
