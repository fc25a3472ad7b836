"""``tg.checkpoint_loop``: ``state = step(state)`` run ``n_steps`` times under a tape that keeps
a few snapshots instead of every step's record, and recomputes the rest in the reverse sweep
by the binomial schedule (``revolve.py``).

The enclosing tape gets one record for the whole loop (``LoopRecord``): it reads the initial
state and the parameters, writes the final state.  Its adjoint walks the schedule: it restores
and advances states unrecorded, records one step at a time on a tape of its own, and takes
that tape's vector-Jacobian product (``Tape.vjp``) to carry the state's cotangent one step
back, adding up the parameters' cotangents over every step.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from tapegrad.checkpointing.closure import check_closure, unrecorded
from tapegrad.checkpointing.guards import (
    Samples,
    outside_arrays,
    reached,
    refuse_rebound,
    signature,
    takes_index,
    unlike_state,
)
from tapegrad.checkpointing.revolve import reverse_actions
from tapegrad.checkpointing.second import loop_with_tangents
from tapegrad.checkpointing.snapshots import Snapshots, agreed, choose_snapshots, least
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.hostops import copy
from tapegrad.tape.identity import array_key
from tapegrad.tape.memory import kept_by, owner
from tapegrad.tape.modes import current_forward, paused, recording_tapes
from tapegrad.tape.records import Record
from tapegrad.tape.scalars import DualScalar, TrackedScalar, plain
from tapegrad.tape.tape import Tape
from tapegrad.tracebacks import api_boundary

PROBE_STEPS = 64     # steps of a linear loop recorded on one tape to check the shortcut


@api_boundary
def checkpoint_loop(step: Callable[..., Any], state: Any, n_steps: int,
                    params: Sequence[Any] = (), snapshots: int | None = None,
                    memory: int | None = None, storage: str = "memory",
                    in_memory: int | None = None) -> Any:
    """Run ``state = step(state, *params)`` ``n_steps`` times and return the last state,
    differentiable by the enclosing tape at the memory of ``snapshots`` states rather than one
    per step: the reverse sweep recomputes what it needs by Revolve's binomial schedule.

    ``state`` is an array or a tuple of arrays (``step`` takes and returns the same, new
    arrays or updated in place); ``params`` are what ``step`` reads from outside the loop and
    may need gradients for (arrays, tape scalars, numbers), given to it after the state.
    ``snapshots=None`` picks as many as ``memory`` bytes hold (default: a quarter of the free
    memory; in an MPI program, the least over the processes the step talks to), and says so
    on stderr; where all ``n_steps`` states fit, every step is recorded as the plain tape
    records it.  ``storage="disk"`` keeps the snapshots in a private
    temporary folder (removed with the tape), the ``in_memory`` newest of them in memory.

    A ``step`` with one more positional parameter (without a default) than the state and the
    parameters gets the step's number: ``step(*state, *params, k)``.  It must be a function
    of what it is given (the reverse sweep runs steps again); what it reads from outside is
    guarded as docs/checkpointing.md's "Guard rules" say (``guards.py``).

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def decay(out, u, k):
    ...     i = tg.index()
    ...     out[i] = u[i] - k * u[i] * u[i]
    >>> def step(u, k):
    ...     out = np.empty_like(u)
    ...     decay(tg.CPU())(out, u, k, ndrange=u.size)
    ...     return out
    >>> u0 = np.full(4, 0.5)
    >>> with tg.Tape() as tape:
    ...     k = tape.watch(0.1)
    ...     loss = tg.sum(tg.checkpoint_loop(step, u0, 1000, params=(k,), snapshots=8))
    >>> g_u0, g_k = tape.gradient(loss, [u0, k])
    """
    states, single = _as_states(state)
    n = _steps(n_steps)
    params = tuple(params)
    tapes = recording_tapes()
    if n == 0:
        return state
    index = takes_index(step, len(states), len(params))
    ctx = current_forward()
    if ctx is not None and ctx.taped:          # tg.hvp: states and tangents, checkpointed
        return loop_with_tangents(ctx, checkpoint_loop, step, states, n, params, single, index,
                                  dict(snapshots=snapshots, memory=memory, storage=storage,
                                       in_memory=in_memory))
    if not tapes or ctx is not None:   # nothing to keep: the plain loop
        for k in range(n):
            states = _call(step, states, params, single, k if index else None)
        return states[0] if single else states
    stored = Snapshots(storage, in_memory)
    s = snapshots if snapshots is not None else choose_snapshots(
        states, n, memory, not stored.disk, _step_comms(step, states, params, single, index))
    if snapshots is None and s >= n and not stored.disk:   # all fits: the plain tape
        states = tuple(copy(x) for x in states)   # (recorded: a step may update in place)
        for k in range(n):
            states = _call(step, states, params, single, k if index else None)
        return states[0] if single else states
    if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
        raise TapegradError(f"tg.checkpoint_loop: snapshots is a number of states to keep, at "
                            f"least 1 (the initial state), got {s!r}")
    loop = Loop(step, n, int(s), params, single, stored, index)
    out = loop.primal(states)
    for tape in tapes:
        record = LoopRecord.make(tape, loop, states, out)
        tape.record_host(record, record.live)
    return out[0] if single else out


def _step_comms(step: Callable[..., Any], states: tuple, params: tuple, single: bool,
                index: bool) -> list:
    """The MPI communicators that ``step`` talks over (tapegrad.mpi), from its first step
    recorded on a tape of its own from copies of the states: run once more for this in a
    program of more than one process that imported tapegrad.mpi (a step cannot talk
    otherwise); none elsewhere."""
    if "tapegrad.mpi" not in sys.modules:
        return []
    from tapegrad.mpi.buffers import mpi
    if mpi().COMM_WORLD.Get_size() == 1:
        return []
    probe = Tape(watch_changes=False)
    with paused(), probe:
        given = tuple(probe.watch(plain(p)) if isinstance(p, TrackedScalar) else p
                      for p in params)
        _call(step, _copies(states), given, single, 0 if index else None)
    return _comms_of(probe)


def _comms_of(tape: Tape) -> list:
    """The communicators of the operations ``tape`` recorded that communicate."""
    if not any(r.communicates for r in tape.records):
        return []
    from tapegrad.mpi.holders import communicators
    return communicators(tape.records)


def _as_states(state: Any) -> tuple[tuple, bool]:
    if is_array(state):
        return (state,), True
    if isinstance(state, (tuple, list)) and state and all(is_array(x) for x in state):
        return tuple(state), False
    raise TapegradError(f"tg.checkpoint_loop's state is an array or a tuple of arrays, got "
                        f"{type(state).__name__}")


def _steps(n_steps: Any) -> int:
    if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 0:
        raise TapegradError(f"tg.checkpoint_loop: n_steps is a number of steps (0 or more), "
                            f"got {n_steps!r}")
    return int(n_steps)


def _call(step: Callable[..., Any], states: tuple, params: tuple, single: bool,
          k: int | None = None) -> tuple:
    """One step (``k``: its index, for a step that takes one), its result checked against
    the state it was given."""
    out = step(*states, *params) if k is None else step(*states, *params, k)
    new = ((out,) if is_array(out) else None) if single else \
        tuple(out) if isinstance(out, (tuple, list)) else None
    if new is None or len(new) != len(states) or not all(
            is_array(y) and tuple(y.shape) == tuple(x.shape) and y.dtype == x.dtype
            for x, y in zip(states, new)):
        raise TapegradError(unlike_state(states, out, new, single))
    return new


def _copies(states: tuple) -> tuple:
    return tuple(x.copy() for x in states)


class Loop:
    """One checkpointed loop: its schedule, the snapshots its primal run stored, and the
    reverse sweep over it."""

    def __init__(self, step: Callable[..., Any], n: int, s: int, params: tuple, single: bool,
                 stored: Snapshots, index: bool = False):
        self.step, self.n, self.params, self.single = step, n, list(params), single
        self.index = index                  # whether step takes the step index
        self.outside: list = []             # float arrays step reads without params=
        self.stale: list = []               # of those, ones a later operation overwrote
        self.reached: list = []             # where step reaches those by name (guards.reached)
        self.s = min(s, n)
        self.actions = reverse_actions(n, self.s)
        self.first_reverse = next(k for k, a in enumerate(self.actions) if a[0] == "reverse")
        self.initial: tuple = ()
        self.stored = stored
        self.last: tuple | None = None      # the last step recorded: (tape, inputs, outputs)
        self.linear: tuple | None = None    # the first step recorded, if it serves every step
        self.forward_steps = 0              # unrecorded steps run, for the tests and docs
        self.recorded_steps = 0
        self.checked_steps = 0              # steps recorded to check the linear shortcut
        self.most_stored = 0                # snapshots held at once, at most
        self.comms: list = []               # MPI communicators a step talks over

    # -- forward --------------------------------------------------------------------------
    def primal(self, states: tuple) -> tuple:
        """The forward run; returns the last state.  Its first step is recorded on a tape of
        its own, to check what ``step`` reads (arrays from outside become parameters it was
        not given: ``self.outside``) and whether its adjoint reads the state at all: a step
        whose recording keeps no values but the parameters' is replayed from that one
        recording for every step, with no snapshots (``linear``), if every step's recording
        proves the same (``run_linear``).  Otherwise snapshots are stored as the schedule
        says and the last step is recorded (the sweep starts there)."""
        who = "tg.checkpoint_loop's step"
        self.samples = Samples(self.n, states)
        hand = _copies(states)
        before = _copies(hand)
        tape, out = self.record(hand, 0)
        self.comms = _comms_of(tape)
        self.check_alike()
        self.check_returned(tape, hand, before, out)
        check_closure(tape, who)
        self.outside = outside_arrays(tape, (*hand, *self.params), who)
        self.reached = reached(self.step, self.outside)
        keys = {array_key(p) for p in (*self.params, *self.outside) if is_array(p)}
        if self.alike(all(array_key(owner(x)) in keys for _, x in
                          (kept for r in tape.records for kept in kept_by(r)))):
            last = self.run_linear(tape, hand, out)
            if last is not None:
                return last
        self.initial = before
        if self.n == 1:
            self.last = (tape, hand, out)
            return out
        self.recorded_steps -= 1                 # (a probe: the schedule records step 0 again)
        # (its states, which its tape and its tape scalars hold: not through the run)
        tape = hand = out = None
        self.watched = ()
        with unrecorded():
            hand = self.run_actions(self.actions[:self.first_reverse], _copies(before))
        tape, out = self.record(hand, self.n - 1)
        self.last = (tape, hand, out)
        return out

    def run_linear(self, tape: Tape, hand: tuple, out: tuple) -> tuple | None:
        """The steps after the first, each recorded to compare what its adjoint depends on
        with the first's (``guards.signature``): the last state if all agree, and the first
        step's recording then stands for every step; else None (a factor the step chose on
        the host from the state: the general path).  (Host code may read the state in ways
        no hook sees, at any step: only each step's recording shows what it did.  The steps
        are recorded ``PROBE_STEPS`` at a time on one tape, which then knows the parameters
        and each state from the step before, rather than on a tape each.)"""
        first = signature(tape, self.roles(tape, hand, out), nodes=self.nodes(self.watched))
        if not self.alike(first is not None):
            return None
        recorded, watched, same = (tape, hand, out), self.watched, True
        for begin in range(1, self.n, PROBE_STEPS):
            probe = Tape(watch_changes=False)
            with paused(), probe:
                given = tuple(probe.watch(plain(p)) if isinstance(p, TrackedScalar) else p
                              for p in self.params)
                nodes = self.nodes(given)
                for k in range(begin, min(begin + PROBE_STEPS, self.n)):
                    start = len(probe.records)
                    new = _call(self.step, out, given, self.single, k if self.index else None)
                    self.samples.check(k + 1, new, "tg.checkpoint_loop's step")
                    self.checked_steps += 1
                    if signature(probe, self.roles(probe, out, new), probe.records[start:],
                                 nodes) != first:
                        if not self.comms:
                            return None
                        same = False       # (on to the last step: as the other processes)
                    out = new
        if not self.alike(same):
            return None
        self.linear, self.watched = recorded, watched   # (the first step's tape scalars)
        return out

    def alike(self, yes: bool) -> bool:
        """``yes`` on every process the step talks to (where it talks): the loop takes one
        path on all of them, whose steps communicate."""
        return bool(agreed(int(yes), self.comms)) if self.comms else yes

    def check_alike(self) -> None:
        """Every process the step talks to runs one schedule: the same ``n_steps`` and
        snapshots (``snapshots=None`` chooses them alike), else the error on every one."""
        if not self.comms:
            return
        lo_n, lo_s, neg_n, neg_s = least([self.n, self.s, -self.n, -self.s], self.comms)
        if (lo_n, lo_s) != (-neg_n, -neg_s):
            raise TapegradError(
                f"tg.checkpoint_loop's step communicates (tapegrad.mpi), but the processes it "
                f"talks to run it with n_steps from {lo_n} to {-neg_n} and snapshots from "
                f"{lo_s} to {-neg_s}: each would recompute other steps in the reverse sweep, "
                "and wait for messages the others do not send. Give every process the same "
                "n_steps and snapshots (snapshots=None chooses one number for all)")

    @staticmethod
    def nodes(watched: tuple) -> dict:
        """The tape-scalar nodes of the parameters as one tape watches them, by position."""
        return {p.node: ("param", k) for k, p in enumerate(watched)
                if isinstance(p, TrackedScalar)}

    def roles(self, tape: Tape, hand: tuple, out: tuple) -> dict:
        """Each array's part in one recorded step, by its identity on ``tape``."""
        roles: dict = {}
        for part, arrays in (("state", hand), ("out", out), ("param", self.params),
                             ("outside", self.outside)):
            for j, x in enumerate(arrays):
                ident = tape.ids.ident_of(x) if is_array(x) else None
                if ident is not None:
                    roles[ident] = (part, j)
        return roles

    def check_returned(self, tape: Tape, hand: tuple, before: tuple, out: tuple) -> None:
        """A state array that ``step`` returns as it was given must hold what it was given:
        changed by code the tape does not see (NumPy in place), its cotangent would pass
        through unchanged, silently wrong.  (Checked on the step the primal run records.)"""
        for y in out:
            if _written(tape, y):
                continue
            same = next((j for j, x in enumerate(hand) if x is y), None)
            if same is None or not _equal(y, before[same]):
                raise TapegradError(
                    f"tg.checkpoint_loop's step returned an array of shape {tuple(y.shape)} "
                    "that no recorded operation wrote (NumPy made it, or changed it in place: "
                    "tapes cannot see that); write it in a kernel, or with tg.copy/tg.scale")

    def run_actions(self, actions: list[tuple], hand: tuple | None) -> tuple | None:
        for action in actions:
            kind = action[0]
            if kind == "store":
                if action[1] == 0 and self.initial:      # (kept anyway: not a second copy)
                    self.stored.put(0, self.initial, copy=False)
                else:
                    self.stored.put(action[1], hand)
                self.most_stored = max(self.most_stored, len(self.stored))
            elif kind == "free":
                self.stored.drop(action[1])
            elif kind == "restore":
                hand = self.stored.get(action[1])
            elif kind == "advance":
                for k in range(action[1], action[2]):
                    hand = _call(self.step, hand, self.plain_params(), self.single,
                                 k if self.index else None)
                    self.samples.check(k + 1, hand, "tg.checkpoint_loop's step")
                self.forward_steps += action[2] - action[1]
        return hand

    def plain_params(self) -> tuple:
        return tuple(plain(p) if isinstance(p, (TrackedScalar, DualScalar)) else p
                     for p in self.params)

    def record(self, hand: tuple, k: int, counted: bool = True,
               sampled: bool = True) -> tuple[Tape, tuple]:
        """Step ``k`` from ``hand`` on a tape of its own (tape scalars for the parameters that
        are the enclosing tapes' scalars); ``sampled``: its result checked against the
        forward run's (``guards.Samples``)."""
        tape = Tape(watch_changes=False)
        with paused(), tape:
            self.watched = tuple(tape.watch(plain(p)) if isinstance(p, TrackedScalar) else p
                                 for p in self.params)
            out = _call(self.step, hand, self.watched, self.single, k if self.index else None)
        if sampled:
            self.samples.check(k + 1, out, "tg.checkpoint_loop's step")
        self.recorded_steps += counted
        return tape, out

    # -- reverse --------------------------------------------------------------------------
    def reverse(self, given: list[Any], want: list[bool]) -> tuple[list, list]:
        """The cotangents of the initial state and of the parameters (``want``: which
        parameters are active) given the final state's cotangent ``given`` (None where
        zero).  ``given`` is consumed: its arrays are the sweep's to overwrite, and the list
        is emptied so that none outlives the first step back.  At any time the sweep holds
        the snapshots, the state in hand, the recorded step's result, the cotangent it
        carries and the one it makes (``_vjp``)."""
        bar = list(given)
        given.clear()
        param_bars: list[Any] = [None] * (len(self.params) + len(self.outside))
        refuse_rebound(self.step, self.reached, "tg.checkpoint_loop's step", "the step",
                       "the loop ran", "Pass it in params=({}, ...)")
        if self.stale:
            raise TapegradError(
                f"tg.checkpoint_loop's step reads an array of shape {self.stale[0]} from "
                "outside, and a recorded operation after the loop overwrote it: the reverse "
                "sweep, which runs steps again, would read the new contents. Pass it in "
                "params= (the tape then keeps what the loop read) and use the argument")
        if self.linear is not None:         # one recording serves every step
            tape, hand, out = self.linear
            for _ in range(self.n):
                bar = self.step_back(tape, hand, out, bar, want, param_bars)
            return bar, param_bars
        if self.last is None:              # asked again: the forward run once more
            with unrecorded():
                hand = self.run_actions(self.actions[:self.first_reverse],
                                        _copies(self.initial))
            tape, out = self.record(hand, self.n - 1)
            self.last = (tape, hand, out)
        tape, hand, out = self.last
        self.last = None
        for action in self.actions[self.first_reverse:]:
            if action[0] != "reverse":
                with unrecorded():
                    hand = self.run_actions([action], hand)
                continue
            if tape is None:
                tape, out = self.record(hand, action[1])
            bar = self.step_back(tape, hand, out, bar, want, param_bars)
            # (the tape scalars hold their tape, which holds the state it recorded from)
            tape = hand = out = self.watched = None
        self.watched = ()
        return bar, param_bars

    def step_back(self, tape: Tape, hand: tuple, out: tuple, bar: list, want: list[bool],
                  param_bars: list) -> list:
        """One recorded step's vector-Jacobian product: the cotangent of its input state;
        the parameters' added into ``param_bars``.  ``bar`` is consumed (emptied)."""
        sources, where = [], []
        for k, x in enumerate(hand):
            if tape.tracks(x) and np.dtype(x.dtype).kind == "f":
                sources.append(x)
                where.append(("state", k))
        for k, (p, w) in enumerate(zip((*self.watched, *self.outside), want)):
            if w and (isinstance(p, TrackedScalar) or is_array(p) and tape.tracks(p)
                      and not any(p is q for q in sources)):   # (given twice: once)
                sources.append(p)
                where.append(("param", k))
        outputs, cotangents, passed = [], [], {}
        for y, w in zip(out, bar):
            if w is None:
                if not self.comms:
                    continue
                # (a step that communicates runs its adjoint on every process, a zero
                # cotangent where there is none: the others' adjoints wait for its messages)
                w = zeros_like(y)
            if _written(tape, y):
                outputs.append(y)
                cotangents.append(w)
                continue
            same = next(j for j, x in enumerate(hand) if x is y)    # (check_returned)
            passed[same] = w               # returned as it was given: the cotangent passes
        bar.clear()                  # (the sweep consumes them: held there alone)
        w = None
        grads = _vjp(tape, outputs, cotangents, sources) \
            if outputs and sources or self.comms else [None] * len(sources)
        new_bar: list[Any] = [None] * len(hand)
        for (kind, k), g in zip(where, grads):
            if kind == "state":
                new_bar[k] = g
            elif param_bars[k] is None:
                param_bars[k] = g            # (a new array: added to in place from now on)
            else:
                param_bars[k] += g
        for k, w in passed.items():
            new_bar[k] = w if new_bar[k] is None else new_bar[k] + w
        return new_bar


def _vjp(tape: Tape, outputs: list, cotangents: list, sources: list) -> list:
    """``tape.vjp(outputs, cotangents, sources)``, the cotangents consumed: the sweep takes
    them as its shadows of the outputs rather than copies (they are the loop's own, used
    once), one state less held at each step back."""
    grads = tape.new_gradients(sources, "tg.checkpoint_loop")
    unwritten, seeds = set(grads), {}
    for y, w in zip(outputs, cotangents):
        k = tape.key(y)
        if k in seeds:                   # (one array returned twice: one shadow)
            seeds[k] += w
        elif any(w is v for v in seeds.values()):
            seeds[k] = w.copy()          # (one cotangent for two outputs)
        else:
            seeds[k] = w
    cotangents.clear()
    for k in list(seeds):
        if k in grads:                   # an output that is a source (updated in place)
            grads[k] = seeds.pop(k)
            unwritten.discard(k)
    sweep = tape.sweep({**seeds, **grads}, sources, unwritten, set(seeds))
    seeds = None
    sweep.run(outputs, sources)
    return tape.gradients_of(sources, grads, sweep)


def _written(tape: Tape, y: Any) -> bool:
    """Whether an operation ``tape`` recorded wrote the array ``y``."""
    ident = tape.ids.ident_of(y)
    return ident is not None and any(ident in r.writes for r in tape.records)


def _equal(a: Any, b: Any) -> bool:
    from tapegrad.tape.fingerprint import fingerprint
    return bool(fingerprint(a) == fingerprint(b))


class LoopRecord(Record):
    """The enclosing tape's record of a checkpointed loop: reads the initial state and the
    parameters, writes the final state; its adjoint is the loop's reverse sweep."""

    loop: Loop
    state_ids: list
    param_ids: list
    param_nodes: list

    @classmethod
    def make(cls, tape: Any, loop: Loop, states: tuple, out: tuple) -> LoopRecord:
        """The record; the tape keeps watching the parameters (given or read from outside)
        as it does a launch's inputs: changed in place before the gradient, they are refused
        (``Tape.check_unchanged``); overwritten by a later recorded operation, ``redirect``."""
        params = (*loop.params, *loop.outside)
        param_ids = [tape.track(p) if is_array(p) else None for p in params]
        param_nodes = [p.node_on(tape) if isinstance(p, TrackedScalar) else None
                       for p in params]
        state_ids = [tape.track(x) for x in states]
        record = cls(reads=state_ids + [i for i in param_ids if i is not None],
                     writes=[tape.track(y) for y in out],
                     scalars_in=[n for n in param_nodes if n is not None],
                     name="tg.checkpoint_loop")
        record.loop, record.state_ids = loop, state_ids
        record.param_ids, record.param_nodes = param_ids, param_nodes
        record.live = [(p, k) for k, p in enumerate(params) if is_array(p)]
        if loop.comms:    # (its adjoint runs on every process alike: Record.communicates)
            record.communicates, record.comms = True, tuple(loop.comms)
        return record

    def redirect(self, pos: int, copy: Any) -> None:
        """A later recorded operation overwrites parameter ``pos``: a given one is read from
        ``copy`` from now on (what the loop read), and the steps the loop recorded with it
        are recorded again; one read from outside cannot be (the step reads the global)."""
        loop = self.loop
        if pos >= len(loop.params):
            loop.stale.append(tuple(copy.shape))
            return
        loop.params[pos] = copy
        loop.last = None
        if loop.linear is not None:     # (its state may have been updated in place since:
            hand = _copies(loop.linear[1])    # a linear step's adjoint does not read it)
            tape, out = loop.record(hand, 0, counted=False, sampled=False)
            loop.linear = (tape, hand, out)

    def held(self) -> Iterable[tuple[str, Any]]:
        """What the loop keeps between its forward run and its reverse sweep: the initial
        state, the snapshots, the last step's record (``Tape.memory``)."""
        loop = self.loop
        for states in (loop.initial, *loop.stored):
            for x in states:
                yield "snapshots", x
        for recorded in (loop.last, loop.linear):
            if recorded is not None:
                tape, hand, _ = recorded
                for x in hand:
                    yield "snapshots", x
                for record in tape.records:
                    for _, x in kept_by(record):
                        yield "snapshots", x

    def backward(self, sweep: Any) -> None:
        bar = [_consumed(sweep, ident) for ident in self.writes]
        if all(b is None for b in bar) and not self.communicates:
            return
        want = [(i is not None and i in sweep.active_ids)
                or (n is not None and n in sweep.active_nodes)
                for i, n in zip(self.param_ids, self.param_nodes)]
        state_bar, param_bars = self.loop.reverse(bar, want)
        for ident, g in zip(self.state_ids, state_bar):
            if g is not None and ident in sweep.active_ids:
                sweep.shadow(ident)[...] += g
        for ident, node, g in zip(self.param_ids, self.param_nodes, param_bars):
            if g is None:
                continue
            if node is not None:
                sweep.add_scalar_bar(node, float(g))
            elif ident is not None and ident in sweep.active_ids:
                sweep.shadow(ident)[...] += g


def _consumed(sweep: Any, ident: Any) -> Any:
    """The cotangent of the loop's result ``ident``, None where zero, for the reverse sweep
    to overwrite; the shadow is consumed (the loop wrote the array).  A shadow the sweep
    made is taken from it (what a later adjoint would find is zeros, as if consumed),
    a caller's is copied and zeroed."""
    shadow = sweep.shadows.get(ident)
    if shadow is None or ident in sweep.fresh:      # (no adjoint wrote it: zeros)
        return None
    if ident in sweep.requested:
        bar = shadow.copy()
        shadow.fill(0)
        return bar
    return sweep.shadows.pop(ident)
