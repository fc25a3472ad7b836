"""``tg.checkpoint(fn)``: a host function kept on the tape as one operation whose internals are
recomputed in the reverse sweep (like ``jax.checkpoint``): the tape holds its arguments, not
what its launches would have kept.

It is a ``tg.register_adjoint`` operation whose reverse rule runs ``fn`` again on a tape of its
own and takes that tape's vector-Jacobian product; forward mode runs ``fn`` itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.checkpointing.closure import check_closure, unrecorded
from tapegrad.tape.arrays import is_array
from tapegrad.tape.modes import current_forward, paused, recording_tapes
from tapegrad.tape.registry import register_adjoint
from tapegrad.tape.scalars import TrackedScalar
from tapegrad.tape.tape import Tape


def checkpoint(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (arrays and numbers in, a new array or a scalar out) as one recorded operation
    that the reverse sweep recomputes instead of keeping what its launches need: memory for
    time, for a costly segment that is not a loop (loops: ``tg.checkpoint_loop``).  Everything
    ``fn`` needs from outside comes in as an argument.

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def cube(out, x):
    ...     i = tg.index()
    ...     out[i] = x[i] * x[i] * x[i]
    >>> @tg.checkpoint
    ... def segment(x):
    ...     y = np.empty_like(x)
    ...     cube(tg.CPU())(y, x, ndrange=x.size)
    ...     return tg.sum(y)
    >>> x = np.array([1.0, 2.0])
    >>> with tg.Tape() as tape:
    ...     loss = segment(x)
    >>> tape.gradient(loss, [x])[0].tolist()
    [3.0, 12.0]
    """
    name = getattr(fn, "__name__", "function")
    who = f"tg.checkpoint's {name}"

    def forward_run(*args: Any) -> Any:
        # recorded on a throwaway tape, to refuse what it reads from outside (the enclosing
        # tapes are paused here); then kept as nothing but its arguments
        inner = Tape(watch_changes=False)
        with unrecorded(), inner:
            y = fn(*args)
        check_closure(inner, outer_tapes[-1], args, who)
        return y

    def reverse(y_bar: Any, *args: Any) -> tuple:
        inner = Tape(watch_changes=False)
        with paused(), inner:
            given = [inner.watch(float(a)) if _number(a) else a for a in args]
            y = fn(*given)
        sources = [(k, a) for k, a in enumerate(given)
                   if isinstance(a, TrackedScalar)
                   or is_array(a) and inner.tracks(a) and np.dtype(a.dtype).kind == "f"]
        grads = inner.vjp([y], [y_bar], [a for _, a in sources]) if sources else []
        out: list[Any] = [None] * len(args)
        for (k, _), g in zip(sources, grads):
            out[k] = g
        return tuple(out)

    outer_tapes: list[tuple] = [()]
    op = register_adjoint(forward_run, reverse)

    @functools.wraps(fn)
    def wrapped(*args: Any) -> Any:
        if current_forward() is not None or not recording_tapes():
            return fn(*args)                 # (forward mode: tangents flow through fn itself)
        outer_tapes[-1] = recording_tapes()
        return op(*args)
    return wrapped


def _number(a: Any) -> bool:
    return isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool)
