"""Forward mode over a host function (``tg.jvp``, ``tg.jacobian(..., mode=tg.Forward)``,
``tg.autodiff(tg.Forward, f, ...)``): ``f`` runs once with tangents, and a result that carries
none is told apart as reverse mode tells it (a source nothing used, an array NumPy made, a
number: refused; a constant that operations computed: zero)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.api.launches import batch_width, forward_annotation
from tapegrad.api.sources import call_on_sources, check_direction, is_number
from tapegrad.errors import TapegradError
from tapegrad.tape.activity import BatchDuplicated, Const, Mode, annotate
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.forward import ForwardContext
from tapegrad.tape.identity import array_key
from tapegrad.tape.modes import refuse_nested
from tapegrad.tape.scalars import DualScalar, plain_value


class _ForwardRun(ForwardContext):
    """Forward mode over a host function (tg.jvp, tg.jacobian, tg.autodiff), noting what a
    tape would have recorded: which seeded arrays had their tangents asked for (by a launch,
    a reduction, a registered function: ``tangent_of``), and which arrays such operations
    were given.  A result that carries no tangent is then told apart as reverse mode tells
    it: from a source nothing used, or an array NumPy made (both refused: its derivative
    would be a silent zero), or an array the operations used but no tangent reached (a
    constant: zero, as ``tg.vjp`` gives)."""

    def __init__(self, width: int) -> None:
        super().__init__(width)
        self.unread: dict[Any, tuple[str, Any]] = {}   # seeded sources nothing read yet
        # (by id: arrays need not be hashable; held weakly: a long simulation's states are
        # freed as they are dropped)
        self.used: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def watch(self, x: Any, label: str) -> None:
        """``x`` (seeded) is a source, ``label`` in messages."""
        self.unread[self.ids.find(x)] = (label, x)

    def tangent_of(self, x: Any) -> list[Any] | None:
        found = super().tangent_of(x)
        if found is not None and self.unread:
            self.unread.pop(self.ids.find(x), None)
        if self.used.get(id(x)) is not x:
            try:
                self.used[id(x)] = x
            except TypeError:       # (no weak references to this array type)
                pass
        return found

    def was_used(self, y: Any) -> bool:
        """Whether an operation of the run was given ``y`` (or another view of its memory)."""
        if self.used.get(id(y)) is y:
            return True
        key = array_key(y)
        return any(array_key(a) == key for a in list(self.used.values()))

    def refuse_unread(self, who: str) -> None:
        """Refuse a source whose tangent nothing read (where a result carries none)."""
        if self.unread:
            label, x = next(iter(self.unread.values()))
            raise TapegradError(
                f"{who}: {label}, an array of shape {tuple(x.shape)}, was not used by any "
                "kernel launch or tapegrad operation, so f's result carries no tangent and its "
                "derivative would be a silent 0 (reverse mode refuses it too). If f copies it "
                "with NumPy (x.copy(), np.array(x), x * 1) or computes from it with NumPy, "
                "tapegrad cannot see that: use tg.copy(x), or launch kernels on x itself")


def forward_host(mode: Mode, f: Callable[..., Any], ret: Any, args: tuple,
                           who: str = "tg.autodiff", labels: tuple[str, ...] = (),
                           several_out: bool = False) -> tuple:
    """Run ``f`` with tangents: kernels launch their tangent kernels, reductions carry duals.
    ``who``, ``labels``: the call and its sources (by default ``argument k``) in messages;
    ``several_out``: a tuple ``f`` returns is several outputs, each with its tangents."""
    refuse_nested()
    annotated = [annotate(a) for a in args]
    width = batch_width(annotated)
    ctx = _ForwardRun(width)
    name = getattr(f, "__name__", "f")
    call_args = []
    for k, a in enumerate(annotated):
        label = labels[k] if labels else f"argument {k}"
        kind, dirs = forward_annotation(name, f"argument {k}", a, width)
        if kind == "dup":
            for d in dirs:     # (its shape and dtype checked: the device is left)
                check_direction(name, a.val, d, names=(f"argument {k}", "its tangent"))
            ctx.seed(a.val, list(dirs))
            ctx.watch(a.val, label)
            call_args.append(a.val)
        elif kind == "active":
            call_args.append(DualScalar(float(a.val), dirs))
        else:
            call_args.append(a.val)
    with ctx:
        result = call_on_sources(name, None, [], lambda: f(*call_args), f)
    several = several_out and isinstance(result, tuple)
    outputs = result if several else (result,)
    primals = tuple(plain_value(y) if isinstance(y, DualScalar) else y for y in outputs)
    primal = primals if several else primals[0]
    if ret is Const or isinstance(ret, Const):
        return (primal,) if mode.with_primal else ()
    batch = ret is BatchDuplicated or isinstance(ret, BatchDuplicated)
    tangents = []
    for y in outputs:
        ts = _result_tangents(who, ctx, y, width)
        tangents.append(ts[0] if width == 1 and not batch else tuple(ts))
    tangent = tuple(tangents) if several else tangents[0]
    return (tangent, primal) if mode.with_primal else (tangent,)


def _result_tangents(who: str, ctx: _ForwardRun, result: Any, width: int) -> list[Any]:
    """The tangents of one of ``f``'s results; one that carries none is zero only where
    reverse mode gives zero too (an array the run's operations used, none of them carrying
    a tangent into it), else refused."""
    if isinstance(result, DualScalar):
        return list(result.tangents)
    if is_array(result):
        used = ctx.was_used(result)      # (before tangent_of, which notes it as used)
        t = ctx.tangent_of(result)
        if t is not None:
            ctx.unchanged(result, None)
            return list(t)
        if not used:
            raise TapegradError(
                f"{who}: f returned an array of shape {tuple(result.shape)} that carries no "
                "tangent and that no kernel launch or tapegrad operation was given: NumPy made "
                "it (B * 2.0, B.copy(), np.exp(B), B.reshape(...)), which tapegrad cannot see, "
                "so its derivative would be a silent 0. Return an array a kernel wrote, or "
                "make it with tapegrad's operations (tg.scale(B, 2.0), tg.copy(B), "
                "tg.reshape(B, shape))")
        ctx.refuse_unread(who)
        return [zeros_like(result) for _ in range(width)]
    if not is_number(result):
        raise TapegradError(f"forward mode needs f to return a scalar or an array, got "
                            f"{type(result).__name__}")
    ctx.refuse_unread(who)
    raise TapegradError(
        f"{who}: f returned the number {_shown(result)}, which carries no tangent: no "
        "operation that a tangent reached computed it, so its derivative would be a silent 0. "
        "A number NumPy or Python computes from arrays (np.sum(B), B[0], B.max()) is "
        "invisible to tapegrad: compute it with tg.sum, tg.dot, tg.mean or tg.norm (and "
        "+ - * / ** on their results). A number that does not depend on x has derivative 0 "
        "and needs no differentiating (tg.gradient refuses it too)")


def _shown(number: Any) -> str:
    return repr(float(number) if isinstance(number, (float, np.floating)) else int(number))
