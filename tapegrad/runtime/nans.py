"""``tg.debug_nans()``: the launch that first writes a NaN or an infinity, and where.

Under it (or with ``TAPEGRAD_DEBUG_NANS=1`` in the environment) every kernel launch — a
primal launch, recorded or not, a tape's replayed adjoints, ``tg.autodiff``'s adjoints,
forward mode's tangents — runs by the general path (no launch plans, no chains of replays,
captured functions run as plain ones), with a copy of each of its float arrays taken where
it lives.  After the launch each array is compared with its copy on its own device (one
number comes back); an element the launch turned into a NaN or an infinity (one that held
another value before) raises :class:`~tapegrad.errors.NonFiniteError` naming the kernel, the
mode (primal, adjoint of the launch at which line, tangent), the user's line, the array and
index, and what the launch's other arrays held at that index and its numbers.  The arrays
are put back as they were before the launch.  Off (the default), a launch tests one flag.

The rule, stated once: an element is blamed on the first checked launch that changes it into
a non-finite value.  A value that was already NaN or infinite and stays so is not a change
(an array initialised to ``-inf`` for a maximum is fine); host code is not checked (a NaN it
makes is blamed on the first launch that spreads it, whose message says that an input there
was not finite).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.callers import user_line
from tapegrad.errors import NonFiniteError


class _Switch:
    """Whether launches are watched.  ``slow`` is read once per launch on the hot path: when
    set, launches take the general path (no launch plans) and captured functions run as
    plain ones.  ``on``: NaN checks (here, for the whole process); ``collectors``: how many
    threads' ``collecting`` blocks are open (``collector()`` is this thread's, or None)."""

    __slots__ = ("on", "depth", "always", "collectors", "slow")

    def __init__(self) -> None:
        self.always = os.environ.get("TAPEGRAD_DEBUG_NANS", "").lower() in ("1", "on", "true",
                                                                              "yes")
        self.depth = 0
        self.on = self.always
        self.collectors = 0
        self.slow = self.on

    def update(self) -> None:
        self.on = self.always or self.depth > 0
        self.slow = self.on or self.collectors > 0


NANS = _Switch()

# What the adjoint launches running now belong to ("the adjoint of step, launched at
# sim.py:42"), set by a tape's sweep around each record's adjoint while checking.
adjoint_of_launch: ContextVar[str] = ContextVar("tapegrad_nans_adjoint_of", default="")


class debug_nans:
    """``with tg.debug_nans():`` every kernel launch inside checks that it writes no new NaN
    or infinity, and raises ``tg.NonFiniteError`` at the first that does: which kernel,
    primal, adjoint or tangent, your line, the element, and the inputs there.  For the whole
    process while inside (``TAPEGRAD_DEBUG_NANS=1``: always).  Launches take longer: each
    copies its float arrays (on their device) and compares them afterwards.

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def ratio(B, A):
    ...     i = tg.index()
    ...     B[i] = A[i] / A[i]
    >>> A, B = np.array([1.0, 0.0]), np.zeros(2)
    >>> with tg.debug_nans():
    ...     ratio(tg.CPU())(B, A, ndrange=2)        # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tapegrad.errors.NonFiniteError: ...: the launch of kernel ratio wrote nan into B[1] ...
    >>> B.tolist()                                  # put back as it was
    [0.0, 0.0]
    """

    def __enter__(self) -> debug_nans:
        NANS.depth += 1
        NANS.update()
        return self

    def __exit__(self, *exc: Any) -> None:
        NANS.depth -= 1
        NANS.update()


# The collector of this thread (context): tapegrad.testing.check_tape's, which sees every
# primal launch before it runs (``launch(cfg, args, ndrange)``) and every registered
# adjoint's call (``op(...)``) of this thread only; another thread's launches are its own.
_COLLECTOR: ContextVar[Any] = ContextVar("tapegrad_collector", default=None)
_COUNT = threading.Lock()


def collector() -> Any:
    """This thread's collector, or None."""
    return _COLLECTOR.get()


class collecting:
    """``with collecting(collector):`` this thread's primal launches are shown to
    ``collector.launch`` before they run, its registered adjoints' calls to ``collector.op``
    (one at a time).  Launches take the general path in every thread meanwhile."""

    def __init__(self, collector: Any):
        self.collector = collector

    def __enter__(self) -> Any:
        if _COLLECTOR.get() is not None:
            raise RuntimeError("tapegrad.testing.check_tape inside check_tape")
        self.token = _COLLECTOR.set(self.collector)
        with _COUNT:
            NANS.collectors += 1
            NANS.update()
        return self.collector

    def __exit__(self, *exc: Any) -> None:
        _COLLECTOR.reset(self.token)
        with _COUNT:
            NANS.collectors -= 1
            NANS.update()


class uncollected:
    """``with uncollected():`` launches are not shown to the collector (a registered
    adjoint's own function: its rules stand for its kernels)."""

    def __enter__(self) -> None:
        self.token = _COLLECTOR.set(None)

    def __exit__(self, *exc: Any) -> None:
        _COLLECTOR.reset(self.token)


def checked(run: Callable[[], Any], args: Sequence[Any], names: Sequence[str],
            what: str, find: Callable[[int, int], str | None] | None = None,
            write_only: frozenset[int] = frozenset()) -> Any:
    """``run()``, a launch on ``args`` (named ``names``, by position), checked: a new NaN or
    infinity in one of its float arrays raises ``NonFiniteError`` after its arrays are put
    back (as they are if the launch raises).  ``what`` says which launch it is ("the launch
    of kernel step"); ``find(k, flat)``, the statement that made element ``flat`` of argument
    ``k`` (run on the arrays put back), or None, or an :class:`Unattributed` where which
    work-item wrote that element is not known (then no input is named "there" either);
    ``write_only``: the positions of arrays the launch writes and never reads, whose old NaNs
    and infinities (memory from ``np.empty``) must not hide new ones
    (``ArrayKind.mark_nonfinite``)."""
    arrays = []                     # every array: all are put back on an error
    for k, a in enumerate(args):
        kind = kind_of(a)
        if kind is not None:
            arrays.append((k, a, kind, kind.snapshot(a)))
    floats = [(k, a, kind, old) for k, a, kind, old in arrays if kind.dtype(a).kind == "f"]
    marked = [(k, a, kind, old) for k, a, kind, old in floats if k in write_only]
    for _, a, kind, _ in marked:
        kind.mark_nonfinite(a)
    try:
        result = run()
    except BaseException:
        _put_back(arrays)
        raise
    for k, a, kind, old in floats:
        flat = kind.first_new_nonfinite(old, a, marked=k in write_only)
        if flat is not None:
            value = kind.element(a, flat)
            _put_back(arrays)
            found = find(k, flat) if find is not None else None
            raise NonFiniteError(_report(what, value, args, names, floats, k, flat, found,
                                         write_only))
    for _, a, kind, old in marked:
        kind.unmark(a, old)
    return result


def _put_back(arrays: list) -> None:
    for _, a, kind, old in arrays:
        kind.restore(a, old)


def _report(what: str, value: float, args: Sequence[Any], names: Sequence[str], floats: list,
            k: int, flat: int, statement: str | None, write_only: frozenset[int]) -> str:
    """The message: the launch, the element, what its inputs held there (the same element of
    its arrays of that shape, its numbers) and elsewhere (an input's first NaN or infinity,
    which the kernel may have read), and the statement."""
    a = args[k]
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(a.shape)))
    where = f"[{', '.join(map(str, index))}]"
    unknown = isinstance(statement, Unattributed)   # (which work-item wrote it)
    there, elsewhere = [], []
    for j, other, kind, old in floats:
        if j in write_only:
            continue                        # (what it held does not matter: not read)
        if tuple(other.shape) == tuple(a.shape) and not unknown:
            there.append(f"{_name(names, j)}{where} = {kind.element(old, flat)!r}")
        bad = kind.first_new_nonfinite(kind.new(tuple(old.shape), kind.dtype(old), True), old)
        if bad is not None:
            at = tuple(int(i) for i in np.unravel_index(bad, tuple(old.shape)))
            elsewhere.append(f"{_name(names, j)}[{', '.join(map(str, at))}] = "
                             f"{kind.element(old, bad)!r}")
    for j, x in enumerate(args):
        if isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, bool):
            there.append(f"{_name(names, j)} = {float(x)!r}")
            if not np.isfinite(float(x)):
                elsewhere.append(f"{_name(names, j)} = {float(x)!r}")
    if unknown:
        why = statement.format(array=_name(names, k))
        held = (f"The work-item that wrote it is not known ({why}), so neither its statement "
                "nor its inputs are named. " + (f"Its numbers: {', '.join(there)}. " if there
                                                else ""))
    else:
        held = (f"Before the launch its inputs held there {', '.join(there)}. " if there
                else "")
    if elsewhere:
        verdict = (f"Not every input was finite: {', '.join(elsewhere)} (the first NaN or "
                   "infinity of each): it may have come in from there (host code, the data "
                   "given, or a launch before checking began).")
    else:
        verdict = ("Every input was finite: the kernel made it (a 0/0, a log or sqrt of a "
                   "negative number, an overflow, inf - inf...).")
    found = (f" The statement, run again in Python for that element: {statement}."
             if statement and not unknown else "")
    line = user_line()
    return (f"{line + ': ' if line else ''}{what} wrote {value!r} into {_name(names, k)}{where}"
            f" (tg.debug_nans). {held}{verdict}{found} The launch's arrays are as they were "
            "before it.")


def _name(names: Sequence[str], k: int) -> str:
    return names[k] if k < len(names) else f"argument {k}"


class Unattributed(str):
    """``find``'s answer where the work-item that wrote the element is not known: its text
    says why (``{array}``: the array's name).  The report names neither a statement nor the
    inputs "there", which may be another work-item's."""


def forward_what(kernel_name: str, params: Sequence[str],
                 tangent_params: Sequence[tuple[str, int]], width: int) -> tuple[str, list[str]]:
    """How a forward-mode launch's error names it and its arguments: ``params``, then the
    tangent of each ``(parameter, direction)`` in ``tangent_params``."""
    names = list(params) + [f"the tangent of {p}" + (f" (direction {j})" if width > 1 else "")
                            for p, j in tangent_params]
    return f"the forward-mode launch (values and tangents) of kernel {kernel_name}", names


def adjoint_what(kernel_name: str) -> str:
    """How an adjoint launch's error names it (with the launch it belongs to, in a sweep)."""
    of = adjoint_of_launch.get()
    return f"the adjoint of kernel {kernel_name}" + (f" (of its launch at {of})" if of else "")
