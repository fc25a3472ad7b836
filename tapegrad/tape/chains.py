"""Runs of recorded launches that replay one adjoint along a chain of states, in one loop.

A simulation that launches one kernel per step on a new array (``t_new = step(t)``) records a
chain: launch j reads the state launch j - 1 wrote.  The reverse sweep replays the same
adjoint launch once per step, on the same arguments but for two shadow buffers, which the
sweep's bookkeeping passes back and forth: launch j reads the shadow launch j + 1 stored,
stores the shadow of its own input into the buffer launch j + 1 read (freed, and the first
one the pool gives back), and so on; where the step is nonlinear, its adjoint also reads the
state its record kept (``sin`` reads its input).  Per step that bookkeeping costs about twice
the launch itself (measured: CHANGELOG.md, 'the figures that moved').

``extend`` checks, per record below one the sweep has just replayed, the facts that make its
replay that same launch with the two buffers swapped (same kernel plan, ndrange and scalars;
its output is the state the record above read; its input has no shadow yet; the same
shadow flags; other arrays the same and without shadows), then runs the whole run in one
loop (the launcher's ``chain_runner``) and leaves the sweep's state as the record-by-record
sweep would have left it.  A linear step's loop is compiled on the CPU
(``tapegrad/backends/cpu/chain.py``); a nonlinear one's, whose adjoint reads each record's
own state, is a loop of launches that puts that state in its slot
(``backends/launch_chain.py``).  Everything else goes record by record.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Any

from tapegrad.runtime.nans import NANS
from tapegrad.tape.records import _ACTIVE, _DUP, _FRESH

_VALUES = operator.attrgetter("values")
MIN_RUN = 2      # shorter runs go record by record (the compiled call costs a launch)
enabled = True   # False: every record goes by itself (``python -m tapegrad bench`` compares)


@dataclass(frozen=True)
class ChainPlan:
    """How a run of records replays one ``Replay``: the positions of the written state and of
    the state read in the record's arguments, the slots of their shadows in the launcher's
    arguments, and the loop that runs it (the launcher's ``chain_runner``, given the slots
    of the states where the adjoint reads them)."""

    out_pos: int
    in_pos: int
    read: frozenset[int]         # positions of the arguments whose contents the adjoint reads
    out_slot: int
    in_slot: int
    shaped_by: int | None        # the argument whose shape is the launch's ndrange (a gather)
    runner: Any
    # positions of the states whose contents the adjoint reads: each record's own, per launch
    states: tuple[int, ...] = ()


def extend(sweep: Any, records: list, k: int, head: tuple) -> int:
    """After record ``k`` ran its adjoint as ``head`` = (record, replay, values, shadows,
    pattern): run the records below it that continue its chain, in one compiled loop, and
    return how many ran (0: the sweep goes on record by record)."""
    if not enabled or NANS.on or sweep.tape.stale:
        return 0        # (tg.debug_nans checks launch by launch; so does a stale array's)
    record, replay, values, shadows, pattern = head
    plan = replay.chain
    if plan is None:
        plan = replay.chain = _plan(record, replay, pattern) or False
    if plan is False or k == 0:
        return 0
    o, i = plan.out_pos, plan.in_pos
    first_use, given, current = sweep.first_use, sweep.given, sweep.shadows
    out_k, in_k = record.ids[o], record.ids[i]
    if first_use.get(out_k) != k or out_k in given:   # its shadow is not freed after it
        return 0
    meta = out_k.meta          # every state of the chain: one type, shape and dtype
    if in_k.meta != meta:
        return 0
    discard_in = first_use.get(in_k) == k and in_k not in given
    pool = sweep.free.get(out_k.meta)
    x, y = current.get(in_k), shadows[record.params[o]]
    if x is None or not pool or pool[-1] is not y:
        return 0
    if x is not shadows[record.params[i]]:
        return 0
    # the record's other arguments must be the head's: scalars equal, other arrays the same
    # array without a shadow (the same object where the adjoint reads its contents; any
    # array of the head's type will do where it does not: the loop passes the head's).
    # A record with the head's ``replays`` has the head's recording plan, so the same
    # argument types, written positions and tracked scalars' positions (those must not be
    # active: the loop adds into no scalar's gradient, see _run_length)
    ids = record.ids
    scalar_at = tuple(pos for pos in range(len(values)) if ids[pos] is None)
    const_at = tuple(pos for pos in range(len(values))
                     if ids[pos] is not None and pos not in (o, i))
    if any(ids[pos] in sweep.active_ids for pos in const_at):
        return 0
    pick_scalars, pick_consts = _picker(scalar_at), _picker(const_at)
    pick_read = _picker(tuple(pos for pos in const_at if pos in plan.read))
    scalars, consts, read = pick_scalars(values), pick_consts(ids), pick_read(values)
    # (-0.0 == 0.0: where the head has a zero, its sign is compared too)
    zeros = [(pos, math.copysign(1.0, values[pos])) for pos in scalar_at if values[pos] == 0]
    runs = sweep.runs
    known = runs.get(k) if runs is not None else None
    if known is not None and known[0] is replay:
        n = known[1]
        # (a sweep of this kind over this frozen tape verified the run's records: only the
        # values of their scalars and read arrays, rebound per call, may differ)
        vals = list(map(_VALUES, records[k - n:k]))
        if scalar_at and list(map(pick_scalars, vals)).count(scalars) != n \
                or read and not all(all(map(operator.is_, pick_read(v), read)) for v in vals) \
                or zeros and not all(math.copysign(1.0, v[pos]) == sign
                                     for v in vals for pos, sign in zeros):
            sweep.runs = known = None     # off the verified path: check everything
    if known is None or known[0] is not replay:
        n = _run_length(sweep, records, k, record, (o, i), discard_in, consts, scalars, read,
                        zeros, (pick_consts, pick_scalars, pick_read))
        if sweep.runs is not None:
            sweep.runs[k] = (replay, n)
    if n < MIN_RUN:
        return 0
    args = (*values, *[shadows[p] for p in replay.order])
    if plan.shaped_by is not None:
        args = args + record.nd
        nd = args[plan.shaped_by].shape
    else:
        nd = record.nd
    rest = [a for s, a in enumerate(args) if s not in (plan.out_slot, plan.in_slot)]
    # record k - 1 reads the shadow record k stored (x) and stores into the one record k
    # read and freed (y); then the other way round
    if plan.states:         # (each record's own states: a nonlinear step's adjoint reads them)
        kept = [records[j].values for j in range(k - 1, k - 1 - n, -1)]
        plan.runner(n, x, y, rest, nd, [[v[pos] for pos in plan.states] for v in kept])
    elif not plan.runner(n, x, y, rest, nd):   # not compiled for these types: record by record
        replay.chain = False
        return 0
    last = records[k - n].ids[i]          # the state the run's last record read
    pool.pop()                            # y, taken by record k - 1
    del current[in_k]                     # (record k - 1's output: freed after it)
    current[last], spare = (y, x) if n % 2 else (x, y)
    pool.append(spare)
    sweep.position = k - n
    return n


def _run_length(sweep: Any, records: list, k: int, record: Any, positions: tuple[int, int],
                discard_in: bool, consts: tuple, scalars: tuple, read: tuple, zeros: list,
                pickers: tuple) -> int:
    """How many records below ``k`` continue the chain of ``record`` (``extend``'s head),
    whose output and input are at ``positions``: the facts ``extend`` lists."""
    o, i = positions
    pick_consts, pick_scalars, pick_read = pickers
    first_use, given, current = sweep.first_use, sweep.given, sweep.shadows
    in_k = record.ids[i]
    meta = in_k.meta
    active, fresh, replays, nd = sweep.active_ids, sweep.fresh, record.replays, record.nd
    tracked, active_nodes = record.tracked_at, sweep.active_nodes
    above_in, n = in_k, 0
    for j in range(k - 1, -1, -1):
        r = records[j]
        if getattr(r, "replays", None) is not replays or r.nd != nd:
            break
        if tracked and not active_nodes.isdisjoint([r.nodes[pos] for pos in tracked]):
            break
        ids = r.ids
        out_j, in_j = ids[o], ids[i]
        if out_j is not above_in or in_j.meta != meta or in_j not in active \
                or in_j in current or in_j in given or in_j in fresh \
                or first_use.get(out_j) != j or out_j in given \
                or (first_use.get(in_j) == j) != discard_in:
            break
        # (the usual step has none of these: each test only where there is something to test)
        if consts and pick_consts(ids) != consts \
                or scalars and pick_scalars(r.values) != scalars \
                or read and not all(map(operator.is_, pick_read(r.values), read)) \
                or zeros and not all(math.copysign(1.0, r.values[pos]) == sign
                                     for pos, sign in zeros):
            break
        above_in, n = in_j, n + 1
    return n


def _picker(positions: tuple[int, ...]) -> Any:
    """A function taking a sequence to the tuple of its items at ``positions``."""
    if len(positions) > 1:
        return operator.itemgetter(*positions)
    if positions:
        (at,) = positions
        return lambda seq: (seq[at],)
    return lambda seq: ()


def _plan(record: Any, replay: Any, pattern: tuple) -> ChainPlan | None:
    """Whether runs of this record's replay can go in one loop: one kernel launch with
    nothing to zero first, two arrays with shadows (one written, one only read), other
    arrays without shadows, no active tracked scalar, no scratch copies or stack, the
    input's shadow new (stored into) and the output's not.  Where the adjoint reads the
    two states' contents (a nonlinear step), the loop puts each record's own in their slots
    (the launcher's ``chain_runner`` with ``states``: a loop of launches); else the
    launcher's ``chain_runner`` (the CPU's compiled)."""
    if len(replay.steps) != 1 or replay.zeroed or replay.general \
            or any(pattern[pos] == _ACTIVE for pos in record.tracked_at):
        return None
    if len(record.writes) != 1:
        return None
    out_pos = next((pos for pos in record.float_at if record.ids[pos] is record.writes[0]), None)
    # the state read: the one other array with a shadow (the rest are constant: no shadow)
    ins = [pos for pos in record.float_at if pattern[pos] & _DUP and pos != out_pos]
    if out_pos is None or len(ins) != 1:
        return None
    in_pos = ins[0]
    params = record.params
    read = frozenset(pos for pos, p in enumerate(params) if p in replay.adjoint.contents_read)
    states = tuple(sorted({out_pos, in_pos} & read))
    if record.ids[in_pos] not in record.reads or record.ids[in_pos] is record.ids[out_pos] \
            or not pattern[in_pos] & _FRESH or pattern[out_pos] & _FRESH \
            or set(states) & set(record.released_at):
        return None
    order = list(replay.order)
    if sorted(order) != sorted((params[out_pos], params[in_pos])):
        return None
    base = len(record.values)
    run, shaped_by = replay.steps[0]
    out_slot, in_slot = base + order.index(params[out_pos]), base + order.index(params[in_pos])
    n_args = base + len(order) + (len(record.nd) if shaped_by is not None else 0)
    chain_runner = getattr(run, "chain_runner", None)       # a backend that offers it
    if chain_runner is None or states and shaped_by is not None:
        return None
    runner = chain_runner(n_args, out_slot, in_slot, states) if states else \
        chain_runner(n_args, out_slot, in_slot)
    if runner is None:
        return None
    return ChainPlan(out_pos, in_pos, read, out_slot, in_slot, shaped_by, runner, states)
