"""One reverse sweep over a finished tape: the records' adjoints run in reverse order,
accumulating into shadows (Enzyme's semantics: an overwrite consumes the shadow of what it
overwrote), with what the sweep worked out once (which arrays and scalars are active, which
records can reach the outputs, where each shadow is first and last needed).

``tape.gradient``, ``tape.vjp`` and ``tg.autodiff`` each make one ``Sweep``; a record's
``backward(sweep)`` reads and updates it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tapegrad.errors import TapegradError
from tapegrad.runtime.nans import NANS, adjoint_of_launch
from tapegrad.tape import chains
from tapegrad.tape.arrays import allocate, is_array, repeats, spares
from tapegrad.tape.bars import ScalarBars
from tapegrad.tape.identity import Ident
from tapegrad.tape.scalars import TrackedScalar
from tapegrad.tape.stamps import changed_after_use, check_output


# How many processes hold a target, by the records that made it: set by tapegrad.mpi (its
# holders.py) when it is imported, as only its records hold copies (tape.holds_copies); the
# tape layer does not import the MPI layer above it.
def _one_copy(records: list, node: int, value: float | None) -> int:
    return 1


SEED_COPIES: Callable[[list, int, float | None], int] = _one_copy


def _is_array(x: Any) -> bool:
    return type(x) is Ident or is_array(x)


def first_uses(records: list) -> dict[Any, int]:
    """Identity -> the position of the first record touching it."""
    first_use: dict[Any, int] = {}
    for k, record in enumerate(records):
        for ident in record.reads:
            first_use.setdefault(ident, k)
        for ident in record.writes:
            first_use.setdefault(ident, k)
    return first_use


class Frozen:
    """What sweeps over a tape that no longer changes (a captured function's trace tape,
    swept once per call) work out once: where each array is first used, what is active for
    given sources and useful for given targets, and the chain runs ``chains.extend``
    verified (per sweep kind: its active and useful sets and the shadows it was given).

    A sweep over the same records with the same kind takes the same path (its bookkeeping
    depends on nothing else but the values of the scalars, which ``extend`` checks again,
    and of a reduction's gradient, whose adjoint a zero skips), so a run verified once is
    known to hold until a sweep leaves that path (``Sweep.runs`` None)."""

    def __init__(self, records: list):
        self.first_use = first_uses(records)
        self.activity: dict[tuple, tuple] = {}
        self.usefulness: dict[tuple, tuple] = {}
        self.runs: dict[tuple, dict] = {}

    @staticmethod
    def remembered(memo: dict, key: tuple, work: Any) -> tuple[frozenset, frozenset]:
        found = memo.get(key)
        if found is None:
            ids, nodes = work()
            found = memo[key] = (frozenset(ids), frozenset(nodes))
        return found

    def runs_of(self, sweep: Sweep, useful: tuple) -> dict:
        """Position -> (replay, length) of the runs verified by sweeps of ``sweep``'s kind."""
        key = (sweep.active_ids, sweep.active_nodes, *useful, frozenset(sweep.given))
        return self.runs.setdefault(key, {})


class Sweep:
    """The state of one reverse sweep over ``tape``'s records.

    ``shadows`` maps array identities to the shadows to accumulate into (others are made when
    needed; those in ``unwritten`` are new and hold no values yet: the sweep writes or zeroes
    them; those in ``scratch`` are the caller's temporaries, whose values afterwards do not
    matter).  ``sources``: what is differentiated with respect to (arrays, tracked scalars).
    """

    def __init__(self, tape: Any, shadows: dict[Any, Any], sources: list[Any],
                 unwritten: set[Any] = frozenset(), scratch: set[Any] = frozenset(),
                 frozen: Frozen | None = None):
        self.tape = tape
        self.ids = tape.ids
        self.records = tape.records
        self.frozen = frozen
        self.first_use = frozen.first_use if frozen else first_uses(self.records)
        self.check_sources_seen(sources)
        self.requested = shadows           # the caller's: kept to the end of the sweep
        self.shadows = dict(shadows)
        self.given = set(shadows) - set(scratch)   # the caller's shadows it will read
        # tape-made shadows are distinct arrays: only the caller's can be one array twice
        self.aliased_given = repeats(list(shadows.values()))
        self.fresh = set(unwritten)      # shadows holding no values yet (not even zeros)
        self.stand_ins: dict[tuple, Any] = {}   # for freed arrays whose contents nobody reads
        self.free: dict[tuple, list[Any]] = {}   # finished shadows, by type, shape and dtype
        self.scalar_bar = ScalarBars()     # (some still summed on a device: bars.py)
        self.position: int | None = None        # the record whose adjoint runs
        self.last_replay: tuple | None = None   # the replay it ran (LaunchRecord.backward)
        self.runs: dict | None = None    # the frozen tape's chain runs for this sweep (run)
        self.trace: Any = None    # told the array operations the adjoints run (Record.traceable)
        # arrays changed after their last recorded read that the record whose adjoint runs
        # keeps, where its replay decides whether it reads them (LaunchRecord.backward)
        self.stale_here: list | None = None
        self.activity_from(sources)

    def key(self, x: Any) -> Any:
        # (an identity stands for its array: a captured function's sweep has no arrays of
        # its own between calls: tapegrad/capturing)
        return x if type(x) is Ident else self.tape.key(x)

    def tracks(self, x: Any) -> bool:
        return self.tape.tracks(x)

    def run(self, outputs: list[Any], sources: list[Any], connected: bool = False) -> None:
        """Run the adjoints of the records that can reach ``outputs`` (seeded by the caller)
        and read something active, in reverse order.  ``connected``: refuse outputs that no
        recorded operation connects to any source (every gradient would be zero)."""
        useful_ids, useful_nodes = self.useful_from(outputs)
        if self.frozen is not None:
            self.runs = self.frozen.runs_of(self, (useful_ids, useful_nodes))
        if connected and sources and useful_ids.isdisjoint(self.active_ids) \
                and useful_nodes.isdisjoint(self.active_nodes):
            raise self.disconnected(useful_ids, sources)
        provenance = getattr(self.tape, "provenance", None)
        if provenance is not None and provenance.made:
            provenance.check(self.records, (useful_ids, useful_nodes),
                             (self.active_ids, self.active_nodes))
        records, first_use, requested = self.records, self.first_use, self.requested
        active_ids, active_nodes = self.active_ids, self.active_nodes
        current, free = self.shadows, self.free
        stale = self.tape.stale
        k = len(records) - 1
        while k >= 0:
            record = records[k]
            self.position = k
            if record.communicates or (
                    not useful_ids.isdisjoint(record.writes) or
                    (record.scalar_out is not None and record.scalar_out in useful_nodes)) and (
                    not active_ids.isdisjoint(record.reads)
                    or not active_nodes.isdisjoint(record.scalars_in)
                    or not active_ids.isdisjoint(record.writes)):
                if stale and id(record) in stale:
                    self.stale_here = []        # (those its replay decides on: records.py)
                    for pos, x in stale[id(record)]:
                        reads = record.reads_contents(pos, self)
                        if reads:
                            raise changed_after_use(x, record.name)
                        if reads is None:
                            self.stale_here.append((pos, x))
                if self.trace is not None and not record.traceable:
                    self.trace.fail(f"the adjoint of {record.name or type(record).__name__}")
                if NANS.on:
                    self.checked_backward(record)
                else:
                    record.backward(self)
            # no earlier record touches what this one made: its shadow is done, reuse the memory
            for ident in record.writes:
                if first_use[ident] == k and ident not in requested and ident in current:
                    free.setdefault(ident.meta, []).append(current.pop(ident))
            head, self.last_replay = self.last_replay, None
            if head is not None and self.trace is None:   # the records below may replay
                # it along a chain (a traced sweep goes record by record: the trace's
                # compiled form runs a chain as a loop of its own)
                k -= chains.extend(self, records, k, head)
            k -= 1
        self.position = None
        self.runs = None
        for ident in self.fresh:         # given shadows no adjoint reached: zero gradients
            self.shadows[ident].fill(0)
            if self.trace is not None:
                self.trace.array_op("zero", self.shadows[ident])
        self.fresh = set()
        self.stand_ins = {}
        spares.keep(self.free)           # (only the sweep's own shadows are in it)
        self.free = {}

    def checked_backward(self, record: Any) -> None:
        """``record.backward`` under ``tg.debug_nans``: its adjoint launches' checks name the
        line of the launch they belong to (runtime/nans.py)."""
        where = getattr(record, "where", None)
        token = adjoint_of_launch.set(where or "a line recorded before tg.debug_nans began")
        try:
            record.backward(self)
        finally:
            adjoint_of_launch.reset(token)

    def disconnected(self, useful_ids: set[Any], sources: list[Any]) -> TapegradError:
        """The error for a target that no recorded operation connects to any source: every
        gradient would be zero, which is nearly always a value computed by host code the
        tape cannot see (NumPy arithmetic or copies of recorded arrays)."""
        written = {ident for record in self.records for ident in record.writes}
        made = [ident for record in self.records if record.scalar_out is not None
                for ident in record.reads if ident in useful_ids and ident not in written]
        hint = ""
        if made:
            hint = (f" The target was computed from an array of shape {made[0].meta[1]} that "
                    "no recorded operation wrote: if NumPy made it from recorded arrays (B * "
                    "2.0, B.copy(), np.exp(B), B.reshape(...)), the tape cannot see that. Use "
                    "tg.scale(B, 2.0), tg.copy(B), tg.reshape(B, shape), or compute it in a "
                    "kernel.")
            provenance = getattr(self.tape, "provenance", None)
            seen = next((m for m in provenance.made if m.ident in useful_ids), None) \
                if provenance is not None else None
            if seen is not None:
                hint += (f" (Made during the recording, that array was first read at "
                         f"{seen.where}.)")
        return TapegradError(
            f"the target does not depend on any of the {len(sources)} value(s) you "
            "differentiate with respect to through operations the tape recorded, so every "
            f"gradient would be zero.{hint} See 'What the tape sees' in docs/tape.md")

    def seed(self, target: Any) -> None:
        node = target.node_on(self.tape) if isinstance(target, TrackedScalar) else None
        if node is not None:
            self.scalar_bar[node] = self.scalar_bar.get(node, 0.0) + 1.0 / self.copies_of(
                node, float.__float__(target))
        elif is_array(target) and self.tracks(target) and target.size == 1:
            check_output(self.tape, target, self.key(target))
            self.shadow(self.key(target))[...] += 1
        else:
            raise not_a_scalar(target)

    def activity_from(self, sources: list[Any]) -> None:
        """Forward pass: what depends on the sources (everything else is constant).  Arrays
        are tracked by identity, not by version: one overwritten from a source later is
        active for the earlier records that read it too, and those give it a shadow, so
        their outputs must be active as well: passes to a fixed point (an array read while
        constant, then overwritten from the source, made the earlier reader's adjoint take
        an active input into a constant output, which adjoint generation refuses)."""
        active = self.active_ids = {self.key(s) for s in sources if _is_array(s)}
        nodes = self.active_nodes = {s.node_on(self.tape) for s in sources
                                     if isinstance(s, TrackedScalar)} - {None}
        if self.frozen is not None:
            self.active_ids, self.active_nodes = self.frozen.remembered(
                self.frozen.activity, (frozenset(active), frozenset(nodes)),
                lambda: self.spread_activity(active, nodes))
            return
        self.spread_activity(active, nodes)

    def spread_activity(self, active: set[Any], nodes: set[int]) -> tuple[set, set]:
        """``activity_from``'s passes: ``active`` and ``nodes`` grown to what depends on
        them (returned too)."""
        first_use = self.first_use
        again = True
        while again:            # (one pass, unless an earlier record touched what became active)
            again = False
            for k, record in enumerate(self.records):
                if record.communicates or not active.isdisjoint(record.reads) \
                        or not nodes.isdisjoint(record.scalars_in):
                    for ident in record.writes:
                        if ident not in active:
                            active.add(ident)
                            again = again or first_use[ident] < k
                    if record.scalar_out is not None:
                        nodes.add(record.scalar_out)   # (read only by later records)
        return active, nodes

    def useful_from(self, targets: list[Any]) -> tuple[set[int], set[int]]:
        """Backward pass: what can reach the targets (the rest is skipped)."""
        ids = {self.key(t) for t in targets if _is_array(t)}
        nodes = {t.node_on(self.tape) for t in targets if isinstance(t, TrackedScalar)} - {None}
        if self.frozen is not None:
            return self.frozen.remembered(self.frozen.usefulness,
                                          (frozenset(ids), frozenset(nodes)),
                                          lambda: self.spread_usefulness(ids, nodes))
        return self.spread_usefulness(ids, nodes)

    def spread_usefulness(self, ids: set[Any], nodes: set[int]) -> tuple[set, set]:
        """``useful_from``'s pass: ``ids`` and ``nodes`` grown to what can reach them."""
        for record in reversed(self.records):
            if record.communicates or not ids.isdisjoint(record.writes) or (
                    record.scalar_out is not None and record.scalar_out in nodes):
                ids.update(record.reads)
                ids.update(record.writes)
                nodes.update(record.scalars_in)
        return ids, nodes

    def shadow(self, ident: int, unwritten_ok: bool = False) -> Any:
        """The shadow of array ``ident``, zeros until an adjoint adds into it.  With
        ``unwritten_ok`` it may come without its zeros (``ident`` is then in ``self.fresh``,
        and the caller must write every element or zero it, then call ``written``)."""
        sh = self.shadows.get(ident)
        if sh is None:
            meta = self.ids.meta(ident)      # (type, shape, dtype): the array may be gone
            pool = self.free.get(meta)
            # a finished shadow, of this sweep or an earlier one: reusing it beats fresh pages
            sh = pool.pop() if pool else spares.take(meta)
            if sh is not None:
                self.fresh.add(ident)
            else:
                sh = allocate(meta, zeroed=not unwritten_ok)
                if unwritten_ok:
                    self.fresh.add(ident)
                elif self.trace is not None:
                    self.trace.array_op("zero", sh)
            self.shadows[ident] = sh
        if ident in self.fresh and not unwritten_ok:
            sh.fill(0)
            self.fresh.discard(ident)
            if self.trace is not None:
                self.trace.array_op("zero", sh)
        return sh

    def written(self, ident: Any) -> None:
        self.fresh.discard(ident)

    def discardable(self, ident: Any) -> bool:
        """Whether nothing reads the shadow of ``ident`` after the current record's adjoint:
        no earlier record touched the array and the caller did not give that shadow."""
        return (self.position is not None and ident not in self.given
                and self.first_use.get(ident) == self.position)

    def copies_of(self, node: int, value: float | None = None) -> int:
        """How many processes hold scalar ``node`` as one value: those of a communicator
        where it was computed from allreduce results over it and numbers alone, else 1
        (``tapegrad/mpi/holders.py``).  Such a target is seeded 1/P on each of its P
        processes, so that the objective, the sum over processes of their targets, counts
        it once (tapegrad.mpi.allreduce's convention).  Collective on a tape that holds
        such scalars: it checks that the processes counted as holding the target (of
        ``value``, where given) do."""
        if not self.tape.holds_copies:
            return 1
        return SEED_COPIES(self.records, node, value)

    def add_scalar_bar(self, node: int, value: float) -> None:
        self.scalar_bar[node] = self.scalar_bar.get(node, 0.0) + value

    def check_sources_seen(self, sources: list[Any]) -> None:
        """A source no recorded operation read would get a zero gradient; that is nearly
        always a copy made with NumPy, which tapes cannot see, so say so."""
        seen = self.first_use
        for s in sources:
            if type(s) is not Ident and is_array(s) and self.key(s) not in seen:
                # (a source the tape tracks but no record touched is not a view of itself)
                tracked = None if self.tracks(s) else self.ids.overlapping(s)
                if tracked is not None:
                    raise TapegradError(
                        f"the array of shape {s.shape} you differentiate with respect to is a "
                        f"view of (or shares memory with) an array of shape {tracked.meta[1]} "
                        "that the recorded code used; gradients are per array as the kernels "
                        "were given it: differentiate with respect to that array and slice its "
                        "gradient (g = tape.gradient(loss, x); g[1:])")
                raise TapegradError(
                    f"the array of shape {s.shape} you differentiate with respect to was not "
                    "used by any recorded kernel launch or tapegrad operation, so its gradient "
                    "would be zero. If the code copies it with NumPy (x.copy(), np.array(x), "
                    "x * 1), the copy is invisible to the tape: use tg.copy(x), or launch "
                    "kernels on x itself")


def not_a_scalar(value: Any) -> TapegradError:
    """The error for a function whose result cannot be differentiated: a number no recorded
    operation made, or something that is not a scalar."""
    if isinstance(value, (float, int)) or type(value).__module__ == "numpy" \
            and not is_array(value):
        return TapegradError(
            f"the function returned the number {value!r}, but not from an operation tapegrad "
            "recorded, so nothing connects it to the inputs; compute it with tg.sum, tg.dot, "
            "tg.mean or tg.norm (and + - * / ** on their results)")
    what = (f"an array of shape {value.shape}" if is_array(value) else
            f"a {type(value).__name__}")
    return TapegradError(
        f"an Active return must be a scalar, but the function returned {what}. Ways out: "
        "return a scalar from a differentiable host reduction (tg.sum(B), tg.dot(B, w), "
        "tg.mean, tg.norm); or use tg.Const as the return activity and seed the output's "
        "shadow yourself (dB[:] = w gives the vector-Jacobian product); or take the whole "
        "Jacobian with tg.jacobian(f, x); or record with tg.Tape and call "
        "tape.gradient(target, sources)")
