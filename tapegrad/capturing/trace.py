"""The first call of a captured function: run it on a tape that also writes down, in order,
what ran (every launch with its compiled launcher and arguments, every copy the tape made
before an overwrite, every host operation) and every comparison of a tape scalar (a branch
its replays must take the same way).  ``tapegrad/capturing/program.py`` turns that into a
program."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from tapegrad.callers import user_line
from tapegrad.errors import CaptureError
from tapegrad.runtime.launch import distinct, prepare
from tapegrad.tape import hostmath
from tapegrad.tape.arrays import is_array
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.memory import owner
from tapegrad.tape.records import LaunchRecord
from tapegrad.tape.scalars import TrackedScalar, concretized, plain
from tapegrad.tape.tape import Tape


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
    """A tape that records as any tape does and keeps the trace (``steps``, ``guards``) of
    a call of ``fn`` (whose ``math``/``cmath`` functions of tape scalars become guards while
    it records: tape/hostmath.py)."""

    def __init__(self, fn: Any = None, args: tuple = (), name: str = "") -> None:
        Tape.__init__(self, watch_changes=False)
        self.fn, self.args, self.name = fn, args, name
        self.steps, self.guards = [], []
        # the arguments' contents as recorded operations left them (ArgumentsWatch)
        self.arguments = ArgumentsWatch(fn, args, name)
        self.depth = 0       # (record_launch within record_launch: a merged launch)

    def __enter__(self) -> TraceTape:
        # (the arguments' fingerprints first: taking one can fail, e.g. a PyOpenCL view
        # that skips elements, and must leave no tape recording behind)
        self.arguments.start()
        Tape.__enter__(self)
        self.watching = concretized.set(self.compared)
        self.host_math = hostmath.install(hostmath.places(self.fn))
        return self

    def __exit__(self, *exc: Any) -> None:
        hostmath.restore(self.host_math)
        concretized.reset(self.watching)
        Tape.__exit__(self, *exc)

    def compared(self, fn: Any, args: tuple, answer: Any) -> None:
        if any(isinstance(a, TrackedScalar) and a.node_on(self) is not None for a in args):
            self.guards.append(Guard(len(self.steps), fn, args, answer))

    def record_launch(self, cfg: Any, args: tuple, ndrange: Any, run: bool = True) -> None:
        cfg, args = distinct(cfg, args)       # (its steps keep the launch as it runs)
        watched = self.depth == 0 and self.arguments.positions
        if watched and run:
            self.arguments.unchanged(args)
        steps = len(self.steps)
        self.depth += 1
        try:
            self.record_launch_step(cfg, args, ndrange, run)
        finally:
            self.depth -= 1
        if watched:     # (an enclosing tape's copy of a launch that has not run yet: unknown)
            self.arguments.left(self.written(steps), known=run)

    def written(self, first: int) -> list[Any]:
        """The arrays the launch steps from ``first`` on wrote."""
        return [a for step in self.steps[first:] if step.kind == "launch"
                for a, ident in zip(step.args, step.record.ids)
                if ident is not None and ident in step.record.writes]

    def record_launch_step(self, cfg: Any, args: tuple, ndrange: Any, run: bool) -> None:
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

    def before_host_write(self, x: Any, who: str) -> tuple:
        self.arguments.unchanged((x,))
        return Tape.before_host_write(self, x, who)

    def after_host_write(self, x: Any, ident: tuple) -> None:
        Tape.after_host_write(self, x, ident)
        self.arguments.left((x,))

    def record_host(self, record: Any, live_inputs: list[tuple[Any, int]],
                    read: tuple = (), wrote: tuple = ()) -> None:
        self.arguments.unchanged(tuple(x for x, _ in live_inputs) + tuple(read))
        Tape.record_host(self, record, live_inputs, read, wrote)
        arrays = tuple(x for x, _ in live_inputs) + tuple(read)
        self.steps.append(Step("host", record, args=arrays))


class ArgumentsWatch:
    """A first call's array arguments, fingerprinted as the call found them and again after
    each recorded operation that writes one: an argument that differs when a recorded
    operation is about to use it, or when the call returns (``unchanged``), was changed in
    place by code no tape records (``u *= 2`` in NumPy), which a replay would not do:
    refused at that line.  Arguments sharing memory are fingerprinted together."""

    def __init__(self, fn: Any, args: tuple, name: str):
        self.args, self.name = args, name
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        self.defined_at = "" if code is None else \
            f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
        self.positions: dict[int, list[int]] = {}     # id of memory's owner -> positions
        for pos, a in enumerate(args):
            if is_array(a):
                self.positions.setdefault(id(owner(a)), []).append(pos)
        self.expected: dict[int, Any] = {}    # position -> fingerprint (None: not known)
        self.left_at: dict[int, str] = {}     # position -> the line that last wrote it

    def start(self) -> None:
        self.expected = {pos: fingerprint(self.args[pos])
                         for positions in self.positions.values() for pos in positions}

    def touched(self, arrays: Any) -> list[int]:
        return sorted({pos for x in arrays if is_array(x)
                       for pos in self.positions.get(id(owner(x)), ())})

    def unchanged(self, arrays: Any, returning: bool = False) -> None:
        """Refuse a change of the arguments among ``arrays`` since a recorded operation last
        left them (``returning``: the call's end, where every argument is checked)."""
        if not self.positions:
            return
        for pos in self.touched(arrays):
            now, want = fingerprint(self.args[pos]), self.expected[pos]
            if want is None:
                self.expected[pos] = now
            elif bool(now != want):
                x, since = self.args[pos], self.left_at.get(pos)
                where = self.defined_at if returning else user_line()
                span = (f"after {since}, before it returned" if since else "") if returning \
                    else f"between {since} and this line" if since else "before this line"
                raise CaptureError(
                    f"{where + ': ' if where else ''}{self.name} changed argument {pos} (shape "
                    f"{tuple(x.shape)}) in place with code no tape records (NumPy arithmetic "
                    f"in place, such as u *= 2 or u[0] = 1){' ' + span if span else ''}: a "
                    "replay would not change it. Do it in a kernel or with tg.scale/tg.copy, "
                    "or outside the captured function")

    def left(self, arrays: Any, known: bool = True) -> None:
        """A recorded operation wrote ``arrays``: what it left is what later ones find."""
        for pos in self.touched(arrays):
            self.expected[pos] = fingerprint(self.args[pos]) if known else None
            self.left_at[pos] = user_line()

    def returned(self) -> None:
        self.unchanged(self.args, returning=True)
