"""``tg.register_adjoint``: make an opaque host callable (a CuPy RawKernel launch, a NumPy or
SciPy function) a recorded, differentiable operation with a hand-written reverse rule."""

from __future__ import annotations

import functools
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapegrad.errors import TapegradError
from tapegrad.runtime.nans import collector, uncollected
from tapegrad.tape.arrays import is_array
from tapegrad.tape.forward import ForwardContext
from tapegrad.tape.identity import overlapping
from tapegrad.tape.modes import current_forward, new_scalar, paused, recording_tapes, suspended
from tapegrad.tape.records import Record
from tapegrad.tape.scalars import DualScalar, TrackedScalar, plain_value


@dataclass
class OpRecord(Record):
    rule: Callable[..., Any] | None = None
    views: list[Any] = field(default_factory=list)        # the arguments as the op saw them
    arg_ids: list[int | None] = field(default_factory=list)
    arg_nodes: list[int | None] = field(default_factory=list)
    out_id: int | None = None
    op_name: str = ""

    def redirect(self, pos: int, copy: Any) -> None:
        self.views[pos] = copy

    def backward(self, sweep: Any) -> None:
        if self.out_id is not None:
            y_bar = sweep.shadow(self.out_id)
        else:
            y_bar = sweep.scalar_bar.get(self.scalar_out, 0.0)
        cotangents = check_count(self.op_name, self.rule(y_bar, *self.views), len(self.views))
        for k, (ident, node, c) in enumerate(zip(self.arg_ids, self.arg_nodes, cotangents)):
            if c is None:
                continue
            if ident is not None and ident in sweep.active_ids:
                shadow = sweep.shadow(ident)
                check_like(self.op_name, "reverse rule's cotangent", k, c, shadow)
                shadow[...] += c
            elif node is not None and node in sweep.active_nodes:
                check_like(self.op_name, "reverse rule's cotangent", k, c, None)
                sweep.add_scalar_bar(node, float(c))


def register_adjoint(fn: Callable[..., Any], reverse: Callable[..., Any],
                     forward: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """Wrap ``fn`` so that tapes record it; ``reverse(y_bar, *args)`` returns one cotangent per
    argument (``None`` for arguments without one).

    ``fn`` must return a new array or a float and leave its arguments unchanged.  It runs
    unrecorded (and outside forward mode): the rules stand for everything it does, kernels it
    launches included.

    >>> import numpy as np, tapegrad as tg
    >>> square = tg.register_adjoint(np.square, reverse=lambda y_bar, x: 2 * x * y_bar)
    >>> x = np.array([1.0, 2.0])
    >>> with tg.Tape() as tape:
    ...     loss = tg.sum(square(x))
    >>> tape.gradient(loss, [x])[0].tolist()
    [2.0, 4.0]
    """
    name = getattr(fn, "__name__", type(fn).__name__)

    @functools.wraps(fn)
    def op(*args: Any) -> Any:
        ctx = current_forward()
        if ctx is not None:
            return _forward(ctx, fn, forward, name, args)
        tapes = recording_tapes()
        plain = [float.__float__(a) if isinstance(a, TrackedScalar) else a for a in args]
        watcher = collector()
        if watcher is not None:           # (tapegrad.testing.check_tape: not its kernels)
            watcher.op(name, fn, reverse, forward, plain)
            with uncollected():
                return call_and_record(args, plain, tapes)
        return call_and_record(args, plain, tapes)

    def call_and_record(args: tuple, plain: list, tapes: tuple) -> Any:
        if not tapes:
            return fn(*plain)
        with paused():
            y = fn(*plain)
        check_result(name, y, plain)
        if not is_array(y):
            y = new_scalar(float(y), tapes)
        for tape in tapes:
            record = OpRecord(reads=[tape.track(a) for a in args if is_array(a)], writes=[],
                              name=name, op_name=name, rule=reverse, views=list(plain),
                              arg_ids=[tape.track(a) if is_array(a) else None for a in args],
                              arg_nodes=[a.node_on(tape) if isinstance(a, TrackedScalar)
                                         else None for a in args])
            record.scalars_in = [n for n in record.arg_nodes if n is not None]
            if is_array(y):
                record.out_id = tape.track(y)
                record.writes = [record.out_id]
            else:
                record.scalar_out = y.node_on(tape)
            tape.record_host(record, [(a, k) for k, a in enumerate(args) if is_array(a)])
        return y

    op.forward_rule = forward
    return op


def _forward(ctx: ForwardContext, fn: Callable[..., Any], forward: Callable[..., Any] | None,
             name: str, args: tuple) -> Any:
    """Forward mode: ``forward(*args, *arg_tangents)`` gives the result's tangent."""
    if ctx.taped and any(isinstance(a, ctx.dual) or (is_array(a) and ctx.tangent_of(a)
                                                    is not None) for a in args):
        raise TapegradError(
            f"tg.hvp cannot differentiate twice through {name}: a function made with "
            "tg.register_adjoint has first-derivative rules only, and its second derivatives "
            "would be silently missing. Compute its part of the Hessian-vector product "
            "yourself, or write it as kernels (which tg.hvp differentiates twice)")
    plain = [plain_value(a) if isinstance(a, DualScalar) else a for a in args]
    with suspended():        # (the rule gives the tangent of everything fn does)
        y = fn(*plain)
    per_arg = [a.tangents if isinstance(a, DualScalar) else
               (ctx.tangent_of(a) if is_array(a) else None) for a in args]
    if all(t is None for t in per_arg):
        return y
    if forward is None:
        raise TapegradError(f"{name} was registered with a reverse rule only; forward mode needs "
                            "tg.register_adjoint(fn, reverse=..., forward=rule) with "
                            "rule(*args, *arg_tangents) returning the result's tangent")
    check_result(name, y, plain)
    tangents = []
    for j in range(ctx.width):
        dots = [None if t is None else t[j] for t in per_arg]
        with suspended():    # (the rule may run forward mode on kernels itself)
            tangents.append(forward(*plain, *dots))
        check_like(name, "forward rule's tangent", None, tangents[-1],
                   y if is_array(y) else None)
    if is_array(y):
        ctx.seed(y, tangents)
        return y
    return DualScalar(plain_value(y), tangents)


def check_result(name: str, y: Any, args: list[Any]) -> None:
    """What a registered function may return: one new array or one number.  Its argument
    itself or a view of it (``np.asarray``, ``x.reshape``) would be one array to the tape
    twice (its rule's cotangent added into the shadow it reads: a gradient twice as big)."""
    if is_array(y):
        shared = next((k for k, a in enumerate(args) if is_array(a) and overlapping(y, a)),
                      None)
        if shared is not None:
            raise TapegradError(
                f"{name}, registered with tg.register_adjoint, returned an array sharing memory "
                f"with its argument {shared} (the argument itself, or a view of it as "
                "x.reshape or np.asarray give); a registered function must return a new "
                "array: return y.copy()")
    elif not isinstance(y, numbers.Real) and not (hasattr(y, "shape") and y.shape == ()):
        raise TapegradError(
            f"{name}, registered with tg.register_adjoint, returned a {type(y).__name__}; a "
            "registered function returns one array or one number: for several outputs "
            "register one function per output, or return them stacked into one array")


def check_count(name: str, cotangents: Any, n: int) -> tuple[Any, ...]:
    """A reverse rule's result as one cotangent per argument (``n`` of them, ``None`` where
    there is none); a bare value is the one cotangent of a one-argument function."""
    if not isinstance(cotangents, (tuple, list)):
        cotangents = (cotangents,)
    if len(cotangents) != n:
        raise TapegradError(f"the reverse rule of {name} returned {len(cotangents)} "
                            f"cotangent(s) for {n} argument(s); return one per argument (None "
                            "where there is none)")
    return tuple(cotangents)


def check_like(name: str, what: str, k: int | None, value: Any, like: Any) -> None:
    """A rule's cotangent (of argument ``k``) or tangent must have the shape of what it
    stands for: ``like``'s (an array), or be a number (``like`` None).  NumPy would
    broadcast a wrong one silently (a summed cotangent added into every element)."""
    shape = tuple(getattr(value, "shape", ()))
    wanted = tuple(like.shape) if like is not None else ()
    if shape != wanted or (like is not None and not is_array(value) and wanted != ()):
        of = f" for argument {k}" if k is not None else ""
        got = f"an array of shape {shape}" if is_array(value) else f"a {type(value).__name__}"
        raise TapegradError(
            f"the {what}{of} of {name} (tg.register_adjoint) is {got}, but it must have the "
            + (f"shape {wanted} of that array" if like is not None else "form of a number")
            + ": return one value per element of what it stands for")
