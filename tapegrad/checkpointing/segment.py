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
from tapegrad.checkpointing.guards import outside_arrays, reached, refuse_rebound
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array
from tapegrad.tape.modes import current_forward, paused, recording_tapes
from tapegrad.tape.registry import register_adjoint
from tapegrad.tape.scalars import TrackedScalar
from tapegrad.tape.tape import Tape
from tapegrad.tracebacks import api_boundary


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
    ran: list[Any] = [None]        # the forward run's result, handed to register_adjoint

    def reverse(y_bar: Any, *views: Any) -> tuple:
        hidden = views[-1]
        args, outside = views[:-1 - len(hidden.arrays)], views[-1 - len(hidden.arrays):-1]
        refuse_rebound(fn, hidden.paths, who, name, f"{name} ran",
                       f"Pass it in as an argument: {name}(..., {{}})")
        if any(x is not a for x, a in zip(outside, hidden.arrays)):
            x = next(x for x, a in zip(outside, hidden.arrays) if x is not a)
            raise TapegradError(
                f"{who} reads an array of shape {tuple(x.shape)} from outside, and a recorded "
                "operation after it overwrote that array: its recomputation in the reverse "
                "sweep would read the new contents. Pass the array in as an argument")
        inner = Tape(watch_changes=False)
        with paused(), inner:
            # (floats are what may have a derivative; an int stays an int: a count, an index)
            given = [inner.watch(float(a)) if _float(a) else a for a in args]
            y = fn(*given)
        sources = [(k, a) for k, a in enumerate((*given, *outside))
                   if isinstance(a, TrackedScalar)
                   or is_array(a) and inner.tracks(a) and np.dtype(a.dtype).kind == "f"]
        # (a segment that communicates runs its adjoint on every process, with a zero
        # cotangent where it has none: the others' adjoints wait for its messages)
        grads = _vjp(inner, y, y_bar, [a for _, a in sources]) \
            if sources or hidden.comms else []
        out: list[Any] = [None] * len(views)
        for (k, _), g in zip(sources, grads):
            out[k] = g
        return tuple(out)

    op = register_adjoint(lambda *_: ran[0], reverse)

    @functools.wraps(fn)
    @api_boundary
    def wrapped(*args: Any) -> Any:
        if current_forward() is not None or not recording_tapes():
            return fn(*args)                 # (forward mode: tangents flow through fn itself)
        plain = [float.__float__(a) if isinstance(a, TrackedScalar) else a for a in args]
        # run on a throwaway tape (the enclosing tapes paused), to see what fn reads from
        # outside: tape scalars are refused, float arrays become hidden arguments of the
        # recorded operation (the tapes follow them, their gradients come out right); then
        # kept as nothing but its arguments
        inner = Tape(watch_changes=False)
        with unrecorded(), inner:
            ran[0] = fn(*plain)
        check_closure(inner, who)
        outside = outside_arrays(inner, plain, who)
        hidden = _Hidden(outside, inner, ran[0])
        hidden.paths = reached(fn, outside)     # (where fn reaches them by name)
        try:
            y = op(*args, *outside, hidden)
        finally:
            ran[0] = None
        hidden.mark(y)
        return y
    return wrapped


def _vjp(inner: Tape, y: Any, y_bar: Any, sources: list) -> list:
    """``inner.vjp([y], [y_bar], sources)``; a scalar ``y``'s cotangent is the enclosing
    sweep's, this process's share already (``Sweep.copies_of``): not divided again."""
    node = y.node_on(inner) if isinstance(y, TrackedScalar) else None
    if node is None or not inner.holds_copies:
        return inner.vjp([y], [y_bar], sources)
    grads = inner.new_gradients(sources, "tg.checkpoint")
    sweep = inner.sweep(dict(grads), sources, set(grads), set())
    sweep.add_scalar_bar(node, float(y_bar))
    sweep.run([y], sources)
    return inner.gradients_of(sources, grads, sweep)


class _Hidden:
    """The arrays a segment read from outside, as its recorded operation's last argument
    (no array: the tape does not track it): the reverse rule tells them from the rest, and
    finds one a later operation overwrote (the tape hands the rule a copy instead).  Also
    what its forward run on a tape of its own (``inner``, its result ``y``) showed of MPI:
    the communicators it talks over, and the one whose processes hold a scalar result."""

    def __init__(self, arrays: list[Any], inner: Tape, y: Any):
        self.arrays = arrays
        self.paths: list = []             # where fn reaches them by name (guards.reached)
        self.comms: list = []
        self.holder = None
        if any(r.communicates for r in inner.records):
            from tapegrad.mpi.holders import communicators, holder
            self.comms = communicators(inner.records)
            node = y.node_on(inner) if isinstance(y, TrackedScalar) else None
            if node is not None and inner.holds_copies:
                self.holder = holder(inner.records, node)

    def mark(self, y: Any) -> None:
        """The enclosing tapes' records of the segment (result ``y``) as the operations
        they stand for: one whose recomputation communicates runs in every sweep on every
        process (``Record.communicates``), and a scalar result held by the processes of a
        communicator is held so here too (``Record.copies``: the seed of a target made from
        it, ``tapegrad/mpi/holders.py``), as the plain tape's allreduce would be."""
        if not self.comms:
            return
        for tape in recording_tapes():
            record = tape.records[-1]
            record.communicates, record.comms = True, tuple(self.comms)
            if self.holder is not None and isinstance(y, TrackedScalar) \
                    and y.node_on(tape) == record.scalar_out:
                record.copies, record.comm = self.holder.Get_size(), self.holder
                tape.holds_copies = True


def _float(a: Any) -> bool:
    return isinstance(a, (float, np.floating))
