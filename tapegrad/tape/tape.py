"""``tg.Tape``: record kernel launches and host operations, then run their adjoints backwards.

Recording keeps, for every launch, the arguments as the launch saw them.  Arrays are tracked
by identity; when a recorded launch is about to overwrite an array whose current contents an
earlier record (or the launch itself) reads, the tape first copies it and points those
records at the copy (copy on overwrite), so every adjoint later sees exactly what its primal
saw.  One shadow per array identity is enough: the reverse sweep runs in reverse order and an
overwrite consumes the shadow of what it overwrote (Enzyme's semantics).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.callers import user_line
from tapegrad.errors import TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.adjoint import values_read
from tapegrad.runtime.arguments import access, groupsize_of
from tapegrad.runtime.launch import (
    checking_primal,
    distinct,
    interceptor,
    prepare,
)
from tapegrad.runtime.nans import NANS
from tapegrad.runtime.plans import make_plan
from tapegrad.tape import hostmath, threads
from tapegrad.tape.arrays import empty_like, is_array, only_tape_holds
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.identity import Identities, array_key
from tapegrad.tape.memory import MemoryLimit, held_bytes
from tapegrad.tape.modes import current_forward, refuse_while_recording, tapes_var
from tapegrad.tape.provenance import Provenance
from tapegrad.tape.recorder import RecordPlan, recorder
from tapegrad.tape.records import LaunchRecord, Record
from tapegrad.tape.scalars import TrackedScalar, plain
from tapegrad.tape.stamps import (
    HostChanges,
    changed_after_last_use,
    check_output,
    sample,
    verify_by_default,
)
from tapegrad.tape.sweep import Sweep
from tapegrad.tracebacks import api_boundary


def _record_on_each(tapes: tuple[Tape, ...]) -> Any:
    """The launch interceptor of nested tapes: every enclosing tape records the launch without
    running it, then the innermost records and runs it."""
    *outer, inner = tapes

    def record(cfg: Any, args: tuple, ndrange: Any) -> None:
        for tape in outer:
            tape.unstamped.clear()
            tape.record_launch(cfg, args, ndrange, run=False)
        inner.record_launch(cfg, args, ndrange)
        for tape in outer:      # what the launch wrote, as it left it (recorder.py's stamps)
            for ident, x in tape.unstamped:
                tape.stamps[ident] = tape.sample(x)
            tape.unstamped.clear()
    return record


class Tape(HostChanges):
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

    foreign_scalars = False     # whether a launch was given another tape's scalar
    holds_copies = False        # whether a record's result is held by several processes

    def __init__(self, watch_changes: bool = True, verify: bool | None = None,
                 max_memory: int | None = None):
        """``watch_changes=False`` skips fingerprinting the recorded arrays at the end of the
        recording (for internal tapes whose gradient follows at once).  ``verify=True`` (or
        ``TAPEGRAD_VERIFY=1`` in the environment) checks every element of each array a
        recorded launch wrote when the next recorded operation reads it, instead of two
        samples: host code that changed it in between is caught wherever it wrote.
        ``max_memory``: bytes the tape may hold (``memory()``); recording past them is an
        error naming ``tg.checkpoint_loop``."""
        self.limit = MemoryLimit(max_memory) if max_memory is not None else None
        self.watch_changes = watch_changes
        self.verify = verify_by_default() if verify is None else verify
        # identity -> what a recorded launch left in that array (``sample``): compared when
        # a recorded operation reads it, so host code changing it in between is refused
        self.stamps: dict[Any, Any] = {}
        self.unstamped: list[tuple[Any, Any]] = []    # an enclosing tape's, until the launch ran
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
        self.fingerprints: dict[int, Any] = {}
        self.stale: dict[int, list] = {}      # (stamps.changed_after_last_use)
        self.recording = False
        self.used = False
        # (verify mode: arrays host code made from recorded values: tape/provenance.py)
        self.provenance = Provenance() if self.verify else None

    # -- recording ------------------------------------------------------------------------
    def __enter__(self) -> Tape:
        if self.recording:
            raise TapegradError("this tape is already recording")
        if current_forward() is not None:
            # its launches would not carry tangents, and leaving it turned forward mode off
            raise TapegradError(
                "a tg.Tape cannot record inside forward mode (tg.jvp, tg.autodiff(tg.Forward, "
                "...), tg.jacobian(..., mode=tg.Forward), tg.hvp): the launches it records "
                "would carry no tangents; differentiate the function in one mode")
        self.recording = True
        if self.provenance is not None:
            self.provenance.start()
        tapes = tapes_var.get() + (self,)
        self.tokens = (tapes_var.set(tapes), interceptor.set(
            self.record_launch if len(tapes) == 1 else _record_on_each(tapes)))
        self.math_wrappers = hostmath.install()     # (math.sqrt(s) recorded: tape/hostmath.py)
        threads.started(self)         # (other threads' launches: tape/threads.py)
        return self

    def __exit__(self, *exc: Any) -> None:
        hostmath.restore(self.math_wrappers)     # (first: a reset below can raise)
        threads.stopped(self)
        tapes_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])
        self.recording = False
        if self.provenance is not None:
            self.provenance.stop()
        if exc[0] is None:
            self.stale = changed_after_last_use(self)
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

    @api_boundary
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
        for launch_plan in cfg.kernel.cache.get(("plans", cfg), ()):     # (runtime/plans.py)
            # (a plan's guards refuse an object passed twice; one written for plain numbers
            # is never given a tape's scalar)
            found = launch_plan.prepared(args, ndrange) if launch_plan.plain_scalars else None
            if found is not None:
                launcher, nd, key = found
                plain = args
                plan = launch_plan.recording
                if plan is None:
                    plan = launch_plan.recording = self.record_plan(cfg, args, args, nd, key,
                                                                    launcher, ())
                break
        else:
            cfg, args, plain, launcher, nd, plan = self.prepare_record(cfg, args, ndrange)
        # (a written-out launch where the backend has one: cuda/plan.py)
        run_it = getattr(launcher, "launch", launcher) if run else None
        if NANS.on:
            self.checked_record(plan, cfg, args, plain, run_it, nd, ndrange)
        elif self.provenance is None:
            plan.record(self, cfg, args, plain, run_it, nd, ndrange)
        else:
            self.verified_record(plan, cfg, args, plain, run_it, nd, ndrange)
        if self.limit is not None:
            self.limit.check(self.records)

    def prepare_record(self, cfg: Any, args: tuple, ndrange: Any) -> tuple:
        """A launch no plan of its kernel takes (its first, a tape's scalar among its
        arguments, one array object for several parameters, a bad launch): what
        ``record_launch`` needs, by the general path (which raises for bad launches before
        anything is copied)."""
        cfg, args = distinct(cfg, args)
        tracked: tuple[int, ...] = ()
        plain = args
        if TrackedScalar in map(type, args):
            plain = tuple(float.__float__(a) if type(a) is TrackedScalar else a for a in args)
            tracked = tuple(k for k, a in enumerate(args) if type(a) is TrackedScalar
                            and a.node_on(self) is not None)
            if len(tracked) < sum(type(a) is TrackedScalar for a in args):
                self.foreign_scalars = True     # (another tape's: a constant here)
        launcher, nd, key = prepare(cfg, plain, ndrange)
        if 0 not in nd:
            make_plan(cfg, plain, nd, key, launcher, cfg.kernel.cache[key][1])
        plan = self.record_plan(cfg, args, plain, nd, key, launcher, tracked)
        return cfg, args, plain, launcher, nd, plan

    def record_plan(self, cfg: Any, args: tuple, plain: tuple, nd: tuple[int, ...],
                    key: tuple, launcher: Any, tracked: tuple[int, ...]) -> RecordPlan:
        """The recording plan of launches by ``launcher`` with this tape's scalars at
        ``tracked``, made the first time (kept under the launcher, which is one per launch
        key and hashes by identity: the key is a nested tuple that would be hashed again)."""
        cache = cfg.kernel.cache
        plan = cache.get(("record plan", launcher, tracked))
        if plan is None:
            plan = cache[("record plan", launcher, tracked)] = self.plan_record(
                cfg, args, plain, nd, key, tracked)
        return plan

    def checked_record(self, plan: RecordPlan, cfg: Any, args: tuple, plain: tuple,
                       launcher: Any, nd: tuple[int, ...], ndrange: Any) -> None:
        """A launch recorded under ``tg.debug_nans``: checked, and its record told the
        user's line, which its adjoint's check names (runtime/nans.py)."""
        before = len(self.records)
        if launcher is not None and 0 not in nd:
            launcher = checking_primal(cfg, launcher)
        if self.provenance is None:
            plan.record(self, cfg, args, plain, launcher, nd, ndrange)
        else:
            self.verified_record(plan, cfg, args, plain, launcher, nd, ndrange)
        if len(self.records) > before:
            self.records[-1].where = user_line()

    def verified_record(self, plan: RecordPlan, cfg: Any, args: tuple, plain: tuple,
                        launcher: Any, nd: tuple[int, ...], ndrange: Any) -> None:
        """``plan.record`` under ``verify``, noting the launch's line and the arrays it reads
        that host code made during the recording (provenance.py)."""
        before = len(self.records)
        plan.record_stamped(self, cfg, args, plain, launcher, nd, ndrange)
        if len(self.records) > before:
            self.provenance.recorded(self, self.records[-1],
                                     [args[pos] for pos, reads, *_ in plan.arrays if reads])

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
        host_at = tuple(pos for pos, *_ in arrays if kind_of(plain[pos]).host)
        return recorder(RecordPlan(needs, arrays, params, kernel.name, {}, float_at, tracked,
                                   len(args), host_at))

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
                kind_of(v) is not None and np.dtype(v.dtype).kind == "f")
            else "const" for a, v in zip(args, plain))
        everything = frozenset(kernel_ir(kernel).params)
        if "dup" not in activity and "active" not in activity:
            return frozenset()     # (no derivative goes through it: it has no adjoint to read)
        try:
            return values_read(kernel, cfg.backend, plain, activity, nd,
                                 groupsize_of(cfg, len(nd)))
        except TapegradError:     # not differentiable here: the sweep will say so, if asked
            return everything

    def record_host(self, record: Record, live_inputs: list[tuple[Any, int]],
                    read: tuple = (), wrote: tuple = ()) -> None:
        """Append a host operation's ``record``; ``live_inputs``: (array, position) pairs it
        keeps reading until its adjoint runs, ``read``: other arrays it read now, ``wrote``:
        the new arrays it made (stamped: later recorded uses find them as it left them)."""
        for x in (*(x for x, _ in live_inputs), *read):
            self.unchanged_since_use(x, record.name)
        for y in wrote:
            self.after_host_write(y, self.track(y))
        self.records.append(record)
        for x, pos in live_inputs:
            self.read_live(x, record, pos)
        if self.provenance is not None:
            self.provenance.recorded(self, record, (*(x for x, _ in live_inputs), *read))
        if self.limit is not None:
            self.limit.check(self.records)

    def memory(self) -> dict[str, int]:
        r"""Bytes this tape holds, by kind: ``arrays`` its records keep (launch arguments
        whose contents an adjoint reads, copies of overwritten inputs, host operations'
        operands), ``snapshots`` of ``tg.checkpoint_loop``\ s, and the ``total``
        (``tapegrad/tape/memory.py``); PyOpenCL buffers that views shared count with the
        arrays (the tape holds them: tape/identity.py)."""
        return held_bytes(self.records, self.ids.anchors())

    # -- the reverse sweep ----------------------------------------------------------------

    @api_boundary
    def gradient(self, target: Any, sources: Any) -> Any:
        """The gradient of the scalar ``target`` with respect to each of ``sources`` (a list of
        arrays or tracked scalars), as new arrays / floats; for a single source given without
        a list, its gradient alone.  The tape can be asked again."""
        if not isinstance(sources, (list, tuple)):
            return self.gradient(target, [sources])[0]
        grads = self.new_gradients(sources, "tape.gradient")
        if not self.recording:
            self.check_target(target)
        sweep = self.backward(target, grads, sources, unwritten=set(grads))
        return self.gradients_of(sources, grads, sweep)

    @api_boundary
    def vjp(self, outputs: list[Any], cotangents: list[Any], sources: list[Any]) -> list[Any]:
        """The vector-Jacobian product of the recorded code: for each of ``sources`` (arrays
        or tracked scalars), ``sum_k cotangents[k] . d outputs[k] / d source``, as a new array
        or float.  ``outputs``: arrays the recorded code wrote, or tracked scalars it made;
        ``cotangents``: for each, an array of its shape or a number (for every element).
        Several outputs, several sources, one sweep.  The tape can be asked again.

        >>> import numpy as np, tapegrad as tg
        >>> @tg.kernel
        ... def square(B, A):
        ...     i = tg.index()
        ...     B[i] = A[i] * A[i]
        >>> A = np.array([1.0, 2.0, 3.0]); B = np.zeros(3)
        >>> with tg.Tape() as tape:
        ...     square(tg.CPU())(B, A, ndrange=3)
        ...     total = tg.sum(B)
        >>> (gA,) = tape.vjp([B, total], [np.array([1.0, 0.0, 0.0]), 10.0], [A])
        >>> gA.tolist()          # (e_0 + 10) . 2 A
        [22.0, 40.0, 60.0]
        """
        if len(outputs) != len(cotangents):
            raise TapegradError(f"tape.vjp: {len(outputs)} output(s) but {len(cotangents)} "
                                "cotangent(s); give one cotangent per output")
        grads = self.new_gradients(sources, "tape.vjp")
        unwritten, scratch, seeds = set(grads), set(), {}
        scalar_seeds = []
        for y, w in zip(outputs, cotangents):
            if isinstance(y, TrackedScalar):
                node = y.node_on(self)
                if node is None:
                    raise TapegradError("tape.vjp: a scalar output was not recorded by this "
                                        "tape; ask the tape whose `with` block made it")
                if is_array(w) and getattr(w, "size", 1) != 1:
                    raise TapegradError(f"tape.vjp: a scalar output's cotangent is a number, "
                                        f"got an array of shape {tuple(w.shape)}")
                scalar_seeds.append((node, float(w.reshape(())) if is_array(w) else
                                     float(plain(w))))
                continue
            if not is_array(y) or not self.tracks(y):
                raise TapegradError(
                    "tape.vjp's outputs are arrays the recorded kernels wrote, or scalars from "
                    f"tg.sum/tg.dot/... recorded by this tape; got {type(y).__name__}"
                    + (f" of shape {tuple(y.shape)}, which no recorded operation used"
                       if is_array(y) else ""))
            w_shape = tuple(getattr(w, "shape", ()))
            if w_shape not in (tuple(y.shape), ()):
                raise TapegradError(
                    f"vjp: a cotangent has shape {w_shape}, but its output is an array of "
                    f"shape {tuple(y.shape)}; give a cotangent of the output's shape (or a "
                    "number for every element)")
            k = self.key(y)
            check_output(self, y, k)
            seed = grads.get(k, seeds.get(k))     # an output that is a source: one shadow
            if seed is None:
                seed = seeds[k] = empty_like(y)
                seed[...] = w
                scratch.add(k)                    # ours: consumed or not, no matter
            elif k in unwritten:
                seed[...] = w
                unwritten.discard(k)
            else:
                seed += w
        sweep = self.sweep({**seeds, **grads}, sources, unwritten, scratch)
        for node, w in scalar_seeds:
            sweep.add_scalar_bar(node, w / sweep.copies_of(node))
        sweep.run(list(outputs), sources)
        return self.gradients_of(sources, grads, sweep)

    def backward(self, target: Any, shadows: dict[Any, Any], sources: list[Any],
                 seed_target: bool = True, seeded: list[Any] = (),
                 unwritten: set[Any] = frozenset(), scratch: set[Any] = frozenset()) -> Sweep:
        """Run every adjoint in reverse order (a :class:`~tapegrad.tape.sweep.Sweep`, returned
        for the scalars' adjoints); with ``seed_target`` the scalar ``target`` gets adjoint 1
        and must depend on a source, else the caller seeded the shadows of ``seeded``."""
        sweep = self.sweep(shadows, sources, unwritten, scratch)
        if seed_target:
            sweep.seed(target)
        sweep.run(([target] if seed_target else []) + list(seeded), sources,
                  connected=seed_target)
        return sweep

    def sweep(self, shadows: dict[Any, Any], sources: list[Any], unwritten: set[Any],
              scratch: set[Any]) -> Sweep:
        """A reverse sweep over the finished recording, not run yet."""
        if self.recording:
            raise TapegradError("ask for gradients after the `with tg.Tape()` block ends")
        refuse_while_recording()
        self.check_unchanged()
        return Sweep(self, shadows, sources, unwritten, scratch)

    def new_gradients(self, sources: list[Any], who: str) -> dict[Any, Any]:
        """An array, not filled yet, for each array source's gradient (by identity)."""
        grads = {}
        for s in sources:
            if isinstance(s, TrackedScalar):
                if s.node_on(self) is None:     # (its gradient here would be a silent 0)
                    raise TapegradError(
                        f"a source of {who} is a scalar ({float.__repr__(s)}) this tape did not "
                        "record: another tape's (tape.watch of another tape, or a result of "
                        "another tape's recording), which this tape sees as a constant. Watch "
                        "it with this tape (s = tape.watch(value) inside its block), or ask the "
                        "tape that made it")
                continue
            if not is_array(s):
                raise TapegradError(
                    f"{who} sources are arrays, or tape scalars: numbers made sources "
                    f"with s = tape.watch(0.3) inside the block, or results of tg.sum/tg.dot/"
                    f"...; got {type(s).__name__}")
            if np.dtype(s.dtype).kind != "f":
                raise TapegradError(
                    f"{who} is with respect to float arrays, but a source has dtype "
                    f"{np.dtype(s.dtype)} (integers and booleans have no derivative); convert "
                    f"it before recording (x = x.astype(np.float64)) and differentiate that")
            grads[self.key(s)] = empty_like(s)
        return grads

    def gradients_of(self, sources: list[Any], grads: dict[Any, Any], sweep: Sweep) -> list:
        return [sweep.scalar_bar.get(s.node_on(self), 0.0) if isinstance(s, TrackedScalar)
                else grads[self.key(s)] for s in sources]

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


