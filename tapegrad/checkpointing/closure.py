"""What checkpointed code may read from outside.  Code that is not kept on the tape but
recomputed in the sweep sees the enclosing tape's scalars through closures as constants, and
their gradients through it would be lost without a word: these checks refuse that.  (Float
arrays it reads from outside are followed as hidden parameters: ``guards.outside_arrays``.)"""

from __future__ import annotations

from typing import Any

from tapegrad.errors import TapegradError
from tapegrad.runtime.launch import interceptor, launch_now, merging
from tapegrad.tape.modes import paused, tapes_var
from tapegrad.tape.scalars import TrackedScalar


def check_closure(inner: Any, who: str) -> None:
    """Refuse a tape scalar that the code ``inner`` recorded took from outside rather than as
    an argument: recomputed in the sweep, it would be a constant there.  (Float arrays read
    from outside are followed instead: ``guards.outside_arrays``.)"""
    if inner.foreign_scalars:
        raise _closed_over_scalar(who)


class unrecorded(paused):
    """``with unrecorded():`` runs checkpointed code unrecorded (a loop's advances, a
    segment's forward run), refusing a launch given a tape scalar that the code took from
    outside rather than as an argument (unrecorded, its derivative would be lost)."""

    def __enter__(self) -> None:
        self.tokens = (tapes_var.set(()), interceptor.set(merging(_launch_unrecorded)))


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
