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
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.lang.primitives import ABS, MATH, OPERATORS, Primitive, lookup
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


class Operators:
    """``+ - * / ** %`` of a host scalar that carries a derivative, each the operator table's
    row (``lang/primitives.py``) applied by the class's ``_arith(kind, other, reflected)``."""

    __slots__ = ()

    def __add__(self, o: Any) -> Any:
        return self._arith("Add", o)

    __radd__ = __add__

    def __sub__(self, o: Any) -> Any:
        return self._arith("Sub", o)

    def __rsub__(self, o: Any) -> Any:
        return self._arith("Sub", o, reflected=True)

    def __mul__(self, o: Any) -> Any:
        return self._arith("Mult", o)

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Any:
        return self._arith("Div", o)

    def __rtruediv__(self, o: Any) -> Any:
        return self._arith("Div", o, reflected=True)

    def __pow__(self, o: Any) -> Any:
        return self._arith("Pow", o)

    def __rpow__(self, o: Any) -> Any:
        return self._arith("Pow", o, reflected=True)

    def __mod__(self, o: Any) -> Any:
        return self._arith("Mod", o)

    def __rmod__(self, o: Any) -> Any:
        return self._arith("Mod", o, reflected=True)


class PlainAnswers:
    """Comparisons, ``bool()``, ``int()``, ``round()``, floor division and the like of a host
    scalar that carries a derivative give plain answers (of its value); while a captured
    function records (tg.capture), each answer is a guard its replays check."""

    __slots__ = ()

    def __lt__(self, o: Any) -> bool:
        return concrete(operator.lt, self, o)

    def __le__(self, o: Any) -> bool:
        return concrete(operator.le, self, o)

    def __gt__(self, o: Any) -> bool:
        return concrete(operator.gt, self, o)

    def __ge__(self, o: Any) -> bool:
        return concrete(operator.ge, self, o)

    def __eq__(self, o: Any) -> bool:
        return concrete(operator.eq, self, o) if isinstance(o, (float, int)) else NotImplemented

    def __ne__(self, o: Any) -> bool:
        return concrete(operator.ne, self, o) if isinstance(o, (float, int)) else NotImplemented

    __hash__ = float.__hash__

    def __bool__(self) -> bool:
        return concrete(bool, self)

    def __int__(self) -> int:
        return concrete(int, self)

    def __round__(self, ndigits: int | None = None) -> Any:
        return concrete(round, self) if ndigits is None else concrete(round, self, ndigits)

    # float's own floor division, floor/ceil/trunc (math.floor(s), int(T // 0.25)) would
    # read the value without a word: their answers are guards too, as int()'s is
    def __floordiv__(self, o: Any) -> Any:
        return concrete(operator.floordiv, self, o)

    def __rfloordiv__(self, o: Any) -> Any:
        return concrete(_reflected_floordiv, self, o)

    def __divmod__(self, o: Any) -> Any:
        return concrete(divmod, self, o)

    def __rdivmod__(self, o: Any) -> Any:
        return concrete(_reflected_divmod, self, o)

    def __floor__(self) -> int:
        return concrete(math.floor, self)

    def __ceil__(self) -> int:
        return concrete(math.ceil, self)

    def __trunc__(self) -> int:
        return concrete(math.trunc, self)

    def is_integer(self) -> bool:
        return concrete(float.is_integer, self)

    @property
    def real(self) -> Any:
        return self           # (a real number's real part is itself, derivative and all)

    def conjugate(self) -> Any:
        return self


class TrackedScalar(Operators, PlainAnswers, float):
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
            raise TapegradError(
                f"float() of a tape scalar ({float.__repr__(self)}, from tg.sum/dot/mean/norm or "
                "arithmetic on them) while the tape records would drop its derivative: a "
                "kernel or NumPy given the plain value sees a constant. Use the scalar itself "
                "(kernels take it as an argument; + - * / **, tg.sqrt/exp/... and comparisons "
                "work on it; print(s) and f'{s:.4g}' show it), or call float() after the "
                "recording ends")
        return float.__float__(self)

    def _op(self, name: str, others: tuple, value: float, partials: tuple,
            rule: Callable[..., tuple] | None = None) -> Any:
        return record_scalar_op(name, (self,) + others, value, partials, rule)

    def _arith(self, kind: str, o: Any, reflected: bool = False) -> Any:
        """``self (op) o``, or ``o (op) self`` when reflected, recorded with the table's rule."""
        rule = _operator_rule(kind, reflected)
        value, partials = rule(float.__float__(self), operand(o))
        return self._op(OPERATORS[kind].symbol, (o,), value, partials, rule)

    def __neg__(self) -> Any:
        rule = _operator_rule("USub", False)
        value, partials = rule(float.__float__(self))
        return self._op("neg", (), value, partials, rule)

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        rule = _math_rule(ABS)
        value, partials = rule(float.__float__(self))
        return self._op("abs", (), value, partials, rule)

    def __tg_math__(self, name: str, args: tuple, host: Any = None) -> Any:
        return scalar_math(name, args, host)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return numpy_ufunc(ufunc, method, inputs, kwargs)


def plain_value(x: Any) -> float:
    """The plain value of a number or a dual scalar, tangents dropped on purpose: for the
    library's own conversions, where the tangents are carried separately (``float(dual)`` is
    refused while forward mode runs, see ``DualScalar.__float__``)."""
    return operand(x)      # (a dual scalar is a float: its value is read directly)


class DualScalar(Operators, float):
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

    @property
    def real(self) -> DualScalar:
        return self           # (float's own would drop the tangents)

    def conjugate(self) -> DualScalar:
        return self

    @staticmethod
    def combine(operands: tuple, value: float, partials: tuple) -> DualScalar:
        """``value = f(*operands)`` given its partial derivatives: each tangent is the sum of
        ``partial * operand tangent`` over the operands that carry tangents (the others are
        constants: an infinite partial times their zero tangent would give NaN)."""
        refuse_numpy_numbers("arithmetic", operands)
        width = next(len(o.tangents) for o in operands if isinstance(o, DualScalar))
        tangents = [0.0] * width
        for o, p in zip(operands, partials):
            if isinstance(o, DualScalar):
                for j, t in enumerate(o.tangents):
                    tangents[j] += p * t
        return DualScalar(value, tangents)

    def _arith(self, kind: str, o: Any, reflected: bool = False) -> DualScalar:
        """``self (op) o``, or ``o (op) self`` when reflected, with the table's rule."""
        operands = (o, self) if reflected else (self, o)
        value, partials = host_operator(kind, *(plain_value(x) for x in operands))
        return DualScalar.combine(operands, value, partials)

    def __neg__(self) -> DualScalar:
        return DualScalar.combine((self,), *host_operator("USub", plain_value(self)))

    def __pos__(self) -> DualScalar:
        return self

    def __abs__(self) -> DualScalar:
        return DualScalar.combine((self,), *_evaluated(ABS, (plain_value(self),)))

    def __tg_math__(self, name: str, args: tuple, host: Any = None) -> Any:
        return scalar_math(name, args, host)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return numpy_ufunc(ufunc, method, inputs, kwargs)


@dataclass
class ScalarRecord(Record):
    """``scalar_out = rule(*operands)``: its adjoint adds ``partial * bar`` to each tracked
    operand's.  ``constants``: the operands that are plain numbers (None where tracked), and
    ``rule`` what computes the value and the partials from all operands' values (a captured
    function's replay recomputes them: tg.capture)."""

    partials: tuple = ()
    inputs: list[int | None] = field(default_factory=list)
    constants: tuple = ()
    rule: Callable[..., tuple] | None = None

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    traceable = True

    def backward(self, sweep: Any) -> None:
        if sweep.trace is not None:
            sweep.trace.scalar(self)
        bar = sweep.scalar_bar.get(self.scalar_out, 0.0)
        for node, p in zip(self.inputs, self.partials):
            if node is not None:
                sweep.add_scalar_bar(node, bar * p)


def record_scalar_op(name: str, operands: tuple, value: float, partials: tuple,
                     rule: Callable[..., tuple] | None = None) -> Any:
    """Record ``value = name(*operands)`` (reverse mode) given its partial derivatives;
    ``rule(*values)`` gives both again from the operands' values (None: a record that a
    captured function cannot replay)."""
    return _record_scalar_op(name, operands, value, partials, rule)


def _record_scalar_op(name: str, operands: tuple, value: float, partials: tuple,
                      rule: Callable[..., tuple] | None) -> Any:
    tapes = tuple({id(t): t for o in operands if isinstance(o, TrackedScalar)
                   for t in (o.tape, *(t for t, _ in o.outer)) if t.recording}.values())
    if not tapes:
        return value
    refuse_numpy_numbers(name, operands)
    for o in operands:
        if not isinstance(o, (TrackedScalar, int, float, np.integer)):
            raise TapegradError(f"cannot combine a tracked scalar with a {type(o).__name__} "
                                f"in {name!r}; only numbers and tracked scalars mix")
    scalar = new_scalar(value, tapes)
    for tape in tapes:
        nodes = [o.node_on(tape) if isinstance(o, TrackedScalar) else None for o in operands]
        if any(n is None and isinstance(o, TrackedScalar) for o, n in zip(operands, nodes)):
            tape.foreign_scalars = True     # (another tape's scalar: a constant here)
        record = ScalarRecord(reads=[], writes=[], name=name, scalar_out=scalar.node_on(tape),
                              scalars_in=[n for n in nodes if n is not None],
                              partials=partials, inputs=nodes, rule=rule,
                              constants=tuple(None if n is not None else o
                                              for n, o in zip(nodes, operands)))
        tape.record_host(record, [])
    return scalar


# The host's derivative rules are the kernels' (the rows of tapegrad/lang/primitives.py),
# evaluated on NumPy floats: a rule at the edge of its domain gives inf or nan, as in a kernel,
# rather than a ZeroDivisionError (acosh at 1, asin at +-1).  A tape records ``partial *
# r_bar``, forward mode carries ``partial * tangent``.

def host_operator(kind: str, *values: float) -> tuple[float, tuple[float, ...]]:
    """An operator's value (Python's own: ``1.0 / 0.0`` still raises) and its partials."""
    row = OPERATORS[kind]
    value = row.host(*values)
    if isinstance(value, complex):
        raise TapegradError(
            f"{values[0]!r} ** {values[1]!r} of a scalar that carries a derivative is a complex "
            "number in Python, and tapegrad's scalars are real: take the power of abs(x) (and "
            "the sign apart), or an integer exponent")
    with np.errstate(all="ignore"):
        partials = row.host_partials(*(np.float64(v) for v in values), np.float64(value))
    return value, tuple(float(p) for p in partials)


class _Rule:
    """An operation's value and partials from its operands' values (``rule(*values)``): a
    table operator (``reflected``: the scalar is its right operand) or a math row."""

    __slots__ = ("kind", "row", "reflected", "host")

    def __init__(self, kind: str | None, row: Primitive | None, reflected: bool,
                 host: Callable[..., Any] | None = None):
        self.kind, self.row, self.reflected, self.host = kind, row, reflected, host

    def __call__(self, *values: float) -> tuple[float, tuple[float, ...]]:
        if self.row is not None:
            return _evaluated(self.row, values, self.host)
        if self.reflected:
            value, (p_o, p_self) = host_operator(self.kind, values[1], values[0])
            return value, (p_self, p_o)
        return host_operator(self.kind, *values)


_RULES: dict[tuple, _Rule] = {}


def _operator_rule(kind: str, reflected: bool) -> _Rule:
    rule = _RULES.get((kind, reflected))
    if rule is None:
        rule = _RULES[kind, reflected] = _Rule(kind, None, reflected)
    return rule


def _math_rule(row: Primitive, host: Callable[..., Any] | None = None) -> _Rule:
    rule = _RULES.get(("math", row.name, host))
    if rule is None:
        rule = _RULES["math", row.name, host] = _Rule(None, row, False, host)
    return rule


# A function told of every comparison (and bool/int/round) of a tape scalar in this context,
# as ``watch(fn, args, answer)``: set while tg.capture records a function.
concretized: ContextVar[Any] = ContextVar("tapegrad_concretized", default=None)


def _reflected_floordiv(a: float, b: Any) -> Any:
    return b // a


def _reflected_divmod(a: float, b: Any) -> Any:
    return divmod(b, a)


def concrete(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn`` of plain values (tape scalars as their floats), reported to the watcher."""
    answer = fn(*(float.__float__(a) if isinstance(a, float) else a for a in args))
    watch = concretized.get()
    if watch is not None:
        watch(fn, args, answer)
    return answer


def _evaluated(row: Primitive, plain: tuple, host: Callable[..., Any] | None = None
               ) -> tuple[float, tuple[float, ...]]:
    """``f(*plain)`` and its partials, as IEEE arithmetic gives them (inf and nan where math
    would raise: log(0), atanh(1), fmod(s, 0), acosh's derivative at 1).  ``host``: the
    function that gives the value instead (``math.<f>`` itself, which raises where math raises:
    tape/hostmath.py); the partials are the row's all the same."""
    x = tuple(np.float64(p) for p in plain)
    if host is not None:
        value = np.float64(host(*plain))
    else:
        fn = row.host_function() if row.numpy_name is None else getattr(np, row.numpy_name)
        with np.errstate(all="ignore"):
            value = np.float64(fn(*x))
    with np.errstate(all="ignore"):
        partials = row.host_partials(*x, value)
    return float(value), tuple(float(p) for p in partials)


def scalar_math(name: str, args: tuple, host: Callable[..., Any] | None = None) -> Any:
    """``tg.<name>(s, ...)`` of tracked scalars (recorded on their tape) or of forward-mode
    scalars (the tangents carried along); ``host``: the function that gives the value (Python's
    ``math.<name>``, for ``math.<name>(s)``: tape/hostmath.py), NumPy's by default."""
    if name == "pow" and host is None:
        return args[0] ** args[1]    # the scalars' own ** (a plain base reaches __rpow__)
    for a in args:
        if getattr(a, "taped_dual", False):     # (tg.hvp's scalars: tape/duals.py)
            return a.__tg_math__(name, args, host)
    row = lookup(name)
    if row is None or row.arity != len(args):
        names = sorted([*MATH, "abs"])
        raise TapegradError(f"tg.{name} of {len(args)} argument(s) has no derivative rule for "
                            f"host scalars that carry a derivative; use one of "
                            f"{', '.join(names)}")
    plain = tuple(plain_value(a) for a in args)
    if not row.differentiable:       # piecewise constant, or not a number: the plain result
        return row.host_function()(*plain)
    rule = _math_rule(row, host)
    value, partials = rule(*plain)
    if any(isinstance(a, DualScalar) for a in args):
        return DualScalar.combine(args, value, partials)
    return record_scalar_op(name, args, value, partials, rule)


# NumPy's ufuncs of host scalars: those of the table's rows, by NumPy's name (the arithmetic
# ones are the scalars' own operators)
_UFUNCS = {row.numpy_name: row.name for row in (*MATH.values(), ABS)
           if row.numpy_name is not None and row.name != "pow"}


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


def refuse_numpy_numbers(name: str, operands: tuple) -> None:
    """Refuse a NumPy float among the operands of a scalar that carries a derivative (a tape
    scalar while its tape records; a forward-mode scalar, or tg.hvp's): a number NumPy
    computed from the differentiated arrays (np.sum(B), B.max(), B[0]) carries none, so the
    derivative through it would be lost."""
    for o in operands:
        if isinstance(o, (np.floating, np.ndarray)) and getattr(o, "ndim", 0) == 0:
            raise TapegradError(
                f"{name!r} of a scalar that carries a derivative (from tg.sum/dot/mean/norm) "
                f"and a NumPy number ({o!r}): a number NumPy computed from the arrays being "
                "differentiated (np.sum(B), B.max(), B[0]) carries no derivative, so the "
                "derivative through it would be lost. Compute it with tg.sum / tg.dot / "
                "tg.mean / tg.norm (or in a kernel); if it is a constant, pass float(value)")


def numpy_ufunc(ufunc: Any, method: str, inputs: tuple, kwargs: dict,
                carried: bool = False) -> Any:
    """NumPy ufuncs on tracked scalars: the differentiable ones are recorded, others refused
    (so a derivative is never lost silently); ``carried``: an operand carries a derivative
    (tg.hvp's scalars, which are neither kind here)."""
    if method != "__call__" or kwargs:
        raise TapegradError(f"numpy.{ufunc.__name__}.{method} on a tracked scalar is not "
                            "differentiable; use tg functions and + - * / **")
    name = "true_divide" if ufunc.__name__ == "divide" else ufunc.__name__
    if name not in _COMPARISONS and (carried or any(
            isinstance(v, TrackedScalar) and v.recorded() or isinstance(v, DualScalar)
            for v in inputs)):
        refuse_numpy_numbers(name, inputs)   # (a comparison's result has no derivative to lose)
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
        return concrete(_COMPARISONS[name], *inputs)
    if name == "negative":
        return -inputs[0]
    if name in ("positive", "conjugate"):     # (a real number's own: derivative and all)
        return inputs[0]
    if name == "square":
        return inputs[0] * inputs[0]
    if name in _UFUNCS:
        if not lookup(_UFUNCS[name]).differentiable:   # np.floor(s), np.isnan(s): NumPy's
            return ufunc(*(plain(v) for v in inputs)).item()    # value, as a Python number
        return scalar_math(_UFUNCS[name], inputs)
    raise TapegradError(f"numpy.{name} of a tracked scalar is not differentiable; use "
                        "tg.sqrt/exp/log/... and + - * / **")
