"""``@tg.kernel`` and ``@tg.func``: the user's handles on kernels and device functions.

These objects only hold the user's Python function and what was compiled from it; parsing,
differentiation and compilation live in later stages (``frontend``, ``ad``, ``backends``), which
``tapegrad.launch`` drives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from tapegrad.errors import LaunchError


class Func:
    """A device function: callable from kernels and other device functions, differentiable.

    >>> import tapegrad as tg
    >>> @tg.func
    ... def square(x):
    ...     return x * x
    >>> square(3.0)  # on the host it is the plain Python function
    9.0
    """

    def __init__(self, pyfunc: Callable[..., Any]):
        self.pyfunc = pyfunc
        self.name = pyfunc.__name__
        self.cache: dict[Any, Any] = {}   # filled by the frontend and backends
        self.forward_rule: Callable[..., Any] | None = None
        self.reverse_rule: Callable[..., Any] | None = None
        functools.update_wrapper(self, pyfunc)

    def __call__(self, *args: Any) -> Any:
        return self.pyfunc(*args)

    def reverse(self, rule: Callable[..., Any]) -> Func:
        """Decorator: a hand-written reverse rule, used instead of differentiating the body.

        ``rule(*args, r_bar)`` is written in the kernel language and returns the adjoint of
        each argument (a tuple when there are several) given the adjoint ``r_bar`` of the result.

        >>> import math, tapegrad as tg
        >>> @tg.func
        ... def softplus(x):
        ...     return math.log1p(math.exp(x))
        >>> @softplus.reverse
        ... def softplus_reverse(x, r_bar):
        ...     return r_bar / (1.0 + math.exp(-x))
        """
        from tapegrad.frontend.checks import check_syntax
        check_syntax(rule, is_kernel=False)
        self.reverse_rule = Func(rule)
        return self.reverse_rule

    def forward(self, rule: Callable[..., Any]) -> Func:
        """Decorator: a hand-written forward rule ``rule(*args, *arg_dots) -> r_dot``."""
        from tapegrad.frontend.checks import check_syntax
        check_syntax(rule, is_kernel=False)
        self.forward_rule = Func(rule)
        return self.forward_rule

    def __repr__(self) -> str:
        return f"<tg.func {self.name}>"


class Kernel:
    """A kernel written in the tapegrad kernel language; configure it, then launch it.

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def double(B, A):
    ...     i = tg.index()
    ...     B[i] = 2.0 * A[i]
    >>> A = np.arange(4.0); B = np.zeros(4)
    >>> double(tg.CPU(), 64)(B, A, ndrange=4)
    >>> B.tolist()
    [0.0, 2.0, 4.0, 6.0]
    """

    merged_from: Kernel | None = None   # a variant with parameters merged: the kernel it is of

    def __init__(self, pyfunc: Callable[..., Any]):
        self.pyfunc = pyfunc
        self.name = pyfunc.__name__
        self.cache: dict[Any, Any] = {}   # filled by the frontend and backends
        self.shown: dict[str, Any] = {}   # mode -> the launcher kern.source(mode) shows
        self._configured: dict[Any, ConfiguredKernel] = {}
        functools.update_wrapper(self, pyfunc)

    def __call__(self, backend: Any, workgroupsize: int | tuple[int, ...] | None = None,
                 *args: Any, ndrange: Any = None) -> ConfiguredKernel:
        """Bind a backend and a workgroup size: ``kern(backend, 64)(*args, ndrange=n)``."""
        if args or ndrange is not None or not hasattr(backend, "compile"):
            raise LaunchError(
                f"{self.name}(...) takes a backend first, e.g. {self.name}(tg.CPU()) or "
                f"{self.name}(tg.get_backend(A)), then the arguments: "
                f"{self.name}(backend)(A, B, ndrange=n); got {type(backend).__name__}.")
        if isinstance(workgroupsize, list):
            workgroupsize = tuple(workgroupsize)
        try:
            key = (id(backend), workgroupsize)
            cfg = self._configured.get(key)
        except TypeError:
            raise LaunchError(f"{self.name}: workgroupsize must be an int or a tuple of ints, "
                              f"got {type(workgroupsize).__name__}") from None
        if cfg is None or cfg.backend is not backend:
            cfg = ConfiguredKernel(self, backend, workgroupsize)
            self._configured[key] = cfg
        return cfg

    def source(self, mode: str = "primal", backend: Any = None) -> str:
        """The kernel as tapegrad will run it, as readable Python.

        ``mode`` is ``"primal"``; with ``backend`` given, the code lowered for that backend by
        the most recent launch (launch once first).
        """
        from tapegrad import launch  # deferred: the launcher is a later stage than the language
        return launch.source_of(self, mode, backend)

    def __repr__(self) -> str:
        return f"<tg.kernel {self.name}>"


_launch: Callable[..., None] | None = None    # tapegrad.launch.launch, once imported


class ConfiguredKernel:
    """A kernel bound to a backend and a workgroup size; call it with the arguments."""

    def __init__(self, kernel: Kernel, backend: Any, workgroupsize: Any):
        self.kernel = kernel
        self.backend = backend
        self.workgroupsize = workgroupsize

    def __call__(self, *args: Any, ndrange: int | tuple[int, ...] | None = None) -> None:
        global _launch
        if _launch is None:   # deferred: the launcher is a later stage than the language
            from tapegrad import launch
            _launch = launch.launch
        _launch(self, args, ndrange)

    def __repr__(self) -> str:
        return f"<tg.kernel {self.kernel.name} on {self.backend!r}, workgroupsize={self.workgroupsize}>"


def kernel(fn: Callable[..., Any]) -> Kernel:
    """Decorator: turn a Python function written in the kernel language into a kernel."""
    from tapegrad.frontend.checks import check_syntax  # fail early, at the decorated line
    check_syntax(fn)
    return Kernel(fn)


def func(fn: Callable[..., Any]) -> Func:
    """Decorator: a device function callable from kernels."""
    from tapegrad.frontend.checks import check_syntax
    check_syntax(fn, is_kernel=False)
    return Func(fn)
