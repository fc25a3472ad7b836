"""A captured function's program: what its first call ran, as operations on numbered arrays
(slots) and tape-scalar nodes, that run again on a new call's arrays without the function's
Python; and how to point the first call's records at a call's arrays, so that the tape's own
reverse sweep differentiates any call.

Slots are of four kinds.  ``input``: argument ``index`` of the call.  ``output``: result
``index`` (a new array per call).  ``const``: an array the function read but neither was
given nor made (a closure's or a global's), used by reference: a replay reads its contents
as they are then.  ``temp``: an array the function made; a replay uses memory the program
keeps, shared between temporaries whose lives do not overlap, except for those whose
contents the reverse sweep reads (``kept``), which a call that a tape records gets anew.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapegrad.backends.cpu.driver import plan as cpu_plan
from tapegrad.backends.cuda.graphs import plan as cuda_plan
from tapegrad.backends.cuda.launches import plan as cuda_launches
from tapegrad.backends.notice import compiling
from tapegrad.backends.opencl.queue import plan as opencl_plan
from tapegrad.capturing.outside import outside_arrays
from tapegrad.capturing.trace import Step, TraceTape
from tapegrad.errors import CaptureError
from tapegrad.tape.arrays import empty_like, is_array
from tapegrad.tape.hostops import CopyRecord, ReductionRecord, ScaleRecord
from tapegrad.tape.memory import owner
from tapegrad.tape.records import LaunchRecord
from tapegrad.tape.released import Released
from tapegrad.tape.scalars import ScalarRecord, TrackedScalar
from tapegrad.tape.sweep import Frozen

INPUT, OUTPUT, CONST, TEMP = "input", "output", "const", "temp"


@dataclass
class Slot:
    """One array of the program (see the module's docstring for ``kind`` and ``index``);
    ``proto``: the first call's array (a const's is the array itself), ``ident``: its
    identity on the trace tape, ``kept``: the reverse sweep reads its contents."""

    kind: str
    index: int
    proto: Any
    ident: Any
    kept: bool = False
    written: bool = False
    layout: tuple = ()
    used_at: str = ""        # the user's line of the first operation on it ("file:line")
    written_at: str = ""     # ... of the first that wrote it


@dataclass
class Op:
    """One operation of the program.  ``kind``: ``launch`` (``fn``: the compiled launcher,
    ``refs``: its arguments, ``nd``), ``copy`` (``refs``: source, destination), ``scale``
    (source, factor, destination), ``reduce`` (``fn``: the reduction, ``refs``: its arrays,
    ``out``: the node it makes), ``scalar`` (``fn``: the rule, ``refs``: its operands,
    ``out``) or ``guard`` (``fn(*refs)`` must give ``answer``).  A reference is ``("a",
    slot)``, ``("s", node)`` or ``("c", value)``."""

    kind: str
    fn: Any = None
    refs: tuple = ()
    nd: tuple[int, ...] = ()
    out: int | None = None
    answer: Any = None
    name: str = ""


class GuardFailed(Exception):
    """A replay met a branch the first call took the other way (``op``: the guard)."""

    def __init__(self, op: Op, index: int):
        super().__init__(op.name)
        self.op, self.index = op, index


@dataclass
class Frame:
    """One call's arrays (per slot) and scalars: node values, scalar records' partials."""

    arrays: list[Any]
    scalars: dict[int, float] = field(default_factory=dict)
    partials: dict[int, tuple] = field(default_factory=dict)


@dataclass
class Program:
    tape: TraceTape
    slots: list[Slot]
    ops: list[Op]
    params: list[tuple[int, int]]        # (argument position, node) of float arguments
    results: list[tuple]                 # per result: ("a", slot) / ("s", node) / ("c", value)
    rebind: list[tuple]                  # (container, key, reference): see ``bind``
    scratch: list[Any]                   # per slot: the program's memory (temps), else None
    written_before_guard: bool           # an input is written before a guard
    # no guard, no argument written, one scalar result: a call whose result's value is not
    # used (tg.gradient's) can leave the forward to its reverse sweep (CapturedRecord.pending)
    deferrable: bool = False
    name: str = ""
    returns_tuple: bool = False
    outside: list = field(default_factory=list)   # what it read from outside (outside.py)
    compiled: Any = None       # the ops' plan (backends/cpu/driver.py, backends/cuda/graphs.py)
    frozen: Frozen | None = None   # what its reverse sweeps work out once (CapturedRecord)
    # per sweep kind (the slots whose shadows are given): its Reverse (capturing/reverse.py),
    # or False where it stays a Python sweep
    reverses: dict = field(default_factory=dict)
    # held while a call runs it or its reverse: they use the program's memory (temporaries,
    # the reverse's buffers) and point its trace tape at the call's arrays
    lock: Any = field(default_factory=threading.RLock)

    # -- a call ---------------------------------------------------------------------------

    def frame(self, args: tuple, fresh_kept: bool) -> Frame:
        """The arrays of a call on ``args``: inputs, consts, new outputs, the program's
        temporaries (new ones for those the reverse reads, with ``fresh_kept``)."""
        arrays = list(self.scratch)
        for k, slot in enumerate(self.slots):
            if slot.kind == INPUT:
                arrays[k] = args[slot.index]
            elif slot.kind == OUTPUT or fresh_kept and slot.kept and slot.kind == TEMP:
                arrays[k] = new_array(slot)
        scalars = {node: float.__float__(args[pos]) for pos, node in self.params}
        return Frame(arrays, scalars)

    def run(self, frame: Frame) -> None:
        """The forward operations on ``frame`` (GuardFailed where a branch differs): the
        stretches of CPU launches compiled into one function each, of CUDA launches recorded
        as one CUDA graph each (else called from one list), of OpenCL launches packed once
        (the first replay prepares them), the rest one by one."""
        if self.compiled is None:
            # (its first run compiles its stretches: seconds, said as other compiles say it)
            with compiling(self.name, key=(self.name, id(self))):
                self.compiled = cpu_plan(self, frame) or cuda_plan(self) \
                    or cuda_launches(self) or opencl_plan(self, frame) or False
                self.run_plan(frame)
            return
        self.run_plan(frame)

    def run_plan(self, frame: Frame) -> None:
        plan = self.compiled or [(False, k) for k in range(len(self.ops))]
        for compiled, what in plan:
            if compiled:
                what(frame)
            else:
                self.run_op(self.ops[what], what, frame)

    def run_op(self, op: Op, index: int, frame: Frame) -> None:
        arrays, scalars = frame.arrays, frame.scalars

        def value(ref: tuple) -> Any:
            kind, what = ref
            return arrays[what] if kind == "a" else scalars[what] if kind == "s" else what

        kind = op.kind
        if kind == "launch":
            if 0 not in op.nd:
                op.fn(tuple(value(r) for r in op.refs), op.nd)
        elif kind == "copy":
            src, dst = value(op.refs[0]), value(op.refs[1])
            dst[...] = src.reshape(dst.shape)
        elif kind == "add":        # (a reverse's ops: capturing/reverse.py)
            src, dst = value(op.refs[0]), value(op.refs[1])
            dst += src.reshape(dst.shape)
        elif kind == "zero":
            value(op.refs[0]).fill(0)
        elif kind == "axpy":       # (as tg.scale's adjoint computes it: NumPy's rounding)
            src, a, dst = (value(r) for r in op.refs)
            dst[...] += a * src
        elif kind == "scale":
            src, a, dst = (value(r) for r in op.refs)
            dst[...] = src * src.dtype.type(a)
        elif kind == "reduce":
            scalars[op.out] = op.fn(*(value(r) for r in op.refs))
        elif kind == "scalar":
            scalars[op.out], frame.partials[op.out] = op.fn(*(value(r) for r in op.refs))
        elif kind == "guard":
            try:
                same = _same(op.fn(*(value(r) for r in op.refs)), op.answer)
            except (ArithmeticError, ValueError, TypeError):
                same = False    # (math.sqrt(-1.0): recording again raises at the user's line)
            if not same:
                raise GuardFailed(op, index)

    def results_of(self, frame: Frame) -> list[Any]:
        return [frame.arrays[what] if kind == "a" else frame.scalars[what] if kind == "s"
                else what for kind, what in self.results]

    # -- the reverse sweep ----------------------------------------------------------------

    def bind(self, frame: Frame | None) -> None:
        """Point the trace tape's records at ``frame``'s arrays and scalars (None: at
        nothing, so that the program holds no call's arrays)."""
        for container, key, (kind, what) in self.rebind:
            if frame is None:
                got = None
            elif kind == "a":
                got = frame.arrays[what]
            elif kind == "s":
                got = frame.scalars[what]
            else:
                got = frame.partials[what]
            if type(key) is str:
                setattr(container, key, got)
            else:
                container[key] = got


def _same(got: Any, answer: Any) -> bool:
    """Whether a guard's answer is the first call's: NaN is NaN, -0.0 is not 0.0 (a replay
    uses what was computed from it)."""
    if type(got) is tuple and type(answer) is tuple:
        return len(got) == len(answer) and all(map(_same, got, answer))
    if type(got) is float and type(answer) is float:
        return got == answer and math.copysign(1.0, got) == math.copysign(1.0, answer) \
            or got != got and answer != answer
    if type(got) is complex and type(answer) is complex:
        return _same(got.real, answer.real) and _same(got.imag, answer.imag)
    return got == answer


def build(tape: TraceTape, fn: Any, args: tuple, params: list[tuple[int, int]], result: Any,
          name: str) -> Program:
    """The program of a finished first call of ``fn``: ``args`` its arguments, ``params``
    the float ones' (position, node on ``tape``), ``result`` what it returned."""
    slots: list[Slot] = []
    by_ident: dict[Any, int] = {}
    by_id: dict[int, int] = {}

    def add(kind: str, index: int, x: Any) -> int:
        ident = tape.ids.ident_of(x)
        slots.append(Slot(kind, index, x, ident, layout=_layout(x)))
        if ident is not None:
            by_ident[ident] = len(slots) - 1
        by_id[id(x)] = len(slots) - 1
        return len(slots) - 1

    def slot_of(x: Any, made_here: bool) -> int:
        k = by_id.get(id(x))
        if k is None:
            ident = tape.ids.ident_of(x)
            k = by_ident.get(ident) if ident is not None else None
        if k is None:
            k = add(TEMP if made_here else CONST, -1, x)
        return k

    for pos, a in enumerate(args):
        if is_array(a):
            if tape.ids.ident_of(a) in by_ident:
                raise CaptureError(f"{name}: arguments {by_ident[tape.ids.ident_of(a)]} and "
                                   f"{pos} are the same array; a captured function takes "
                                   "distinct arrays")
            add(INPUT, pos, a)
    for step in tape.steps:     # (before any op: what such a step did may be gone by now)
        if not _replayable(step):
            raise _cannot_replay(step, name)
    outputs = result if isinstance(result, tuple) else (result,)
    results: list[tuple] = []
    ops: list[Op] = []
    guards = iter(tape.guards)
    guard = next(guards, None)
    for n, step in enumerate(tape.steps):
        while guard is not None and guard.step == n:
            ops.append(_guard_op(guard, tape, name))
            guard = next(guards, None)
        ops.append(_op(step, tape, slots, slot_of, name))
    while guard is not None:
        ops.append(_guard_op(guard, tape, name))
        guard = next(guards, None)
    for j, y in enumerate(outputs):
        if is_array(y):
            ident = tape.ids.ident_of(y)
            k = by_ident.get(ident) if ident is not None else None
            if k is None:
                raise CaptureError(
                    f"{name} returned an array of shape {tuple(y.shape)} that none of its "
                    "recorded operations made or used; a captured function returns arrays "
                    "its kernels (or tg.copy, tg.scale, ...) wrote")
            if slots[k].kind == TEMP:
                slots[k].kind, slots[k].index = OUTPUT, j
            results.append(("a", k))
        elif isinstance(y, TrackedScalar) and y.node_on(tape) is not None:
            results.append(("s", y.node_on(tape)))
        elif isinstance(y, TrackedScalar):
            tape.foreign_scalars = True      # (an enclosing tape's scalar, returned as it is)
            results.append(("c", y))
        elif isinstance(y, (int, float)) or y is None:
            results.append(("c", y))
        else:
            raise CaptureError(f"{name} returned a {type(y).__name__}; a captured function "
                               "returns arrays, tape scalars (tg.sum, tg.dot, ...), numbers, "
                               "or a tuple of them")
    if tape.foreign_scalars:
        raise CaptureError(
            f"{name} uses a tape scalar from outside (a closure's or a global's) without "
            "taking it as an argument: a replay would use its value at the first call, and "
            "its gradient would be lost. Pass it as a float argument")
    rebind = _rebind(tape, slots, slot_of)
    # (first: an array it made with NumPy whose contents a kernel reads, an atomic's target
    # or an update in place included, is a const to the trace, as a global is)
    _check_origins(fn, args, slots, name)
    for slot in slots:
        if slot.kind == CONST and slot.written:
            raise CaptureError(
                f"{_at(slot.written_at)}{name} writes an array of shape "
                f"{tuple(slot.proto.shape)} that it was not given and did not make (a "
                "global's or a closure's): a replay would write it "
                "without the function's Python to say so. Pass it as an argument (or return "
                "a new array)")
    scratch = _scratch(slots, ops)
    last_guard = max((k for k, op in enumerate(ops) if op.kind == "guard"), default=0)
    written_before = any(
        op.kind in ("launch", "copy", "scale") and _writes_input(op, slots)
        for op in ops[:last_guard])
    deferrable = [kind for kind, _ in results] == ["s"] and not any(
        op.kind == "guard" for op in ops) and not any(
        slot.kind == INPUT and slot.written for slot in slots)
    program = Program(tape, slots, ops, params, results, rebind, scratch, written_before,
                      deferrable, name, isinstance(result, tuple), frozen=Frozen(tape.records))
    for slot in slots:
        if slot.kind != CONST and slot.layout[0] is np.ndarray:
            slot.proto = None            # (the program holds no call's arrays)
    program.bind(None)
    return program


def _op(step: Step, tape: TraceTape, slots: list[Slot], slot_of: Any, name: str) -> Op:
    """The operation that ``step`` of the trace stands for (its slots told where it is)."""
    op = _op_of(step, tape, slots, slot_of, name)
    for kind, k in op.refs:
        if kind == "a":
            slots[k].used_at = slots[k].used_at or step.where
    if op.kind in ("launch", "copy", "scale"):
        for kind, k in op.refs:
            if kind == "a" and slots[k].written and not slots[k].written_at and (
                    op.kind != "launch" or _launch_writes(step, op, k)):
                slots[k].written_at = step.where
    return op


def _launch_writes(step: Step, op: Op, k: int) -> bool:
    return any(ref == ("a", k) and step.record.ids[pos] in step.record.writes
               for pos, ref in enumerate(op.refs))


def _at(where: str) -> str:
    """A message's prefix naming the user's line (``file:line: ``), if known."""
    return f"{where}: " if where else ""


def _op_of(step: Step, tape: TraceTape, slots: list[Slot], slot_of: Any, name: str) -> Op:
    record = step.record
    if step.kind == "launch":
        refs = []
        for pos, a in enumerate(step.args):
            ident = record.ids[pos]
            if ident is not None:
                written = ident in record.writes
                k = slot_of(a, written and ident not in record.reads)
                slots[k].written |= written
                refs.append(("a", k))
            elif pos in record.tracked_at:
                refs.append(("s", record.nodes[pos]))
            else:
                refs.append(("c", a))
        return Op("launch", step.launcher, tuple(refs), step.nd, name=record.name)
    if step.kind == "copy":
        src, dst = step.args
        k = slot_of(dst, True)
        slots[k].written = True
        return Op("copy", refs=(("a", slot_of(src, False)), ("a", k)), name="copy")
    reads = [("a", slot_of(x, False)) for x in step.args[:len(record.reads)]]
    if type(record) is CopyRecord:
        dst = slot_of(record.writes[0].owner(), True)
        slots[dst].written = True
        return Op("copy", refs=(reads[0], ("a", dst)), name=record.name)
    if type(record) is ScaleRecord:
        dst = slot_of(record.writes[0].owner(), True)
        slots[dst].written = True
        factor = ("s", record.node) if record.node is not None else ("c", record.factor)
        return Op("scale", refs=(reads[0], factor, ("a", dst)), name="scale")
    if type(record) is ReductionRecord and record.reduce is not None:
        return Op("reduce", record.reduce, tuple(reads), out=record.scalar_out, name=record.name)
    if type(record) is ScalarRecord and record.rule is not None:
        refs = tuple(("s", node) if node is not None else ("c", c)
                     for node, c in zip(record.inputs, record.constants))
        return Op("scalar", record.rule, refs, out=record.scalar_out, name=record.name)
    raise _cannot_replay(step, name)


def _replayable(step: Step) -> bool:
    record, kind = step.record, type(step.record)
    if step.kind in ("launch", "copy") or kind in (CopyRecord, ScaleRecord):
        return True
    if kind is ReductionRecord:
        return record.reduce is not None
    return kind is ScalarRecord and record.rule is not None


def _cannot_replay(step: Step, name: str) -> CaptureError:
    record = step.record
    return CaptureError(
        f"{_at(step.where)}{name} uses {record.name or type(record).__name__}, which a "
        "captured function cannot "
        "replay yet (it replays kernel launches, tg.copy, tg.reshape, tg.scale, tg.sum, "
        "tg.mean, tg.dot, tg.norm and arithmetic on their results); call it outside the "
        "captured function, or do not capture this one")


def _guard_op(guard: Any, tape: TraceTape, name: str) -> Op:
    refs = tuple(("s", a.node_on(tape)) if isinstance(a, TrackedScalar)
                 and a.node_on(tape) is not None else ("c", float.__float__(a)
                                                       if isinstance(a, float) else a)
                 for a in guard.args)
    what = getattr(guard.fn, "__name__", "a comparison")
    return Op("guard", guard.fn, refs, answer=guard.answer,
              name=f"{what} of a tape scalar (answered {guard.answer!r})")


def _writes_input(op: Op, slots: list[Slot]) -> bool:
    refs = op.refs if op.kind == "launch" else op.refs[-1:]
    return any(kind == "a" and slots[k].kind == INPUT and slots[k].written
               for kind, k in refs)


def _rebind(tape: TraceTape, slots: list[Slot], slot_of: Any) -> list[tuple]:
    """Where the records hold a call's arrays and scalars: (container, key, reference),
    ``key`` a position in a list or an attribute's name.  A temporary found there is
    ``kept``."""
    rebind: list[tuple] = []

    def array_at(container: list, pos: int) -> None:
        x = container[pos]
        if isinstance(x, Released) or x is None:
            return                     # contents no adjoint reads: any array will do
        k = slot_of(x, True)
        if slots[k].kind != CONST:     # (a const is the same array in every call)
            slots[k].kept = True
            rebind.append((container, pos, ("a", k)))

    for record in tape.records:
        if isinstance(record, LaunchRecord):
            for pos, ident in enumerate(record.ids):
                if ident is not None:
                    array_at(record.values, pos)
            for pos in record.tracked_at:
                rebind.append((record.values, pos, ("s", record.nodes[pos])))
        elif type(record) is ReductionRecord:
            for pos in range(len(record.views)):
                array_at(record.views, pos)
            rebind.append((record, "value", ("s", record.scalar_out)))
        elif type(record) is ScaleRecord and record.node is not None:
            array_at(record.views, 0)
            rebind.append((record, "factor", ("s", record.node)))
        elif type(record) is ScalarRecord:
            rebind.append((record, "partials", ("p", record.scalar_out)))
    return rebind


def _check_origins(fn: Any, args: tuple, slots: list[Slot], name: str) -> None:
    """Refuse what a replay would get wrong: a temporary (an array written before it was
    read, neither given nor returned) that is in fact a buffer from outside, reached through
    ``fn``'s closure, its globals or its object (a replay writes the program's memory, not
    that buffer); and a view of an argument or a temporary that ``fn`` made anew (a replay
    would use the first call's view)."""
    outside = outside_arrays(fn)
    made = {id(owner(a)): f"argument {k}" for k, a in enumerate(args) if is_array(a)}
    for slot in slots:
        if slot.kind in (TEMP, OUTPUT) and slot.proto is not None:
            made.setdefault(id(owner(slot.proto)), "an array it made")
    for slot in slots:
        x = slot.proto
        if slot.kind == INPUT or x is None:
            continue
        base = owner(x)
        if slot.kind == TEMP and (id(x) in outside or id(base) in outside):
            raise CaptureError(
                f"{_at(slot.written_at)}{name} writes an array of shape {tuple(x.shape)} that "
                "it was not given and did not make (a buffer from outside, reached through a closure, a global or "
                "self): a replay would not write that buffer. Pass it as an argument, or make "
                "it inside the function (np.empty_like)")
        if slot.kind == CONST and id(x) not in outside and id(base) not in outside \
                and id(base) not in made:
            fix = ("Make it outside the captured function (a closure's or a global's "
                   "constant), pass it as an argument, or make it with a kernel")
            if slot.written:      # (an atomic's target, A[i] += x: what is there is read)
                fix = ("A kernel updates it in place (an atomic, +=), which reads what is there, "
                       "np.zeros's zeros too. Pass it as an argument, or make it with a kernel "
                       "(one that stores zeros, say, before the one that adds into it)")
            raise CaptureError(
                f"{_at(slot.used_at)}{name} reads an array of shape {tuple(x.shape)} that no "
                "recorded operation wrote and that it was not given: made by host code inside the function "
                "(NumPy, say), which a replay does not run: every replay would read the first "
                f"call's contents. {fix}")
        if base is not x and id(base) in made and (slot.kind == CONST or
                                                   made[id(base)] != "an array it made"):
            raise CaptureError(
                f"{_at(slot.used_at)}{name} passes a view of {made[id(base)]} (shape {tuple(x.shape)} of "
                f"{tuple(base.shape)}) to a recorded operation; a captured function does not "
                "replay views of its arguments or of arrays it made yet: pass whole arrays "
                "and let the kernel's indices pick the part")


def _scratch(slots: list[Slot], ops: list[Op]) -> list[Any]:
    """The program's memory for its temporaries: one array per kept one, and for the others
    arrays shared between those whose lives (first to last operation using them) do not
    overlap."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, op in enumerate(ops):
        for kind, k in op.refs:
            if kind == "a":
                first.setdefault(k, n)
                last[k] = n
    scratch: list[Any] = [None] * len(slots)
    free: dict[tuple, list[Any]] = {}
    ending: dict[int, list[int]] = {}
    for k, slot in enumerate(slots):
        if slot.kind == CONST:
            scratch[k] = slot.proto
        elif slot.kind == TEMP and (slot.kept or k not in first):
            scratch[k] = new_array(slot)
    order = sorted((first[k], k) for k, s in enumerate(slots)
                   if s.kind == TEMP and not s.kept and k in first)
    for n, k in order:
        for done in sorted(m for m in ending if m < n):
            for j in ending.pop(done):
                free.setdefault(slots[j].layout, []).append(scratch[j])
        pool = free.get(slots[k].layout)
        scratch[k] = pool.pop() if pool else new_array(slots[k])
        ending.setdefault(last[k], []).append(k)
    return scratch


def _layout(x: Any) -> tuple:
    """What a new array like ``x`` needs: type, shape, dtype, order (C or Fortran)."""
    order = "F" if x.flags.f_contiguous and not x.flags.c_contiguous else "C"
    return (type(x), tuple(x.shape), x.dtype, order)


def new_array(slot: Slot) -> Any:
    """A new array for ``slot``, laid out as the first call's was."""
    kind, shape, dtype, order = slot.layout
    if kind is np.ndarray:
        return np.empty(shape, dtype, order)
    return empty_like(slot.proto)
