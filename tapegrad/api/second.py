"""``tg.hvp``: Hessian-vector products, as the gradient of a forward-mode run (reverse over
forward).

``f`` runs once in forward mode along ``v`` while a tape records it: every launch runs as its
tangent kernel, launched as a kernel of its own (values and tangents in one launch), and host
scalars carry their tangents as tape scalars (``tape/duals.py``).  The tangent of the result,
``grad f(x) . v``, is then a recorded function of ``x``, and one reverse sweep gives its
gradient, ``H v`` (the Hessian is symmetric).  Reverse over forward rather than forward over
reverse: everything the reverse sweep does (kept states, checkpoints, adjoints of barriers,
atomics and local memory, every backend) applies to the tangent kernels unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tapegrad.api.sources import call_on_sources, check_direction, stamp_sources
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.duals import TapedDual
from tapegrad.tape.forward import ForwardContext
from tapegrad.tape.hostops import sum as tg_sum
from tapegrad.tape.modes import recording_tapes, refuse_nested
from tapegrad.tape.scalars import TrackedScalar, plain
from tapegrad.tape.sweep import not_a_scalar
from tapegrad.tape.tape import Tape
from tapegrad.tracebacks import api_boundary


@api_boundary
def hvp(f: Callable[..., Any], x: Any, v: Any) -> Any:
    """The Hessian of the scalar ``f(x)`` times ``v``: a new array like ``x`` (or a float,
    for a number ``x``), from one forward-mode run of ``f`` that a tape records and one
    reverse sweep (about twice a gradient's cost).

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def cube(B, A):
    ...     i = tg.index()
    ...     B[i] = A[i] * A[i] * A[i]
    >>> def f(x):
    ...     y = np.zeros_like(x)
    ...     cube(tg.CPU())(y, x, ndrange=x.size)
    ...     return tg.sum(y)
    >>> tg.hvp(f, np.array([1.0, 2.0]), np.array([1.0, 0.5])).tolist()   # 6 x v
    [6.0, 6.0]
    """
    refuse_nested()
    if recording_tapes():
        raise TapegradError("tg.hvp inside a recording tg.Tape: its result is a new array the "
                            "tape cannot differentiate (third derivatives); call it outside")
    check_direction("tg.hvp(f, x, v)", x, v)
    tape = Tape(watch_changes=False)   # the sweep follows at once: nothing can change
    with tape:
        if is_array(x):
            source = x
            stamped = stamp_sources(tape, [("x", x)])
            with ForwardContext(1, on_tape=True) as ctx:
                ctx.seed(x, [v.copy()])      # (v's own copy: a step may update x in place)
                target = _tangent(tape, ctx, call_on_sources("tg.hvp", tape, stamped,
                                                              lambda: f(x), f))
        else:
            source = tape.watch(float(plain(x)))
            with ForwardContext(1, on_tape=True) as ctx:
                target = _tangent(tape, ctx, call_on_sources(
                    "tg.hvp", tape, [], lambda: f(TapedDual(source, float(plain(v)))), f))
    if target is None:       # grad f . v does not depend on x: f is linear (or constant)
        return zeros_like(x) if is_array(x) else 0.0
    return tape.vjp([target], [1.0], [source])[0]     # (zero where f is linear)


def _tangent(tape: Tape, ctx: ForwardContext, result: Any) -> Any:
    """The recorded tangent of ``f``'s scalar result (None where it is a constant)."""
    if isinstance(result, TapedDual):
        return result.tangent if isinstance(result.tangent, TrackedScalar) else None
    if is_array(result) and getattr(result, "size", 0) == 1 and tape.tracks(result):
        t = ctx.tangent_of(result)
        if t is None:
            return None
        ctx.unchanged(result, None)
        with ctx.on_tape():
            return tg_sum(t[0])
    raise not_a_scalar(result)
