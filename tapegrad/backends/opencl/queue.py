"""A captured program's launches on OpenCL, packed in advance (``tapegrad/capturing``).

A launch packs its arguments each time (an array's buffer, offset and extents, each scalar
as a NumPy scalar of its C type) before PyOpenCL enqueues it.  In a captured program only the
arrays change from call to call (a call's inputs and results; the extents are the
recording's) and the float parameters: so each run of consecutive launches is packed once,
and a call puts its buffers, their offsets and its parameters into their places and enqueues
the kernels one after another, with nothing else between them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.opencl.backend import _Launcher, element_offset
from tapegrad.backends.stretches import stretches


class QueuedLaunches:
    """Ops ``[start, stop)`` of ``program`` (all OpenCL launches) packed for ``frame``'s
    kind of arrays: per launch its launcher, queue, sizes, packed arguments, and where the
    call's buffers and offsets (slot, parameter name) and parameters (node, C type) go in
    them."""

    def __init__(self, program: Any, start: int, stop: int, frame: Any):
        self.start, self.stop = start, stop
        self.launches = []
        for op in program.ops[start:stop]:
            run = op.fn
            values = [frame.arrays[what] if kind == "a" else frame.scalars[what]
                      if kind == "s" else what for kind, what in op.refs]
            packed = run.pack(tuple(values), op.nd)
            arrays, params, at = [], [], 0
            for (kind, what), value, name in zip(op.refs, values, run.params):
                if kind == "a":
                    arrays.append((at, what, name))
                    at += 2 + value.ndim           # its buffer, offset, then its extents
                else:
                    if kind == "s":
                        params.append((at, what, type(packed[at])))
                    at += 1
            global_, local = run.sizes(op.nd)
            self.launches.append((run, run.queue, global_, local, packed, arrays, params))

    def __call__(self, frame: Any) -> None:
        arrays, scalars = frame.arrays, frame.scalars
        for run, queue, global_, local, packed, at_arrays, at_params in self.launches:
            values = list(packed)
            for at, k, name in at_arrays:
                a = arrays[k]
                values[at] = a.base_data
                values[at + 1] = np.int64(element_offset(name, a))
            for at, node, ctype in at_params:
                values[at] = ctype(scalars[node])
            # (restrict pointers where this call's arrays are disjoint: c/items.py)
            kernel = run.pick([arrays[k] for _, k, _ in at_arrays])
            kernel(queue, global_, local, *values)


def plan(program: Any, frame: Any) -> list[tuple[bool, Any]] | None:
    """``program``'s ops as (queued, what): a ``QueuedLaunches`` for each run of two or more
    OpenCL launches, else the op's index; None where there is none."""
    return stretches(program.ops, lambda op: op.kind == "launch"
                     and isinstance(op.fn, _Launcher) and 0 not in op.nd,
                     lambda start, stop: QueuedLaunches(program, start, stop, frame))
