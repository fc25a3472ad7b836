"""``tg.autodiff`` and friends: thin functions over the launchers and (later) the tape."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad import launch as L
from tapegrad.errors import AdjointStackOverflow, LaunchError, TapegradError  # noqa: F401
from tapegrad.lang.kernel import ConfiguredKernel
from tapegrad.tape.activity import (
    Active,
    Annotation,
    BatchDuplicated,
    Const,
    Duplicated,
    Mode,
    annotate,
)


def autodiff(mode: Mode, f: Any, ret_activity: Any, *args: Any, ndrange: Any = None) -> tuple:
    """Differentiate ``f`` with Enzyme's conventions.

    ``f`` is a configured kernel (``kern(backend, workgroupsize)``; pass ``ndrange=``).
    Reverse mode returns ``(derivs,)``, one entry per argument: the derivative of an
    ``Active`` scalar, else None; shadows of ``Duplicated`` arrays are *added to*.

    >>> import math, numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def sin_kernel(B, A):
    ...     i = tg.index()
    ...     B[i] = math.sin(A[i])
    >>> A = np.linspace(0, 1, 8); B = np.zeros(8)
    >>> dA, dB = tg.make_zero(A), np.ones(8)
    >>> tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const,
    ...             tg.Duplicated(B, dB), tg.Duplicated(A, dA), ndrange=8)
    ((None, None),)
    >>> bool(np.allclose(dA, np.cos(A))), float(dB.sum())   # dB was consumed: B was overwritten
    (True, 0.0)
    """
    if not isinstance(mode, Mode):
        raise TapegradError(f"the first argument of tg.autodiff is a mode (tg.Reverse, "
                            f"tg.Forward, ...), got {mode!r}")
    if isinstance(f, ConfiguredKernel):
        return _autodiff_kernel(mode, f, ret_activity, args, ndrange)
    if hasattr(f, "compile") or type(f).__name__ == "Kernel":
        raise TapegradError("configure the kernel first: tg.autodiff(mode, kern(backend, "
                            "workgroupsize), tg.Const, ..., ndrange=n)")
    raise TapegradError("tg.autodiff differentiates configured kernels in this version; "
                        "differentiating host functions that launch kernels comes with the tape")


def _autodiff_kernel(mode: Mode, cfg: ConfiguredKernel, ret: Any, args: tuple, ndrange: Any
                     ) -> tuple:
    kernel, backend = cfg.kernel, cfg.backend
    if ret is not Const and not isinstance(ret, Const):
        raise TapegradError(
            f"a kernel returns nothing, so its return activity is tg.Const, not {ret!r}. To "
            "differentiate a scalar computed from its outputs, write a host function that "
            "launches the kernel and returns tg.sum(B) (then use tg.Active); to get a "
            "vector-Jacobian product, seed the output's shadow (dB[:] = w) and use tg.Const")
    if not mode.reverse:
        raise TapegradError("forward mode on kernels is not available in this version yet")
    annotated = [annotate(a) for a in args]
    params = L.kernel_ir(kernel).params
    if len(annotated) != len(params):
        raise LaunchError(f"{kernel.name} takes {len(params)} argument(s) ({', '.join(params)}), "
                          f"got {len(annotated)}")
    activity = tuple(_check_annotation(kernel, backend, p, a) for p, a in zip(params, annotated))
    values = tuple(a.val for a in annotated)
    nd = L._ndrange(kernel, ndrange)
    L.check_args(kernel, backend, values)
    # arrays the kernel reads and overwrites: the adjoint needs their contents from before
    old = {p: values[params.index(p)].copy()
           for p in L.overwritten_inputs(cfg, values, activity, nd)}
    cfg(*values, ndrange=nd)                                        # the primal launch
    seen = tuple(old.get(p, v) for p, v in zip(params, values))
    shadows = {p: a.dval for p, a in zip(params, annotated) if isinstance(a, Duplicated)}
    scalars = L.run_adjoint(cfg, seen, shadows, activity, nd)       # the adjoint launch
    derivs = []
    for p, a in zip(params, annotated):
        if isinstance(a, Active):
            value = scalars[p]
            derivs.append(type(a.val)(value) if isinstance(a.val, np.floating) else value)
        else:
            derivs.append(None)
    return (tuple(derivs),) if not mode.with_primal else (tuple(derivs), None)


def _check_annotation(kernel: Any, backend: Any, name: str, a: Annotation) -> str:
    if isinstance(a, BatchDuplicated):
        raise TapegradError("BatchDuplicated is for forward mode, which kernels do not have "
                            "in this version yet")
    if isinstance(a, Duplicated):
        x, dx = a.val, a.dval
        if not hasattr(x, "shape"):
            raise TapegradError(f"{kernel.name}: argument {name} is a scalar; scalars are "
                                f"tg.Active({name}) or tg.Const({name}), not Duplicated")
        if not hasattr(dx, "shape") or dx.shape != x.shape or dx.dtype != x.dtype:
            got = (f"shape {dx.shape}, dtype {dx.dtype}" if hasattr(dx, "shape")
                   else type(dx).__name__)
            raise LaunchError(f"{kernel.name}: the shadow of {name} must match it (shape "
                              f"{x.shape}, dtype {x.dtype}); got {got}. Make one with "
                              f"tg.make_zero({name})")
        if not backend.owns(dx):
            raise LaunchError(f"{kernel.name}: the shadow of {name} does not live on {backend!r}")
        if not np.dtype(x.dtype).name.startswith("float"):
            raise TapegradError(f"{kernel.name}: {name} has dtype {x.dtype}; only float arrays "
                                "carry derivatives (pass integer arrays as Const)")
        return "dup"
    if isinstance(a, Active):
        if hasattr(a.val, "shape") and getattr(a.val, "ndim", 0) > 0:
            raise TapegradError(f"{kernel.name}: argument {name} is an array; arrays are "
                                f"tg.Duplicated({name}, d{name}), Active is for float scalars")
        if not isinstance(a.val, (float, np.floating)):
            raise TapegradError(f"{kernel.name}: tg.Active({name}) needs a float scalar, got "
                                f"{type(a.val).__name__}")
        return "active"
    return "const"
