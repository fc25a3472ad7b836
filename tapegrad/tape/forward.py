"""Forward mode on host functions: while a ``ForwardContext`` is active, every kernel launch
runs its tangent kernel (values and tangents in one launch), host reductions return dual
scalars, and arithmetic on those carries the tangents along.  Nothing is recorded.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.arguments import access, check_args, ndrange_of
from tapegrad.runtime.launch import interceptor, launch_now
from tapegrad.runtime.tangent import run_tangent
from tapegrad.tape.identity import extent
from tapegrad.tape.scalars import operand
from tapegrad.tape.tape import _zeros_like, array_key, is_array

# The forward-mode run of this thread (or asyncio task), if any (a tuple of at most one).
_active: ContextVar[tuple[ForwardContext, ...]] = ContextVar("tapegrad_forward", default=())


def current() -> ForwardContext | None:
    active = _active.get()
    return active[-1] if active else None


def refuse_nested() -> None:
    """Forward mode inside forward mode: the inner run's results would carry none of the outer
    run's tangents (a kernel-level tg.autodiff(tg.Forward, ...) inside tg.jvp gave a zero
    derivative silently), so it is refused before anything runs."""
    if _active.get():
        raise TapegradError(
            "nested forward mode is not supported: tg.jvp, tg.autodiff(tg.Forward, ...) or "
            "tg.jacobian(..., mode=tg.Forward) was called inside a function that forward mode "
            "is already differentiating, and the inner run's results would not carry the outer "
            "run's tangents. Compute the inner derivative separately, outside the function, and "
            "pass it in; for several directions use one run, tg.jacobian(f, x, mode=tg.Forward) "
            "or tg.autodiff(tg.Forward, f, tg.BatchDuplicated, tg.BatchDuplicated(x, (v1, v2))). "
            "Second derivatives (forward over forward) are not available")


class suspended:
    """``with suspended():`` runs its body outside forward mode: a registered forward rule
    works on plain values and the tangents it is given, and may use forward mode itself."""

    def __enter__(self) -> None:
        self.tokens = (_active.set(()), interceptor.set(None))

    def __exit__(self, *exc: Any) -> None:
        _active.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])


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
        if _active.get():
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
        from tapegrad.tape.hostops import scalar_math
        return scalar_math(name, args)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        from tapegrad.tape.hostops import numpy_ufunc
        return numpy_ufunc(ufunc, method, inputs, kwargs)


class ForwardContext:
    """Runs host code in forward mode with ``width`` tangent directions."""

    def __init__(self, width: int = 1):
        self.width = width
        self.tangents: dict[tuple, list[Any]] = {}
        self.arrays: dict[tuple, Any] = {}
        self.extents: dict[tuple, tuple[int, int]] = {}   # the bytes each one's elements span

    def __enter__(self) -> ForwardContext:
        refuse_nested()      # (the outer run's recorder would read as a tape's below)
        if interceptor.get() is not None:
            raise TapegradError("forward mode cannot run inside a recording tg.Tape")
        self.tokens = (_active.set((self,)), interceptor.set(self.launch))
        return self

    def __exit__(self, *exc: Any) -> None:
        _active.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])

    def seed(self, x: Any, tangents: list[Any]) -> None:
        key = array_key(x)
        self.arrays[key] = x
        self.tangents[key] = list(tangents)
        self.extents[key] = extent(x, key[0])

    def tangent_of(self, x: Any) -> list[Any] | None:
        key = array_key(x)
        found = self.tangents.get(key)
        if found is None and self.tangents:
            self.check_not_a_view(x, key)
        return found

    def check_not_a_view(self, x: Any, key: tuple) -> None:
        """Tangents belong to whole arrays: another view of an array that carries one would
        have none (a kernel given ``x[1:]`` got a zero tangent, silently)."""
        lo, hi = extent(x, key[0])
        for other, (o_lo, o_hi) in self.extents.items():
            if o_lo < hi and lo < o_hi:
                raise TapegradError(
                    f"an array of shape {tuple(x.shape)} shares memory with an array of shape "
                    f"{other[1]} that carries a tangent; forward mode follows whole arrays, so "
                    "this view would carry none: pass the array itself (and offset the indices "
                    "in the kernel), or make the view before differentiating")

    def tangents_or_zero(self, x: Any) -> list[Any]:
        t = self.tangent_of(x)
        if t is None:
            t = [_zeros_like(x) for _ in range(self.width)]
            self.seed(x, t)
        return t

    def launch(self, cfg: Any, args: tuple, ndrange: Any) -> None:
        kernel = cfg.kernel
        nd = ndrange_of(kernel, ndrange)
        plain = tuple(plain_value(a) if isinstance(a, DualScalar) else a for a in args)
        check_args(kernel, cfg.backend, plain)
        reads, writes = access(kernel)
        params = kernel_ir(kernel).params
        varied = any((is_array(a) and p in reads and self.tangent_of(a) is not None)
                     or isinstance(a, DualScalar) for p, a in zip(params, args))
        activity, tangents = [], {}
        for p, a in zip(params, args):
            if isinstance(a, DualScalar):
                activity.append("active")
                tangents[p] = a.tangents
            elif is_array(a) and np.dtype(a.dtype).kind == "f" and (
                    self.tangent_of(a) is not None or (varied and p in writes)):
                activity.append("dup")
                tangents[p] = tuple(self.tangents_or_zero(a))
            else:
                activity.append("const")
        if "dup" not in activity and "active" not in activity:
            launch_now(cfg, plain, ndrange)      # nothing carries a tangent here
            return
        run_tangent(cfg, plain, tangents, tuple(activity), nd)
