"""Which processes hold a tape scalar as one value: the seed of a target under the factor-of-P
convention (docs/mpi.md), and the check, where a target is seeded, that they do hold it.

A scalar made by an ``allreduce`` over a communicator is held by its processes (the record's
``copies`` > 1, ``comm``); one computed from such scalars and numbers alone, by the processes
that hold all of them: those of one communicator when their groups are equal or one contains
the others (nested), this process alone when they have no other process in common (the rows
and columns of a process grid); one computed from this process's arrays, by this process
alone.  Held by a communicator of P processes, a target is seeded 1/P on each of them.
A number that differs per process and enters after the allreduce (``rank * total``) is not
on the tape: the seed checks that the processes counted as holding the target do hold one
value, and otherwise says what to write instead (``seed_copies``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.mpi.buffers import mpi
from tapegrad.tape import sweep


def holder(records: list, node: int) -> Any:
    """The communicator whose processes hold scalar ``node`` as one value, None where this
    process alone holds it."""
    made_by = {r.scalar_out: r for r in records if r.scalar_out is not None}
    held: dict[int, Any] = {}
    stack = [node]
    while stack:                 # (iterative: a loss summed over 10,000 steps is deep)
        n = stack[-1]
        record = made_by.get(n)
        if record is not None and record.copies > 1:
            held[stack.pop()] = record.comm
        elif record is None or record.reads or not record.scalars_in:
            held[stack.pop()] = None        # a source, or a reduction of this process's arrays
        else:
            waiting = [m for m in record.scalars_in if m not in held]
            if waiting:
                stack.extend(waiting)
                continue
            common = held[record.scalars_in[0]]
            for m in record.scalars_in[1:]:
                common = _common(common, held[m])
            held[stack.pop()] = common
    return held[node]


def _common(a: Any, b: Any) -> Any:
    """The communicator of the processes that hold both a value held by ``a`` and one held
    by ``b`` (None: this process alone)."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    MPI = mpi()
    if MPI.Comm.Compare(a, b) in (MPI.IDENT, MPI.CONGRUENT, MPI.SIMILAR):
        return a
    groups = (a.Get_group(), b.Get_group())
    both = MPI.Group.Intersection(*groups)
    try:
        if both.Get_size() <= 1:
            return None
        for comm, group in zip((a, b), groups):
            if MPI.Group.Compare(both, group) in (MPI.IDENT, MPI.SIMILAR):
                return comm
        shared = both.Get_size()
    finally:
        for group in (*groups, both):
            group.Free()
    raise TapegradError(
        f"a target combines allreduce results over two communicators ({a.Get_size()} and "
        f"{b.Get_size()} processes) that have {shared} processes in common but neither "
        "contains the other: tapegrad cannot tell which processes hold it as one value "
        "(docs/mpi.md, 'The convention'). Reduce over one communicator that contains the "
        "others (or over the common processes' communicator, comm.Split) first")


def held_over(records: list) -> list:
    """The communicators (of more than one process) over which the records' scalars are
    held, each once, in the order of their first record: the same on every process of each
    of them, as the program made the same allreduces on each."""
    found: list = []
    for r in records:
        if r.scalar_out is not None and r.copies > 1 and not any(r.comm == c for c in found):
            found.append(r.comm)
    return found


def communicators(records: list) -> list:
    """The communicators the records' operations (and their adjoints) talk over, each once,
    in the order of their first record (``Record.comms`` of those that communicate)."""
    found: list = []
    for r in records:
        if r.communicates:
            for c in getattr(r, "comms", ()):
                if not any(c == f for f in found):
                    found.append(c)
    return found


def seed_copies(records: list, node: int, value: float | None = None) -> int:
    """How many processes hold target ``node`` (of ``value``, where known) as one value: its
    seed is 1 over that.  Collective over every communicator in ``held_over(records)``, on
    every process alike whatever its target: one ``Allreduce`` each checks that the
    processes counted as holding the target all seed it so and hold one value; a mismatch is
    the same TapegradError on each of them (raised after all the checks, so that no process
    waits in one)."""
    held = holder(records, node)
    errors = [e for e in (_check(comm, held, value) for comm in held_over(records)) if e]
    if errors:
        raise errors[0]
    return 1 if held is None else held.Get_size()


def _check(comm: Any, held: Any, value: float | None) -> TapegradError | None:
    MPI = mpi()
    claim = held is not None and held == comm
    known = claim and value is not None and math.isfinite(value)
    mine = np.array([value if known else math.inf, -value if known else math.inf,
                     -float(claim), float(claim)])
    out = np.empty(4)
    comm.Allreduce(mine, out, op=MPI.MIN)
    low, high, some, every = out[0], -out[1], -out[2] > 0, out[3] > 0
    n = comm.Get_size()
    if some and not every:
        return TapegradError(
            f"the targets differ in kind across the {n} processes of a communicator: on some "
            "it is computed from allreduce results (over it) and numbers alone, one value "
            f"they all hold, seeded 1/{n} on each; on others it is per process (computed "
            "from that process's arrays too). The objective (docs/mpi.md, 'The "
            "convention') would count it once and once per process at the same time. Write "
            "the same target on every process: the per-process part inside the allreduce "
            "(tgm.allreduce(a + tg.sum(b))), or a per-process target on each")
    if every and math.isfinite(low) and math.isfinite(high) \
            and high - low > 1e-12 * max(abs(low), abs(high)):
        return TapegradError(
            f"the target is computed from allreduce results over {n} processes and numbers "
            "alone, so it is taken as one value they all hold and counted once (docs/mpi.md, "
            f"'The convention'), but its value differs between them (from {float(low)!r} "
            f"to {float(high)!r}): a number that differs per process (the rank, a local weight or "
            "count) enters it after the allreduce. Put that number inside the allreduce "
            "(tgm.allreduce(c * tg.sum(u)) for the sum over processes of c_p u_p), sum it "
            "with one (tgm.allreduce(c) * total for (sum of c_p) * total), or, for the sum "
            "over processes of the targets, make it a tape scalar (c = tape.watch(c))")
    return None


sweep.SEED_COPIES = seed_copies       # (the tape's sweep seeds targets by this rule)
