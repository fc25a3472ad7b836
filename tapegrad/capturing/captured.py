"""``tg.capture(fn)``: the first call records what ``fn`` runs; later calls with arguments of
the same kinds replay it without ``fn``'s Python (``program.py``; on the CPU, compiled into
one Numba function per stretch of launches: ``tapegrad/backends/cpu/driver.py``)."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.backends.determinism import DETERMINISTIC
from tapegrad.capturing.outside import outside, same_outside
from tapegrad.capturing.program import INPUT, GuardFailed, Program, build
from tapegrad.capturing.record import before_writes, record_call
from tapegrad.capturing.trace import TraceTape
from tapegrad.errors import CaptureError, LaunchError
from tapegrad.runtime.nans import NANS
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import array_key, extent
from tapegrad.tape.memory import owner
from tapegrad.tape.modes import current_forward, recording_tapes
from tapegrad.tape.scalars import DualScalar, TrackedScalar
from tapegrad.tracebacks import api_boundary

MOST_VARIANTS = 8      # programs kept per kind of arguments (branches taken), newest first


class Captured:
    """A function whose launches replay without its Python (made by :func:`capture`).

    ``recordings`` counts the calls that ran the function's Python (the first call per
    kind of arguments, and calls whose branches differed); ``programs`` holds what they
    recorded: per kind of arguments, up to ``MOST_VARIANTS`` programs (one per way through
    the function's branches), the most recently used first."""

    def __init__(self, fn: Callable[..., Any], strict: bool):
        self.fn = fn
        self.strict = strict
        self.programs: dict[tuple, list[Program]] = {}
        self.recordings = 0
        self.name = getattr(fn, "__name__", "the captured function")
        self.arity = _arity(fn)       # a call with this many arguments binds as it is
        functools.update_wrapper(self, fn)

    def __repr__(self) -> str:
        return f"tg.capture({self.name}, strict={self.strict})"

    @api_boundary
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.call(args, kwargs)

    def call(self, args: tuple, kwargs: dict, value_unused: bool = False) -> Any:
        """A call; ``value_unused``: only the gradient of its scalar result is wanted, not
        its value (``tg.gradient(captured, ...)``), so that a replay whose reverse reads
        nothing the forward computes need not run the forward."""
        if kwargs or len(args) != self.arity:
            args = self.positional(args, kwargs)
        if current_forward() is not None or any(type(a) is DualScalar for a in args):
            return self.fn(*args)       # forward mode: its tangents go through fn's Python
        if NANS.slow or DETERMINISTIC.on:
            return self.fn(*args)       # tg.debug_nans, check_tape, tg.deterministic
        if any(isinstance(t, TraceTape) for t in recording_tapes()):
            return self.fn(*args, **kwargs)   # inside another capture's first call: its ops
        key = signature(args, self.name)
        variants = self.programs.get(key)
        if not variants:
            if self.strict and self.programs:
                raise CaptureError(
                    f"{self.name} was captured with strict=True for arguments "
                    f"{describe(next(iter(self.programs)))}, and this call has "
                    f"{describe(key)}; a strict capture records once. Call it with arguments "
                    "of the recorded shapes, dtypes and constants, or capture without "
                    "strict=True to record once per kind of arguments")
            return self.record(key, args)
        for program in variants:
            if not same_outside(self.fn, args, program.outside):
                continue        # (a global or a closure's array rebound: records again)
            try:
                result = self.replay(program, args, value_unused)
            except GuardFailed as failed:
                if self.strict:       # (the replay put back what it had written)
                    why = "a strict capture does not record again"
                    raise CaptureError(
                        f"{self.name}: this call takes another branch than the recorded one: "
                        f"{failed.op.name}, which this call answers otherwise; {why}. Make the "
                        "branch a kernel's (tg.where, an if inside the kernel), or pass what "
                        "decides it as an integer argument (a new value records again)"
                    ) from None
                continue
            if program is not variants[0]:        # the branches taken lately come first
                variants.remove(program)
                variants.insert(0, program)
            return result
        return self.record(key, args)

    def positional(self, args: tuple, kwargs: dict) -> tuple:
        """Arguments given by name, put in their places (defaults filled in)."""
        if self.arity is None and not kwargs:
            return args
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except (TypeError, ValueError) as e:
            raise CaptureError(f"{self.name}: {e}") from None
        bound.apply_defaults()
        if bound.kwargs:
            raise CaptureError(f"{self.name}: a captured function's arguments go by position "
                               f"or by their parameter's name; {', '.join(bound.kwargs)} "
                               "cannot (keyword-only or **kwargs)")
        return bound.args

    def record(self, key: tuple, args: tuple) -> Any:
        """Run ``fn`` on a trace tape (inside any recording tapes, which record its
        operations one by one as they would without capture) and keep its program."""
        _distinct_arrays(args, self.name)
        tapes = recording_tapes()
        trace = TraceTape(self.fn, args, self.name)
        with trace:
            params, call_args = [], list(args)
            for pos, a in enumerate(args):
                if key[pos][0] == "float":
                    s = trace.new_node(float.__float__(a))
                    if isinstance(a, TrackedScalar):     # still the enclosing tapes' scalar
                        s.outer = tuple((t, a.node_on(t)) for t in tapes
                                        if a.node_on(t) is not None)
                    else:     # a constant there, but theirs: not one from outside
                        s.outer = tuple((t, t.next_node()) for t in tapes)
                    params.append((pos, s.node))
                    call_args[pos] = s
            result = self.fn(*call_args)
            trace.arguments.returned()
        self.recordings += 1
        program = build(trace, self.fn, args, params, result, self.name)
        program.outside = outside(self.fn, args)     # (as the function left it)
        if sum(kind == "s" for kind, _ in program.results) > 1:
            raise CaptureError(f"{self.name} returns more than one tape scalar; a captured "
                               "function returns at most one (combine them, or return arrays)")
        variants = self.programs.setdefault(key, [])
        variants.insert(0, program)
        del variants[MOST_VARIANTS:]
        if tapes:
            return result
        return _plain(result)

    def replay(self, program: Program, args: tuple, value_unused: bool = False) -> Any:
        written = [args[slot.index] for slot in program.slots
                   if slot.kind == INPUT and slot.written]
        _writable(written, self.name)
        tapes = recording_tapes()
        if tapes:
            before_writes(program, args, tapes)
        frame = program.frame(args, fresh_kept=bool(tapes))
        pending = value_unused and program.deferrable and len(tapes) == 1
        # a guard after an argument's write in place may fail: the arguments go back as they
        # were, so that recording again (or the error) does not see them written twice
        saved = [x.copy() for x in written] if program.written_before_guard else []
        if pending:         # (its one result's value, which no one reads)
            results = [math.nan]
        else:
            with program.lock:
                try:
                    program.run(frame)
                except GuardFailed:
                    for x, before in zip(written, saved):
                        x[...] = before
                    raise
                results = program.results_of(frame)
        if tapes:
            results = record_call(program, frame, args, results, tapes, pending)
        return tuple(results) if program.returns_tuple else results[0]


def _writable(written: list[Any], name: str) -> None:
    """Refuse a read-only NumPy array for an argument the replay writes (as a launch does)."""
    for x in written:
        if isinstance(x, np.ndarray) and not x.flags.writeable:
            raise LaunchError(f"{name}: an argument of shape {tuple(x.shape)} is read-only "
                              "(its flags.writeable is False) but the captured function writes "
                              "it in place; pass a writable array, e.g. u.copy()")


def _distinct_arrays(args: tuple, name: str) -> None:
    """Refuse one array given for two arguments (before anything runs)."""
    seen: dict[tuple, int] = {}
    for pos, a in enumerate(args):
        if is_array(a):
            first = seen.setdefault(array_key(a), pos)
            if first != pos:
                raise CaptureError(f"{name}: arguments {first} and {pos} are the same array; "
                                   "a captured function takes distinct arrays")


def _arity(fn: Callable[..., Any]) -> int | None:
    """How many positional parameters ``fn`` has (None: any number, ``*args``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def _plain(result: Any) -> Any:
    """Results as an unrecorded call gives them (tape scalars as floats)."""
    if isinstance(result, tuple):
        return tuple(_plain(r) for r in result)
    return float.__float__(result) if isinstance(result, TrackedScalar) else result


def signature(args: tuple, name: str) -> tuple:
    """What a replay needs to be the same per argument: an array's type, shape, dtype and
    order (and which earlier argument's memory it shares); that an argument is a float (a
    parameter: Python's, NumPy's float64 or a tape scalar); any other argument's value (a
    NumPy float32 too: kernels take it as float32, a parameter would be a float64)."""
    parts = []
    roots: dict[int, int] = {}        # the memory's owner -> the first argument that has it
    spans: list[tuple[int, tuple[int, int]]] = []   # (position, bytes) of the other arrays
    for pos, a in enumerate(args):
        if is_array(a):
            flags = a.flags
            order = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "strided"
            # (arguments sharing memory replay another program than distinct ones would)
            shares = roots.setdefault(id(owner(a)), pos)
            if shares == pos and type(a) is not np.ndarray:
                # (a PyOpenCL view knows no base: its bytes tell, as a tape's identities)
                lo, hi = extent(a)
                shares = next((p for p, (l2, h2) in spans if lo < h2 and l2 < hi), pos)
                spans.append((pos, (lo, hi)))
            parts.append(("array", type(a), tuple(a.shape), a.dtype, order,
                          tuple(a.strides) if order == "strided" else (),
                          shares if shares != pos else None))
        elif isinstance(a, float):      # (Python's, NumPy's float64, a tape scalar)
            parts.append(("float",))
        else:
            try:
                hash(a)
            except TypeError:
                raise CaptureError(
                    f"{name}: argument {pos} is a {type(a).__name__}, which a captured "
                    "function cannot tell apart from one call to the next; pass arrays, "
                    "numbers, or hashable constants (ints, strings, tuples)") from None
            parts.append(("value", type(a), a))
    return tuple(parts)


def describe(key: tuple) -> str:
    """A signature in words."""
    words = []
    for part in key:
        if part[0] == "array":
            words.append(f"{part[1].__name__}{list(part[2])} {part[3]}")
        elif part[0] == "float":
            words.append("float")
        else:
            words.append(repr(part[2]))
    return "(" + ", ".join(words) + ")"


def capture(fn: Callable[..., Any] | None = None, *, strict: bool = False) -> Any:
    """``fn`` captured: its first call runs it and records what it launches; later calls
    with arguments of the same kinds replay that, forward and (under a tape, in
    ``tg.gradient``...) reverse, without running ``fn``'s Python.

    Arrays are the arguments the replay reads and writes; floats are parameters (a new value
    replays with it); any other argument (an int, a string) is a constant: a new value
    records again, as does a new shape or dtype.  A comparison of a tape scalar inside
    ``fn`` (an ``if`` on a value) is checked on each replay: a call that would go the other
    way records again.  ``strict=True`` raises ``tg.CaptureError`` instead of recording
    again.  Docs: docs/capture.md.

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def step(U_new, U, a):
    ...     i = tg.index()
    ...     U_new[i] = a * U[i]
    >>> @tg.capture
    ... def simulate(u, a, steps):
    ...     for _ in range(steps):
    ...         u_new = np.empty_like(u)
    ...         step(tg.CPU())(u_new, u, a, ndrange=u.size)
    ...         u = u_new
    ...     return tg.sum(u)
    >>> u = np.ones(4)
    >>> simulate(u, 0.5, 3), simulate(u, 2.0, 3)      # the second call replays
    (0.5, 32.0)
    >>> tg.gradient(lambda u: simulate(u, 0.5, 3), u)[0].tolist()
    [0.125, 0.125, 0.125, 0.125]
    """
    if fn is None:
        return lambda f: Captured(f, strict)
    return Captured(fn, strict)
