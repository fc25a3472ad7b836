"""The user's handles: ``@tg.kernel`` (configured with a backend and a workgroup size, then
launched) and ``@tg.func`` (a device function, with hand-written derivative rules if wanted).
Both are checked against the kernel language when decorated, at the user's line."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.errors import LaunchError, TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.checks import check_syntax
from tapegrad.lang.kernel import DeviceFunction, KernelFunction
from tapegrad.runtime.launch import launch
from tapegrad.runtime.show import passes_of, source_of
from tapegrad.tracebacks import api_boundary, filter_error


class Func(DeviceFunction):
    """A device function: callable from kernels and other device functions, differentiable.

    >>> import tapegrad as tg
    >>> @tg.func
    ... def square(x):
    ...     return x * x
    >>> square(3.0)  # on the host it is the plain Python function
    9.0
    """

    @api_boundary
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
        check_syntax(rule, is_kernel=False)
        self.reverse_rule = Func(rule)
        return self.reverse_rule

    @api_boundary
    def forward(self, rule: Callable[..., Any]) -> Func:
        """Decorator: a hand-written forward rule ``rule(*args, *arg_dots) -> r_dot``."""
        check_syntax(rule, is_kernel=False)
        self.forward_rule = Func(rule)
        return self.forward_rule

    def __repr__(self) -> str:
        return f"<tg.func {self.name}>"


class Kernel(KernelFunction):
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

    def __init__(self, pyfunc: Callable[..., Any]):
        super().__init__(pyfunc)
        self._configured: dict[Any, ConfiguredKernel] = {}

    def __call__(self, backend: Any, workgroupsize: int | tuple[int, ...] | None = None,
                 *args: Any, ndrange: Any = None) -> ConfiguredKernel:
        """Bind a backend and a workgroup size: ``kern(backend, 64)(*args, ndrange=n)``."""
        try:                           # (api_boundary, inlined: tracebacks.py)
            if args or ndrange is not None or not hasattr(backend, "compile"):
                raise self.no_backend(backend, hasattr(backend, "compile"))
            workgroupsize = self.group_key(workgroupsize)
        except TapegradError as e:
            filter_error(e)
            raise
        # keyed by the backend's value (its type and settings, ``Backend.__eq__``), not its
        # identity: ``kern(tg.get_backend(x))`` in a loop finds one entry, whatever object
        # each call passes
        key = (backend, workgroupsize)
        cfg = self._configured.get(key)
        if cfg is None:
            cfg = ConfiguredKernel(self, backend, workgroupsize)
            self._configured[key] = cfg
        return cfg

    def no_backend(self, got: Any, with_backend: bool) -> LaunchError:
        """The error for ``kern(B, A)`` (``got``: what came where the backend goes), or with
        ``with_backend`` for ``kern(backend, 64, B, A)``: the arguments in the first call."""
        params = list(inspect.signature(self.pyfunc).parameters) or ["..."]
        example = (f"{self.name}(tg.CPU()) or {self.name}(tg.get_backend({params[0]}))"
                   if params[0] != "..." else f"{self.name}(tg.CPU())")
        what = ("the arguments with the backend, in one call" if with_backend
                else type(got).__name__)
        return LaunchError(
            f"{self.name}(...) takes a backend first, e.g. {example}, then the arguments: "
            f"{self.name}(backend)({', '.join(params)}, ndrange=n); got {what}.")

    def group_key(self, wgs: Any) -> int | tuple[int, ...] | None:
        """``wgs`` as Python ints (4 and np.int64(4) are one configuration); anything but
        None, an int or a list or tuple of ints is refused here, before it is a key (4.0,
        equal to 4, once made that key fail for 4 as well)."""
        if wgs is None or type(wgs) is int or type(wgs) is tuple and all(
                type(x) is int for x in wgs):    # (the usual ones: as they are, at once)
            return wgs
        items = tuple(wgs) if isinstance(wgs, (tuple, list)) else (wgs,)
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))
                   for x in items):
            raise LaunchError(f"{self.name}: workgroupsize must be an int or a tuple of ints, "
                              f"got {wgs!r}")
        return tuple(int(x) for x in items) if isinstance(wgs, (tuple, list)) else int(wgs)

    @api_boundary
    def source(self, mode: str = "primal", backend: Any = None) -> str:
        """The kernel as tapegrad will run it, as readable Python.

        ``mode`` is ``"primal"``; with ``backend`` given, the code lowered for that backend by
        the most recent launch (launch once first).
        """
        return source_of(self, mode, backend)

    @api_boundary
    def passes(self, mode: str = "primal", backend: Any = None) -> str:
        """What each of the CPU's optimisation passes did for the code the most recent launch
        in ``mode`` on ``backend`` ran (``tapegrad.backends.cpu.passes``), one line each.

        >>> import numpy as np, tapegrad as tg
        >>> @tg.kernel
        ... def double(B, A):
        ...     i = tg.index()
        ...     B[i] = 2.0 * A[i]
        >>> cpu = tg.CPU()
        >>> double(cpu)(np.zeros(4), np.ones(4), ndrange=4)
        >>> print(double.passes(backend=cpu).splitlines()[2])
        phases        no barriers
        """
        return passes_of(self, mode, backend)

    def __repr__(self) -> str:
        return f"<tg.kernel {self.name}>"


class ConfiguredKernel:
    """A kernel bound to a backend and a workgroup size; call it with the arguments."""

    def __init__(self, kernel: Kernel, backend: Any, workgroupsize: Any):
        self.kernel = kernel
        self.backend = backend
        self.workgroupsize = workgroupsize

    def __call__(self, *args: Any, ndrange: int | tuple[int, ...] | None = None) -> None:
        try:                           # (api_boundary, inlined: tracebacks.py)
            try:
                launch(self, args, ndrange)
            except OverflowError:      # (an int the launch could not pass: nothing ran)
                error = int_too_big(self.kernel, args)
                if error is None:
                    raise
                raise error from None
        except TapegradError as e:
            filter_error(e)
            raise

    def __repr__(self) -> str:
        return f"<tg.kernel {self.kernel.name} on {self.backend!r}, workgroupsize={self.workgroupsize}>"


def int_too_big(kernel: Kernel, args: tuple) -> LaunchError | None:
    """The error for an int argument outside the 64-bit integers kernels compute with (a
    launch raised OverflowError: runtime/arguments.py arg_key, or a GPU's packing)."""
    params = kernel_ir(kernel).params
    for name, a in zip(params, args):
        if (type(a) is int or type(a) is np.uint64) and not -(2**63) <= int(a) < 2**63:
            what = "" if type(a) is int else " (np.uint64)"
            return LaunchError(
                f"{kernel.name}: argument {name} = {a}{what} does not fit in a 64-bit integer, "
                f"which kernels compute with (-2**63 to 2**63 - 1); pass a smaller int, or a "
                f"float if it is a quantity ({float(a):g})")
    return None


@api_boundary
def kernel(fn: Callable[..., Any]) -> Kernel:
    """Decorator: turn a Python function written in the kernel language into a kernel."""
    check_syntax(fn)                  # fail early, at the decorated line
    return Kernel(fn)


@api_boundary
def func(fn: Callable[..., Any]) -> Func:
    """Decorator: a device function callable from kernels."""
    check_syntax(fn, is_kernel=False)
    return Func(fn)
