"""``tg.autodiff`` and friends: thin functions over the launchers and the tape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.api.autodiff_plans import autodiff_by_plan
from tapegrad.api.forward_host import forward_host
from tapegrad.api.launches import (
    autodiff_kernel,
    batch_in_reverse,
    check_layout,
    check_shadows_apart,
    floats,
    host_array,
    no_derivative,
)
from tapegrad.api.second import hvp  # noqa: F401
from tapegrad.api.sources import call_on_sources, check_direction, is_number, stamp_sources
from tapegrad.backends.registry import kind_of
from tapegrad.capturing.captured import Captured
from tapegrad.capturing.trace import TraceTape
from tapegrad.errors import (  # noqa: F401
    AdjointStackOverflow,
    CaptureError,
    LaunchError,
    TapegradError,
)
from tapegrad.frontend import kernel_ir
from tapegrad.kernels import ConfiguredKernel, Kernel, int_too_big
from tapegrad.runtime.arguments import access
from tapegrad.tape.activity import (
    Active,
    Annotation,
    BatchDuplicated,
    Const,
    Duplicated,
    Forward,
    ForwardWithPrimal,
    Mode,
    Reverse,
    annotate,
)
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.identity import array_key, sharing_pairs
from tapegrad.tape.modes import (
    current_forward,
    jacobian_var,
    recording_tapes,
    refuse_nested,
    refuse_while_recording,
)
from tapegrad.tape.scalars import TrackedScalar, plain
from tapegrad.tape.sweep import not_a_scalar
from tapegrad.tape.tape import Tape
from tapegrad.tracebacks import api_boundary


@api_boundary
def autodiff(mode: Mode, f: Any, ret_activity: Any, *args: Any, ndrange: Any = None,
             accumulate: bool = True) -> tuple:
    """Differentiate ``f`` with Enzyme's conventions.

    ``f`` is a configured kernel (``kern(backend, workgroupsize)``; pass ``ndrange=``) or a
    host function that launches kernels.  Reverse mode returns ``(derivs,)``, one entry per
    argument: the derivative of an ``Active`` scalar, else None; shadows of ``Duplicated``
    arrays are *added to*, and the shadow of an array the kernel overwrites is consumed.

    ``accumulate=False`` (reverse mode, configured kernels) is the functional form, a
    vector-Jacobian product: the shadows of the arrays the kernel writes are the seeds, read
    and left as they are; the shadows of the arrays it only reads are *overwritten* with the
    derivatives (no ``make_zero_`` first, and their old contents do not matter).  It moves
    fewer bytes: no seed copy, no zeroing, no read-modify-write.

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
    >>> w = np.full(8, 2.0); dA = np.empty(8)     # any contents: accumulate=False overwrites
    >>> _ = tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.DuplicatedNoNeed(B, w),
    ...                 tg.Duplicated(A, dA), ndrange=8, accumulate=False)
    >>> bool(np.allclose(dA, 2 * np.cos(A))), float(w.sum())  # the seed w is left as it was
    (True, 16.0)
    """
    if not isinstance(mode, Mode):
        raise TapegradError(f"the first argument of tg.autodiff is a mode (tg.Reverse, "
                            f"tg.Forward, ...), got {mode!r}")
    if not accumulate and not mode.reverse:
        raise TapegradError("accumulate=False is for reverse mode: forward mode writes its "
                            "tangents, it never adds into them")
    if not mode.reverse:
        refuse_nested()
    for tape in recording_tapes():
        if isinstance(tape, TraceTape):
            raise CaptureError(
                "tg.autodiff inside a function that tg.capture records: a replay repeats the "
                "recorded kernel launches and tapegrad host operations, not tg.autodiff's "
                "derivative launches, so its shadows would be left as they were. Call "
                "tg.autodiff outside the captured function (tg.autodiff(tg.Reverse, captured, "
                "...) or tg.gradient(captured, ...) differentiate the captured function "
                "itself)")
    if isinstance(f, ConfiguredKernel):
        try:
            derivs = autodiff_by_plan(mode, f, ret_activity, args, ndrange, accumulate)
            if derivs is None:
                # (a configured kernel's shadows meet in one_object_per_memory, by name)
                check_shadows_apart(f, args, between_shadows=False)
                derivs = autodiff_kernel(mode, f, ret_activity, args, ndrange, accumulate)
        except OverflowError:          # (an int the launch could not pass: nothing ran)
            error = int_too_big(f.kernel, tuple(annotate(a).val for a in args))
            if error is None:
                raise
            raise error from None
        tapes = recording_tapes()
        if tapes:
            _derivatives_written(tapes, mode, f, args)
        ctx = current_forward()
        if mode.reverse and ctx is not None:   # (its primal launch carried tangents)
            ctx.unknown([a.dval for a in map(annotate, args) if isinstance(a, Duplicated)],
                        "tg.autodiff(tg.Reverse, ...) computed inside a function that "
                        "forward mode differentiates (tg.jvp, tg.hvp, ...)")
        return derivs
    if isinstance(f, Kernel):
        raise TapegradError("configure the kernel first: tg.autodiff(mode, kern(backend, "
                            "workgroupsize), tg.Const, ..., ndrange=n)")
    if isinstance(f, Annotation):      # (Enzyme's autodiff(Reverse, Const(f), ...))
        inner = getattr(f.val, "__name__", None) or "f"
        raise TapegradError(
            f"tg.autodiff takes the function itself, not tg.{type(f).__name__}(...) around "
            f"it (Enzyme's Const(f) has no counterpart: tapegrad differentiates no closure "
            f"state): drop the wrapper, tg.autodiff(tg.Reverse, {inner}, tg.Active, ...)")
    if not callable(f):
        raise TapegradError(f"tg.autodiff differentiates a function or a configured kernel, "
                            f"got {type(f).__name__}")
    check_shadows_apart(f, args, between_shadows=True)
    if ndrange is not None:
        raise TapegradError("ndrange= is for configured kernels; a host function launches its "
                            "kernels itself")
    if not accumulate:
        raise TapegradError("accumulate=False is for a configured kernel. For a host function, "
                            "tg.gradient(f, x) and tg.vjp(f, x, w) return new gradients "
                            "(nothing to zero first)")
    return _autodiff_host(mode, f, ret_activity, args)


def autodiff_deferred(*args: Any, **kwargs: Any) -> None:
    """Enzyme's ``autodiff_deferred`` differentiates a function from inside a kernel;
    tapegrad has no such mode: it differentiates the host function that launches the kernel
    (or the configured kernel itself) with ``tg.autodiff``, which says so.

    >>> import tapegrad as tg
    >>> tg.autodiff_deferred(tg.Reverse)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    tapegrad.errors.TapegradError: tapegrad has no deferred mode ...
    """
    raise TapegradError(
        "tapegrad has no deferred mode (Enzyme's autodiff_deferred, which differentiates from "
        "inside a kernel): differentiate the host function that launches the kernel, "
        "tg.autodiff(tg.Reverse, f, tg.Active, tg.Duplicated(A, dA), ...), or the configured "
        "kernel itself, tg.autodiff(tg.Reverse, kern(backend), tg.Const, ..., ndrange=n); a "
        "kernel cannot call tg.autodiff")


def _derivatives_written(tapes: tuple, mode: Mode, cfg: ConfiguredKernel, args: tuple) -> None:
    """A kernel-level tg.autodiff inside a recording: the tapes record its primal launch, not
    its derivative launches, so the derivatives it wrote are marked (``stamps.Derivatives``):
    a recorded operation reading them before one writes them is refused.  Reverse mode: the
    shadows of arrays the kernel reads (an output's shadow is zeroed or, as a seed, only
    read); forward mode: the tangents of arrays it writes."""
    reads, writes = access(cfg.kernel)
    wrote = reads if mode.reverse else writes
    what = (f"tg.autodiff({'tg.Reverse' if mode.reverse else 'tg.Forward'}, "
            f"{cfg.kernel.name}, ...)")
    for p, a in zip(kernel_ir(cfg.kernel).params, map(annotate, args)):
        if p in wrote and isinstance(a, Duplicated):
            for d in (a.dval if isinstance(a.dval, tuple) else (a.dval,)):
                if is_array(d):
                    for tape in tapes:
                        tape.derivatives_written(d, what)


def _autodiff_host(mode: Mode, f: Callable[..., Any], ret: Any, args: tuple) -> tuple:
    """Record ``f`` on a tape, then run the adjoints backwards (Enzyme's conventions)."""
    if not mode.reverse:
        return forward_host(mode, f, ret, args)
    refuse_while_recording()
    ret_kind = _return_kind(ret)
    annotated = [annotate(a) for a in args]
    given: dict[int, Any] = {}
    for k, a in enumerate(annotated):
        _check_host_annotation(f, k, a)
        if isinstance(a, Duplicated) and given.setdefault(id(a.val), a.dval) is not a.dval:
            raise TapegradError(
                f"{getattr(f, '__name__', 'f')}: argument {k} is an array given before with "
                "another shadow; an array has one shadow: pass the same dx each time")
    tape = Tape(watch_changes=False)   # the sweep follows at once: nothing can change
    sources: list[Any] = []
    with tape:
        call_args = []
        for a in annotated:
            if isinstance(a, Active):
                s = tape.new_node(float(plain(a.val)))
                sources.append(s)
                call_args.append(s)
            else:
                if isinstance(a, Duplicated):
                    sources.append(a.val)
                call_args.append(a.val)
        stamped = stamp_sources(tape, [(f"argument {k}", a.val) for k, a in
                                        enumerate(annotated) if isinstance(a, Duplicated)])
        result = call_on_sources("tg.autodiff", tape, stamped, lambda: f(*call_args), f)
    _check_shared_shadows(f, tape, annotated)     # (before the sweep writes any shadow)
    shadows = {tape.key(a.val): a.dval for a in annotated if isinstance(a, Duplicated)}
    seeded = [a.val for a in annotated if isinstance(a, Duplicated)]
    if ret_kind == "active":
        _check_scalar_result(tape, result)
    sweep = tape.backward(result, shadows, sources, seed_target=ret_kind == "active",
                          seeded=seeded)
    derivs = []
    scalar_sources = iter(s for s in sources if isinstance(s, TrackedScalar))
    for a in annotated:
        if isinstance(a, Active):
            value = sweep.scalar_bar.get(next(scalar_sources).node_on(tape), 0.0)
            derivs.append(type(a.val)(value) if isinstance(a.val, np.floating) else value)
        else:
            derivs.append(None)
    if mode.with_primal:
        primal = plain(result) if isinstance(result, TrackedScalar) else result
        return tuple(derivs), primal
    return (tuple(derivs),)


@api_boundary
def jvp(f: Callable[..., Any], x: Any, v: Any) -> tuple[Any, Any]:
    """``(y, y_dot)`` with ``y = f(x)`` and ``y_dot = J(x) v``, in one forward-mode run; ``x``
    an array (``v`` an array like it) or a number (``v`` a number).
    Several inputs: ``x`` a tuple, ``f(*x)``, and ``v`` a tuple of as many directions (``y_dot``
    adds up every input's part); several outputs: ``f`` returns a tuple, and ``y`` and
    ``y_dot`` are tuples (as ``tg.vjp`` takes them).

    >>> import numpy as np, tapegrad as tg
    >>> y, y_dot = tg.jvp(lambda x: tg.dot(x, x), np.array([3.0, 1.0]), np.array([1.0, 0.0]))
    >>> float(y), y_dot
    (10.0, 6.0)
    >>> (s, d), (s_dot, d_dot) = tg.jvp(lambda a, b: (tg.sum(a), tg.dot(a, b)),
    ...                                 (np.array([1.0, 2.0]), np.array([3.0, 4.0])),
    ...                                 (np.array([1.0, 0.0]), np.array([0.0, 1.0])))
    >>> s_dot, d_dot          # 1, then b . (1, 0) + a . (0, 1)
    (1.0, 5.0)
    """
    refuse_nested()      # (before float(x): x may be an outer run's dual scalar)
    several_in = isinstance(x, tuple)
    if several_in != isinstance(v, tuple) or several_in and len(x) != len(v):
        got = (f"a tuple of {len(x)}" if several_in else type(x).__name__,
               f"a tuple of {len(v)}" if isinstance(v, tuple) else type(v).__name__)
        raise TapegradError(
            f"tg.jvp(f, x, v): several inputs are a tuple x, f(*x), with a tuple v of as many "
            f"directions, one per input; one input is an array (v an array like it) or a "
            f"number (v a number); got x {got[0]} and v {got[1]}")
    if several_in and not x:
        raise TapegradError("tg.jvp(f, x, v): x is an empty tuple; give f's inputs")
    xs, vs = (x, v) if several_in else ((x,), (v,))
    names = [(f"x[{k}]", f"v[{k}]") if several_in else ("x", "v") for k in range(len(xs))]
    for (x_name, v_name), xk, vk in zip(names, xs, vs):
        check_direction("tg.jvp(f, x, v)", xk, vk, names=(x_name, v_name))
    _refuse_shared("tg.jvp", [(x_name, xk) for (x_name, _), xk in zip(names, xs)],
                   "carry one tangent, not one each")
    # (a copy of v: the run updates x's tangent along with x, and v is the caller's)
    args = tuple(Duplicated(xk, vk.copy()) if is_array(xk) else
                 Duplicated(float(plain(xk)), float(plain(vk))) for xk, vk in zip(xs, vs))
    tangent, primal = forward_host(ForwardWithPrimal, f, Duplicated, args,
                                             who="tg.jvp", labels=tuple(n for n, _ in names),
                                             several_out=True)
    return primal, tangent


def _refuse_shared(who: str, sources: list[tuple[str, Any]], what: str) -> None:
    """Refuse two sources that share memory (``what`` they would get instead of their own
    derivatives): tapegrad follows arrays by their memory."""
    shared = sharing_pairs([(name, a) for name, a in sources if is_array(a)])
    if shared:
        a, b = shared[0]
        raise TapegradError(
            f"{who}: {a} and {b} share memory (one array passed twice, or views of one "
            f"array), and tapegrad follows arrays by their memory, so they would {what}. "
            f"Pass the array once and use it twice inside f; for the part of each, pass a "
            f"copy as {b}")


def _return_kind(ret: Any) -> str:
    if ret is Active or isinstance(ret, Active):
        return "active"
    if ret is Const or isinstance(ret, Const):
        return "const"
    raise TapegradError(f"the return activity is tg.Active (f returns a scalar to "
                        f"differentiate) or tg.Const (seed the outputs' shadows yourself), got "
                        f"{ret!r}")


def _check_scalar_result(tape: Tape, result: Any) -> None:
    if isinstance(result, TrackedScalar) and result.node_on(tape) is not None:
        return
    if is_array(result) and getattr(result, "size", 0) == 1 and tape.tracks(result):
        return
    raise not_a_scalar(result)


def _check_shared_shadows(f: Any, tape: Tape, annotated: list[Annotation]) -> None:
    """One shadow given for several arrays collects the sum of their gradients, but where a
    recorded operation wrote one of them it is that array's seed too, which its adjoint
    consumes (a launch given both refuses it: runtime/adjoint.py).  Refused after the
    recording, before the sweep seeds or writes any shadow."""
    by_shadow: dict[tuple, list[int]] = {}
    for k, a in enumerate(annotated):
        if isinstance(a, Duplicated):
            by_shadow.setdefault(array_key(a.dval), []).append(k)
    groups = [ks for ks in by_shadow.values()
              if len({tape.key(annotated[k].val) for k in ks}) > 1]
    if not groups:
        return
    written = {ident for record in tape.records for ident in record.writes}
    name = getattr(f, "__name__", "f")
    for ks in groups:
        for k in ks:
            if tape.key(annotated[k].val) in written:
                which = ", ".join(map(str, ks[:-1])) + f" and {ks[-1]}"
                raise LaunchError(
                    f"{name}: one shadow array is given for arguments {which}, and a "
                    f"recorded operation wrote argument {k}: "
                    "its shadow is a seed the sweep consumes, not a gradient to add to; give "
                    "each array its own shadow (tg.make_zero(x))")


def _check_host_annotation(f: Any, k: int, a: Annotation) -> None:
    name = getattr(f, "__name__", "f")
    if isinstance(a, BatchDuplicated):
        raise batch_in_reverse(name)
    if isinstance(a, Duplicated):
        x, dx = a.val, a.dval
        if not is_array(x):
            raise TapegradError(f"{name}: argument {k} is Duplicated but is not an array; "
                                "scalars are tg.Active(x) or tg.Const(x)")
        if not floats(x):     # (as a kernel's: its shadow would stay zero)
            raise no_derivative(name, f"argument {k}", x)
        if not is_array(dx) or dx.shape != x.shape or dx.dtype != x.dtype or \
                kind_of(dx) is not kind_of(x):
            got = (f"shape {dx.shape}, dtype {dx.dtype}" if is_array(dx) else type(dx).__name__)
            raise LaunchError(f"{name}: the shadow of argument {k} must match it (shape "
                              f"{x.shape}, dtype {x.dtype}, same device); got {got}. Make one "
                              "with tg.make_zero(x)")
        check_layout(name, f"argument {k}", dx)
    if isinstance(a, Active) and not isinstance(a.val, (float, np.floating)):
        raise TapegradError(f"{name}: tg.Active(x) needs a float scalar, got "
                            f"{type(a.val).__name__}; arrays are tg.Duplicated(x, dx)")


@api_boundary
def gradient(f: Callable[..., Any], *args: Any) -> tuple:
    """The gradient of the scalar ``f(*args)`` with respect to each argument: a new array for
    an array, a float for a float (``f`` gets a tape scalar in its place: pass it to kernels,
    compute with it).  With ``f`` a captured function (``tg.capture``) whose reverse reads
    nothing its forward computes (a linear simulation's), the forward is not run at all.

    >>> import numpy as np, tapegrad as tg
    >>> (g,) = tg.gradient(lambda x: tg.dot(x, x), np.array([1.0, 2.0]))
    >>> g.tolist()
    [2.0, 4.0]
    >>> tg.gradient(lambda x, c: c * tg.sum(x), np.array([1.0, 2.0]), 0.5)[1]
    3.0
    """
    for k, a in enumerate(args):
        if not is_array(a) and (isinstance(a, bool) or not isinstance(a, (float, np.floating))):
            raise TapegradError(
                f"tg.gradient differentiates with respect to every argument, and argument {k} "
                f"is a {type(a).__name__}, which has no derivative; pass it by closure instead "
                "(tg.gradient(lambda x: f(x, n), x))")
    refuse_while_recording()
    shared = sharing_pairs([(k, a) for k, a in enumerate(args) if is_array(a)])
    if shared:
        # (a tape follows memory: both would get the total derivative, not their own part)
        j, k = shared[0]
        raise TapegradError(
            f"tg.gradient: arguments {j} and {k} share memory (one array passed twice, or "
            "views of one array), and tapegrad follows arrays by their memory, so each "
            "would get the derivative with respect to both. Pass the array once and use it "
            f"twice inside f; for the partial derivative by argument, pass a copy as argument "
            f"{k}")
    tape = Tape(watch_changes=False)   # the sweep follows at once: nothing can change
    with tape:
        sources = [tape.watch(a) for a in args]
        stamped = stamp_sources(tape, [(f"argument {k}", a) for k, a in enumerate(args)])
        # (a captured function's result only seeds the sweep: where the reverse reads
        # nothing its forward computes, a linear simulation's, the forward is not run)
        result = call_on_sources("tg.gradient", tape, stamped, lambda: f.call(
            sources, {}, value_unused=True) if isinstance(f, Captured) else f(*sources),
            None if isinstance(f, Captured) else f)     # (a capture's record installs its own)
    _check_scalar_result(tape, result)
    return tuple(tape.gradient(result, sources))


@api_boundary
def vjp(f: Callable[..., Any], x: Any, w: Any) -> tuple[Any, Any]:
    """``(y, x_bar)`` with ``y = f(x)`` and ``x_bar = J(x)^T w`` (a vector-Jacobian product;
    ``x`` an array or a number).
    Several inputs: ``x`` a tuple, ``f(*x)``, ``x_bar`` a tuple; several outputs: ``f``
    returns a tuple and ``w`` is a tuple of cotangents, one per output (``tape.vjp`` is the
    same on a recording of your own).

    >>> import numpy as np, tapegrad as tg
    >>> y, x_bar = tg.vjp(lambda x: tg.dot(x, x), np.array([3.0]), 1.0)
    >>> float(y), x_bar.tolist()
    (9.0, [6.0])
    >>> (s, d), (a_bar, b_bar) = tg.vjp(lambda a, b: (tg.sum(a), tg.dot(a, b)),
    ...                                 (np.array([1.0, 2.0]), np.array([3.0, 4.0])), (1.0, 10.0))
    >>> a_bar.tolist(), b_bar.tolist()
    ([31.0, 41.0], [10.0, 20.0])
    """
    refuse_while_recording()
    several_in = isinstance(x, tuple)
    xs = x if several_in else (x,)
    labels = [f"x[{k}]" if several_in else "x" for k in range(len(xs))]
    for label, xk in zip(labels, xs):
        if not is_array(xk) and not is_number(xk):
            raise TapegradError(f"tg.vjp(f, x, w): {label} is an array or a number (several "
                                f"inputs: a tuple of them), got "
                                f"{'None' if xk is None else type(xk).__name__}")
    _refuse_shared("tg.vjp", list(zip(labels, xs)),
                   "each get the sum of both gradients")
    tape = Tape(watch_changes=False)   # the sweep follows at once: nothing can change
    with tape:
        xs = tuple(v if is_array(v) else tape.watch(v) for v in xs)    # (numbers: tape scalars)
        stamped = stamp_sources(tape, [(f"argument {k}" if several_in else "x", v)
                                        for k, v in enumerate(xs)])
        y = call_on_sources("tg.vjp", tape, stamped, lambda: f(*xs), f)
    several_out = isinstance(y, tuple)
    ys = y if several_out else (y,)
    ws = w if several_out else (w,)
    if several_out and not (isinstance(w, tuple) and len(w) == len(ys)):
        raise TapegradError(f"tg.vjp: f returned {len(ys)} outputs; give a tuple of "
                            f"{len(ys)} cotangents, one per output")
    ys = [_vjp_output(tape, v) for v in ys]
    for k, (yk, wk) in enumerate(zip(ys, ws)):    # (before the sweep writes anything)
        check_direction("tg.vjp(f, x, w)", yk, wk, every_element=True,
                        names=(f"f's output {k}", f"w[{k}]") if several_out else
                        ("f's output", "w"))
    x_bars = tape.vjp(ys, list(ws), list(xs))
    primal = tuple(plain(v) if isinstance(v, TrackedScalar) else v for v in ys)
    return (primal if several_out else primal[0]), (tuple(x_bars) if several_in else x_bars[0])


def _vjp_output(tape: Tape, y: Any) -> Any:
    if isinstance(y, TrackedScalar) or (is_array(y) and tape.tracks(y)):
        return y
    raise TapegradError("tg.vjp / tg.jacobian need f(x) to return an array its kernels "
                        "wrote, or a scalar from tg.sum/tg.dot/...")


@api_boundary
def jacobian(f: Callable[..., Any], x: Any, mode: Mode = Reverse) -> Any:
    """The Jacobian of ``f`` at ``x``, an array of shape ``(y.size, x.size)``: one reverse
    sweep per output element over a single recording.

    >>> import numpy as np, tapegrad as tg
    >>> J = tg.jacobian(lambda x: tg.dot(x, x), np.array([1.0, 2.0]))
    >>> J.tolist()
    [[2.0, 4.0]]
    """
    if not is_array(x):
        raise TapegradError(
            f"tg.jacobian(f, x) takes an array x, got {type(x).__name__}: for a number x the "
            "derivative of f is tg.jvp(f, x, 1.0)[1] (an array or number like f(x))")
    token = jacobian_var.set(True)      # (tapegrad.mpi refuses it: modes.refuse_jacobian)
    try:
        return _jacobian_forward(f, x) if not mode.reverse else _jacobian_reverse(f, x)
    finally:
        jacobian_var.reset(token)


def _jacobian_reverse(f: Callable[..., Any], x: Any) -> Any:
    """One reverse sweep per output element over a single recording."""
    refuse_while_recording()
    tape = Tape(watch_changes=False)   # the sweep follows at once: nothing can change
    with tape:
        stamped = stamp_sources(tape, [("x", x)])
        y = call_on_sources("tg.jacobian", tape, stamped, lambda: f(x), f)
    y = _vjp_output(tape, y)
    size = 1 if isinstance(y, TrackedScalar) else y.size
    rows = []
    for k in range(size):
        if isinstance(y, TrackedScalar):
            w = 1.0
        else:
            w = zeros_like(y).ravel()
            w[k] = 1
            w = w.reshape(y.shape)
        (x_bar,) = tape.vjp([y], [w], [x])
        rows.append(host_array(x_bar).ravel())
    return np.stack(rows)


def _jacobian_forward(f: Callable[..., Any], x: Any, width: int = 8) -> Any:
    """Columns of the Jacobian in chunks of ``width`` directions (one batched run each)."""
    columns = []
    original = x.copy() if x.size > width else x   # f may change x: each run starts from it
    for start in range(0, x.size, width):
        count = min(width, x.size - start)
        seeds = []
        for k in range(count):
            e = zeros_like(x).ravel()
            e[start + k] = 1
            seeds.append(e.reshape(x.shape))
        at = x if start == 0 else original.copy()  # (x itself once, as in reverse mode)
        (tangents,) = forward_host(Forward, f, BatchDuplicated,
                                             (BatchDuplicated(at, tuple(seeds)),),
                                             who="tg.jacobian", labels=("x",))
        for t in tangents:
            columns.append(np.ravel(host_array(t)) if is_array(t) else np.array([t]))
    return np.stack(columns, axis=1)


