"""What kernels and device functions are to the language: the user's Python functions.

These objects only hold the user's Python function and what was compiled from it; parsing,
differentiation and compilation live in later stages (``frontend``, ``ad``, ``backends``),
which ``tapegrad.runtime`` drives.  The user's handles (``@tg.kernel``, ``@tg.func``: checked
when decorated, configured, launched) are ``tapegrad.kernels``'s.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class DeviceFunction:
    """A function written in the kernel language and marked as a device function (callable
    from kernels), with its hand-written derivative rules if any.  ``tg.func`` makes a
    :class:`tapegrad.kernels.Func`, which adds registering those rules."""

    def __init__(self, pyfunc: Callable[..., Any]):
        self.pyfunc = pyfunc
        self.name = pyfunc.__name__
        self.cache: dict[Any, Any] = {}   # filled by the frontend and backends
        self.forward_rule: DeviceFunction | None = None
        self.reverse_rule: DeviceFunction | None = None
        functools.update_wrapper(self, pyfunc)

    def __call__(self, *args: Any) -> Any:
        return self.pyfunc(*args)


class KernelFunction:
    """A function written in the kernel language and marked as a kernel: what the frontend
    parses and the caches of what was made from it.  ``tg.kernel`` makes a
    :class:`tapegrad.kernels.Kernel`, which adds configuring and launching."""

    merged_from: KernelFunction | None = None   # a variant with parameters merged: its kernel
    tangent_of: KernelFunction | None = None    # a kernel's tangent as a kernel: that kernel
    # how tg.debug_nans names its launches and their arguments, where not as a kernel's own
    # (a tangent as a kernel: as forward mode names the launches of ``tangent_of``)
    reported_as: tuple[str, list[str]] | None = None

    def __init__(self, pyfunc: Callable[..., Any]):
        self.pyfunc = pyfunc
        self.name = pyfunc.__name__
        self.cache: dict[Any, Any] = {}   # filled by the frontend, the runtime and backends
        self.shown: dict[str, Any] = {}   # mode -> the launcher kern.source(mode) shows
        functools.update_wrapper(self, pyfunc)
