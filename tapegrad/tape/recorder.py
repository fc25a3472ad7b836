"""Recording a kernel launch on a tape, by a function written for the launch's recording plan.

Recording is the hot path of a recorded simulation: once per launch, the tape tracks each
array argument's identity, copies what a launch is about to overwrite while an adjoint still
needs it, holds weakly what no adjoint reads, launches, and appends a ``LaunchRecord``.  Which
argument is an array, and whether the kernel reads it, writes it and needs its contents in
its adjoint, depends only on the kernel and the argument types: the recording plan
(``Tape.plan_record``).  ``recorder(plan)`` writes that work out for the plan, argument by
argument, as the source of a small Python function (no loops over positions, no tests of
flags known in advance) and compiles it once per plan, so that each launch pays only for
the work its plan needs (measured: CHANGELOG.md, 'the figures that moved').
``RecordPlan.source`` shows what runs.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field
from typing import Any

from tapegrad.tape.arrays import repeats
from tapegrad.tape.records import LaunchRecord, launch_merged
from tapegrad.tape.released import release


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
    host_at: tuple[int, ...] = ()
    source: str = ""
    record: Any = None
    record_stamped: Any = None


def recorder(plan: RecordPlan) -> RecordPlan:
    """``plan`` with its recording functions: ``record(tape, cfg, args, plain, launcher, nd,
    ndrange)`` (``plain``: the arguments with tracked scalars as floats; ``launcher`` None
    records without launching), which stamps the host arrays it reads and writes only (the
    tape's ``sample`` of other arrays is None: reading device memory would synchronise), and
    ``record_stamped``, which stamps every such array (a tape that ``verify``s fingerprints
    arrays where they live).  Such arrays: the float arrays, and the others whose contents
    an adjoint reads (an index array changed between two launches changes what the first
    one's adjoint gathers)."""
    every = tuple(pos for pos, _, _, needed in plan.arrays if needed or pos in plan.float_at)
    host = tuple(k for k in every if k in plan.host_at)
    plan.source = _source(plan, host)
    plan.record = _compiled(plan, plan.source, f"<tapegrad recorder of {plan.name}>")
    plan.record_stamped = plan.record if host == every else _compiled(
        plan, _source(plan, every), f"<tapegrad verifying recorder of {plan.name}>")
    return plan


def _compiled(plan: RecordPlan, source: str, filename: str) -> Any:
    scope = dict(LaunchRecord=LaunchRecord, NAME=plan.name, PARAMS=plan.params,
                 NEEDS=plan.needs, REPLAYS=plan.replays, FLOAT_AT=plan.float_at,
                 TRACKED=plan.tracked, _repeats=repeats,
                 _launch_merged=launch_merged, _release=release)
    # (tracebacks through it show its lines)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)
    return scope["record"]


def _source(plan: RecordPlan, stamped: tuple[int, ...]) -> str:
    """The recording function's source; ``stamped``: the positions of the arrays whose
    contents it stamps (what a launch wrote, what it reads first) and checks (unchanged
    since the last recorded use when a launch reads them)."""
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
             "    track, readers = tape.ids.track, tape.readers"]
    emit = lines.append
    if stamped:
        emit("    stamps, sample = tape.stamps, tape.sample")
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
    checked = [(pos, reads, writes) for pos, reads, writes, _ in arrays if pos in stamped]
    for pos, reads, _ in checked:
        if reads:     # as the last recorded operation that used it left it: else stamped now
            emit(f"    s{pos} = stamps.get(i{pos})")
            emit(f"    if s{pos} is None:")
            emit(f"        stamps[i{pos}] = sample(a{pos})")
            emit(f"    elif s{pos} != sample(a{pos}):")
            emit(f"        tape.changed_by_host(a{pos}, s{pos}, NAME)")
    emit("    seen = list(plain)")
    for pos, reads, writes, needed in arrays:
        a, i = f"a{pos}", f"i{pos}"
        if writes and reads and needed:     # its contents now feed this launch's adjoint
            emit(f"    seen[{pos}] = tape.will_overwrite({a}, True, {i})")
        elif writes:                        # ... or an earlier record's
            emit(f"    if readers.get({i}):")
            emit(f"        seen[{pos}] = tape.will_overwrite({a}, False, {i})")
        if not needed and writes:           # contents no adjoint reads: do not keep them
            emit(f"    if seen[{pos}] is {a}:")
            emit(f"        seen[{pos}] = _release({a}, {i})")
        elif not needed:
            emit(f"    seen[{pos}] = _release({a}, {i})")
    written = [pos for pos, _, writes in checked if writes]
    emit("    if launcher is not None and 0 not in nd:   # (None: an enclosing tape's copy)")
    emit("        launcher(plain, nd)")
    for pos in written:
        emit(f"        stamps[i{pos}] = sample(a{pos})")
    if written:     # (stamped once the innermost tape has run it: _record_on_each)
        emit("    elif launcher is None:")
        emit(f"        tape.unstamped.extend(({_tuple([f'(i{pos}, a{pos})' for pos in written])}))")
    for k in plan.tracked:
        emit(f"    n{k} = args[{k}].node_on(tape)")
    nodes = [f"n{k}" if k in plan.tracked else "None" for k in range(plan.n_args)]
    reads = [f"i{pos}" for pos, r, _, _ in arrays if r]
    writes = [f"i{pos}" for pos, _, w, _ in arrays if w]
    emit(f"    record = LaunchRecord({_tuple(reads)}, {_tuple(writes)}, "
         f"{_tuple([f'n{k}' for k in plan.tracked])}, NAME, cfg, PARAMS, seen, "
         f"{_ids_tuple(plan)}, nd, {_tuple(nodes)}, NEEDS, REPLAYS, FLOAT_AT, TRACKED, "
         f"{_tuple([str(pos) for pos, *_, needed in arrays if not needed])})")
    emit("    tape.records.append(record)")
    for pos, reads, writes, needed in arrays:
        if reads and needed and not writes:   # its contents feed the adjoint: a later launch
            emit(f"    readers.setdefault(i{pos}, []).append((record, {pos}, a{pos}))")
            # that overwrites it copies them first (an overwritten one was copied above)
    return "\n".join(lines) + "\n"


def _ids_tuple(plan: RecordPlan) -> str:
    arrays = {pos for pos, *_ in plan.arrays}
    return _tuple([f"i{k}" if k in arrays else "None" for k in range(plan.n_args)])


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"
