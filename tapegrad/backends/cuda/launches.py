"""A captured program's CUDA launches called from one list made in advance
(``tapegrad/capturing``): per launch, its written-out launch (``plan.py``), where its
arguments come from (the call's arrays and tape scalars, or constants) and its ndrange, so a
call does nothing between launches but gather their arguments.  Used for the forward replay
where CUDA graphs are off, and for the written-down reverse."""

from __future__ import annotations

from typing import Any

from tapegrad.backends.cuda.backend import _Launcher
from tapegrad.backends.stretches import stretches


class LaunchList:
    """Ops ``[start, stop)`` of ``program``, all CUDA launches, as (launch, refs, ndrange)."""

    def __init__(self, program: Any, start: int, stop: int):
        self.start, self.stop = start, stop
        self.calls = [(op.fn.launch, op.refs, op.nd) for op in program.ops[start:stop]]

    def __call__(self, frame: Any) -> None:
        arrays, scalars = frame.arrays, frame.scalars
        for launch, refs, nd in self.calls:
            launch(tuple([arrays[what] if kind == "a" else scalars[what] if kind == "s"
                          else what for kind, what in refs]), nd)


def plan(program: Any) -> list[tuple[bool, Any]] | None:
    """``program``'s ops as (listed, what): a ``LaunchList`` for each run of two or more CUDA
    launches, else the op's index; None where there is none."""
    return stretches(program.ops, listed, lambda start, stop: LaunchList(program, start, stop))


def listed(op: Any) -> bool:
    """Whether ``op`` is a launch of a compiled CUDA kernel on a nonempty ndrange."""
    return op.kind == "launch" and isinstance(op.fn, _Launcher) and 0 not in op.nd
