"""``tg.Tape``: record kernel launches and host operations, then run their adjoints backwards.

Recording keeps, for every launch, the arguments as the launch saw them.  Arrays are tracked
by identity; when a recorded launch is about to overwrite an array whose current contents an
earlier record (or the launch itself) reads, the tape first copies it and points those
records at the copy (copy on overwrite), so every adjoint later sees exactly what its primal
saw.  One shadow per array identity is enough: the reverse sweep runs in reverse order and an
overwrite consumes the shadow of what it overwrote (Enzyme's semantics).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.adjoint import values_read
from tapegrad.runtime.arguments import access, groupsize_of
from tapegrad.runtime.launch import interceptor, prepare
from tapegrad.tape import chains
from tapegrad.tape.arrays import allocate, empty_like, is_array, only_tape_holds, repeats, spares
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.identity import Identities, array_key
from tapegrad.tape.modes import current_forward, tapes_var
from tapegrad.tape.recorder import RecordPlan, recorder
from tapegrad.tape.records import LaunchRecord, Record
from tapegrad.tape.scalars import TrackedScalar


def _record_on_each(tapes: tuple[Tape, ...]) -> Any:
    """The launch interceptor of nested tapes: every enclosing tape records the launch without
    running it, then the innermost records and runs it."""
    *outer, inner = tapes

    def record(cfg: Any, args: tuple, ndrange: Any) -> None:
        for tape in outer:
            tape.record_launch(cfg, args, ndrange, run=False)
        inner.record_launch(cfg, args, ndrange)
    return record


class Tape:
    """Record what runs inside ``with tg.Tape() as tape:``, then ask for gradients.

    >>> import math, numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def sin_kernel(B, A):
    ...     i = tg.index()
    ...     B[i] = math.sin(A[i])
    >>> A = np.linspace(0, 1, 5); B = np.zeros(5)
    >>> with tg.Tape() as tape:
    ...     sin_kernel(tg.CPU())(B, A, ndrange=5)
    ...     loss = tg.sum(B)
    >>> (gA,) = tape.gradient(loss, [A])
    >>> bool(np.allclose(gA, np.cos(A)))
    True
    """

    def __init__(self, watch_changes: bool = True, verify: bool | None = None):
        """``watch_changes=False`` skips fingerprinting the recorded arrays at the end of the
        recording (for internal tapes whose gradient follows at once).  ``verify=True`` (or
        ``TAPEGRAD_VERIFY=1`` in the environment) checks every element of each array a
        recorded launch wrote when the next recorded operation reads it, instead of two
        samples: host code that changed it in between is caught wherever it wrote."""
        self.watch_changes = watch_changes
        self.verify = verify_by_default() if verify is None else verify
        # identity -> what a recorded launch left in that array (``sample``): compared when
        # a recorded operation reads it, so host code changing it in between is refused
        self.stamps: dict[Any, Any] = {}
        self.sample = fingerprint if self.verify else sample
        self.records: list[Record] = []
        self.ids = Identities()
        # identity -> (record, position, array): records that need the array's current
        # contents (redirected to a copy when a launch is about to overwrite them)
        self.readers: dict[tuple, list[tuple[Record, int, Any]]] = {}
        # tracked scalars are numbered, not kept: each one refers to its tape, and a list of
        # them here would make every tape a reference cycle, freed only by the garbage
        # collector (its records and kept arrays with it, after several collections)
        self.node_count = 0
        self.fingerprints: dict[int, int] = {}
        self.recording = False
        self.used = False
        # filled by a reverse sweep
        self.shadows: dict[int, Any] = {}
        self.stand_ins: dict[tuple, Any] = {}
        self.free: dict[tuple, list[Any]] = {}   # finished shadows, by shape and dtype
        self.scalar_bar: dict[int, float] = {}
        self.active_ids: set[int] = set()
        self.active_nodes: set[int] = set()
        self.given: set[Any] = set()
        self.aliased_given = False
        self.first_use: dict[Any, int] = {}
        self.position: int | None = None    # the record whose adjoint runs
        self.last_replay: tuple | None = None   # the replay it ran (LaunchRecord.backward)

    # -- recording ------------------------------------------------------------------------
    def __enter__(self) -> Tape:
        if self.recording:
            raise TapegradError("this tape is already recording")
        if current_forward() is not None:
            # its launches would not carry tangents, and leaving it turned forward mode off
            raise TapegradError(
                "a tg.Tape cannot record inside forward mode (tg.jvp, tg.autodiff(tg.Forward, "
                "...), tg.jacobian(..., mode=tg.Forward)): the launches it records would carry "
                "no tangents; differentiate the function in one mode")
        self.recording = True
        tapes = tapes_var.get() + (self,)
        self.tokens = (tapes_var.set(tapes), interceptor.set(
            self.record_launch if len(tapes) == 1 else _record_on_each(tapes)))
        return self

    def __exit__(self, *exc: Any) -> None:
        tapes_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])
        self.recording = False
        # remember what every live input looked like, to catch changes before gradient();
        # arrays only the tape still holds (a simulation's intermediate states) cannot change
        if self.watch_changes:
            watched = {ident: refs[-1][2] for ident, refs in self.readers.items() if refs}
            held = self.references_held({id(x) for x in watched.values()})
            for ident in list(watched):
                x = watched.pop(ident)      # the caller's variable is the only extra reference
                if not only_tape_holds(x, held[id(x)]):
                    self.fingerprints[ident] = fingerprint(x)

    def references_held(self, candidates: set[int]) -> dict[int, int]:
        """How many references the tape's own structures hold to each of the arrays whose
        ``id`` is in ``candidates`` (a lower bound: references held elsewhere, e.g. in a
        derivative rule's closure, are not counted, which can only make an array look
        reachable from outside)."""
        held = dict.fromkeys(candidates, 0)
        for x in self.ids.strong_references():
            if id(x) in held:
                held[id(x)] += 1
        for refs in self.readers.values():
            for *_, x in refs:
                if id(x) in held:
                    held[id(x)] += 1
        for record in self.records:
            fields = (record.values,) if isinstance(record, LaunchRecord) else vars(record).values()
            for value in fields:
                for v in value if isinstance(value, (list, tuple)) else (value,):
                    if id(v) in held:
                        held[id(v)] += 1
        return held

    def track(self, x: Any) -> tuple:
        """The identity of array ``x`` on this tape (registered the first time)."""
        return self.ids.track(x)

    def key(self, x: Any) -> tuple:
        """The identity of ``x`` if the tape tracks it, else its memory (which no record
        refers to)."""
        return self.ids.ident_of(x) or array_key(x)

    def tracks(self, x: Any) -> bool:
        return self.ids.ident_of(x) is not None

    def will_overwrite(self, x: Any, also_read_now: bool, ident: tuple | None = None) -> Any:
        """Before ``x`` is overwritten: if someone still needs its contents, copy them and
        point those readers at the copy.  Returns the copy, or ``x`` when none was needed."""
        ident = ident or self.track(x)
        refs = self.readers.get(ident, [])
        if not refs and not also_read_now:
            return x
        old = x.copy()
        for record, pos, _ in refs:
            record.redirect(pos, old)
        self.readers[ident] = []
        return old

    def read_live(self, x: Any, record: Record, pos: int) -> None:
        self.readers.setdefault(self.track(x), []).append((record, pos, x))

    def new_node(self, value: float) -> TrackedScalar:
        node = TrackedScalar(value, self, self.node_count)
        self.node_count += 1
        return node

    def watch(self, x: Any) -> Any:
        """Make the number ``x`` a source of this tape: returns a tape scalar to use in its
        place (pass it to kernels, compute with it) and to differentiate with respect to.
        Arrays need no watching: the tape follows every array the recorded code uses.

        >>> import numpy as np, tapegrad as tg
        >>> with tg.Tape() as tape:
        ...     c = tape.watch(0.5)
        ...     loss = c * tg.dot(np.ones(3), np.ones(3))
        >>> tape.gradient(loss, [c])
        [3.0]
        """
        if not self.recording:
            raise TapegradError("tape.watch(x) works inside the `with tg.Tape() as tape:` block, "
                                "before x is used")
        if is_array(x):
            return x
        if isinstance(x, bool) or not isinstance(x, (float, int, np.floating, np.integer)):
            raise TapegradError(f"tape.watch(x) takes a number (or an array), got "
                                f"{type(x).__name__}")
        return self.new_node(float(x))

    def next_node(self) -> int:
        self.node_count += 1
        return self.node_count - 1

    def record_launch(self, cfg: Any, args: tuple, ndrange: Any, run: bool = True) -> None:
        """Called for every kernel launch while this tape records (the hot path of a
        recorded simulation: one pass over the array arguments, with what depends only on
        the kernel and the argument types worked out once); ``run=False`` records without
        launching (an enclosing tape's copy of a nested tape's launch)."""
        kernel = cfg.kernel
        tracked: tuple[int, ...] = ()
        plain = args
        if TrackedScalar in map(type, args):
            plain = tuple(float.__float__(a) if type(a) is TrackedScalar else a for a in args)
            tracked = tuple(k for k, a in enumerate(args) if type(a) is TrackedScalar
                            and a.node_on(self) is not None)
        launcher, nd, key = prepare(cfg, plain, ndrange)   # bad launches fail before copies
        # (under the launcher, which is one per key and hashes by identity: the key is a
        # nested tuple that would be hashed a second time)
        plan = kernel.cache.get(("record plan", launcher, tracked))
        if plan is None:
            plan = kernel.cache[("record plan", launcher, tracked)] = self.plan_record(
                cfg, args, plain, nd, key, tracked)
        plan.record(self, cfg, args, plain, launcher if run else None, nd, ndrange)

    def plan_record(self, cfg: Any, args: tuple, plain: tuple, nd: tuple[int, ...], key: tuple,
                    tracked: tuple[int, ...]) -> RecordPlan:
        """What recording a launch needs that depends only on the kernel and the argument
        types (``recorder.RecordPlan``), with the function that records such launches;
        ``tracked``: the positions of this tape's scalars (part of the plan's cache key)."""
        kernel = cfg.kernel
        reads, writes = access(kernel)
        params = kernel_ir(kernel).params
        needs = self.values_needed(cfg, args, plain, nd)
        arrays = tuple((pos, p in reads, p in writes, p in needs)
                       for pos, (p, k) in enumerate(zip(params, key[2]))
                       if type(k) is tuple)          # an array's argument key (runtime.arguments.arg_key)
        float_at = tuple(pos for pos, *_ in arrays if np.dtype(plain[pos].dtype).kind == "f")
        return recorder(RecordPlan(needs, arrays, params, kernel.name, {}, float_at, tracked,
                                   len(args)))

    def values_needed(self, cfg: Any, args: tuple, plain: tuple, nd: tuple[int, ...]
                      ) -> frozenset[str]:
        """The parameters whose contents this launch's adjoint may read, whatever the sweep
        differentiates: the adjoint with every float array and every scalar this tape tracks
        active.  Other arrays need no copy when a later launch overwrites them (a linear
        kernel's adjoint reads only shapes)."""
        kernel = cfg.kernel
        activity = tuple(
            "active" if type(a) is TrackedScalar and a.node_on(self) is not None else
            "dup" if isinstance(v, np.ndarray) and v.dtype.kind == "f" or (
                hasattr(v, "__cuda_array_interface__") and np.dtype(v.dtype).kind == "f")
            else "const" for a, v in zip(args, plain))
        everything = frozenset(kernel_ir(kernel).params)
        if "dup" not in activity and "active" not in activity:
            return everything
        try:
            return values_read(kernel, cfg.backend, plain, activity, nd,
                                 groupsize_of(cfg, len(nd)))
        except TapegradError:     # not differentiable here: the sweep will say so, if asked
            return everything

    def record_host(self, record: Record, live_inputs: list[tuple[Any, int]],
                    read: tuple = ()) -> None:
        """Append a host operation's ``record``; ``live_inputs``: (array, position) pairs it
        keeps reading until its adjoint runs, ``read``: other arrays it read now."""
        for x in (*(x for x, _ in live_inputs), *read):
            stamp = self.stamps.get(self.ids.ident_of(x)) if self.stamps else None
            if stamp is not None and stamp != self.sample(x):
                self.changed_by_host(x, stamp, record.name)
        self.records.append(record)
        for x, pos in live_inputs:
            self.read_live(x, record, pos)

    def changed_by_host(self, x: Any, stamp: Any, reader: str) -> None:
        """A recorded operation is about to read ``x``, which a recorded launch wrote, and
        its contents differ from what that launch left (``stamp``): host code changed it."""
        if _same_bits(stamp, self.sample(x)):
            return                # (NaN samples compare unequal to themselves)
        raise TapegradError(
            f"an array of shape {tuple(x.shape)} that a recorded kernel launch wrote was "
            f"changed by code the tape does not record before {reader} read it (NumPy "
            "arithmetic in place, such as B *= 3.0 or B[0] = 1, is invisible to tapes), so the "
            "gradient would not include that change. Do it in a kernel, or with tapegrad's "
            "recorded host operations (B2 = tg.scale(B, 3.0), tg.copy, tg.reshape); to change "
            "a result only for display, change a copy (B.copy())")

    # -- the reverse sweep ----------------------------------------------------------------
    def gradient(self, target: Any, sources: Any) -> Any:
        """The gradient of the scalar ``target`` with respect to each of ``sources`` (a list of
        arrays or tracked scalars), as new arrays / floats; for a single source given without
        a list, its gradient alone.  The tape can be asked again."""
        if not isinstance(sources, (list, tuple)):
            return self.gradient(target, [sources])[0]
        seeds = {}
        grads = {}
        for s in sources:
            if isinstance(s, TrackedScalar):
                continue
            if not is_array(s):
                raise TapegradError(
                    f"tape.gradient sources are arrays, or tape scalars: numbers made sources "
                    f"with s = tape.watch(0.3) inside the block, or results of tg.sum/tg.dot/"
                    f"...; got {type(s).__name__}")
            if np.dtype(s.dtype).kind != "f":
                raise TapegradError(
                    f"tape.gradient is with respect to float arrays, but a source has dtype "
                    f"{np.dtype(s.dtype)} (integers and booleans have no derivative); convert "
                    f"it before recording (x = x.astype(np.float64)) and differentiate that")
            grads[self.key(s)] = empty_like(s)
        if not self.recording:
            self.check_target(target)
        self.backward(target, seeds, grads, sources, unwritten=set(grads))
        out = []
        for s in sources:
            if isinstance(s, TrackedScalar):
                out.append(self.scalar_bar.get(s.node_on(self), 0.0))
            else:
                out.append(grads[self.key(s)])
        return out

    def backward(self, target: Any, seeds: dict, shadows: dict[int, Any], sources: list[Any],
                 seed_target: bool = True, seeded: list[Any] = (),
                 unwritten: set[Any] = frozenset(), scratch: set[Any] = frozenset()) -> None:
        """Run every adjoint in reverse order.  ``shadows`` maps array identities to the
        shadows to accumulate into (others are made when needed; those in ``unwritten`` are
        new and hold no values yet: the sweep writes or zeroes them; those in ``scratch``
        are the caller's temporaries, whose values afterwards do not matter); with
        ``seed_target`` the scalar ``target`` gets adjoint 1, else the caller seeded the
        shadows of ``seeded``."""
        if self.recording:
            raise TapegradError("ask for gradients after the `with tg.Tape()` block ends")
        self.check_unchanged()
        records = self.records
        first_use: dict[Any, int] = {}     # identity -> the first record touching it
        for k, record in enumerate(records):
            for ident in record.reads:
                first_use.setdefault(ident, k)
            for ident in record.writes:
                first_use.setdefault(ident, k)
        self.first_use = first_use
        self.check_sources_seen(sources)
        self.shadows = dict(shadows)
        self.given = set(shadows) - set(scratch)   # the caller's shadows it will read
        # tape-made shadows are distinct arrays: only the caller's can be one array twice
        self.aliased_given = repeats(list(shadows.values()))
        self.fresh = set(unwritten)      # shadows holding no values yet (not even zeros)
        self.stand_ins: dict[tuple, Any] = {}   # for freed arrays whose contents nobody reads
        self.free = {}
        self.scalar_bar = {}
        self.activity_from(sources)
        if seed_target:
            self.seed(target)
        # (with an Active return the given shadows are seeds too, as in Enzyme: a launch that
        # writes an array whose shadow holds values consumes and propagates them, whether or
        # not it reaches the result)
        useful_ids, useful_nodes = self.useful_from(([target] if seed_target else [])
                                                    + list(seeded))
        if seed_target and sources and useful_ids.isdisjoint(self.active_ids) \
                and useful_nodes.isdisjoint(self.active_nodes):
            raise self.disconnected(useful_ids, sources)
        active_ids, active_nodes = self.active_ids, self.active_nodes
        current, free = self.shadows, self.free
        self.last_replay = None
        k = len(records) - 1
        while k >= 0:
            record = records[k]
            self.position = k
            if (not useful_ids.isdisjoint(record.writes) or
                    (record.scalar_out is not None and record.scalar_out in useful_nodes)) and (
                    not active_ids.isdisjoint(record.reads)
                    or not active_nodes.isdisjoint(record.scalars_in)
                    or not active_ids.isdisjoint(record.writes)):
                record.backward(self)
            # no earlier record touches what this one made: its shadow is done, reuse the memory
            for ident in record.writes:
                if first_use[ident] == k and ident not in shadows and ident in current:
                    free.setdefault(ident.meta, []).append(current.pop(ident))
            head, self.last_replay = self.last_replay, None
            if head is not None:         # the records below may replay it along a chain
                k -= chains.extend(self, records, k, head)
            k -= 1
        self.position = None
        for ident in self.fresh:         # given shadows no adjoint reached: zero gradients
            self.shadows[ident].fill(0)
        self.fresh = set()
        self.stand_ins = {}
        spares.keep(self.free)           # (only the tape's own shadows are in it)
        self.free = {}

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
        return TapegradError(
            f"the target does not depend on any of the {len(sources)} value(s) you "
            "differentiate with respect to through operations the tape recorded, so every "
            f"gradient would be zero.{hint} See 'What the tape sees' in docs/tape.md")

    def check_target(self, target: Any) -> None:
        """``tape.gradient``'s target is a scalar this tape recorded; say what else it is."""
        if isinstance(target, TrackedScalar):
            if target.node_on(self) is None:
                raise TapegradError("tape.gradient's target was recorded by another tape: ask "
                                    "that tape for its gradient")
            return
        if is_array(target):
            if self.tracks(target) and target.size == 1:
                return
            if self.tracks(target):
                raise TapegradError(
                    f"tape.gradient's target must be a scalar, got an array of shape "
                    f"{target.shape}; reduce it inside the `with tg.Tape()` block (tg.sum(B), "
                    "tg.dot(B, w)), or take a vector-Jacobian product with tg.vjp")
            whole = self.ids.overlapping(target)
            if whole is not None:
                raise TapegradError(
                    f"tape.gradient's target, an array of shape {target.shape}, is a view of "
                    f"an array of shape {whole.meta[1]} that the recorded code used, and the "
                    "tape follows whole arrays: compute the scalar inside the `with tg.Tape()` "
                    "block from the whole array (loss = tg.dot(y, w), w zero outside the part "
                    "you want)")
            raise TapegradError(
                f"tape.gradient's target, an array of shape {target.shape}, is not an array the "
                "recorded code used; compute it inside the `with tg.Tape()` block")
        raise TapegradError(
            f"tape.gradient's target is a plain {type(target).__name__} ({target!r}), not a "
            "value the tape recorded: arithmetic on tape scalars after the `with tg.Tape()` "
            "block ends (or float(...), np.float64(...) of one) is not recorded. Compute the "
            "target inside the block (loss = tg.sum(B) + 0.5 * tg.dot(B, B)), then call "
            "tape.gradient(loss, x)")

    def seed(self, target: Any) -> None:
        node = target.node_on(self) if isinstance(target, TrackedScalar) else None
        if node is not None:
            self.scalar_bar[node] = self.scalar_bar.get(node, 0.0) + 1.0
        elif is_array(target) and self.tracks(target) and target.size == 1:
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
        active = self.active_ids = {self.key(s) for s in sources if is_array(s)}
        nodes = self.active_nodes = {s.node_on(self) for s in sources
                                     if isinstance(s, TrackedScalar)} - {None}
        first_use = self.first_use
        again = True
        while again:            # (one pass, unless an earlier record touched what became active)
            again = False
            for k, record in enumerate(self.records):
                if not active.isdisjoint(record.reads) or not nodes.isdisjoint(record.scalars_in):
                    for ident in record.writes:
                        if ident not in active:
                            active.add(ident)
                            again = again or first_use[ident] < k
                    if record.scalar_out is not None:
                        nodes.add(record.scalar_out)   # (read only by later records)

    def useful_from(self, targets: list[Any]) -> tuple[set[int], set[int]]:
        """Backward pass: what can reach the targets (the rest is skipped)."""
        ids = {self.key(t) for t in targets if is_array(t)}
        nodes = {t.node_on(self) for t in targets if isinstance(t, TrackedScalar)} - {None}
        for record in reversed(self.records):
            if not ids.isdisjoint(record.writes) or (record.scalar_out is not None
                                                     and record.scalar_out in nodes):
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
            self.shadows[ident] = sh
        if ident in self.fresh and not unwritten_ok:
            sh.fill(0)
            self.fresh.discard(ident)
        return sh

    def written(self, ident: Any) -> None:
        self.fresh.discard(ident)

    def discardable(self, ident: Any) -> bool:
        """Whether nothing reads the shadow of ``ident`` after the current record's adjoint:
        no earlier record touched the array and the caller did not give that shadow."""
        return (self.position is not None and ident not in self.given
                and self.first_use.get(ident) == self.position)

    def add_scalar_bar(self, node: int, value: float) -> None:
        self.scalar_bar[node] = self.scalar_bar.get(node, 0.0) + value

    def check_sources_seen(self, sources: list[Any]) -> None:
        """A source no recorded operation read would get a zero gradient; that is nearly
        always a copy made with NumPy, which tapes cannot see, so say so."""
        seen = self.first_use
        for s in sources:
            if is_array(s) and self.key(s) not in seen:
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

    def check_unchanged(self) -> None:
        for ident, fp in self.fingerprints.items():
            refs = self.readers.get(ident)
            if refs and fingerprint(refs[-1][2]) != fp:
                x = refs[-1][2]
                raise TapegradError(
                    f"an array of shape {x.shape} that the recorded code read was changed after "
                    "recording and before gradient(), so the recorded derivatives no longer "
                    "match its contents; compute the gradient before changing it, or pass a "
                    "copy into the recorded code")


def verify_by_default() -> bool:
    return os.environ.get("TAPEGRAD_VERIFY", "") not in ("", "0")


def sample(x: Any) -> tuple | None:
    """Two elements of a NumPy array (its first and last), a cheap stand-in for its contents
    that host code scaling or refilling the array changes; None for arrays elsewhere (reading
    device memory is a synchronisation): those are checked with ``verify``."""
    if type(x) is np.ndarray and x.size:
        return x.item(0), x.item(-1)
    return None


def _same_bits(a: Any, b: Any) -> bool:
    """Whether two samples are equal bit for bit (NaNs included)."""
    return type(a) is type(b) and (a == b or np.array_equal(np.array(a), np.array(b),
                                                            equal_nan=True))


def not_a_scalar(value: Any) -> TapegradError:
    what = (f"an array of shape {value.shape}" if is_array(value) else
            f"a {type(value).__name__}")
    return TapegradError(
        f"an Active return must be a scalar, but the function returned {what}. Ways out: "
        "return a scalar from a differentiable host reduction (tg.sum(B), tg.dot(B, w), "
        "tg.mean, tg.norm); or use tg.Const as the return activity and seed the output's "
        "shadow yourself (dB[:] = w gives the vector-Jacobian product); or take the whole "
        "Jacobian with tg.jacobian(f, x); or record with tg.Tape and call "
        "tape.gradient(target, sources)")


