"""The first call of a captured function: run it on a tape that also writes down, in order,
what ran (every launch with its compiled launcher and arguments, every copy the tape made
before an overwrite, every host operation) and every comparison of a tape scalar (a branch
its replays must take the same way).  ``tapegrad/capturing/program.py`` turns that into a
program."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tapegrad.runtime.launch import prepare
from tapegrad.tape.records import LaunchRecord
from tapegrad.tape.scalars import TrackedScalar, concretized, plain
from tapegrad.tape.tape import Tape

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_line() -> str:
    """``file:line`` of the innermost caller outside tapegrad (what a first call's error
    names: the trace records it per step, once, on the first call)."""
    frame = sys._getframe(1)
    # (past tapegrad's frames and generated ones: a dataclass's __init__ is "<string>")
    while frame is not None and frame.f_code.co_filename.startswith((_PACKAGE, "<")):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@dataclass
class Step:
    """One thing the first call did, in order: ``kind`` is ``"launch"`` (``record``: its
    ``LaunchRecord``; ``launcher``, ``args`` (tape scalars as floats), ``nd``: what ran),
    ``"copy"`` (the tape copied ``args[0]`` into ``args[1]`` before an overwrite), or
    ``"host"`` (``record``: a host operation's record; ``args``: the arrays it read)."""

    kind: str
    record: Any = None
    launcher: Any = None
    args: tuple = ()
    nd: tuple[int, ...] = ()
    where: str = field(default_factory=user_line)     # the user's line that did it


@dataclass
class Guard:
    """A comparison (or ``bool``/``int``/``round``) of tape scalars that the first call made
    after ``step`` steps: ``fn(*args)`` gave ``answer`` (``args``: tape scalars and numbers)."""

    step: int
    fn: Any
    args: tuple
    answer: Any


class TraceTape(Tape):
    """A tape that records as any tape does and keeps the trace (``steps``, ``guards``)."""

    def __init__(self) -> None:
        Tape.__init__(self, watch_changes=False)
        self.steps, self.guards = [], []

    def __enter__(self) -> TraceTape:
        Tape.__enter__(self)
        self.watching = concretized.set(self.compared)
        return self

    def __exit__(self, *exc: Any) -> None:
        concretized.reset(self.watching)
        Tape.__exit__(self, *exc)

    def compared(self, fn: Any, args: tuple, answer: Any) -> None:
        if any(isinstance(a, TrackedScalar) and a.node_on(self) is not None for a in args):
            self.guards.append(Guard(len(self.steps), fn, args, answer))

    def record_launch(self, cfg: Any, args: tuple, ndrange: Any, run: bool = True) -> None:
        before = len(self.records)
        Tape.record_launch(self, cfg, args, ndrange, run)
        if len(self.records) > before:
            record = self.records[-1]
            # (a launch of one array for two parameters records once, by the merged launch
            # it makes, which came through here first)
            if isinstance(record, LaunchRecord) and not (self.steps and
                                                         self.steps[-1].record is record):
                values = tuple(plain(a) for a in args)
                launcher, nd, _ = prepare(record.cfg, values, ndrange)
                self.steps.append(Step("launch", record, launcher, values, nd))

    def will_overwrite(self, x: Any, also_read_now: bool, ident: tuple | None = None) -> Any:
        old = Tape.will_overwrite(self, x, also_read_now, ident)
        if old is not x:
            self.steps.append(Step("copy", args=(x, old)))
        return old

    def record_host(self, record: Any, live_inputs: list[tuple[Any, int]],
                    read: tuple = ()) -> None:
        Tape.record_host(self, record, live_inputs, read)
        arrays = tuple(x for x, _ in live_inputs) + tuple(read)
        self.steps.append(Step("host", record, args=arrays))
