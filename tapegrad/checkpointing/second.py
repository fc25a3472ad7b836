"""``tg.checkpoint_loop`` inside a function ``tg.hvp`` differentiates: the loop over the states
and their tangents together, checkpointed like any loop.

Each step of that loop runs the user's step in forward mode from the states and tangents it is
given: on the tape a recomputation records (forward mode on a tape, ``tape/duals.py``) or
unrecorded between snapshots (plain forward mode).  The loop's snapshots then hold tangents
too, and its reverse sweep differentiates the tangent steps: the Hessian-vector product of a
long simulation at the memory of its snapshots.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from tapegrad.tape.duals import TapedDual
from tapegrad.tape.forward import ForwardContext
from tapegrad.tape.hostops import scale
from tapegrad.tape.modes import recording_tapes
from tapegrad.tape.scalars import DualScalar


def loop_with_tangents(ctx: ForwardContext, loop: Callable[..., Any], step: Callable[..., Any],
                       states: tuple, n: int, params: tuple, single: bool, index: bool,
                       options: dict) -> Any:
    """``loop(step, states, n, params, **options)`` (checkpoint_loop) for forward mode on a
    tape ``ctx``: the states' tangents carried as states, the dual parameters' tangents as
    parameters."""
    m = len(states)
    duals = [k for k, p in enumerate(params) if isinstance(p, TapedDual)]
    given = tuple(p.value if isinstance(p, TapedDual) else p for p in params)
    given += tuple(params[k].tangent for k in duals)

    def tangent_step(*args: Any) -> tuple:
        values, tangents = args[:m], args[m:2 * m]
        ps = list(args[2 * m:2 * m + len(params)])
        dots = args[2 * m + len(params):2 * m + len(params) + len(duals)]
        rest = args[2 * m + len(params) + len(duals):]       # (the step's index)
        taped = bool(recording_tapes())
        # (arrays the step reads from outside, params= or a closure, have their tangents
        # in the run around the loop: ``parent``; the loop passes them as it does any
        # array from outside)
        with ForwardContext(1, on_tape=taped, parent=ctx) as inner:
            for x, t in zip(values, tangents):
                inner.seed(x, [t])
            for k, dot in zip(duals, dots):
                ps[k] = TapedDual(ps[k], dot) if taped else DualScalar(ps[k], (dot,))
            out = step(*values, *ps, *rest)
            outs = (out,) if single else tuple(out) if isinstance(out, (tuple, list)) else None
            if outs is None or len(outs) != m:
                return out              # (not a state: the loop says so)
            return (*outs, *(_tangent(inner, y) for y in outs))

    count = 2 * m + len(given) + index
    tangent_step.__signature__ = inspect.Signature(   # (the loop counts its parameters)
        [inspect.Parameter(f"a{k}", inspect.Parameter.POSITIONAL_ONLY) for k in range(count)])
    tangents = tuple(ctx.tangents_or_zero(x)[0] for x in states)
    with ctx.on_tape():
        out = loop(tangent_step, (*states, *tangents), n, params=given, **options)
    for y, t in zip(out[:m], out[m:]):
        ctx.seed(y, [t])
    return out[0] if single else out[:m]


def _tangent(ctx: ForwardContext, y: Any) -> Any:
    """``y``'s tangent after a step; a state that does not vary gets a recorded zero one
    (the loop refuses states no recorded operation wrote)."""
    t = ctx.tangent_of(y)
    if t is not None:
        return t[0]
    with ctx.on_tape():
        return scale(y, 0.0)
