"""Recording a kernel launch on a tape, by a function written for the launch's recording plan.

Recording is the hot path of a recorded simulation: once per launch, the tape tracks each
array argument's identity, copies what a launch is about to overwrite while an adjoint still
needs it, holds weakly what no adjoint reads, launches, and appends a ``LaunchRecord``.  Which
argument is an array, and whether the kernel reads it, writes it and needs its contents in
its adjoint, depends only on the kernel and the argument types: the recording plan
(``Tape.plan_record``).  ``recorder(plan)`` writes that work out for the plan, argument by
argument, as the source of a small Python function (no loops over positions, no tests of
flags known in advance) and compiles it once per plan, so that each launch pays only for
the work its plan needs (measured: docs/performance.md, 'Measurements behind the code').
``RecordPlan.source`` shows what runs.
"""

from __future__ import annotations

import linecache
import weakref
from dataclasses import dataclass, field
from typing import Any

from tapegrad.tape.arrays import allocate, repeats
from tapegrad.tape.identity import Ident
from tapegrad.tape.records import LaunchRecord, launch_merged


@dataclass
class RecordPlan:
    """What recording a launch needs that depends only on the kernel and the argument types:
    the parameters whose contents its adjoint may read, per array argument (position,
    read?, written?, contents needed?), the parameters, where sweeps keep the adjoint
    launches they work out (``launch.Replay``, per pattern), the positions of the float
    arrays (the ones that can have shadows) and of the tracked scalars, and the function
    that records a launch (``recorder``)."""

    needs: frozenset[str]
    arrays: tuple[tuple[int, bool, bool, bool], ...]
    params: list[str]
    name: str
    replays: dict = field(default_factory=dict)
    float_at: tuple[int, ...] = ()
    tracked: tuple[int, ...] = ()
    n_args: int = 0
    source: str = ""
    record: Any = None


def recorder(plan: RecordPlan) -> RecordPlan:
    """``plan`` with its recording function: ``record(tape, cfg, args, plain, launcher, nd,
    ndrange)`` (``plain``: the arguments with tracked scalars as floats; ``launcher`` None
    records without launching)."""
    arrays = plan.arrays
    roles = []
    for pos, reads, writes, needed in arrays:
        did = "read and written" if reads and writes else "read" if reads else "written"
        kept = "contents kept for the adjoint" if needed else "held weakly"
        roles.append(f"a{pos} = {plan.params[pos]} ({did}; {kept})")
    tracked = ", ".join(plan.params[k] for k in plan.tracked) or "none"
    lines = [f"# Records a launch of {plan.name} on a tape: generated once per kernel and "
             "argument types",
             "# (tapegrad/tape/recorder.py). " + "; ".join(roles) + ".",
             f"# Tracked scalars: {tracked}. NAME, PARAMS, NEEDS, REPLAYS, FLOAT_AT and "
             "TRACKED are the plan's.",
             "def record(tape, cfg, args, plain, launcher, nd, ndrange):",
             "    track, readers = tape.ids.track, tape.readers",
             "    stamps, sample = tape.stamps, tape.sample"]
    emit = lines.append
    for pos, *_ in arrays:
        emit(f"    a{pos} = args[{pos}]")
        emit(f"    i{pos} = track(a{pos})")
    names = [f"i{pos}" for pos, *_ in arrays]
    if len(names) > 1:
        # (an identity is one object per tracked memory: comparing them skips hashing)
        pairs = [f"{a} is {b}" for k, a in enumerate(names) for b in names[k + 1:]]
        test = " or ".join(pairs) if len(pairs) <= 6 else f"_repeats([{', '.join(names)}])"
        emit(f"    if {test}:")
        emit("        # two views of one memory: launch with one object for both, which")
        emit("        # merges their parameters (runtime.launch.one_parameter_per_array); that launch")
        emit("        # is recorded on every tape (an enclosing tape's copy records nothing here)")
        emit("        if launcher is not None:")
        emit(f"            _launch_merged(cfg, args, {_ids_tuple(plan)}, ndrange)")
        emit("        return")
    checked = [(pos, reads, writes) for pos, reads, writes, _ in arrays if pos in plan.float_at]
    for pos, reads, _ in checked:
        if reads:     # what a launch wrote is as it left it (not changed by host code since)
            emit(f"    s{pos} = stamps.get(i{pos})")
            emit(f"    if s{pos} is not None and s{pos} != sample(a{pos}):")
            emit(f"        tape.changed_by_host(a{pos}, s{pos}, NAME)")
    emit("    seen = list(plain)")
    releasable = any(not needed for *_, needed in arrays)
    if releasable:
        emit("    released = []")
    for pos, reads, writes, needed in arrays:
        a, i = f"a{pos}", f"i{pos}"
        if writes and reads and needed:     # its contents now feed this launch's adjoint
            emit(f"    seen[{pos}] = tape.will_overwrite({a}, True, {i})")
        elif writes:                        # ... or an earlier record's
            emit(f"    if readers.get({i}):")
            emit(f"        seen[{pos}] = tape.will_overwrite({a}, False, {i})")
        if not needed:                      # contents no adjoint reads: do not keep them
            emit(f"    if seen[{pos}] is {a}:")
            emit(f"        held = _release({a}, {i})")
            emit(f"        if held is not {a}:")
            emit(f"            seen[{pos}] = held")
            emit(f"            released.append({pos})")
    emit("    if launcher is not None and 0 not in nd:   # (None: an enclosing tape's copy)")
    emit("        launcher(plain, nd)")
    for pos, _, writes in checked:
        if writes:
            emit(f"        stamps[i{pos}] = sample(a{pos})")
    for k in plan.tracked:
        emit(f"    n{k} = args[{k}].node_on(tape)")
    nodes = [f"n{k}" if k in plan.tracked else "None" for k in range(plan.n_args)]
    reads = [f"i{pos}" for pos, r, _, _ in arrays if r]
    writes = [f"i{pos}" for pos, _, w, _ in arrays if w]
    emit(f"    record = LaunchRecord({_tuple(reads)}, {_tuple(writes)}, "
         f"{_tuple([f'n{k}' for k in plan.tracked])}, NAME, cfg, PARAMS, seen, "
         f"{_ids_tuple(plan)}, nd, {_tuple(nodes)}, NEEDS, REPLAYS, FLOAT_AT, TRACKED, "
         f"{'tuple(released)' if releasable else '()'})")
    emit("    tape.records.append(record)")
    for pos, reads, writes, needed in arrays:
        if reads and needed and not writes:   # its contents feed the adjoint: a later launch
            emit(f"    readers.setdefault(i{pos}, []).append((record, {pos}, a{pos}))")
            # that overwrites it copies them first (an overwritten one was copied above)
    plan.source = "\n".join(lines) + "\n"
    scope = dict(LaunchRecord=LaunchRecord, NAME=plan.name, PARAMS=plan.params,
                 NEEDS=plan.needs, REPLAYS=plan.replays, FLOAT_AT=plan.float_at,
                 TRACKED=plan.tracked, _repeats=repeats,
                 _launch_merged=launch_merged, _release=release)
    filename = f"<tapegrad recorder of {plan.name}>"
    # (tracebacks through it show its lines)
    linecache.cache[filename] = (len(plan.source), None, plan.source.splitlines(True), filename)
    exec(compile(plan.source, filename, "exec"), scope)
    plan.record = scope["record"]
    return plan


def release(x: Any, ident: Ident) -> Any:
    """What a record holds of argument ``x`` whose contents no adjoint reads: ``x`` held
    weakly (one holder per identity, shared by the records that see it), or ``x`` itself
    where it cannot be."""
    known = ident.released
    if known is None or known.ref() is not x:
        known = Released.of(x, ident)
        if type(known) is Released:
            ident.released = known
    return known


class Released:
    """A launch argument whose contents no adjoint reads, held weakly: the adjoint gets the
    array itself while user code keeps it alive, else a stand-in of the same type and shape
    (whose contents it does not read)."""

    __slots__ = ("ref", "meta")

    def __init__(self, ref: Any, meta: tuple):
        self.ref = ref
        self.meta = meta

    @staticmethod
    def of(x: Any, ident: Any) -> Any:
        """``x`` held weakly, or ``x`` itself; ``ident``: its identity on the tape, whose weak
        reference and metadata serve when ``x`` owns its memory (a new array, each step of
        a simulation)."""
        try:
            flags = x.flags
            contiguous = flags.c_contiguous and getattr(flags, "writeable", True)
            if ident.weak and ident.owner() is x and ident.meta[0] is type(x):
                released = Released(ident.owner, ident.meta)
            else:
                released = Released(weakref.ref(x), (type(x), tuple(x.shape), x.dtype))
        except (AttributeError, TypeError):   # other flags, or no weak references
            return x
        # a stand-in of another layout would need another compiled kernel: keep the array
        return released if contiguous else x

    def get(self, stand_ins: dict) -> Any:
        x = self.ref()
        if x is None:
            x = stand_ins.get(self.meta)
            if x is None:
                x = stand_ins[self.meta] = allocate(self.meta, zeroed=False)
        return x


def _ids_tuple(plan: RecordPlan) -> str:
    arrays = {pos for pos, *_ in plan.arrays}
    return _tuple([f"i{k}" if k in arrays else "None" for k in range(plan.n_args)])


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
