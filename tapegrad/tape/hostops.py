"""Differentiable host operations on arrays: reductions that turn arrays into tracked
scalars, copies, reshapes and scaling (the arithmetic on scalars is ``tape.scalars``'s).  Each records one ``Record`` whose ``backward`` is its
derivative rule; without a recording tape they are plain NumPy/CuPy computations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapegrad.backends.determinism import DETERMINISTIC
from tapegrad.backends.registry import array_kind, backend_of
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array
from tapegrad.tape.duals import TapedDual
from tapegrad.tape.modes import current_forward, new_scalar, recording_tapes, suspended
from tapegrad.tape.records import Record
from tapegrad.tape.scalars import DualScalar, TrackedScalar, plain
from tapegrad.tracebacks import api_boundary


def _xp(x: Any) -> Any:
    return np if isinstance(x, np.ndarray) else array_kind(x).module()


# -- reductions -------------------------------------------------------------------------------

@dataclass
class ReductionRecord(Record):
    """``out = rule(arrays)``; backward adds ``out_bar * d out / d array`` to each shadow.

    ``grad(bar, k, value, *arrays)`` gives array ``k``'s cotangent as ``(scale, array)``, meaning
    ``scale * array`` (``array`` None: ``scale`` everywhere), so that it is computed only for
    active arrays and written straight into a shadow that holds no values yet: a 100-step
    simulation's ``tg.dot(state, w)`` made both cotangents as new arrays, then copied one,
    a third of a millisecond at 256^2 (fresh pages for each temporary)."""

    views: list[Any] = field(default_factory=list)
    grad: Callable[..., tuple[Any, Any]] | None = None
    value: float = 0.0
    reduce: Callable[..., float] | None = None     # the value from the arrays (a replay's)
    # array k's cotangent reads neither the value nor array k, only the others (sum, mean,
    # dot): a captured program's written-down reverse need not run its forward for them
    linear: bool = False

    traceable = True

    def redirect(self, pos: int, copy: Any) -> None:
        self.views[pos] = copy

    def reads_contents(self, pos: int, sweep: Any) -> bool:
        # (a linear one's cotangents read only the other arrays: those of active arrays)
        return any(r in sweep.active_ids for j, r in enumerate(self.reads)
                   if j != pos or not self.linear)

    def backward(self, sweep: Any) -> None:
        bar = sweep.scalar_bar.get(self.scalar_out, 0.0)
        if bar == 0.0:
            # (skipped, by a value: the sweep leaves the path that sweeps of a frozen tape
            # verified, and with it their chain runs, tape.sweep.Frozen; and a trace misses
            # the work that other values need)
            sweep.runs = None
            if sweep.trace is not None:
                sweep.trace.fail(f"{self.name}'s gradient is 0 in this sweep", again=True)
            return
        for k, ident in enumerate(self.reads):
            if ident not in sweep.active_ids:
                continue
            scale, array = self.grad(bar, k, self.value, *self.views)
            shadow = sweep.shadow(ident, unwritten_ok=True)
            fresh = ident in sweep.fresh
            if sweep.trace is not None:
                sweep.trace.cotangent(self, k, shadow, fresh)
            write_cotangent(shadow, scale, array, fresh)
            if fresh:
                sweep.written(ident)


def write_cotangent(shadow: Any, scale: float, array: Any, fresh: bool) -> None:
    """``scale * array`` (``array`` None: ``scale`` everywhere) stored into ``shadow`` where it
    holds no values yet (``fresh``), else added to it."""
    if fresh:
        if array is None:
            shadow.fill(scale)
        else:
            _xp(shadow).multiply(array, scale, out=shadow)
    elif array is None:
        shadow += scale
    else:
        shadow += scale * array


def _reduce(name: str, arrays: tuple, reduce: Callable[..., float],
            grad: Callable[..., tuple[Any, Any]], jvp: Callable[..., float],
            linear: bool = False) -> Any:
    """``reduce(*arrays)``, recorded (reverse mode) or carrying tangents (forward mode).

    ``grad(bar, k, value, *arrays)`` gives array ``k``'s cotangent as ``(scale, array or
    None)`` (see ``ReductionRecord``); ``jvp(tangents, value, *arrays)`` the reduction's
    tangent given one tangent (or None) per array, computed by tg's own reductions (so that a
    tape records it, under tg.hvp); ``linear``: see ``ReductionRecord``."""
    ctx = current_forward()
    if ctx is not None:
        per_array = [ctx.tangent_of(a) for a in arrays]
        if all(t is None for t in per_array):
            return reduce(*arrays)   # a constant (so float() of it, refused for duals, works)
        for a, t in zip(arrays, per_array):
            if t is not None:
                ctx.unchanged(a, f"tg.{name}")
        if ctx.taped:         # (tg.hvp: the value and the tangent recorded, by these same ops)
            with ctx.on_tape():
                scalar = _reduce(name, arrays, reduce, grad, jvp, linear)
                return TapedDual(scalar, jvp([t[0] if t is not None else None
                                              for t in per_array], scalar, *arrays))
        value = reduce(*arrays)
        with suspended():
            tangents = [float(jvp([t[j] if t is not None else None for t in per_array], value,
                                  *arrays)) for j in range(ctx.width)]
        return DualScalar(value, tangents)
    value = reduce(*arrays)
    tapes = recording_tapes()
    if not tapes:
        return value
    scalar = new_scalar(value, tapes)
    for tape in tapes:
        record = ReductionRecord(reads=[tape.track(a) for a in arrays], writes=[], name=name,
                                 scalar_out=scalar.node_on(tape), views=list(arrays),
                                 grad=grad, value=value, reduce=reduce, linear=linear)
        tape.record_host(record, [(a, k) for k, a in enumerate(arrays)])
    return scalar


def _check_array(fn: str, x: Any, on_device: bool = False) -> None:
    """Refuse what ``tg.<fn>`` cannot take (``on_device``: it computes where ``x`` lives,
    which PyOpenCL cannot do on a view that skips elements)."""
    if type(x) is np.ndarray:
        return
    if not is_array(x):
        raise TapegradError(f"tg.{fn} expects arrays (NumPy or CuPy), got {type(x).__name__}")
    backend = backend_of(x, f"tg.{fn}")
    if not backend.owns(x):     # (a PyOpenCL array on a queue of the user's own)
        raise TapegradError(f"tg.{fn}: " + (backend.not_here("x", x) or
                                             f"its array is not on {backend!r}"))
    if on_device:
        array_kind(x).check_operable(x, f"tg.{fn}")


def _whole(fn: str, axis: Any) -> None:
    """Refuse NumPy's ``axis=`` (tapegrad's reductions give one scalar, a loss)."""
    if axis is not None:
        raise TapegradError(
            f"tg.{fn} reduces over all elements to one scalar (a loss to differentiate), so "
            f"it takes no axis; for a {fn} along an axis, write it as a kernel (one work-item "
            "per output element, a loop over the axis) and reduce its output with "
            f"tg.{fn}(...)")


@api_boundary
def sum(x: Any, axis: None = None) -> Any:  # noqa: A001 - the public name is tg.sum
    """The sum of all elements, differentiable: ``loss = tg.sum(B)``.

    >>> import numpy as np, tapegrad as tg
    >>> float(tg.sum(np.arange(4.0)))
    6.0
    """
    _whole("sum", axis)
    _check_array("sum", x)
    return _reduce("sum", (x,), _sum, lambda bar, k, v, a: (bar, None),
                   lambda t, v, a: _f(t[0], sum), linear=True)


def _sum(a: Any) -> float:
    return float(_xp(a).sum(a))


@api_boundary
def mean(x: Any, axis: None = None) -> Any:
    """The mean of all elements, differentiable."""
    _whole("mean", axis)
    _check_array("mean", x)
    n = x.size
    return _reduce("mean", (x,), _mean, lambda bar, k, v, a: (bar / n if n else 0.0, None),
                   lambda t, v, a: _f(t[0], mean), linear=True)


def _mean(a: Any) -> float:
    return float(_xp(a).mean(a))


@api_boundary
def dot(x: Any, y: Any) -> Any:
    """The inner product over all elements (like ``numpy.vdot``), for any shapes of equal size.

    >>> import numpy as np, tapegrad as tg
    >>> float(tg.dot(np.ones((2, 2)), np.full((2, 2), 3.0)))
    12.0
    """
    _check_array("dot", x, on_device=True)
    _check_array("dot", y, on_device=True)
    if type(x) is not type(y) and array_kind(x) is not array_kind(y):
        raise TapegradError(f"tg.dot of arrays of two kinds ({array_kind(x).name} and "
                            f"{array_kind(y).name}): bring both to one backend first "
                            "(tg.asarray(backend, x))")
    if x.size != y.size:
        raise TapegradError(f"tg.dot needs arrays of the same size, got {x.shape} and {y.shape}")
    return _reduce("dot", (x, y), _vdot,
                   lambda bar, k, v, a, b: (bar, b.reshape(a.shape) if k == 0 else
                                            a.reshape(b.shape)),
                   lambda t, v, a, b: _f(t[0], lambda d: dot(d, b))
                   + _f(t[1], lambda d: dot(a, d)), linear=True)


def _vdot(a: Any, b: Any) -> float:
    if isinstance(a, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)    # (an np.matrix's ravel() stays 2-D)
    if DETERMINISTIC.on and isinstance(a, np.ndarray):
        # (NumPy's vdot is BLAS's, whose threads split the sum: other bits with another
        # OPENBLAS_NUM_THREADS; NumPy's own sum adds in one order, pairwise)
        return float(np.sum(np.multiply(a.ravel(), b.ravel(), dtype=np.result_type(a, b))))
    return float(_xp(a).vdot(a.ravel(), b.ravel()))


@api_boundary
def norm(x: Any) -> Any:
    """The Euclidean norm of all elements, differentiable (its gradient at 0 is 0)."""
    _check_array("norm", x, on_device=True)
    return _reduce("norm", (x,), _norm,
                   lambda bar, k, v, a: _norm_cotangent(bar, a, v),
                   lambda t, v, a: _f(t[0], lambda d: dot(a, d) / v if v else 0.0))


def _norm(a: Any) -> float:
    with np.errstate(over="ignore", under="ignore"):    # (an edge seen to below)
        value = math.sqrt(_vdot(a, a)) if DETERMINISTIC.on and isinstance(a, np.ndarray) \
            else float(_xp(a).linalg.norm(a.ravel()))
    if (value == 0.0 or value == math.inf) and a.size:
        # the sum of squares may have over- or underflowed in a's precision (float32's at
        # 1e19 or 1e-23) where the norm itself does not: again, scaled by the largest
        # magnitude (on the host: this edge only)
        host = a if isinstance(a, np.ndarray) else array_kind(a).to_numpy(a)
        largest = float(np.max(np.abs(host)))
        if 0.0 < largest < math.inf:
            value = largest * float(np.linalg.norm((host / host.dtype.type(largest)).ravel()))
    return value


def _norm_cotangent(bar: float, a: Any, value: float) -> tuple[Any, Any]:
    """``bar * a / value`` as ``(scale, array)``: the scale ``bar / value`` alone when it is a
    normal number of ``a``'s type, else the product in that order (``bar / value`` can
    overflow where the product does not: a small norm and a large adjoint)."""
    if not value:
        return 0.0, None
    scale = bar / value
    info = np.finfo(a.dtype)
    if float(info.tiny) <= abs(scale) <= float(info.max):
        return scale, a
    return 1.0, bar * a / value


def _f(tangent: Any, fn: Callable[[Any], Any]) -> Any:
    """``fn(tangent)``, or 0 when there is no tangent.  ``fn`` is tg's own reduction (run
    outside forward mode here: a plain float, or under tg.hvp a tape scalar)."""
    return 0.0 if tangent is None else fn(tangent)


@dataclass
class CopyRecord(Record):
    """``dst = src`` (copied, possibly reshaped): the adjoint adds ``dst``'s shadow, in
    ``src``'s shape, into ``src``'s."""

    traceable = True

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, sweep: Any) -> None:
        src, dst = self.reads[0], self.writes[0]
        if src in sweep.active_ids:
            shadow = sweep.shadow(src, unwritten_ok=True)
            dst_bar = sweep.shadow(dst)
            bar = dst_bar.reshape(shadow.shape)
            if src in sweep.fresh:        # (no zeros to add to: a pass over it fewer)
                shadow[...] = bar
                sweep.written(src)
                if sweep.trace is not None:
                    sweep.trace.array_op("copy", shadow, dst_bar)
            else:
                shadow += bar
                if sweep.trace is not None:
                    sweep.trace.array_op("add", shadow, dst_bar)


@dataclass
class ScaleRecord(Record):
    """``dst = a * src``: ``src_bar += a * dst_bar`` and, for a tracked ``a``,
    ``a_bar += <src, dst_bar>``."""

    factor: float = 1.0
    node: int | None = None
    views: list[Any] = field(default_factory=list)
    traceable = True

    def redirect(self, pos: int, copy: Any) -> None:
        self.views[pos] = copy

    def reads_contents(self, pos: int, sweep: Any) -> bool:
        return self.node is not None and self.node in sweep.active_nodes    # (a_bar's)

    def backward(self, sweep: Any) -> None:
        src, dst = self.reads[0], self.writes[0]
        bar = sweep.shadow(dst)
        if src in sweep.active_ids:
            shadow = sweep.shadow(src)
            shadow[...] += self.factor * bar
            if sweep.trace is not None:
                sweep.trace.scaled_add(self, shadow, bar)
        if self.node is not None and self.node in sweep.active_nodes:
            if sweep.trace is not None:
                sweep.trace.factor(self, bar)
            sweep.add_scalar_bar(self.node, factor_gradient(self.views[0], bar))


def factor_gradient(src: Any, bar: Any) -> float:
    """``<src, bar>``: the gradient of ``a`` in ``dst = a * src`` (``bar``: dst's shadow)."""
    return float(_xp(bar).vdot(src.ravel(), bar.ravel()))


@api_boundary
def copy(x: Any) -> Any:
    """A copy of ``x`` that tapes record (``x.copy()`` is invisible to them).

    >>> import numpy as np, tapegrad as tg
    >>> tg.copy(np.arange(3.0)).tolist()
    [0.0, 1.0, 2.0]
    """
    _check_array("copy", x, on_device=True)
    y = x.copy()
    ctx = current_forward()
    if ctx is not None and ctx.tangent_of(x) is not None:
        ctx.seed(y, [ctx.taped_or_plain(copy, lambda t: t.copy(), t)
                     for t in ctx.tangent_of(x)])
    for tape in recording_tapes():
        tape.record_host(CopyRecord(reads=[tape.track(x)], writes=[tape.track(y)], name="copy"),
                         [], read=(x,), wrote=(y,))
    return y


@api_boundary
def reshape(x: Any, shape: Any) -> Any:
    """A copy of ``x`` in another shape, that tapes record (``x.reshape(...)`` and
    ``x.ravel()`` are views, and tapes follow whole arrays: a view of a recorded array would be
    a second array for the same memory).

    >>> import numpy as np, tapegrad as tg
    >>> tg.reshape(np.arange(4.0), (2, 2)).tolist()
    [[0.0, 1.0], [2.0, 3.0]]
    """
    _check_array("reshape", x, on_device=True)
    try:
        y = x.reshape(shape).copy()
    except (ValueError, TypeError) as e:
        raise TapegradError(f"tg.reshape: an array of shape {tuple(x.shape)} cannot take "
                            f"shape {shape!r} ({e})") from None
    ctx = current_forward()
    if ctx is not None and ctx.tangent_of(x) is not None:
        ctx.seed(y, [ctx.taped_or_plain(reshape, lambda t, shape: t.reshape(shape).copy(), t,
                                        y.shape) for t in ctx.tangent_of(x)])
    for tape in recording_tapes():
        tape.record_host(CopyRecord(reads=[tape.track(x)], writes=[tape.track(y)],
                                    name="reshape"), [], read=(x,), wrote=(y,))
    return y


@api_boundary
def scale(x: Any, a: Any) -> Any:
    """``a * x`` as a new array that tapes record (``x * a`` with NumPy is invisible to
    them); ``a`` is a number or a scalar from ``tg.sum``/``tg.dot``/... (differentiated too).

    >>> import numpy as np, tapegrad as tg
    >>> tg.scale(np.arange(3.0), 2.0).tolist()
    [0.0, 2.0, 4.0]
    """
    _check_array("scale", x, on_device=True)
    ctx = current_forward()
    if ctx is not None and ctx.taped:
        return _scale_on_tape(ctx, x, a)
    value = plain(a) if isinstance(a, (TrackedScalar, DualScalar)) else a
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise TapegradError(f"tg.scale(x, a) takes a number a, got {type(a).__name__}")
    value = float(value)
    # a float array keeps its precision (NumPy's for a Python float); an integer one is
    # multiplied as NumPy would (by 0.5: a float64 result; its dtype's 0.5 was 0)
    y = x * (x.dtype.type(value) if np.dtype(x.dtype).kind in "fc" else
             a if isinstance(a, (int, np.integer)) else value)
    if ctx is not None:
        tx = ctx.tangent_of(x)
        da = a.tangents if isinstance(a, DualScalar) else None
        if tx is not None or da is not None:
            ctx.seed(y, [(value * tx[j] if tx is not None else 0 * x)
                         + (da[j] * x if da is not None else 0) for j in range(ctx.width)])
    for tape in recording_tapes():
        node = a.node_on(tape) if isinstance(a, TrackedScalar) else None
        if node is None and isinstance(a, TrackedScalar):
            tape.foreign_scalars = True     # (another tape's scalar: a constant here)
        record = ScaleRecord(reads=[tape.track(x)], writes=[tape.track(y)], name="scale",
                             scalars_in=[] if node is None else [node], factor=value,
                             node=node, views=[x] if node is not None else [])
        tape.record_host(record, [(x, 0)] if node is not None else [], read=(x,), wrote=(y,))
    return y


def _scale_on_tape(ctx: Any, x: Any, a: Any) -> Any:
    """``tg.scale`` under tg.hvp: ``y = a x`` and its tangent ``a x_dot + a_dot x``, recorded."""
    tx = ctx.tangent_of(x)
    with ctx.on_tape():
        value = a.value if isinstance(a, TapedDual) else a
        y = scale(x, value)
        parts = [] if tx is None else [scale(tx[0], value)]
        if isinstance(a, TapedDual) and (isinstance(a.tangent, TrackedScalar) or a.tangent):
            parts.append(scale(x, a.tangent))
        tangent = parts[0] if len(parts) == 1 else _add(*parts) if parts else None
    if tangent is not None:
        ctx.seed(y, [tangent])
    return y


@dataclass
class AddRecord(Record):
    """``dst = u + w``: each one's shadow gets ``dst``'s."""

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, sweep: Any) -> None:
        bar = sweep.shadow(self.writes[0])
        for ident in dict.fromkeys(self.reads):
            if ident in sweep.active_ids:
                shadow = sweep.shadow(ident, unwritten_ok=True)
                if ident in sweep.fresh:
                    shadow[...] = bar * self.reads.count(ident)
                    sweep.written(ident)
                else:
                    shadow += bar * self.reads.count(ident)


def _add(u: Any, w: Any) -> Any:
    """``u + w`` as a new array that tapes record (for tg.hvp's tangents of ``tg.scale``)."""
    y = u + w
    for tape in recording_tapes():
        tape.record_host(AddRecord(reads=[tape.track(u), tape.track(w)],
                                   writes=[tape.track(y)], name="add"), [], read=(u, w),
                         wrote=(y,))
    return y


# -- arithmetic on tracked scalars ------------------------------------------------------------


