"""Host scalars of ``tg.hvp``'s forward-mode run, which a tape records: a value and a tangent
that are both tape scalars, so that the tape also records how the tangent was computed and
can differentiate it (reverse over forward).

Each operation computes its value with the tape scalars' own arithmetic and its partial
derivatives by evaluating the same templates as everywhere else (``lang/primitives.py``) on
tape scalars: the tangent ``sum(partial * operand tangent)`` is then recorded, partials
included, and its gradient is the Hessian's row along the tangent's direction.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.lang.primitives import ABS, HOST_TG, OPERATORS, lookup, partials_function
from tapegrad.tape.modes import current_forward
from tapegrad.tape.scalars import (
    Operators,
    PlainAnswers,
    TrackedScalar,
    numpy_ufunc,
    refuse_numpy_numbers,
)


class TapedDual(Operators, PlainAnswers, float):
    """A float carrying one tangent, where the value and the tangent are tape scalars (plain
    numbers where they are constants): what ``tg.sum``/``tg.dot``/... and arithmetic return
    inside a function ``tg.hvp`` differentiates.  Comparisons and the like give plain
    answers, as a tape scalar's do."""

    taped_dual = True       # (scalar_math hands an operation with one of these to it)

    def __new__(cls, value: Any, tangent: Any) -> TapedDual:
        obj = float.__new__(cls, float.__float__(value) if isinstance(value, float)
                            else float(value))
        obj.value = value
        obj.tangent = tangent
        return obj

    @property
    def tangents(self) -> tuple[Any]:
        return (self.tangent,)

    def __repr__(self) -> str:
        return float.__repr__(self)

    def __float__(self) -> float:
        if current_forward() is not None:
            raise TapegradError(
                f"float() of a scalar inside a function tg.hvp differentiates "
                f"({float.__repr__(self)}, from tg.sum/dot/mean/norm or arithmetic on them) "
                "would drop its derivatives, and the Hessian through the value would be "
                "silently wrong. Use the scalar itself: kernels take it as an argument, and "
                "+ - * / **, tg.sqrt/exp/... and NumPy's ufuncs carry its derivatives")
        return float.__float__(self)

    # -- arithmetic: a row of the operator table ------------------------------------------
    def _arith(self, kind: str, o: Any, reflected: bool = False) -> Any:
        row = OPERATORS[kind]
        operands = (o, self) if reflected else (self, o)
        return apply(row.host, row, operands)

    def __neg__(self) -> Any:
        row = OPERATORS["USub"]
        return apply(row.host, row, (self,))

    def __pos__(self) -> Any:
        return self

    def __abs__(self) -> Any:
        return apply(abs, ABS, (self,))

    def __tg_math__(self, name: str, args: tuple, host: Any = None) -> Any:
        return taped_math(name, args, host)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return numpy_ufunc(ufunc, method, inputs, kwargs, carried=True)


def part(x: Any) -> Any:
    """``x``'s value: a tape scalar or a number (``x`` a dual or anything else)."""
    if isinstance(x, TapedDual):
        return x.value
    if getattr(x, "ndim", 0):
        raise TapegradError("arithmetic of an array and a scalar from tg.sum/dot/mean/norm is "
                            "not recorded; pass the scalar to a kernel that computes the array")
    refuse_numpy_numbers("arithmetic", (x,))
    return float(x) if isinstance(x, np.generic) else x


def apply(host: Any, row: Any, operands: tuple) -> Any:
    """``host(*operands)`` with its tangent ``sum(partial * tangent)``, both recorded: the
    partials are the templates of ``row`` (an operator's or a function's, ``primitives.py``)
    evaluated on the operands' values (tape scalars)."""
    values = tuple(part(o) for o in operands)
    value = host(*values)
    varying = [isinstance(o, TapedDual) and _varies(o.tangent) for o in operands]
    if not any(varying):
        return TapedDual(value, 0.0) if isinstance(value, TrackedScalar) else value
    at = values + (value,)
    if any(isinstance(v, TrackedScalar) for v in at):
        partials = on_tape(getattr(row, "name", None) or row.symbol, row.partials)
    else:       # (NumPy floats: inf and nan at the edges, no raising)
        at, partials = tuple(np.float64(v) for v in at), row.host_partials
    with np.errstate(all="ignore"):
        slopes = partials(*at)
    tangent = None
    for o, slope, varies in zip(operands, slopes, varying):
        if varies:
            slope = float(slope) if isinstance(slope, np.generic) else slope
            term = slope * o.tangent
            tangent = term if tangent is None else tangent + term
    return TapedDual(value, tangent)


def _varies(tangent: Any) -> bool:
    return isinstance(tangent, TrackedScalar) or tangent != 0.0


def taped_math(name: str, args: tuple, host: Any = None) -> Any:
    """``tg.<name>(*args)`` with at least one dual among ``args`` (``host``: what gives the
    value, as for ``scalar_math``)."""
    from tapegrad.tape.scalars import scalar_math

    if name == "pow" and host is None:
        return args[0] ** args[1]
    row = lookup(name)
    if row is None or row.arity != len(args) or not row.differentiable:
        return scalar_math(name, tuple(part(a) for a in args), host)   # (its error, or value)

    def value(*values: Any) -> Any:
        return scalar_math(name, values, host)
    return apply(value, row, args)


class _TapedMath:
    """``tg`` in a template evaluated on tape scalars and numbers: NumPy's functions, whose
    results on plain numbers come back as Python floats (a NumPy float times a tape scalar
    is refused, as a number computed from arrays)."""

    def __getattr__(self, name: str) -> Any:
        fn = getattr(HOST_TG, name)

        def call(*args: Any) -> Any:
            r = fn(*args)
            return float(r) if isinstance(r, np.generic) else r
        return call


_TAPED_TG = _TapedMath()


@functools.cache
def on_tape(name: str, partials: tuple) -> Any:
    """A row's partial derivatives as a function of tape scalars and numbers."""
    return partials_function(name, partials, _TAPED_TG)
