"""Host scalars that carry a derivative, and their arithmetic in both modes.

A ``TrackedScalar`` remembers which recorded operation made it: arithmetic on it (``+ - * /
**``, ``tg.sqrt/exp/log...``, NumPy's ufuncs) is recorded while its tape records, so
``loss = tg.sum(B) / n + 0.1 * tg.dot(w, w)`` stays differentiable.  A ``DualScalar`` carries
tangents (forward mode).  Both use the one table of host derivative rules below.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.tape.modes import current_forward, new_scalar
from tapegrad.tape.records import Record


def plain(x: Any) -> Any:
    """``x`` itself, or its value as a plain float if it is a tape's or forward mode's scalar:
    for the library's own conversions (their ``float()`` refuses while they differentiate;
    a kernel launch unboxes its arguments through it)."""
    return float.__float__(x) if isinstance(x, float) and type(x) is not float else x


def operand(o: Any) -> float:
    """The other operand of a scalar's arithmetic, as a float; an array is refused (NumPy
    arithmetic on arrays is not recorded)."""
    if getattr(o, "ndim", 0):
        raise array_and_scalar("arithmetic")
    # (another host scalar's value as it is: its own float() refuses while its tape records)
    return float.__float__(o) if isinstance(o, float) else float(o)


class TrackedScalar(float):
    """A Python float that is also a node of a tape (``node`` on ``tape``, the innermost
    recording tape when it was made) and, made inside nested tapes, of each enclosing tape
    (``outer``: (tape, node) pairs)."""

    outer: tuple = ()

    def __new__(cls, value: float, tape: Any, node: int) -> TrackedScalar:
        obj = float.__new__(cls, value)
        obj.tape = tape
        obj.node = node
        return obj

    def node_on(self, tape: Any) -> int | None:
        """This scalar's node on ``tape``, or None when that tape did not record it."""
        if self.tape is tape:
            return self.node
        for t, node in self.outer:
            if t is tape:
                return node
        return None

    def recorded(self) -> bool:
        """Whether one of its tapes is still recording."""
        return self.tape.recording or any(t.recording for t, _ in self.outer)

    def __repr__(self) -> str:
        return float.__repr__(self)

    def __float__(self) -> float:
        # the value alone, passed on to a kernel or into NumPy while the tape records, is a
        # constant there: the derivative through it was lost without a word
        if self.recorded():
            from tapegrad.errors import TapegradError
            raise TapegradError(
                f"float() of a tape scalar ({float.__repr__(self)}, from tg.sum/dot/mean/norm or "
                "arithmetic on them) while the tape records would drop its derivative: a "
                "kernel or NumPy given the plain value sees a constant. Use the scalar itself "
                "(kernels take it as an argument; + - * / **, tg.sqrt/exp/... and comparisons "
                "work on it; print(s) and f'{s:.4g}' show it), or call float() after the "
                "recording ends")
        return float.__float__(self)

    def _op(self, name: str, others: tuple, value: float, partials: tuple) -> Any:
        return record_scalar_op(name, (self,) + others, value, partials)

    def __add__(self, o: Any) -> Any:
        return self._op("+", (o,), float.__float__(self) + operand(o), (1.0, 1.0))

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        return self._op("-", (o,), float.__float__(self) - operand(o), (1.0, -1.0))

    def __rsub__(self, o: Any) -> Any:
        return self._op("-", (o,), operand(o) - float.__float__(self), (-1.0, 1.0))

    def __mul__(self, o: Any) -> Any:
        a, b = float.__float__(self), operand(o)
        return self._op("*", (o,), a * b, (b, a))

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Any:
        a, b = float.__float__(self), operand(o)
        return self._op("/", (o,), a / b, (1.0 / b, -a / (b * b)))

    def __rtruediv__(self, o: Any) -> Any:
        a, b = operand(o), float.__float__(self)
        return self._op("/", (o,), a / b, (-a / (b * b), 1.0 / b))

    def __pow__(self, o: Any) -> Any:
        a, b = float.__float__(self), operand(o)
        r = a ** b
        return self._op("**", (o,), r, (b * a ** (b - 1) if b != 0 else 0.0,
                                         r * math.log(a) if a > 0 else 0.0))

    def __rpow__(self, o: Any) -> Any:
        a, b = operand(o), float.__float__(self)
        r = a ** b
        return self._op("**", (o,), r, (r * math.log(a) if a > 0 else 0.0,
                                         b * a ** (b - 1) if b != 0 else 0.0))

    def __mod__(self, o: Any) -> Any:     # a - b * floor(a / b)
        a, b = float.__float__(self), operand(o)
        return self._op("%", (o,), a % b, (1.0, -math.floor(a / b)))

    def __rmod__(self, o: Any) -> Any:
        a, b = operand(o), float.__float__(self)
        return self._op("%", (o,), a % b, (-math.floor(a / b), 1.0))

    def __neg__(self) -> Any:
        return self._op("neg", (), -float.__float__(self), (-1.0,))

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        v = float.__float__(self)
        return self._op("abs", (), abs(v), (math.copysign(1.0, v) if v else 0.0,))

    def __tg_math__(self, name: str, args: tuple) -> Any:
        return scalar_math(name, args)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return numpy_ufunc(ufunc, method, inputs, kwargs)


def plain_value(x: Any) -> float:
    """The plain value of a number or a dual scalar, tangents dropped on purpose: for the
    library's own conversions, where the tangents are carried separately (``float(dual)`` is
    refused while forward mode runs, see ``DualScalar.__float__``)."""
    return operand(x)      # (a dual scalar is a float: its value is read directly)


class DualScalar(float):
    """A float carrying ``width`` tangents (forward mode on the host)."""

    def __new__(cls, value: float, tangents: tuple[float, ...]) -> DualScalar:
        obj = float.__new__(cls, value)
        obj.tangents = tuple(float(t) for t in tangents)
        return obj

    def __repr__(self) -> str:
        return float.__repr__(self)

    def __float__(self) -> float:
        # the value alone, fed back into the computation (a kernel argument, a NumPy array),
        # is a constant to forward mode: the derivative through it was lost without a word
        if current_forward() is not None:
            raise TapegradError(
                f"float() of a forward-mode scalar ({float.__repr__(self)}, from tg.sum/dot/"
                "mean/norm or arithmetic on them) would drop its tangent, and the derivative "
                "through the value would be silently wrong. Use the scalar itself: kernels take "
                "it as an argument, and + - * / **, tg.sqrt/exp/hypot/... and NumPy's ufuncs "
                "carry its tangent. If it is meant as a constant, compute it outside the "
                "function being differentiated and pass it in")
        return float.__float__(self)

    def _make(self, value: float, tangents: Any) -> DualScalar:
        return DualScalar(value, tuple(tangents))

    @staticmethod
    def combine(operands: tuple, value: float, partials: tuple) -> DualScalar:
        """``value = f(*operands)`` given its partial derivatives: each tangent is the sum of
        ``partial * operand tangent`` over the operands that carry tangents (the others are
        constants: an infinite partial times their zero tangent would give NaN)."""
        width = next(len(o.tangents) for o in operands if isinstance(o, DualScalar))
        tangents = [0.0] * width
        for o, p in zip(operands, partials):
            if isinstance(o, DualScalar):
                for j, t in enumerate(o.tangents):
                    tangents[j] += p * t
        return DualScalar(value, tangents)

    @staticmethod
    def _t(x: Any, width: int) -> tuple[float, ...]:
        return x.tangents if isinstance(x, DualScalar) else (0.0,) * width

    def _binary(self, o: Any, value: float, da: float, db: float) -> DualScalar:
        w = len(self.tangents)
        ot = self._t(o, w)
        return self._make(value, (da * a + db * b for a, b in zip(self.tangents, ot)))

    def _rbinary(self, o: Any, value: float, da: float, db: float) -> DualScalar:
        """``o (op) self``: ``da`` is the partial in ``o``, ``db`` in ``self``."""
        w = len(self.tangents)
        ot = self._t(o, w)
        return self._make(value, (da * a + db * b for a, b in zip(ot, self.tangents)))

    def __add__(self, o: Any) -> DualScalar:
        return self._binary(o, plain_value(self) + plain_value(o), 1.0, 1.0)

    __radd__ = __add__

    def __sub__(self, o: Any) -> DualScalar:
        return self._binary(o, plain_value(self) - plain_value(o), 1.0, -1.0)

    def __rsub__(self, o: Any) -> DualScalar:
        return self._rbinary(o, plain_value(o) - plain_value(self), 1.0, -1.0)

    def __mul__(self, o: Any) -> DualScalar:
        a, b = plain_value(self), plain_value(o)
        return self._binary(o, a * b, b, a)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> DualScalar:
        a, b = plain_value(self), plain_value(o)
        return self._binary(o, a / b, 1.0 / b, -a / (b * b))

    def __rtruediv__(self, o: Any) -> DualScalar:
        a, b = plain_value(o), plain_value(self)
        return self._rbinary(o, a / b, 1.0 / b, -a / (b * b))

    def __pow__(self, o: Any) -> DualScalar:
        a, b = plain_value(self), plain_value(o)
        r = a ** b
        return self._binary(o, r, b * a ** (b - 1) if b != 0 else 0.0,
                            r * math.log(a) if a > 0 else 0.0)

    def __rpow__(self, o: Any) -> DualScalar:
        a, b = plain_value(o), plain_value(self)
        r = a ** b
        return self._rbinary(o, r, b * a ** (b - 1) if b != 0 else 0.0,
                             r * math.log(a) if a > 0 else 0.0)

    def __mod__(self, o: Any) -> DualScalar:     # a - b * floor(a / b)
        a, b = plain_value(self), plain_value(o)
        return self._binary(o, a % b, 1.0, -math.floor(a / b))

    def __rmod__(self, o: Any) -> DualScalar:
        a, b = plain_value(o), plain_value(self)
        return self._rbinary(o, a % b, 1.0, -math.floor(a / b))

    def __neg__(self) -> DualScalar:
        return self._make(-plain_value(self), (-t for t in self.tangents))

    def __pos__(self) -> DualScalar:
        return self

    def __abs__(self) -> DualScalar:
        v = plain_value(self)
        s = math.copysign(1.0, v) if v else 0.0
        return self._make(abs(v), (s * t for t in self.tangents))

    def __tg_math__(self, name: str, args: tuple) -> Any:
        return scalar_math(name, args)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return numpy_ufunc(ufunc, method, inputs, kwargs)


@dataclass
class ScalarRecord(Record):
    partials: tuple = ()
    inputs: list[int | None] = field(default_factory=list)

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, sweep: Any) -> None:
        bar = sweep.scalar_bar.get(self.scalar_out, 0.0)
        for node, p in zip(self.inputs, self.partials):
            if node is not None:
                sweep.add_scalar_bar(node, bar * p)


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
    scalar = new_scalar(value, tapes)
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
    plain = tuple(plain_value(a) for a in args)
    if name in _NO_DERIVATIVE:
        return getattr(math, name)(*plain)
    rules = _SCALAR_RULES if len(args) == 1 else _BINARY_RULES if len(args) == 2 else {}
    if name not in rules:
        names = sorted([*_SCALAR_RULES, *_BINARY_RULES, "pow", *_NO_DERIVATIVE])
        raise TapegradError(f"tg.{name} of {len(args)} argument(s) has no derivative rule for "
                            f"host scalars that carry a derivative; use one of "
                            f"{', '.join(names)}")
    value, partials = _evaluated(name, plain)
    if any(isinstance(a, DualScalar) for a in args):
        return DualScalar.combine(args, value, partials)
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
