"""``tg.autodiff`` and friends: thin functions over the launchers and (later) the tape."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad import launch as L
from tapegrad.errors import LaunchError, TapegradError
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


class AdjointStackOverflow(TapegradError):
    """A differentiated kernel needed more per-work-item stack than it had."""


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
    wgs = L._groupsize(cfg, len(nd))
    argtypes = L.check_args(kernel, backend, values)
    key = ("reverse", backend, L._arg_key(values), activity, len(nd), wgs)
    entry = kernel.cache.get(key)
    if entry is None:
        depth = kernel.cache.get(("stack depth", key))
        entry = L.compile_adjoint(kernel, backend, argtypes, activity, len(nd), wgs, depth)
        kernel.cache[key] = entry
    adjoint, launcher = entry
    kernel.cache[("last", "reverse", backend)] = launcher
    kernel.cache[("last adjoint",)] = adjoint.ir
    # values the adjoint must see as they were before the primal launch overwrote them
    snapshots = {p: backend.asarray(values[params.index(p)]) if not isinstance(
        values[params.index(p)], np.ndarray) else values[params.index(p)].copy()
        for p in adjoint.scratch}
    cfg(*values, ndrange=nd)                                        # the primal launch
    shadows = {p: a.dval for p, a in zip(params, annotated) if isinstance(a, Duplicated)}
    backup = None
    if adjoint.uses_status:
        backup = {p: d.copy() for p, d in shadows.items()}
    for attempt in range(2):
        adj_args = [snapshots[p].copy() if p in snapshots else v for p, v in zip(params, values)]
        adj_args += [shadows[p] for p in adjoint.shadow_of.values()]
        outs = [backend.zeros(np.float64, 1) for _ in adjoint.active_scalars]
        adj_args += outs
        status = backend.zeros(np.int64, 1) if adjoint.uses_status else None
        if status is not None:
            adj_args.append(status)
        if 0 not in nd:
            launcher(tuple(adj_args), nd)
        needed = int(backend.to_numpy(status)[0]) if status is not None else 0
        if needed == 0:
            break
        for p, d in shadows.items():   # undo the partial accumulation, grow the stack, redo
            d[...] = backup[p]
        depth = 1 << max(needed - 1, 1).bit_length()
        kernel.cache[("stack depth", key)] = depth
        if attempt == 1:
            raise AdjointStackOverflow(
                f"the adjoint of {kernel.name} needs a stack of {needed} entries per work-item "
                f"and had {adjoint.stack_depth}; set {kernel.name}.cache[...] via "
                f"tg.autodiff again (it grows automatically) or report this as a bug")
        adjoint, launcher = L.compile_adjoint(kernel, backend, argtypes, activity, len(nd), wgs,
                                              depth)
        kernel.cache[key] = (adjoint, launcher)
    derivs = []
    out_iter = iter(outs)
    for a in annotated:
        if isinstance(a, Active):
            value = float(backend.to_numpy(next(out_iter))[0])
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
