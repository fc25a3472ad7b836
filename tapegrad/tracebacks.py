"""Tracebacks of tapegrad's errors without tapegrad's own frames.

An error a launch or an API call raises says what is wrong and where (the user's line, and for
kernel errors the kernel's line); the dozen tapegrad frames between the user's call and the
``raise`` only hide that.  The entry points (a configured kernel's call, ``tg.gradient`` and
friends, a tape's ``gradient``) catch a :class:`~tapegrad.errors.TapegradError` passing
through them and take tapegrad's frames (and its generated code's) out of its traceback, so
the user sees their own frames and the entry point's one line.  Errors that are not
tapegrad's (a bug, the user's own exception) keep every frame.

``TAPEGRAD_TRACEBACK_FILTERING=off`` keeps every frame (as JAX's
``JAX_TRACEBACK_FILTERING=off``), for reporting a tapegrad bug.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable
from typing import Any, TypeVar

from tapegrad.callers import tapegrads
from tapegrad.errors import TapegradError

F = TypeVar("F", bound=Callable[..., Any])


def filtering() -> bool:
    """Whether tracebacks are filtered (``TAPEGRAD_TRACEBACK_FILTERING``, default on)."""
    return os.environ.get("TAPEGRAD_TRACEBACK_FILTERING", "on").lower() not in (
        "off", "0", "false", "no")


def users_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without tapegrad's frames."""
    kept = []
    while tb is not None:
        if not tapegrads(tb.tb_frame.f_code.co_filename):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for entry in reversed(kept):
        out = types.TracebackType(out, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return out


def filter_error(e: TapegradError) -> None:
    """Take tapegrad's frames out of ``e``'s traceback (where filtering is on); the entry
    point re-raises it with ``raise``, which adds its own frame."""
    if filtering():
        e.__traceback__ = users_frames(e.__traceback__)


def api_boundary(fn: F) -> F:
    """``fn`` as an entry point: a tapegrad error leaves it with the user's frames only.

    >>> @api_boundary
    ... def entry():
    ...     raise TapegradError("what went wrong and what to do")
    >>> try:
    ...     entry()
    ... except TapegradError as e:
    ...     print(e)
    what went wrong and what to do
    """
    @functools.wraps(fn)
    def entry(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TapegradError as e:
            filter_error(e)
            raise
    return entry  # type: ignore[return-value]
