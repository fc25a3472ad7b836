"""What a tape records: one ``Record`` per operation, whose ``backward`` runs its adjoint in
the reverse sweep; ``LaunchRecord`` for a kernel launch (its hot path: the replayed adjoint)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tapegrad.runtime.adjoint import adjoint_of, run_adjoint
from tapegrad.runtime.launch import launch
from tapegrad.runtime.replay import replay_for, run_replay
from tapegrad.tape.arrays import repeats
from tapegrad.tape.released import Released
from tapegrad.tape.stamps import changed_after_use


@dataclass
class Record:
    """One recorded operation: what it read, what it wrote, and how to run its adjoint."""

    reads: list[tuple]                    # identities of arrays read
    writes: list[tuple]                   # identities of arrays written
    scalars_in: list[int] = field(default_factory=list)    # tracked-scalar nodes read
    scalar_out: int | None = None                          # tracked-scalar node produced
    name: str = ""

    # An operation that talks to other processes (tapegrad.mpi): its adjoint runs in every
    # sweep, on every process alike, whatever this process's arrays need (skipping it here
    # would leave another process waiting); what it writes may depend on other processes'
    # sources, so it counts as active.  ``copies``: how many processes hold its scalar result
    # as one value (an allreduce), else 1.
    communicates: ClassVar[bool] = False
    copies: ClassVar[int] = 1
    # Whether its adjoint tells a sweep's ``trace`` the array operations it runs (a captured
    # program's reverse sweep, written down once and then run compiled: capturing/reverse.py)
    traceable: ClassVar[bool] = False

    def backward(self, sweep: Any) -> None:
        raise NotImplementedError

    def reads_contents(self, pos: int, sweep: Any) -> bool:
        """Whether this sweep's run of its adjoint may read the contents of the array it
        keeps at ``pos`` (``stamps.changed_after_last_use``: one changed since)."""
        return True


class LaunchRecord(Record):
    """One recorded kernel launch: its configured kernel, the arguments as the adjoint will
    see them, and what the recording plan worked out for its kernel and argument types.  (A
    plain class with slots, built positionally: one per launch of a simulation, where the
    dataclass keyword constructor was a tenth of the recording's own time.)"""

    __slots__ = ("cfg", "params", "values", "ids", "nd", "nodes", "needs", "replays",
                 "float_at", "tracked_at", "released_at", "where")
    __eq__ = object.__eq__               # one launch is one record (not Record's fields)
    __hash__ = object.__hash__
    traceable = True

    def __init__(self, reads: tuple, writes: tuple, scalars_in: tuple, name: str, cfg: Any,
                 params: list[str], values: list[Any], ids: tuple, nd: tuple[int, ...],
                 nodes: tuple, needs: frozenset[str], replays: dict,
                 float_at: tuple[int, ...], tracked_at: tuple[int, ...],
                 released_at: tuple[int, ...]):
        self.reads, self.writes, self.scalars_in = reads, writes, scalars_in
        self.scalar_out, self.name = None, name
        self.cfg = cfg
        self.params = params
        self.values = values             # the arguments (copies of overwritten ones)
        self.ids = ids                   # identities of the array arguments (else None)
        self.nd = nd
        self.nodes = nodes               # tracked-scalar nodes of the scalar arguments
        self.needs = needs               # parameters whose contents the adjoint may read
        self.replays = replays           # runtime.replay.Replay per pattern (shared)
        self.float_at = float_at         # positions of float arrays (the plan's)
        self.tracked_at = tracked_at     # positions of tracked scalars
        self.released_at = released_at   # positions of values that may be held as Released

    def redirect(self, pos: int, copy: Any) -> None:
        self.values[pos] = copy

    def reads_contents(self, pos: int, sweep: Any) -> bool | None:
        # (what its adjoint reads depends on the sweep's activities: the replay knows)
        return None if self.params[pos] in self.needs else False

    def backward(self, sweep: Any) -> None:
        # (the reverse sweep's hot path: once per recorded launch; the sweep's sets and dicts
        # looked up directly rather than through Tape's methods)
        values = self.values
        for pos in self.released_at:
            held = values[pos]
            if type(held) is Released:
                if values is self.values:
                    values = list(values)
                x = held.ref()
                values[pos] = x if x is not None else held.get(sweep.stand_ins)
        pattern = [_CONST] * len(self.params)    # per parameter: activity, shadow's state
        shadows = {}
        active, fresh, current = sweep.active_ids, sweep.fresh, sweep.shadows
        first_use, given, here = sweep.first_use, sweep.given, sweep.position
        for pos in self.float_at:
            ident = self.ids[pos]
            if ident not in active:
                continue
            sh = current.get(ident)
            if sh is None:
                pool = sweep.free.get(ident.meta)
                if pool:               # a finished shadow of this sweep (Tape.shadow's case)
                    sh = current[ident] = pool.pop()
                    fresh.add(ident)
                else:
                    sh = sweep.shadow(ident, unwritten_ok=True)
            code = _DUP
            if ident in fresh:
                code |= _FRESH | (_COVERED if tuple(sh.shape) == self.nd else 0)
                fresh.discard(ident)       # the adjoint launch writes or zeroes it
            if here is not None and here == first_use.get(ident) and ident not in given:
                code |= _DISCARD           # no earlier record reads this shadow
            shadows[self.params[pos]] = sh
            pattern[pos] = code
        for pos in self.tracked_at:
            if self.nodes[pos] in sweep.active_nodes:
                pattern[pos] = _ACTIVE
        key = (tuple(pattern), self.nd)
        replay = self.replays.get(key, _UNKNOWN)
        if replay is _UNKNOWN:
            if len(self.replays) >= _REPLAYS_KEPT:      # (launches over many ndranges)
                self.replays.clear()
            replay = self.replays[key] = replay_for(self.cfg, tuple(values), *self.split(
                pattern), kept=self.needs)
        if sweep.stale_here is not None:        # (stamps.changed_after_last_use)
            stale, sweep.stale_here = sweep.stale_here, None
            for pos, x in stale:
                if self.params[pos] in replay.adjoint.contents_read:
                    raise changed_after_use(x, self.name)
        distinct = not sweep.aliased_given or len(shadows) < 2 \
            or not repeats(list(shadows.values()))
        if sweep.trace is not None:
            if distinct:
                sweep.trace.launch(self, replay, values, shadows)
            else:
                sweep.trace.fail(f"the adjoint of {self.name} runs with shadows aliased")
        if distinct and not replay.general:
            if replay.scalars:     # (added into on the device; read when needed: bars.py)
                bars, backend = sweep.scalar_bar, self.cfg.backend
                sums = [bars.accumulator(self.nodes[self.params.index(p)], backend, p)
                        for p in replay.scalars]
                run_replay(self.cfg, replay, values, shadows, self.nd, sums)
            else:
                run_replay(self.cfg, replay, values, shadows, self.nd)
            sweep.last_replay = (self, replay, values, shadows, pattern)
            return
        activity, nd, discard, fresh_set, _ = self.split(pattern)
        scalars = run_adjoint(self.cfg, tuple(values), shadows, activity, nd, discard,
                              fresh_set, kept=self.needs)
        if scalars:
            self.add_scalar_bars(sweep, scalars)
        if sweep.trace is not None and replay.general and replay.adjoint is not adjoint_of(
                self.cfg, tuple(values), activity, nd, discard)[0].adjoint:
            # (its stack grew since the replay was made, compiled anew and deeper: what a
            # trace wrote down would be the old one; the next sweep makes it again)
            del self.replays[key]
            sweep.trace.fail(f"the adjoint of {self.name} needed a deeper stack", again=True)

    def add_scalar_bars(self, sweep: Any, scalars: Mapping[str, float]) -> None:
        """The gradients an adjoint launch gave its Active scalars (by parameter name)."""
        for p, node in zip(self.params, self.nodes):
            if p in scalars:
                sweep.add_scalar_bar(node, scalars[p])

    def split(self, pattern: list[int]) -> tuple:
        """``pattern`` as ``replay_for`` takes it: (activity, nd, discard, fresh, covered);
        ``run_adjoint`` takes the first four."""
        activity = tuple("dup" if c & _DUP else "active" if c == _ACTIVE else "const"
                         for c in pattern)
        def having(flag: int) -> frozenset[str]:
            return frozenset(p for p, c in zip(self.params, pattern) if c & flag)
        return activity, self.nd, having(_DISCARD), having(_FRESH), having(_COVERED)


# a parameter's part in a replayed adjoint (LaunchRecord.backward)
_CONST, _ACTIVE, _DUP, _FRESH, _DISCARD, _COVERED = 0, 1, 2, 4, 8, 16


_UNKNOWN = object()


_REPLAYS_KEPT = 64


def launch_merged(cfg: Any, args: tuple, ids: tuple, ndrange: Any) -> None:
    """A launch passing two views of one memory (``ids``: the arguments' identities, None
    for scalars): launched with one object for both, which merges their parameters
    (``runtime.launch.one_parameter_per_array``)."""
    first: dict[Any, Any] = {}
    same = tuple(a if ids[pos] is None else first.setdefault(ids[pos], a)
                 for pos, a in enumerate(args))
    launch(cfg, same, ndrange)
