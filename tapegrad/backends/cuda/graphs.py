"""A captured program's launches on an NVIDIA GPU as CUDA graphs (``tapegrad/capturing``):
each stretch of consecutive launches and copies is recorded once by stream capture and
replayed by one graph launch, instead of a packing and a CuPy call per launch.

A graph holds the addresses it was recorded with, and a call's arrays are new (its inputs
are the caller's, its results new arrays), so a stretch runs on arrays of its own: a call's
arrays are copied in before the graph and out after it (one copy each, where the stretch
saves a launch's host time per step), temporaries are the program's own memory already.  It
holds the scalars it was recorded with too: a call with other values of its float
parameters records another graph (the last ``MOST_GRAPHS`` are kept).  Anything that fails
while recording (an operation that cannot be captured) falls back, with a warning, to
launching the stretch's operations one by one.

Not yet run on a GPU (none was lent after it was written): off unless
``TAPEGRAD_CAPTURE_CUDA_GRAPHS=1``; without it a CUDA program replays op by op.
``tests/gpu/test_gpu.py`` turns it on and checks it against the uncaptured function.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from tapegrad.backends.cuda.backend import _Launcher
from tapegrad.backends.stretches import stretches
from tapegrad.errors import CaptureWarning

MOST_GRAPHS = 4


class GraphStretch:
    """Ops ``[start, stop)`` of ``program`` as a CUDA graph (see the module's docstring)."""

    def __init__(self, program: Any, start: int, stop: int, frame: Any):
        import cupy
        self.cupy, self.program, self.start, self.stop = cupy, program, start, stop
        ops = program.ops[start:stop]
        used = sorted({k for op in ops for kind, k in op.refs if kind == "a"})
        before = {k for op in program.ops[:start] for kind, k in op.refs if kind == "a"}
        slots = program.slots
        moved = [k for k in used if not _stable(program, k)]
        self.own = {k: cupy.empty(frame.arrays[k].shape, frame.arrays[k].dtype) for k in moved}
        self.copy_in = [k for k in moved if slots[k].kind == "input" or k in before]
        self.copy_out = [k for k in moved if slots[k].kind != "input" or slots[k].written]
        self.nodes = sorted({what for op in ops for kind, what in op.refs if kind == "s"})
        self.graphs: dict[tuple, Any] = {}
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.failed: str | None = None

    def __call__(self, frame: Any) -> None:
        if self.failed is not None:
            self.one_by_one(frame)
            return
        key = tuple(frame.scalars[n] for n in self.nodes)
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.record(frame, key)
            if graph is None:
                self.one_by_one(frame)
                return
        cupy = self.cupy
        for k in self.copy_in:
            self.own[k][...] = cupy.asarray(frame.arrays[k])
        graph.launch()                               # on the current stream
        for k in self.copy_out:
            cupy.asarray(frame.arrays[k])[...] = self.own[k]

    def one_by_one(self, frame: Any) -> None:
        for j in range(self.start, self.stop):
            self.program.run_op(self.program.ops[j], j, frame)

    def record(self, frame: Any, key: tuple) -> Any:
        """The stretch's graph for these scalars, recorded on the stretch's own arrays; None
        (and a warning, once) where recording failed."""
        local = type(frame)(list(frame.arrays), frame.scalars, frame.partials)
        for k, own in self.own.items():
            local.arrays[k] = own
        self.cupy.cuda.get_current_stream().synchronize()   # (nothing in flight on them)
        graph = None
        try:
            with self.stream:
                self.stream.begin_capture()
                try:
                    for j in range(self.start, self.stop):
                        self.program.run_op(self.program.ops[j], j, local)
                finally:
                    graph = self.stream.end_capture()
            graph.upload()
        except Exception as e:       # (whatever CUDA refused: launch one by one instead)
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(f"tg.capture: ops {self.start} to {self.stop - 1} of "
                          f"{self.program.name} could not be recorded as a CUDA graph "
                          f"({self.failed}); they replay one launch at a time",
                          CaptureWarning, stacklevel=2)
            return None
        self.graphs[key] = graph
        while len(self.graphs) > MOST_GRAPHS:
            del self.graphs[next(iter(self.graphs))]
        return graph


def _stable(program: Any, k: int) -> bool:
    """Whether slot ``k`` is the same array in every call: a constant, or a temporary in the
    program's own memory (one the reverse sweep reads is new in a call a tape records)."""
    slot = program.slots[k]
    return slot.kind == "const" or slot.kind == "temp" and not slot.kept


def _graphable(op: Any, frame: Any) -> bool:
    if op.kind == "launch":
        return isinstance(op.fn, _Launcher) and 0 not in op.nd
    if op.kind == "copy":
        return all(type(frame.arrays[k]).__module__.startswith("cupy") for _, k in op.refs)
    return False


def plan(program: Any, frame: Any) -> list[tuple[bool, Any]] | None:
    """``program``'s ops as (graph, what): a ``GraphStretch`` for each stretch of two or
    more CUDA launches (and copies between CuPy arrays), else the op's index; None where
    there is none, or where ``TAPEGRAD_CAPTURE_CUDA_GRAPHS`` is not ``1``."""
    if os.environ.get("TAPEGRAD_CAPTURE_CUDA_GRAPHS") != "1":
        return None
    return stretches(program.ops, lambda op: _graphable(op, frame),
                     lambda start, stop: GraphStretch(program, start, stop, frame))
