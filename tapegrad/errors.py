"""Every exception tapegrad raises, in one place.

All derive from :class:`TapegradError`.  A message says what is wrong, where (the user's file
and line when a kernel is involved) and what to write instead.  Errors about kernel source also
derive from :class:`SyntaxError`, so Python's traceback shows the offending line with a caret.
"""

from __future__ import annotations

import ast
import importlib
import linecache
from typing import Any


class TapegradError(Exception):
    """Base class of every tapegrad error."""


class KernelError(TapegradError, SyntaxError):
    """A problem located in the source of a kernel or device function.

    Carries ``filename`` and ``lineno`` like a ``SyntaxError``, so tracebacks point at the
    user's own line.
    """

    def __init__(self, message: str, filename: str | None = None, lineno: int | None = None,
                 col: int | None = None):
        where = f"{filename}:{lineno}: " if filename and lineno else ""
        text = linecache.getline(filename, lineno) if filename and lineno else None
        offset = (col + 1) if col is not None else None
        super().__init__(where + message, (filename, lineno, offset, text or None))
        self.message = message

    def __str__(self) -> str:  # SyntaxError.__str__ appends "(file, line N)"; we already say it
        return self.msg


class KernelSyntaxError(KernelError):
    """The kernel uses Python that tapegrad kernels do not support."""


class KernelTypeError(KernelError):
    """Values in a kernel have types that do not fit (e.g. a float used as an index)."""


class KernelActivityError(KernelError):
    """The activity annotations of a differentiated launch do not fit what the kernel does at
    this line (a value that depends on differentiated inputs stored into a ``Const`` array,
    an integer passed as ``Active``)."""


class KernelCompileError(KernelError):
    """The backend compiler rejected a generated kernel; reported at the user's line."""


class KernelIndexError(TapegradError, IndexError):
    """A kernel indexed outside an array (found with ``TAPEGRAD_BOUNDSCHECK=1``)."""


class NonFiniteError(TapegradError, FloatingPointError):
    """Under ``tg.debug_nans()``: a launch wrote a NaN or an infinity where its array held
    another value (the kernel, the mode, the user's line, the element and the inputs there)."""


class AdjointStackOverflow(TapegradError):
    """A differentiated kernel needed more per-work-item stack than tapegrad could give it."""


class LaunchError(TapegradError, ValueError):
    """A kernel launch was configured wrongly (ndrange, workgroup size, arguments)."""


class BackendError(TapegradError):
    """A backend is unavailable or an array lives on the wrong device."""


class OutsideKernelError(TapegradError, RuntimeError):
    """A kernel-language function (``tg.index``, ``tg.synchronize``, ...) was called from host code."""


class InplaceModificationError(TapegradError, RuntimeError):
    """An array that a recorded backward pass reads was changed in place between the forward
    pass and the backward (``tapegrad.torch``/``tapegrad.jax``); a ``RuntimeError`` as
    PyTorch's own "modified by an inplace operation" error is."""


class CaptureError(TapegradError):
    """A captured function (``tg.capture``) cannot be replayed: it uses an operation a replay
    cannot repeat, or (``strict=True``) a call would take another path than the recorded one."""


class CacheError(TapegradError):
    """The compile cache folder cannot be trusted (another user owns it, or others can write it);
    the message names the folder and ``TAPEGRAD_CACHE_DIR``."""


class CaptureWarning(UserWarning):
    """A captured function replays more slowly than it could (a stretch of its GPU launches
    could not be recorded as a CUDA graph, and replays launch by launch)."""


class CacheWarning(UserWarning):
    """A compile cache entry was damaged or untrusted: tapegrad removed it and compiles again."""


def located(node: ast.AST, filename: str, message: str, cls: type[KernelError] = KernelSyntaxError
            ) -> KernelError:
    """Build a kernel error pointing at ``node``'s line in ``filename``."""
    return cls(message, filename, getattr(node, "lineno", None), getattr(node, "col_offset", None))


def optional_module(name: str, how: str, error: type[TapegradError] = TapegradError) -> Any:
    """The optional package ``name`` (mpi4py.MPI, cupy, torch, ...), or ``error`` with
    ``how``: what needs it and how to install it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise error(how) from None
