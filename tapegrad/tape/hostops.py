"""Differentiable host operations: reductions that turn arrays into tracked scalars, and the
arithmetic on tracked scalars.  Each records one ``Record`` whose ``backward`` is its
derivative rule; without a recording tape they are plain NumPy/CuPy computations.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.tape import forward as F
from tapegrad.tape import tape as T
from tapegrad.tape.scalars import TrackedScalar, plain


def _xp(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return np
    import cupy
    return cupy


# -- reductions -------------------------------------------------------------------------------

@dataclass
class ReductionRecord(T.Record):
    """``out = rule(arrays)``; backward adds ``out_bar * d out / d array`` to each shadow.

    ``grad(bar, k, *arrays)`` gives array ``k``'s cotangent as ``(scale, array)``, meaning
    ``scale * array`` (``array`` None: ``scale`` everywhere), so that it is computed only for
    active arrays and written straight into a shadow that holds no values yet: a 100-step
    simulation's ``tg.dot(state, w)`` made both cotangents as new arrays, then copied one,
    a third of a millisecond at 256^2 (fresh pages for each temporary)."""

    views: list[Any] = field(default_factory=list)
    grad: Callable[..., tuple[Any, Any]] | None = None

    def redirect(self, pos: int, copy: Any) -> None:
        self.views[pos] = copy

    def backward(self, tape: T.Tape) -> None:
        bar = tape.scalar_bar.get(self.scalar_out, 0.0)
        if bar == 0.0:
            return
        for k, ident in enumerate(self.reads):
            if ident not in tape.active_ids:
                continue
            scale, array = self.grad(bar, k, *self.views)
            shadow = tape.shadow(ident, unwritten_ok=True)
            if ident in tape.fresh:
                if array is None:
                    shadow.fill(scale)
                else:
                    _xp(shadow).multiply(array, scale, out=shadow)
                tape.written(ident)
            elif array is None:
                shadow += scale
            else:
                shadow += scale * array


def _reduce(name: str, arrays: tuple, value: float, grad: Callable[..., tuple[Any, Any]],
            jvp: Callable[..., float]) -> Any:
    """Record (reverse mode) or carry tangents (forward mode) for a reduction.

    ``grad(bar, k, *arrays)`` gives array ``k``'s cotangent as ``(scale, array or None)``
    (see ``ReductionRecord``); ``jvp(tangents, *arrays)`` the reduction's tangent given one
    tangent (or None) per array."""
    ctx = F.current()
    if ctx is not None:
        per_array = [ctx.tangent_of(a) for a in arrays]
        if all(t is None for t in per_array):
            return value     # a constant (so float() of it, refused for dual scalars, works)
        tangents = [jvp([t[j] if t is not None else None for t in per_array], *arrays)
                    for j in range(ctx.width)]
        return F.DualScalar(value, tangents)
    tapes = T.recording_tapes()
    if not tapes:
        return value
    scalar = T.new_scalar(value, tapes)
    for tape in tapes:
        record = ReductionRecord(reads=[tape.track(a) for a in arrays], writes=[], name=name,
                                 scalar_out=scalar.node_on(tape), views=list(arrays),
                                 grad=grad)
        tape.record_host(record, [(a, k) for k, a in enumerate(arrays)])
    return scalar


def _check_array(fn: str, x: Any) -> None:
    if not T.is_array(x):
        raise TapegradError(f"tg.{fn} expects arrays (NumPy or CuPy), got {type(x).__name__}")


def sum(x: Any) -> Any:  # noqa: A001 - the public name is tg.sum
    """The sum of all elements, differentiable: ``loss = tg.sum(B)``.

    >>> import numpy as np, tapegrad as tg
    >>> float(tg.sum(np.arange(4.0)))
    6.0
    """
    _check_array("sum", x)
    return _reduce("sum", (x,), float(_xp(x).sum(x)), lambda bar, k, a: (bar, None),
                   lambda t, a: _f(t[0], lambda d: d.sum()))


def mean(x: Any) -> Any:
    """The mean of all elements, differentiable."""
    _check_array("mean", x)
    n = x.size
    return _reduce("mean", (x,), float(_xp(x).mean(x)), lambda bar, k, a: (bar / n, None),
                   lambda t, a: _f(t[0], lambda d: d.mean()))


def dot(x: Any, y: Any) -> Any:
    """The inner product over all elements (like ``numpy.vdot``), for any shapes of equal size.

    >>> import numpy as np, tapegrad as tg
    >>> float(tg.dot(np.ones((2, 2)), np.full((2, 2), 3.0)))
    12.0
    """
    _check_array("dot", x)
    _check_array("dot", y)
    if x.size != y.size:
        raise TapegradError(f"tg.dot needs arrays of the same size, got {x.shape} and {y.shape}")
    xp = _xp(x)
    value = float(xp.vdot(x.ravel(), y.ravel()))
    return _reduce("dot", (x, y), value,
                   lambda bar, k, a, b: (bar, b.reshape(a.shape) if k == 0 else
                                         a.reshape(b.shape)),
                   lambda t, a, b: _f(t[0], lambda d: xp.vdot(d.ravel(), b.ravel()))
                   + _f(t[1], lambda d: xp.vdot(a.ravel(), d.ravel())))


def norm(x: Any) -> Any:
    """The Euclidean norm of all elements, differentiable (its gradient at 0 is 0)."""
    _check_array("norm", x)
    value = float(_xp(x).linalg.norm(x.ravel()))
    return _reduce("norm", (x,), value,
                   lambda bar, k, a: _norm_cotangent(bar, a, value),
                   lambda t, a: _f(t[0], lambda d: _xp(a).vdot(a.ravel(), d.ravel()) / value
                                   if value else 0.0))


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


def _f(tangent: Any, fn: Callable[[Any], Any]) -> float:
    """``fn(tangent)`` as a float, or 0 when there is no tangent."""
    return 0.0 if tangent is None else float(fn(tangent))


@dataclass
class CopyRecord(T.Record):
    """``dst = src`` (copied, possibly reshaped): the adjoint adds ``dst``'s shadow, in
    ``src``'s shape, into ``src``'s."""

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, tape: T.Tape) -> None:
        src, dst = self.reads[0], self.writes[0]
        if src in tape.active_ids:
            shadow = tape.shadow(src, unwritten_ok=True)
            bar = tape.shadow(dst).reshape(shadow.shape)
            if src in tape.fresh:        # (no zeros to add to: a pass over it fewer)
                shadow[...] = bar
                tape.written(src)
            else:
                shadow += bar


@dataclass
class ScaleRecord(T.Record):
    """``dst = a * src``: ``src_bar += a * dst_bar`` and, for a tracked ``a``,
    ``a_bar += <src, dst_bar>``."""

    factor: float = 1.0
    node: int | None = None
    views: list[Any] = field(default_factory=list)

    def redirect(self, pos: int, copy: Any) -> None:
        self.views[pos] = copy

    def backward(self, tape: T.Tape) -> None:
        src, dst = self.reads[0], self.writes[0]
        bar = tape.shadow(dst)
        if src in tape.active_ids:
            tape.shadow(src)[...] += self.factor * bar
        if self.node is not None and self.node in tape.active_nodes:
            tape.add_scalar_bar(self.node, float(_xp(bar).vdot(self.views[0].ravel(),
                                                               bar.ravel())))


def copy(x: Any) -> Any:
    """A copy of ``x`` that tapes record (``x.copy()`` is invisible to them).

    >>> import numpy as np, tapegrad as tg
    >>> tg.copy(np.arange(3.0)).tolist()
    [0.0, 1.0, 2.0]
    """
    _check_array("copy", x)
    y = x.copy()
    ctx = F.current()
    if ctx is not None and ctx.tangent_of(x) is not None:
        ctx.seed(y, [t.copy() for t in ctx.tangent_of(x)])
    for tape in T.recording_tapes():
        tape.record_host(CopyRecord(reads=[tape.track(x)], writes=[tape.track(y)], name="copy"),
                         [], read=(x,))
    return y


def reshape(x: Any, shape: Any) -> Any:
    """A copy of ``x`` in another shape, that tapes record (``x.reshape(...)`` and
    ``x.ravel()`` are views, and tapes follow whole arrays: a view of a recorded array would be
    a second array for the same memory).

    >>> import numpy as np, tapegrad as tg
    >>> tg.reshape(np.arange(4.0), (2, 2)).tolist()
    [[0.0, 1.0], [2.0, 3.0]]
    """
    _check_array("reshape", x)
    y = x.reshape(shape).copy()
    ctx = F.current()
    if ctx is not None and ctx.tangent_of(x) is not None:
        ctx.seed(y, [t.reshape(y.shape).copy() for t in ctx.tangent_of(x)])
    for tape in T.recording_tapes():
        tape.record_host(CopyRecord(reads=[tape.track(x)], writes=[tape.track(y)],
                                    name="reshape"), [], read=(x,))
    return y


def scale(x: Any, a: Any) -> Any:
    """``a * x`` as a new array that tapes record (``x * a`` with NumPy is invisible to
    them); ``a`` is a number or a scalar from ``tg.sum``/``tg.dot``/... (differentiated too).

    >>> import numpy as np, tapegrad as tg
    >>> tg.scale(np.arange(3.0), 2.0).tolist()
    [0.0, 2.0, 4.0]
    """
    _check_array("scale", x)
    value = plain(a) if isinstance(a, (TrackedScalar, F.DualScalar)) else a
    if not isinstance(value, (int, float, np.integer, np.floating)):
        raise TapegradError(f"tg.scale(x, a) takes a number a, got {type(a).__name__}")
    value = float(value)
    y = x * x.dtype.type(value)
    ctx = F.current()
    if ctx is not None:
        tx = ctx.tangent_of(x)
        da = a.tangents if isinstance(a, F.DualScalar) else None
        if tx is not None or da is not None:
            ctx.seed(y, [(value * tx[j] if tx is not None else 0 * x)
                         + (da[j] * x if da is not None else 0) for j in range(ctx.width)])
    for tape in T.recording_tapes():
        node = a.node_on(tape) if isinstance(a, TrackedScalar) else None
        record = ScaleRecord(reads=[tape.track(x)], writes=[tape.track(y)], name="scale",
                             scalars_in=[] if node is None else [node], factor=value,
                             node=node, views=[x] if node is not None else [])
        tape.record_host(record, [(x, 0)] if node is not None else [], read=(x,))
    return y


# -- arithmetic on tracked scalars ------------------------------------------------------------

@dataclass
class ScalarRecord(T.Record):
    partials: tuple = ()
    inputs: list[int | None] = field(default_factory=list)

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, tape: T.Tape) -> None:
        bar = tape.scalar_bar.get(self.scalar_out, 0.0)
        for node, p in zip(self.inputs, self.partials):
            if node is not None:
                tape.add_scalar_bar(node, bar * p)


def record_scalar_op(name: str, operands: tuple, value: float, partials: tuple) -> Any:
    """Record ``value = name(*operands)`` (reverse mode) given its partial derivatives."""
    return _record_scalar_op(name, operands, value, partials)


def _record_scalar_op(name: str, operands: tuple, value: float, partials: tuple) -> Any:
    tapes = tuple({id(t): t for o in operands if isinstance(o, TrackedScalar)
                   for t in (o.tape, *(t for t, _ in o.outer)) if t.recording}.values())
    if not tapes:
        return value
    for o in operands:
        if isinstance(o, (np.floating, np.ndarray)) and getattr(o, "ndim", 0) == 0:
            raise numpy_number(name, o)
        if not isinstance(o, (TrackedScalar, int, float, np.integer)):
            raise TapegradError(f"cannot combine a tracked scalar with a {type(o).__name__} "
                                f"in {name!r}; only numbers and tracked scalars mix")
    scalar = T.new_scalar(value, tapes)
    for tape in tapes:
        nodes = [o.node_on(tape) if isinstance(o, TrackedScalar) else None for o in operands]
        record = ScalarRecord(reads=[], writes=[], name=name, scalar_out=scalar.node_on(tape),
                              scalars_in=[n for n in nodes if n is not None],
                              partials=partials, inputs=nodes)
        tape.record_host(record, [])
    return scalar


# The host's derivative rules for tg.<name> of scalars, in both modes (a tape records
# ``partial * r_bar``, forward mode carries ``partial * tangent``); the conventions are those
# of the kernels' table in tapegrad/ad/rules.py.  A name missing here is refused by
# scalar_math, so a derivative is never lost without a word.  They are evaluated on NumPy
# floats, so that a rule at the edge of its domain gives inf or nan, as in a kernel, rather
# than a ZeroDivisionError (acosh at 1, asin at +-1).
_SCALAR_RULES: dict[str, Callable[[Any, Any], Any]] = {
    # d f(x) / dx given x and r = f(x)
    "sqrt": lambda x, r: 0.5 / r,
    "exp": lambda x, r: r,
    "expm1": lambda x, r: r + 1.0,
    "log": lambda x, r: 1.0 / x,
    "log1p": lambda x, r: 1.0 / (1.0 + x),
    "log2": lambda x, r: 1.0 / (x * math.log(2.0)),
    "log10": lambda x, r: 1.0 / (x * math.log(10.0)),
    "sin": lambda x, r: np.cos(x),
    "cos": lambda x, r: -np.sin(x),
    "tan": lambda x, r: 1.0 + r * r,
    "tanh": lambda x, r: 1.0 - r * r,
    "sinh": lambda x, r: np.cosh(x),
    "cosh": lambda x, r: np.sinh(x),
    "asinh": lambda x, r: 1.0 / np.sqrt(x * x + 1.0),
    "acosh": lambda x, r: 1.0 / np.sqrt(x * x - 1.0),
    "atanh": lambda x, r: 1.0 / (1.0 - x * x),
    "atan": lambda x, r: 1.0 / (1.0 + x * x),
    "asin": lambda x, r: 1.0 / np.sqrt(1.0 - x * x),
    "acos": lambda x, r: -1.0 / np.sqrt(1.0 - x * x),
    "erf": lambda x, r: 2.0 / math.sqrt(math.pi) * np.exp(-x * x),
    "erfc": lambda x, r: -2.0 / math.sqrt(math.pi) * np.exp(-x * x),
    "fabs": lambda x, r: math.copysign(1.0, x) if x else 0.0,
}

_BINARY_RULES: dict[str, Callable[[Any, Any, Any], tuple[Any, Any]]] = {
    # (d f / da, d f / db) given a, b and r = f(a, b); hypot's 0 at the origin as in kernels
    "hypot": lambda a, b, r: (a / r, b / r) if r else (0.0, 0.0),
    "atan2": lambda a, b, r: (b / (a * a + b * b), -a / (a * a + b * b)),
    "copysign": lambda a, b, r: (math.copysign(1.0, a) * math.copysign(1.0, b) if a else 0.0,
                                 0.0),
    "fmod": lambda a, b, r: (1.0, -np.trunc(a / b)),     # a - b * trunc(a / b)
}

# piecewise constant (their derivative is 0) or not numbers: the plain result, as math gives it
_NO_DERIVATIVE = ("floor", "ceil", "trunc", "isnan", "isinf", "isfinite")


def _evaluated(name: str, plain: tuple) -> tuple[float, tuple[float, ...]]:
    """``f(*plain)`` and its partials, as IEEE arithmetic gives them (inf and nan where math
    would raise: log(0), atanh(1), fmod(s, 0), acosh's derivative at 1)."""
    fn = None if name in ("erf", "erfc") else getattr(np, _NUMPY_NAMES.get(name, name))
    x = tuple(np.float64(p) for p in plain)
    with np.errstate(all="ignore"):
        value = fn(*x) if fn is not None else np.float64(getattr(math, name)(*plain))
        partials = (_SCALAR_RULES[name](*x, value),) if len(x) == 1 else \
            _BINARY_RULES[name](*x, value)
    return float(value), tuple(float(p) for p in partials)


def scalar_math(name: str, args: tuple) -> Any:
    """``tg.<name>(s, ...)`` of tracked scalars (recorded on their tape) or of forward-mode
    scalars (the tangents carried along)."""
    if name == "pow":
        return args[0] ** args[1]    # the scalars' own ** (a plain base reaches __rpow__)
    plain = tuple(F.plain_value(a) for a in args)
    if name in _NO_DERIVATIVE:
        return getattr(math, name)(*plain)
    rules = _SCALAR_RULES if len(args) == 1 else _BINARY_RULES if len(args) == 2 else {}
    if name not in rules:
        names = sorted([*_SCALAR_RULES, *_BINARY_RULES, "pow", *_NO_DERIVATIVE])
        raise TapegradError(f"tg.{name} of {len(args)} argument(s) has no derivative rule for "
                            f"host scalars that carry a derivative; use one of "
                            f"{', '.join(names)}")
    value, partials = _evaluated(name, plain)
    if any(isinstance(a, F.DualScalar) for a in args):
        return F.DualScalar.combine(args, value, partials)
    return record_scalar_op(name, args, value, partials)


# NumPy's ufuncs of host scalars, by the math name of their rule (the arithmetic ones are the
# scalars' own operators)
_UFUNCS = {"sqrt": "sqrt", "exp": "exp", "log": "log", "log2": "log2", "log10": "log10",
           "sin": "sin", "cos": "cos", "tan": "tan", "arcsin": "asin", "arccos": "acos",
           "arctan": "atan", "sinh": "sinh", "cosh": "cosh", "tanh": "tanh",
           "arcsinh": "asinh", "arccosh": "acosh", "arctanh": "atanh", "expm1": "expm1",
           "log1p": "log1p", "absolute": "fabs", "fabs": "fabs",
           "negative": None, "add": None, "subtract": None, "multiply": None,
           "true_divide": None, "power": None}
_BINARY_UFUNCS = {"hypot": "hypot", "arctan2": "atan2", "copysign": "copysign", "fmod": "fmod"}
# NumPy's function for each math name (_evaluated; erf and erfc have none: math's, which
# never fail)
_NUMPY_NAMES = {m: n for n, m in {**_UFUNCS, **_BINARY_UFUNCS}.items() if m is not None}
_OPERATORS = {"add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
              "true_divide": operator.truediv, "power": operator.pow,
              "remainder": operator.mod}
_COMPARISONS = {"less": operator.lt, "less_equal": operator.le, "greater": operator.gt,
                "greater_equal": operator.ge, "equal": operator.eq, "not_equal": operator.ne}


def array_and_scalar(what: str) -> TapegradError:
    """The refusal of array arithmetic with a tracked or forward-mode scalar."""
    return TapegradError(
        f"{what} of an array and a scalar from tg.sum/dot/mean/norm: NumPy arithmetic on "
        "arrays is not recorded, so the derivative through the result would be lost. Pass the "
        "scalar to a kernel that computes the array (kernels take these scalars as "
        "arguments), or keep to scalars (tg.sum(B) * s)")


def numpy_number(name: str, value: Any) -> TapegradError:
    """The refusal of a NumPy float met by a tape scalar's arithmetic while it records."""
    return TapegradError(
        f"{name!r} of a tape scalar and a NumPy number ({value!r}) while the tape records: a "
        "number NumPy computed from arrays the recorded code used (np.sum(B), B.max(), B[0]) "
        "carries no derivative, so the gradient through it would be lost. Compute it with "
        "tg.sum / tg.dot / tg.mean / tg.norm (or in a kernel); if it is a constant, pass "
        "float(value)")


def numpy_ufunc(ufunc: Any, method: str, inputs: tuple, kwargs: dict) -> Any:
    """NumPy ufuncs on tracked scalars: the differentiable ones are recorded, others refused
    (so a derivative is never lost silently)."""
    if method != "__call__" or kwargs:
        raise TapegradError(f"numpy.{ufunc.__name__}.{method} on a tracked scalar is not "
                            "differentiable; use tg functions and + - * / **")
    name = "true_divide" if ufunc.__name__ == "divide" else ufunc.__name__
    if name not in _COMPARISONS and any(isinstance(v, TrackedScalar) and v.recorded()
                                        for v in inputs):
        for v in inputs:     # (a comparison's result has no derivative to lose)
            if isinstance(v, (np.floating, np.ndarray)) and getattr(v, "ndim", 0) == 0:
                raise numpy_number(name, v)
    # a NumPy scalar operand as a plain number: its own operators would come back here
    # (np.float64(1) - s recursed without end)
    # (and a 0-d array: np.array(2.0) + s recursed too)
    inputs = tuple(float(v) if isinstance(v, np.generic) or (
        isinstance(v, np.ndarray) and v.ndim == 0) else v for v in inputs)
    if any(getattr(v, "ndim", 0) for v in inputs):
        # (the array's operator would hand the scalar back here: a RecursionError)
        raise array_and_scalar(f"numpy.{name}")
    if name in _OPERATORS and len(inputs) == 2:
        return _OPERATORS[name](*inputs)       # the scalars' own operators and rules
    if name in _COMPARISONS and len(inputs) == 2:
        return _COMPARISONS[name](*(plain(v) for v in inputs))
    if name == "negative":
        return -inputs[0]
    if name == "square":
        return inputs[0] * inputs[0]
    if name in _UFUNCS and len(inputs) == 1:
        # the operand's own rule: a tape's scalar records it, forward mode's carries the
        # tangents (np.exp of a forward-mode scalar lost them through scalar_math)
        return inputs[0].__tg_math__(_UFUNCS[name], inputs)
    if name in _BINARY_UFUNCS and len(inputs) == 2:
        return scalar_math(_BINARY_UFUNCS[name], inputs)
    raise TapegradError(f"numpy.{name} of a tracked scalar is not differentiable; use "
                        "tg.sqrt/exp/log/... and + - * / **")
