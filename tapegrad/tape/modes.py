"""What records or differentiates in this thread: the recording tapes and the forward-mode run.

Recording state is per context (thread or asyncio task), so two threads each inside its own
tape record only their own launches.  Launches reach a tape or forward mode through the
runtime's ``interceptor``, which the contexts here set and clear with it.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from tapegrad.errors import TapegradError
from tapegrad.runtime.launch import interceptor

# The tapes recording in this thread (or asyncio task), outermost first: recording state is
# per context, so two threads each inside its own tape record only their own launches.
tapes_var: ContextVar[tuple[Any, ...]] = ContextVar("tapegrad_tapes", default=())


def current_tape() -> Any | None:
    """The innermost tape that is recording in this thread, if any."""
    tapes = tapes_var.get()
    return tapes[-1] if tapes else None


def recording_tapes() -> tuple[Any, ...]:
    """Every tape recording in this thread, outermost first: a nested tape's operations are
    recorded on each (as TensorFlow's nested ``GradientTape``s do), so an enclosing tape's
    gradient includes what an inner one saw."""
    return tapes_var.get()


class paused:
    """``with paused():`` runs its body unrecorded: a registered adjoint's own function, whose
    rule stands for everything inside it (its launches recorded too counted twice)."""

    def __enter__(self) -> None:
        self.tokens = (tapes_var.set(()), interceptor.set(None))

    def __exit__(self, *exc: Any) -> None:
        tapes_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])


def new_scalar(value: float, tapes: tuple[Any, ...]) -> Any:
    """A tracked scalar with a node on each of ``tapes`` (outermost first)."""
    scalar = tapes[-1].new_node(value)
    if len(tapes) > 1:
        scalar.outer = tuple((t, t.next_node()) for t in tapes[:-1])
    return scalar


# The forward-mode run of this thread (or asyncio task), if any (a tuple of at most one).
forward_var: ContextVar[tuple[Any, ...]] = ContextVar("tapegrad_forward", default=())


# set while tg.jacobian runs its function: tapegrad.mpi's operations refuse it (its rows or
# columns are seeded on every process at once, and a collective would add other processes'
# parts into each one's)
jacobian_var: ContextVar[bool] = ContextVar("tapegrad_jacobian", default=False)


def refuse_jacobian(op: str, comm: Any) -> None:
    """``op`` (a tapegrad.mpi operation over communicator ``comm``) refuses to run under
    ``tg.jacobian`` where another process takes part (asked only then: an exchange is a
    simulation's step)."""
    if jacobian_var.get() and comm.Get_size() > 1:
        raise TapegradError(
            f"tg.jacobian cannot differentiate through {op}: it seeds every row (or column) "
            "on every process at once, and the collectives would add the other processes' "
            "parts into each one's. Over processes use tg.gradient (a scalar objective: "
            "allreduce), or tg.vjp / tg.jvp with one cotangent or direction per call")


def current_forward() -> Any | None:
    active = forward_var.get()
    return active[-1] if active else None


def refuse_nested() -> None:
    """Forward mode inside forward mode: the inner run's results would carry none of the outer
    run's tangents (a kernel-level tg.autodiff(tg.Forward, ...) inside tg.jvp gave a zero
    derivative silently), so it is refused before anything runs."""
    if forward_var.get():
        raise TapegradError(
            "nested forward mode is not supported: tg.jvp, tg.hvp, tg.autodiff(tg.Forward, "
            "...) or tg.jacobian(..., mode=tg.Forward) was called inside a function that "
            "forward mode (or tg.hvp) is already differentiating, and the inner run's results "
            "would not carry the outer "
            "run's tangents. Compute the inner derivative separately, outside the function, and "
            "pass it in; for several directions use one run, tg.jacobian(f, x, mode=tg.Forward) "
            "or tg.autodiff(tg.Forward, f, tg.BatchDuplicated, tg.BatchDuplicated(x, (v1, v2))). "
            "For second derivatives use tg.hvp(f, x, v) on its own")


def refuse_while_recording() -> None:
    """Reverse mode of host code is refused while a tape records: the recording tape sees
    kernel launches and tapegrad operations, not the sweep's derivative computation."""
    if tapes_var.get():
        raise TapegradError(
            "a gradient was asked for while a tape records (tg.gradient, tg.vjp, "
            "tg.jacobian, tg.autodiff of a function or tape.gradient inside a `with "
            "tg.Tape()` block or a function being differentiated): the recording tape "
            "sees kernel launches and tapegrad operations, not the derivative computed "
            "from them, so that gradient would be a constant to it; a loss built from it "
            "(a gradient penalty) would silently lose its second-order terms. Ask for the "
            "gradient after the block ends; for second derivatives use tg.hvp(f, x, v)")


class suspended:
    """``with suspended():`` runs its body outside forward mode: a registered forward rule
    works on plain values and the tangents it is given, and may use forward mode itself."""

    def __enter__(self) -> None:
        self.tokens = (forward_var.set(()), interceptor.set(None))

    def __exit__(self, *exc: Any) -> None:
        forward_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])
