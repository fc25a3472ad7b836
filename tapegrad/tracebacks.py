"""Tracebacks of tapegrad's errors without tapegrad's own frames.

An error a launch or an API call raises says what is wrong and where (the user's line, and for
kernel errors the kernel's line); the dozen tapegrad frames between the user's call and the
``raise`` only hide that.  The entry points (a configured kernel's call, ``tg.gradient`` and
friends, a tape's ``gradient``) catch a :class:`~tapegrad.errors.TapegradError` passing
through them and take tapegrad's frames (and its generated code's) out of its traceback, so
the user sees their own frames and the entry point's one line.  Errors that are not
tapegrad's (a bug, the user's own exception) keep every frame.

The frames of the libraries tapegrad calls into (the standard library's ``ast`` visitors, Numba,
NumPy, ...) go too where tapegrad called them; where the user's code called them they stay.

Every public entry point is wrapped with :func:`api_boundary`; the two calls of the launch path
(``kern(backend)`` and ``kern(backend)(*args)``, made in loops) inline its ``try``/``except``
instead, which costs nothing until an error passes (a wrapper's extra call would add a quarter
to a ``kern(cpu, 64)``).

``TAPEGRAD_TRACEBACK_FILTERING=off`` keeps every frame (as JAX's
``JAX_TRACEBACK_FILTERING=off``), for reporting a tapegrad bug.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sysconfig
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


# the libraries whose frames between tapegrad's own say nothing to the user (the user's
# code is never in them)
_LIBRARIES = ("numpy", "numba", "llvmlite", "cupy", "cupy_backends", "pyopencl", "torch",
              "jax", "jaxlib", "mpi4py")


@functools.cache
def _library_folders() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The standard library's folders, and the folders of :data:`_LIBRARIES` installed."""
    stdlib = {os.path.abspath(sysconfig.get_paths()[k]) + os.sep
              for k in ("stdlib", "platstdlib")}
    packages = set()
    for name in _LIBRARIES:
        try:
            spec = importlib.util.find_spec(name)    # (finds it, imports nothing)
        except (ImportError, ValueError):
            continue
        for folder in (spec.submodule_search_locations or []) if spec else []:
            packages.add(os.path.abspath(folder) + os.sep)
    return tuple(stdlib), tuple(packages)


def _librarys(filename: str) -> bool:
    """Whether code in ``filename`` is the standard library's (not that of a package installed
    below it, in ``site-packages``) or one of :data:`_LIBRARIES`'."""
    stdlib, packages = _library_folders()
    if filename.startswith(packages) or filename.startswith("<frozen "):
        return True
    return any(filename.startswith(folder) and not {"site-packages", "dist-packages"} & set(
        filename[len(folder):].split(os.sep)) for folder in stdlib)


def users_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """``tb`` without tapegrad's frames, nor the libraries' frames that tapegrad called (an
    ``ast.NodeVisitor``'s ``visit`` between two of tapegrad's checks): the user's frames, and
    the libraries' frames that the user's code called."""
    kept = []
    called_by_tapegrad = False      # (whether the innermost non-library frame is tapegrad's)
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if tapegrads(filename):
            called_by_tapegrad = True
        elif not _librarys(filename):
            called_by_tapegrad = False
            kept.append(tb)
        elif not called_by_tapegrad:
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
