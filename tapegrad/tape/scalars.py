"""Tracked scalars: floats that remember which recorded operation made them.

Arithmetic on them (``+ - * / **``, ``tg.sqrt/exp/log...``) is recorded while their tape
records, so ``loss = tg.sum(B) / n + 0.1 * tg.dot(w, w)`` stays differentiable.
"""

from __future__ import annotations

import math
from typing import Any


def plain(x: Any) -> Any:
    """``x`` itself, or its value as a plain float if it is a tape's or forward mode's scalar:
    for the library's own conversions (their ``float()`` refuses while they differentiate;
    a kernel launch unboxes its arguments through it)."""
    return float.__float__(x) if isinstance(x, float) and type(x) is not float else x


def operand(o: Any) -> float:
    """The other operand of a scalar's arithmetic, as a float; an array is refused (NumPy
    arithmetic on arrays is not recorded)."""
    if getattr(o, "ndim", 0):
        from tapegrad.tape.hostops import array_and_scalar
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
        from tapegrad.tape.hostops import record_scalar_op
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
        from tapegrad.tape.hostops import scalar_math
        return scalar_math(name, args)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from tapegrad.tape.hostops import numpy_ufunc
        return numpy_ufunc(ufunc, method, inputs, kwargs)
