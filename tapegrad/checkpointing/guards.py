"""What a checkpointed loop checks so that its recomputed steps give the plain tape's gradient.

- ``outside_arrays``: the arrays a step reads without being given them (a global weight
  array, an index array).  The loop treats them as parameters it was not told about: the
  enclosing tape follows them, so a gradient with respect to a float one comes out right, and
  one changed before the gradient (in place, or by a later recorded operation) is refused.
- ``reached`` and ``refuse_rebound``: where the code reaches those arrays by name (a global,
  a closure variable, an item or attribute of one: ``tg.capture``'s walk,
  ``capturing/outside.py``); one rebound before the gradient (``W = W.copy()``) is refused,
  naming it: the recomputation would read the new array.
- ``signature``: what a recorded step's adjoint depends on (its operations in order, the
  scalars they took, which arrays they read and wrote, by their part in the step).  The
  linear shortcut replays the first step's adjoint for every step only while every step's
  signature equals the first's: a factor chosen on the host from the state
  (``2.0 if u[0] < 1 else 0.5``) changes it.
- ``Samples``: two elements of each state after every step of the forward run; a step run
  again from the same state must give the same ones, else it is not a pure function of its
  state and parameters (a Python counter) and its recomputation would be wrong.
- ``takes_index``: whether ``step`` has a parameter for the step index (and takes its
  arguments at all).
- ``unlike_state``: what tells a state a step returned from the one it was given.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tapegrad.capturing.outside import MISSING, changed, describe, follow, outside, stored
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import Ident, array_key
from tapegrad.tape.memory import owner
from tapegrad.tape.records import LaunchRecord
from tapegrad.tape.scalars import TrackedScalar, _Rule


def outside_arrays(inner: Any, given: Iterable[Any], who: str) -> list[Any]:
    """The arrays the recording ``inner`` read but no recorded operation of it wrote, other
    than ``given`` (the state and the parameters): what the code read from outside.  (Integer
    ones too: the recomputation reads them, so they are guarded as the float ones are.)"""
    keys = {array_key(x) for x in given if is_array(x)}
    written = {i for r in inner.records for i in r.writes}
    read = [i for r in inner.records for i in r.reads]
    objects = {ident: ref() for ref, _, _, ident in inner.ids.known.values()}
    found: list[Any] = []
    seen: set[Ident] = set()
    for ident in read:
        if ident in written or ident in seen or not ident.alive():
            continue
        seen.add(ident)
        x = objects.get(ident)
        if x is None:        # (an array type without weak references: no object to follow)
            raise TapegradError(
                f"{who} reads an array of shape {ident.meta[1]} from outside without taking it "
                "as an argument; pass it in (params= for tg.checkpoint_loop) and use the "
                "argument")
        if array_key(x) not in keys:
            found.append(x)
    return found


def reached(fn: Any, arrays: list[Any]) -> list[tuple]:
    """Where ``fn`` reaches ``arrays`` (those it read from outside: ``outside_arrays``), or
    arrays over their buffers, by name, and the floats it reads by name (``dt``; not ints,
    bools and strings, more often counters and flags than quantities; nor names the code
    assigns: a timer it adds to, a logged energy):
    ``capturing.outside``'s (path, "array", (array, None)) and (path, "==", value) for a
    global, a closure variable, a module's attribute, an item or attribute of one, and so
    on in the functions it calls."""
    bases = {id(owner(x)) for x in arrays}
    written = stored(fn)      # (a timer the code adds to, a logged energy: not read to compute)
    return [(path, kind, want) for path, kind, want in outside(fn, ())
            if kind == "==" and isinstance(want, (float, complex, np.floating,
                                                  np.complexfloating))
            and path[-1][-1] not in written
            or kind == "array" and id(owner(want[0])) in bases]


def refuse_rebound(fn: Any, paths: list[tuple], who: str, what: str, since: str,
                   fix: str) -> None:
    """Refuse where one of ``paths`` (``reached``'s) holds another array now than when
    ``what`` (``fn``: "the step", a segment's name) ran (``W = W.copy()`` since, the next
    iteration of an outer loop): run again in the reverse sweep, it would read the new one,
    and the gradient would be another function's.  ``since``: when it ran ("the loop
    ran"); ``fix``: how to pass the array in, ``{}`` standing for its name."""
    path = changed(fn, (), paths)
    if path is None:
        return
    kind, old = next((kind, want) for p, kind, want in paths if p == path)
    expr, where = describe(fn, path)
    if kind == "array":
        was, now = f"an array of shape {tuple(old[0].shape)}", "another array"
    else:
        new = follow(fn, path)
        was = f"{old!r}"
        now = f"{new!r}" if new is not MISSING else "nothing (deleted)"
    raise TapegradError(
        f"{who} reads {expr} ({where}), {was}, from outside, and {expr} has been rebound to "
        f"{now} since {since}: the reverse sweep runs {what} again, which would read the "
        f"new {expr} and give another function's gradient. {fix.format(expr)} and use the "
        f"argument (the tape then keeps what {what} read)")


def signature(tape: Any, roles: dict[Any, tuple], records: list | None = None,
              nodes: dict[int, tuple] | None = None) -> tuple | None:
    """What the adjoint of the step recorded on ``tape`` depends on, comparable between
    steps; ``roles``: identity -> its part in the step (("state", k), ("param", k)...),
    ``nodes``: tape-scalar node -> its part (the parameters'), ``records``: the step's
    (default: all of the tape's).  Arrays and tape scalars the step made are numbered in
    the order they appear, so that steps recorded one after another on one tape compare as
    if each had a tape of its own.  None where a record holds something this does not know
    how to compare (then no step stands for another)."""
    parts = _Parts(tape, roles, nodes or {})
    out = []
    try:
        for r in tape.records if records is None else records:
            if isinstance(r, LaunchRecord):
                args = tuple(parts.role(i) if i is not None else parts.value(v)
                             for i, v in zip(r.ids, r.values))
                out.append((r.cfg, r.nd, args, tuple(parts.node(n) for n in r.nodes),
                            tuple(parts.node(n) for n in r.scalars_in)))
            else:
                fields = tuple((k, parts.nodes_of(v) if k in _NODE_FIELDS else parts.value(v))
                               for k, v in vars(r).items() if k != "scalar_out")
                out.append((type(r), fields, parts.made(r.scalar_out)))
    except _Unknown:
        return None
    return tuple(out)


_NODE_FIELDS = ("scalars_in", "inputs")     # (Record's and ScalarRecord's: tape-scalar nodes)


class _Unknown(Exception):
    pass


class _Parts:
    """Each array's and tape scalar's part in one step: given (``roles``, ``nodes``), or
    made in it, numbered in order (a node made elsewhere keeps its number, which equals
    nothing another step made)."""

    def __init__(self, tape: Any, roles: dict[Any, tuple], nodes: dict[int, tuple]):
        self.tape, self.roles, self.nodes = tape, roles, dict(nodes)
        self.new: dict[Any, tuple] = {}
        self.made_here = 0

    def role(self, ident: Ident) -> tuple:
        part = self.roles.get(ident) or self.new.get(ident)
        if part is None:
            part = self.new[ident] = ("new", len(self.new))
        return part

    def node(self, n: int | None) -> Any:
        return None if n is None else self.nodes.get(n, ("other", n))

    def nodes_of(self, v: Any) -> Any:
        return tuple(self.node(n) for n in v) if isinstance(v, (list, tuple)) else self.node(v)

    def made(self, n: int | None) -> Any:
        if n is None:
            return None
        self.nodes[n] = ("made", self.made_here)
        self.made_here += 1
        return self.nodes[n]

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, str, int)):
            return v
        if isinstance(v, TrackedScalar):
            return ("scalar", _bits(float.__float__(v)))
        if isinstance(v, (float, np.floating)):
            return _bits(float(v))
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, Ident):
            return self.role(v)
        if isinstance(v, (list, tuple)):
            return tuple(self.value(x) for x in v)
        if is_array(v):
            # (kept contents: the linear shortcut takes only steps whose kept arrays are its
            # parameters, so the array's part in the step says which contents)
            ident = self.tape.ids.ident_of(v)
            if ident is None:
                raise _Unknown
            return ("array", self.role(ident))
        if isinstance(v, types.FunctionType):
            cells = tuple(self.value(c.cell_contents) for c in v.__closure__ or ())
            return (v.__code__, cells)
        if isinstance(v, (types.BuiltinFunctionType, type)):
            return v
        if isinstance(v, _Rule):        # (what a tape scalar's operation was: + or a math row)
            return ("rule", v.kind, v.row, v.reflected)
        raise _Unknown


def _bits(f: float) -> Any:
    return f.hex() if not math.isnan(f) else "nan"


class Samples:
    """Two elements of every state of the forward run (NumPy states; others are not
    sampled: reading device memory is a synchronisation), to check that a step run again
    from the same state gives the same one."""

    def __init__(self, n: int, states: tuple):
        self.on = all(type(x) is np.ndarray and x.size for x in states)
        self.values = np.zeros((n + 1, 2 * len(states))) if self.on else None
        self.known = np.zeros(n + 1, dtype=bool) if self.on else None

    def check(self, k: int, states: tuple, who: str) -> None:
        """State ``k`` (after ``k`` steps): noted the first time, compared afterwards (bit
        for bit: NaN equals NaN)."""
        if not self.on:
            return
        row = self.values[k]
        if not self.known[k]:
            for j, x in enumerate(states):
                row[2 * j], row[2 * j + 1] = x.item(0), x.item(-1)
            self.known[k] = True
            return
        for j, x in enumerate(states):
            for got, want in ((x.item(0), row[2 * j]), (x.item(-1), row[2 * j + 1])):
                if got != want and not (got != got and want != want):
                    raise TapegradError(
                        f"{who} gave another state when run again from the same one (step "
                        f"{k - 1}): it is not a pure function of its state and params (a "
                        "Python counter, random numbers, a global it changes), and the "
                        "reverse sweep recomputes steps. Make it one; for the step's number, "
                        "give step a last parameter: def step(*state, *params, k) receives "
                        "k = 0, 1, ...")


def takes_index(step: Callable[..., Any], n_state: int, n_params: int) -> bool:
    """Whether ``step`` takes the step index after its ``n_state`` state and ``n_params``
    parameter arguments: it has exactly one positional parameter without a default more
    than those (and no ``*args``).  One that can take neither is refused here, where the
    loop is called, rather than by a TypeError from a step deep in the schedule."""
    try:
        sig = inspect.signature(step)
    except (TypeError, ValueError):
        return False
    n_args = n_state + n_params
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in sig.parameters.values()):
        return False
    required = [p for p in sig.parameters.values()
                if p.kind in kinds and p.default is inspect.Parameter.empty]
    if len(required) == n_args + 1:
        return True
    if not _binds(sig, n_args):
        name = getattr(step, "__name__", type(step).__name__)
        write = name if name.isidentifier() else "step"
        state = "u" if n_state == 1 else ", ".join(f"u{k}" for k in range(n_state))
        given = ", ".join([state] + [f"p{k}" for k in range(n_params)])
        parts = f"the state's {n_state} array{'s' * (n_state != 1)}" + (
            f" and the {n_params} value{'s' * (n_params != 1)} of params=" if n_params else "")
        raise TapegradError(
            f"tg.checkpoint_loop calls step(*state, *params): {parts}, {n_args} "
            f"argument{'s' * (n_args != 1)}, or {n_args + 1} with the step's number last; "
            f"{name}{sig} cannot take them. Write def {write}({given}), or "
            f"def {write}({given}, k) for k = 0, 1, ...")
    return False


def _binds(sig: inspect.Signature, n: int) -> bool:
    try:
        sig.bind(*range(n))
    except TypeError:
        return False
    return True


def unlike_state(states: tuple, out: Any, new: tuple | None, single: bool) -> str:
    """What tells the state a step returned (``out``; ``new``: its arrays, None where it is
    not of the state's kind) from the one it was given, and what to write instead."""
    def shape(v: Any) -> str:
        return f"{tuple(v.shape)} {v.dtype}" if is_array(v) else type(v).__name__

    def kind(v: Any) -> str:
        if isinstance(v, (tuple, list)):
            return f"a {type(v).__name__} of {len(v)} ({', '.join(shape(y) for y in v)})"
        return f"an array ({shape(v)})" if is_array(v) else f"a {type(v).__name__}"
    given = ", ".join(shape(x) for x in states)
    head = "tg.checkpoint_loop's step must return a state like the one it takes"
    if new is None and single:
        fix = ": return the array itself, not a tuple" if isinstance(out, (tuple, list)) \
            and len(out) == 1 else ""
        return f"{head}, one array ({given}), but returned {kind(out)}{fix}"
    if new is None:
        fix = ("; a state of one array is given alone: checkpoint_loop(step, u0, ...), not "
               "[u0] or (u0,)") if len(states) == 1 and is_array(out) else ""
        return (f"{head}, a tuple or list of {len(states)} "
                f"array{'s' * (len(states) != 1)} ({given}), but returned {kind(out)}{fix}")
    if len(new) != len(states):
        return (f"{head}, {len(states)} array{'s' * (len(states) != 1)} ({given}), but "
                f"returned {kind(out)}")
    return f"{head} ({given}), but returned {', '.join(shape(y) for y in new)}"
