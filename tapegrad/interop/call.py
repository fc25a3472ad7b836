"""A host function run on a tape of its own, with the vector-Jacobian product back to its
arguments: what the PyTorch and JAX wrappers (``tapegrad.torch``, ``tapegrad.jax``) call for
their forward and backward passes.

>>> import numpy as np, tapegrad as tg
>>> call = RecordedCall(lambda x, a: tg.scale(x, a), (np.array([1.0, 2.0]), 3.0), (True, True))
>>> call.outputs[0].tolist()
[3.0, 6.0]
>>> x_bar, a_bar = call.vjp([np.array([1.0, 1.0])])
>>> x_bar.tolist(), a_bar
([3.0, 3.0], 3.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.capturing.outside import outside
from tapegrad.errors import InplaceModificationError, TapegradError
from tapegrad.tape.arrays import is_array, only_tape_holds
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.identity import extent
from tapegrad.tape.memory import owner
from tapegrad.tape.records import LaunchRecord
from tapegrad.tape.scalars import TrackedScalar, plain
from tapegrad.tape.stamps import same_bits
from tapegrad.tape.tape import Tape


class RecordedCall:
    """``f(*args)`` recorded; ``active[k]``: whether argument ``k`` wants a gradient (a number
    that does is watched as a tape scalar).  ``outputs``: the results as a list (one array or
    number, or each item of a returned tuple); ``single``: whether ``f`` returned one;
    ``outside``: the arrays from outside the arguments that the backward reads, with their
    fingerprints (``outside_reads``, checked by ``check_outside``)."""

    def __init__(self, f: Callable[..., Any], args: Sequence[Any], active: Sequence[bool]):
        # (no fingerprints of the arguments and results: the wrappers guard those themselves,
        # PyTorch by version counters, JAX by copies; docs/interop.md)
        self.f = f
        self.tape = Tape(watch_changes=False)
        with self.tape:
            # (integers are never active: a step count stays an int)
            self.args = [self.tape.watch(float(a)) if on and _float_number(a) else a
                         for a, on in zip(args, active)]
            result = f(*self.args)
        self.single = not isinstance(result, (tuple, list))
        self.outputs = [result] if self.single else list(result)
        self.active = list(active)
        for y in self.outputs:
            if not (is_array(y) or isinstance(y, (float, int, np.floating, np.integer))):
                raise TapegradError(
                    f"{getattr(f, '__name__', 'the function')} returned a "
                    f"{type(y).__name__}; a wrapped tapegrad function returns arrays, numbers "
                    "(tg.sum/tg.dot/... results), or a tuple of them")
        self.outside = self.outside_reads() if any(active) else []

    def outside_reads(self) -> list[tuple[Any, Any]]:
        """(array, fingerprint) for each array the vector-Jacobian product reads as it is then
        that is neither an argument nor a result of ``f`` and that code besides the tape can
        still reach: a global, a closure's, one kept elsewhere.  Arrays ``f`` made that only
        the tape holds now (its temporaries) cannot change and are not fingerprinted: a
        function that reads nothing from outside pays for a look at each array its tape
        reads."""
        mine = {id(a) for a in (*self.args, *self.outputs)}
        own: list[tuple[int, int]] | None = None
        guards = []
        for ident, refs in self.tape.readers.items():
            if not refs or id(refs[-1][2]) in mine or _only_the_tape_holds(refs):
                continue
            if own is None:
                own = [extent(a) for a in (*self.args, *self.outputs) if is_array(a)]
            if not any(lo < ident.span[1] and ident.span[0] < hi for lo, hi in own):
                guards.append((refs[-1][2], fingerprint(refs[-1][2])))
        return guards

    def outside_digest(self) -> int:
        """A 63-bit hash of the fingerprints ``outside_reads`` took (for a forward pass
        recorded again, which must find the same)."""
        return hash(tuple(fp if isinstance(fp, int) else
                          bytes(np.ascontiguousarray(kind_of(fp).to_numpy(fp)))
                          for _, fp in self.outside)) & (2**63 - 1)

    def outside_names(self) -> str:
        """The arrays from outside that the vector-Jacobian product reads, in words."""
        return ", ".join(outside_name(self.f, self.args, x) for x, _ in self.outside)

    def check_outside(self, name: str, fix: str) -> None:
        """Before the vector-Jacobian product: the arrays from outside that it reads
        (``outside_reads``) hold what the forward pass read; one changed in place is an
        ``InplaceModificationError`` naming it (``name``: the wrapped function, for the
        message; ``fix``: how to take the gradient before changing it)."""
        for x, before in self.outside:
            if not same_bits(fingerprint(x), before):
                raise InplaceModificationError(
                    f"{name}: {outside_name(self.f, self.args, x)} (an array of shape "
                    f"{tuple(x.shape)} that the function reads without taking it as an "
                    "argument) was changed in place after the forward pass, and the backward "
                    "pass reads its contents, so the gradient would be wrong. Pass it to the "
                    f"function as an argument (then the wrapper guards it), or {fix} before "
                    "changing it")

    def backward_reads(self) -> list[tuple[int, int]]:
        """The memory (byte ranges) that the vector-Jacobian product reads as it is then, not
        as a copy the tape kept: changing it before ``vjp`` would change the gradient."""
        return [ident.span for ident, refs in self.tape.readers.items() if refs]

    def written(self) -> list[tuple[int, int]]:
        """The memory (byte ranges) that recorded operations wrote."""
        return [ident.span for record in self.tape.records for ident in record.writes]

    def _tracked(self, x: Any, what: str) -> bool:
        """Whether the tape follows ``x``; False for an array it never saw (a constant), a
        ``TapegradError`` for a view of memory it follows (``out.reshape(2, 2)`` returned,
        kernels launched on ``X.reshape(-1)``): its derivative would be taken as zero."""
        if self.tape.tracks(x):
            return True
        other = self.tape.ids.overlapping(x)
        if other is None:
            return False
        raise TapegradError(
            f"{getattr(self.f, '__name__', 'the function')}: {what} (shape {tuple(x.shape)}) "
            f"shares memory with an array of shape {other.meta[1]} that its kernels used, "
            "and tapes follow whole arrays: this view would carry no derivative. Use the "
            "array itself, or a recorded copy in the other shape (tg.reshape(x, shape))")

    def plain_outputs(self) -> list[Any]:
        """The outputs with tape scalars as floats."""
        return [float(plain(y)) if isinstance(y, TrackedScalar) else y for y in self.outputs]

    def check_constant(self, k: int, y: Any, sources: list[Any]) -> None:
        """Result ``k`` (not an argument), which no recorded operation made and a derivative
        reaches, taken as a constant (an array: a mask, a table); a ``TapegradError`` where
        that is surely wrong: a number (``np.sum(y)`` for ``tg.sum(y)``) or a view of an
        argument of ``sources`` (those a gradient is wanted for)."""
        name = getattr(self.f, "__name__", "the function")
        if not is_array(y):
            raise TapegradError(
                f"{name}: its result {k} is the number {y!r}, which no operation tapegrad "
                "recorded gave (np.sum(y) or float(...) give plain numbers), and a "
                "derivative reaches it: it would be taken as zero. Compute it with tapegrad's "
                "operations (tg.sum, tg.dot, tg.norm, ...); a constant number can be added "
                "outside the wrapped function")
        if overlaps(y, [extent(a) for a in sources if is_array(a)]):
            raise TapegradError(
                f"{name}: its result {k} is a view of one of its arguments (x[1:], "
                "x.reshape(...)), and a derivative reaches it: no recorded operation "
                "connects the two, so it would be taken as zero. Return a recorded copy "
                "(tg.reshape(x, shape), or a kernel's output), or take the view outside the "
                "wrapped function")

    def vjp(self, cotangents: Sequence[Any], wanted: Sequence[bool] | None = None) -> list[Any]:
        """Per argument, ``sum_k cotangents[k] . d outputs[k] / d argument`` (an array, a
        float, or None where the argument is not active, not ``wanted``, or nothing connects
        it)."""
        wanted = self.active if wanted is None else [a and w for a, w in zip(self.active, wanted)]
        sources = [(k, a) for k, (a, on) in enumerate(zip(self.args, wanted))
                   if on and (isinstance(a, TrackedScalar) or is_array(a)
                              and np.dtype(a.dtype).kind == "f"
                              and self._tracked(a, f"its argument {k}"))]
        outputs, seeds, passed = [], [], []
        for k, (y, w) in enumerate(zip(self.outputs, cotangents)):
            if w is None:
                continue
            if isinstance(y, TrackedScalar) or is_array(y) and self._tracked(y, f"its result {k}"):
                outputs.append(y)
                seeds.append(w)
            elif any(wanted) and _nonzero(w):
                # (an argument returned as it is: its derivative is the identity, or none
                # where no gradient is wanted for it)
                j = next((j for j, a in enumerate(self.args) if a is y), None)
                if j is None:
                    self.check_constant(k, y, [a for a, on in zip(self.args, wanted) if on])
                elif wanted[j]:
                    passed.append((j, w))
        grads: list[Any] = [None] * len(self.args)
        if outputs and sources:
            for (k, _), g in zip(sources, self.tape.vjp(outputs, seeds,
                                                        [a for _, a in sources])):
                grads[k] = g
        for j, w in passed:
            grads[j] = w if grads[j] is None else grads[j] + w
        return grads


def overlaps(x: Any, spans: list[tuple[int, int]]) -> bool:
    """Whether array ``x`` shares memory with one of the byte ranges ``spans``."""
    lo, hi = extent(x)
    return any(a < hi and lo < b for a, b in spans)


def _only_the_tape_holds(refs: list[tuple]) -> bool:
    """Whether the array that ``refs`` (a tape's readers of one array: record, position,
    array) read is held by nothing but the tape.  Counted: each reader's entry, and the
    record's own reference at that position (the one ``redirect`` replaces) where it is
    found; a lower bound of the tape's references, which can only make an array look
    reachable from outside and be fingerprinted."""
    x = refs[-1][2]                       # (the caller's variable that only_tape_holds allows)
    slots = {(id(record), pos) for record, pos, _ in refs if _slot(record, pos) is x}
    return only_tape_holds(x, len(refs) + len(slots))


def _slot(record: Any, pos: int) -> Any:
    """What ``record`` holds at reader position ``pos`` (a launch's argument, a host
    reduction's operand), or None."""
    held = record.values if isinstance(record, LaunchRecord) else getattr(record, "views", None)
    return held[pos] if isinstance(held, list) and 0 <= pos < len(held) else None


def outside_name(f: Any, args: Sequence[Any], x: Any) -> str:
    """How ``f`` reaches array ``x`` from outside its arguments, for a message: "the global
    W", "the closure variable W", "the global params['W']", or "an array"."""
    base = owner(x)
    for path, kind, want in outside(f, tuple(args)):
        # (kind_of: ``outside`` takes anything with a shape and a dtype for an array, the
        # numpy module too)
        if kind == "array" and kind_of(want[0]) is not None \
                and (owner(want[0]) is base or overlaps(x, [extent(want[0])])):
            return _path_words(f, path)
    return "an array"


def _path_words(f: Any, path: tuple) -> str:
    """``path`` (as ``outside`` gives it) in words: "the global W", "the closure variable
    params['W']", "the global W (through helper)"."""
    names: list[tuple[str, str]] = []      # (kind, name) per step that has a name
    v = f
    for step in path:
        target = getattr(v, "__func__", v)
        try:
            if step[0] == "global":
                names.append(("global", step[1]))
                v = target.__globals__[step[1]]
            elif step[0] == "cell":
                free = target.__code__.co_freevars
                names.append(("closure variable", free[step[1]]))
                v = target.__closure__[step[1]].cell_contents
            elif step[0] == "self":
                names.append(("attribute", "self"))
                v = v.__self__
            elif names:
                kind, name = names[-1]
                names[-1] = (kind, name + (f"[{step[1]!r}]" if step[0] == "item"
                                           else f".{step[1]}"))
                v = v[step[1]] if step[0] == "item" else getattr(v, step[1])
        except (LookupError, AttributeError, TypeError, ValueError):
            break
    if not names:
        return "an array"
    kind, name = names[-1]
    through = " -> ".join(n for _, n in names[:-1])
    return f"the {kind} {name}" + (f" (through {through})" if through else "")


def _float_number(a: Any) -> bool:
    return isinstance(a, (float, np.floating))


def _nonzero(w: Any) -> bool:
    """Whether a cotangent (a number, a NumPy or CuPy array) holds anything but zeros (JAX's
    float0 and integers hold none)."""
    if not hasattr(w, "dtype"):
        w = np.asarray(w)
    return np.dtype(w.dtype).kind in "fc" and bool((w != 0).any())
