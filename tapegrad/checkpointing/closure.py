"""What checkpointed code may read from outside: only what it is given.  Code that is not kept on
the tape but recomputed in the sweep sees the enclosing tape's arrays and scalars through
closures as constants, and their gradients through it would be lost without a word; these
checks refuse that instead."""

from __future__ import annotations

from typing import Any

from tapegrad.errors import TapegradError
from tapegrad.runtime.launch import interceptor, launch_now
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import array_key
from tapegrad.tape.modes import paused, tapes_var
from tapegrad.tape.scalars import TrackedScalar


def check_closure(inner: Any, tapes: tuple, given: tuple, who: str) -> None:
    """Refuse what the code ``inner`` recorded read from outside, other than ``given``, that
    an enclosing tape (``tapes``) follows: a tape scalar, or an array that tape tracks."""
    if inner.foreign_scalars:
        raise _closed_over_scalar(who)
    keys = {array_key(x) for x in given if is_array(x)}
    for outer in tapes:
        for key, ident in inner.ids.by_memory.items():
            if key in outer.ids.by_memory and key not in keys and ident.alive():
                raise TapegradError(
                    f"{who} reads an array of shape {ident.meta[1]} from outside that the tape "
                    "follows, without taking it as an argument (params= for "
                    "tg.checkpoint_loop): its gradient through the checkpointed code would be "
                    "lost. Pass it in and use the argument")


class unrecorded(paused):
    """``with unrecorded():`` runs checkpointed code unrecorded (a loop's advances, a
    segment's forward run), refusing a launch given a tape scalar that the code took from
    outside rather than as an argument (unrecorded, its derivative would be lost)."""

    def __enter__(self) -> None:
        self.tokens = (tapes_var.set(()), interceptor.set(_launch_unrecorded))


def _launch_unrecorded(cfg: Any, args: tuple, ndrange: Any) -> None:
    for a in args:
        if isinstance(a, TrackedScalar):
            raise _closed_over_scalar()
    launch_now(cfg, args, ndrange)


def _closed_over_scalar(who: str = "the function") -> TapegradError:
    return TapegradError(
        f"{who} uses a tape scalar from outside without taking it as an argument (params= "
        "for tg.checkpoint_loop), so its gradient through the checkpointed code would be lost; "
        "pass it in and use the argument")
