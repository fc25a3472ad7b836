"""The kernel language: names that mean something inside ``@tg.kernel`` and ``@tg.func`` bodies.

The frontend recognises these objects by identity when it resolves a kernel's names, so a user
may write ``tg.index()``, ``from tapegrad import index`` or ``import tapegrad.lang as L``.
Called from ordinary host code they raise :class:`~tapegrad.errors.OutsideKernelError`, except
the math aliases (``tg.sin``...), which also work on host scalars and arrays, and
``tg.synchronize(backend)``, which waits for a backend on the host.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import numpy as np

from tapegrad.errors import OutsideKernelError
from tapegrad.lang.primitives import BINARY, MATH, TERNARY, UNARY


class _Marker:
    """A named constant of the kernel language (an index space or kind)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"tg.{self.name}"


Global = _Marker("Global")
Local = _Marker("Local")
Group = _Marker("Group")
Linear = _Marker("Linear")
NTuple = _Marker("NTuple")

SPACES = {"Global": Global, "Local": Local, "Group": Group}
KINDS = {"Linear": Linear, "NTuple": NTuple}


# One work-item run in Python on the host (runtime/workitem.py: tg.debug_nans finding the
# statement that made a NaN): the kernel-language functions ask it instead of refusing.
emulated: ContextVar[Any] = ContextVar("tapegrad_emulated_work_item", default=None)


def _kernel_only(name: str, hint: str = ""):
    def fn(*args: Any, **kwargs: Any):
        item = emulated.get()
        if item is not None:
            return getattr(item, name)(*args, **kwargs)
        raise OutsideKernelError(
            f"tg.{name}() only has a meaning inside a @tg.kernel or @tg.func body, "
            f"where tapegrad compiles it for the device; it was called from host code.{hint}")

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = f"Kernel language: see the kernel-language reference (docs/language.md), `{name}`."
    return fn


index = _kernel_only("index")
index.__doc__ = """``tg.index(space=tg.Global, kind=tg.Linear)``: this work-item's index.

``space`` is ``tg.Global`` (position in the whole ndrange), ``tg.Local`` (position inside its
workgroup) or ``tg.Group`` (which workgroup); ``kind`` is ``tg.Linear`` (one int, row-major) or
``tg.NTuple`` (a tuple with one int per ndrange dimension).  Kernel language only.
"""
groupsize = _kernel_only("groupsize")
groupsize.__doc__ = "``tg.groupsize()``: the workgroup size as a tuple (a compile-time constant)."
ndrange = _kernel_only("ndrange")
ndrange.__doc__ = "``tg.ndrange()``: the launch's ndrange as a tuple."
localmem = _kernel_only("localmem")
localmem.__doc__ = """``tg.localmem(dtype, shape)``: an array shared by the work-items of a workgroup.

``shape`` must be known at compile time: literals, module-level constants or ``tg.groupsize()``.
``dtype`` is a NumPy dtype (``np.float32``) or ``A.dtype`` of an array argument.
"""
private = _kernel_only("private")
private.__doc__ = "``tg.private(dtype, shape)``: a small array owned by one work-item."
atomic_add = _kernel_only("atomic_add")
atomic_add.__doc__ = "``tg.atomic_add(arr, idx, v)``: atomically ``arr[idx] += v``; returns the old value."
atomic_sub = _kernel_only("atomic_sub")
atomic_sub.__doc__ = "``tg.atomic_sub(arr, idx, v)``: atomically ``arr[idx] -= v``; returns the old value."
atomic_min = _kernel_only("atomic_min")
atomic_min.__doc__ = "``tg.atomic_min(arr, idx, v)``: atomically ``arr[idx] = min(arr[idx], v)``; returns the old value."
atomic_max = _kernel_only("atomic_max")
atomic_max.__doc__ = "``tg.atomic_max(arr, idx, v)``: atomically ``arr[idx] = max(arr[idx], v)``; returns the old value."


def synchronize(backend: Any = None) -> None:
    """Inside a kernel: a workgroup barrier.  On the host: ``tg.synchronize(backend)`` waits
    until everything launched on ``backend`` has finished.

    >>> import tapegrad as tg
    >>> tg.synchronize(tg.CPU())
    """
    if backend is None:
        item = emulated.get()
        if item is not None:
            return item.synchronize()
        raise OutsideKernelError(
            "tg.synchronize() without arguments is the workgroup barrier of the kernel language; "
            "it was called from host code. To wait for a device on the host, write "
            "tg.synchronize(backend), e.g. tg.synchronize(tg.get_backend(A)).")
    backend.synchronize()


def where(cond: Any, a: Any, b: Any) -> Any:
    """``tg.where(c, a, b)``: ``a`` where ``c`` holds, else ``b`` (both are evaluated)."""
    return np.where(cond, a, b)


# Scalar math: the names of Python's ``math`` module (and NumPy's logaddexp), one row each in
# tapegrad/lang/primitives.py.  On the host they accept scalars and NumPy arrays; in kernels
# they compile to the device's math library.
UNARY_MATH = UNARY
BINARY_MATH = BINARY
TERNARY_MATH = TERNARY


_DOCS = {"fma": "``tg.fma(x, y, z)``: ``x * y + z`` rounded once (C's ``fma``, Python 3.13's "
                "``math.fma``), the same bits on every backend; on the host, exact, for scalars "
                "or NumPy arrays."}


def _host_math(name: str):
    row = MATH[name]
    np_fn = None if row.numpy_name is None else getattr(np, row.numpy_name)
    scalar_fn = row.host_function()
    vectorized = np_fn or row.host or np.vectorize(scalar_fn, otypes=[float])

    def fn(*args: Any) -> Any:
        for a in args:
            if hasattr(a, "__tg_math__"):        # a tracked scalar: record the operation
                return a.__tg_math__(name, args)
        if any(isinstance(a, np.ndarray) for a in args):
            return vectorized(*args)
        return scalar_fn(*args)

    fn.__name__ = name
    fn.__qualname__ = name
    fn.__doc__ = _DOCS.get(name) or (f"``tg.{name}``: ``{name}`` of Python's math or NumPy in "
                                     "kernels; on the host, scalars or NumPy arrays.")
    return fn


MATH_FUNCTIONS = {name: _host_math(name) for name in UNARY_MATH + BINARY_MATH + TERNARY_MATH}
