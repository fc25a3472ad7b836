"""The primitives of the kernel language, one row each: adding a math function is one row here.

A row says everything the rest of tapegrad needs to know about ``tg.<name>``:

- ``partials``: one derivative template per argument, as kernel-language expressions in the
  arguments ``x``, ``y``, ``z`` (``PARAMS``) and the result ``r``; ``None`` where the
  derivative is zero.  Forward mode adds ``partial * x_dot`` to ``r_dot``, reverse mode adds
  ``partial * r_bar`` to ``x_bar``, the host's tracked scalars evaluate the same template on
  NumPy floats (so the three agree by construction).  A template that names ``g`` is the
  whole term instead of a factor: ``g`` is the incoming tangent or cotangent (``g / y`` reads
  better and rounds once where ``g * (1.0 / y)`` would round twice).
- ``result``: the type rule (``"float"``: the float type of the arguments; ``"rounded"``: the
  argument's own type, as NumPy's floor; ``"bool"``; ``"abs"``: ints stay ints).
- ``numpy``: NumPy's function of that name on the host (arrays, and ``np.<f>`` written in a
  kernel); ``None`` when NumPy has none (then ``host``, else ``math``'s, on the host).
- ``host``: the host's function where NumPy has none and ``math``'s will not do (it takes
  scalars and NumPy arrays).
- ``numba`` / ``c``: what a CPU (Numba) or C (OpenCL C, CUDA C++) kernel calls: a dotted name,
  or an expression in the arguments that the backend writes once per module as a helper;
  C's default is the function of its own name.
- ``domain``: where the function is smooth and finite, one interval per argument (for the
  tests that check every row against finite differences, and for the docs).

Operators (``+ - * / ** %``, unary ``-``) have rows too, in ``OPERATORS``, keyed by the name of
their ``ast`` node.  Conventions at non-differentiable points (docs/autodiff.md):
``abs'(0) = 0``; ``floor``, ``ceil``, ``trunc``, tests and casts to int give 0; ``sqrt'(0)``
and ``log'(0)`` follow the formulas (inf), as in every AD tool.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from tapegrad.lang import hostfma

PARAMS = "xyz"              # the arguments' names in templates and expression lowerings
_SMOOTH = (-3.0, 3.0)
_POSITIVE = (0.05, 5.0)
_UNIT = (-0.95, 0.95)


@dataclass(frozen=True)
class Primitive:
    """One row of the table (see the module docstring for each field)."""

    name: str
    partials: tuple[str | None, ...]
    result: str = "float"
    numpy: str | None = ""
    numba: str = ""
    c: str = ""
    domain: tuple[tuple[float, float], ...] = ()
    host: Callable[..., Any] | None = field(default=None, compare=False)

    @property
    def arity(self) -> int:
        return len(self.partials)

    @property
    def numpy_name(self) -> str | None:
        return self.name if self.numpy == "" else self.numpy

    @property
    def differentiable(self) -> bool:
        return any(p is not None for p in self.partials)

    def lowering(self, target: str) -> str:
        """What a kernel for ``target`` ("numba": the CPU) calls: a dotted name, or an
        expression in the arguments (see ``is_expression``)."""
        return self.numba or f"math.{self.name}"

    @property
    def lowering_c(self) -> str:
        """What a C kernel (OpenCL C, CUDA C++) calls: a function of C's math library, which
        both dialects overload for float, or an expression in the arguments (a helper)."""
        return self.c or self.name

    def host_function(self) -> Callable[..., Any]:
        """The function that computes it on host scalars: the row's own ``host``, else math's,
        else NumPy's."""
        if self.host is not None:
            return self.host
        if hasattr(math, self.name):
            return getattr(math, self.name)
        return getattr(np, self.numpy_name)

    @cached_property
    def host_partials(self) -> Callable[..., tuple[float, ...]]:
        """``(x[, y[, z]], r) -> partials``: the templates evaluated on NumPy floats, so that a rule
        at the edge of its domain gives inf or nan, as in a kernel, rather than raising."""
        return partials_function(self.name, self.partials, HOST_TG)


def partials_function(name: str, partials: tuple[str | None, ...], tg: Any
                      ) -> Callable[..., tuple[Any, ...]]:
    """``(x[, y[, z]], r, g=1.0) -> partials``: a row's templates as one function,
    ``tg.<f>`` in them looked up on ``tg``."""
    params = PARAMS[:len(partials)]
    body = ", ".join("0.0" if p is None else f"({p})" for p in partials)
    source = f"lambda {', '.join(params)}, r, g=1.0: ({body},)"
    return eval(compile(source, f"<partials of {name}>", "eval"), {"tg": tg})  # noqa: S307


def is_expression(lowering: str) -> bool:
    """Whether a lowering is an expression (a helper to write) rather than a function name."""
    return not all(part.isidentifier() for part in lowering.split("."))


def _row(name: str, *partials: str | None, **fields: Any) -> Primitive:
    fields.setdefault("domain", (_SMOOTH,) * len(partials))
    fields["numba"] = fields.get("numba", "").format(name)
    return Primitive(name, tuple(partials), **fields)


# Numba's math calls do not vectorise: the CPU calls tapegrad's own SIMD-friendly versions
# (tapegrad/backends/cpu/vmath/, which says how accurate each is); GPUs have their own
_VECTORISED_ON_CPU: dict[str, Any] = {"numba": "vmath.{}"}

_ABS_PARTIAL = "tg.copysign(1.0, x) if x != 0.0 else 0.0 * x"
# the quotient q of x % y and of fmod(x, y), r = x - q * y: see fmod's row
_QUOTIENT = "tg.floor((x - r) / y + 0.5)"

MATH: dict[str, Primitive] = {p.name: p for p in [
    _row("sin", "tg.cos(x)", **_VECTORISED_ON_CPU),
    _row("cos", "-tg.sin(x)", **_VECTORISED_ON_CPU),
    _row("tan", "1.0 + r * r", domain=((-1.4, 1.4),)),
    _row("asin", "1.0 / tg.sqrt(1.0 - x * x)", numpy="arcsin", domain=(_UNIT,)),
    _row("acos", "-1.0 / tg.sqrt(1.0 - x * x)", numpy="arccos", domain=(_UNIT,)),
    _row("atan", "1.0 / (1.0 + x * x)", numpy="arctan", **_VECTORISED_ON_CPU),
    _row("sinh", "tg.cosh(x)", **_VECTORISED_ON_CPU),
    _row("cosh", "tg.sinh(x)", **_VECTORISED_ON_CPU),
    _row("tanh", "1.0 - r * r", **_VECTORISED_ON_CPU),
    # (asinh', acosh', atan2's partials and expm1': no x * x to overflow or underflow, and
    # no r + 1.0 to lose a tiny r, where the derivative itself is an ordinary number)
    _row("asinh", "1.0 / tg.hypot(1.0, x)", numpy="arcsinh"),
    _row("acosh", "1.0 / (tg.sqrt(x - 1.0) * tg.sqrt(x + 1.0))", numpy="arccosh",
         domain=((1.05, 4.0),)),
    _row("atanh", "1.0 / (1.0 - x * x)", numpy="arctanh", domain=(_UNIT,)),
    _row("exp", "r", **_VECTORISED_ON_CPU),
    _row("expm1", "tg.exp(x)", **_VECTORISED_ON_CPU),
    _row("exp2", "r * 0.6931471805599453", numba="np.exp2"),
    _row("log", "1.0 / x", domain=(_POSITIVE,), **_VECTORISED_ON_CPU),
    # (C: below 2**-60, log1p(x) rounds to x; PoCL's gives 0 for the smallest subnormals)
    _row("log1p", "1.0 / (1.0 + x)", domain=(_POSITIVE,), c="fabs(x) < 0x1p-60f ? x : log1p(x)",
         **_VECTORISED_ON_CPU),
    _row("log2", "1.0 / (x * 0.6931471805599453)", domain=(_POSITIVE,)),
    _row("log10", "1.0 / (x * 2.302585092994046)", domain=(_POSITIVE,)),
    _row("sqrt", "0.5 / r", domain=(_POSITIVE,)),
    _row("cbrt", "1.0 / (3.0 * r * r)", numba="np.cbrt"),
    _row("erf", "1.1283791670955126 * tg.exp(-x * x)", numpy=None),
    _row("erfc", "-1.1283791670955126 * tg.exp(-x * x)", numpy=None),
    _row("fabs", _ABS_PARTIAL),
    _row("floor", None, result="rounded", numba="np.{}"),
    _row("ceil", None, result="rounded", numba="np.{}"),
    _row("trunc", None, result="rounded", numba="np.{}"),
    _row("isnan", None, result="bool"),
    _row("isinf", None, result="bool"),
    _row("isfinite", None, result="bool"),
    _row("atan2", "y / tg.hypot(x, y) / tg.hypot(x, y)",          # atan2(y=x, x=y)
         "-x / tg.hypot(x, y) / tg.hypot(x, y)",
         numpy="arctan2", domain=(_SMOOTH, _POSITIVE)),
    _row("hypot", "x / r if r != 0.0 else 0.0 * r", "y / r if r != 0.0 else 0.0 * r"),
    # (x ** k at x = 0, k = 0 and the exponent's derivative at x <= 0: the plain formulas give
    # NaN for a finite derivative; x ** 0 is 1 for every x, inf and nan included, so its
    # derivative is 0: 0.0 * y, as y is 0 there, where 0.0 * x was nan at x = +-inf)
    _row("pow", "y * tg.pow(x, y - 1.0) if y != 0.0 else 0.0 * y",
         "r * tg.log(x) if x > 0.0 else 0.0 * x", numpy="power", domain=(_POSITIVE, _SMOOTH)),
    _row("copysign", "tg.copysign(1.0, x) * tg.copysign(1.0, y) if x != 0.0 else 0.0 * x", None,
         domain=(_SMOOTH, _POSITIVE)),
    # d/dy is minus the quotient the result implies, r = x - q * y: (x - r) / y rounded to the
    # nearest integer (x - r is exact or nearly so), where trunc(x / y) rounds x / y first and
    # can land on the next integer (fmod(1.0, 0.1) = 1.0 - 9 * 0.1, but 1.0 / 0.1 == 10.0)
    _row("fmod", "1.0 + 0.0 * x", f"-{_QUOTIENT}", numba="np.fmod",
         domain=((0.3, 0.9), (1.0, 2.0))),
    # log(exp(x) + exp(y)) without overflow (softplus(x) is logaddexp(x, 0.0)); the partials
    # are the softmax weights, 1 / (1 + exp(y - x)): 1 or 0 at an infinite argument (where
    # exp(x - r) was exp(nan)), 1/2 each at a tie, infinite ties included
    _row("logaddexp", "0.5 if x == y else 1.0 / (1.0 + tg.exp(y - x))",
         "0.5 if x == y else 1.0 / (1.0 + tg.exp(x - y))",
         numba="np.logaddexp",
         c="x == y ? x + 0.6931471805599453 : fmax(x, y) + log1p(exp(-fabs(x - y)))"),
    # x * y + z rounded once (C's fma, Python 3.13's math.fma): the same bits on every device
    # (no backend contracts a * b + c on its own), one instruction on CPUs that have FMA
    _row("fma", "g * y", "g * x", "g", numpy=None, numba="fused.fma", host=hostfma.fma),
]}

# ``abs`` is Python's builtin (an int stays an int), so it is no tg.<name> on the host
ABS = _row("abs", _ABS_PARTIAL, result="abs", numpy="absolute", numba="abs", host=abs)

UNARY = tuple(name for name, p in MATH.items() if p.arity == 1)
BINARY = tuple(name for name, p in MATH.items() if p.arity == 2)
TERNARY = tuple(name for name, p in MATH.items() if p.arity == 3)


@dataclass(frozen=True)
class Operator:
    """An operator's row: its symbol on the host tape, its host function, its partials."""

    symbol: str
    partials: tuple[str | None, ...]
    host: Callable[..., Any]

    @cached_property
    def host_partials(self) -> Callable[..., tuple[float, ...]]:
        return partials_function(self.symbol, self.partials, HOST_TG)


OPERATORS: dict[str, Operator] = {
    "Add": Operator("+", ("g", "g"), operator.add),
    "Sub": Operator("-", ("g", "-g"), operator.sub),
    "Mult": Operator("*", ("g * y", "g * x"), operator.mul),
    "Div": Operator("/", ("g / y", "-(g * r) / y"), operator.truediv),
    "Pow": Operator("**", MATH["pow"].partials, operator.pow),
    "Mod": Operator("%", ("g", f"-(g * {_QUOTIENT})"), operator.mod),   # x - y floor(x / y)
    "USub": Operator("neg", ("-g",), operator.neg),
    "UAdd": Operator("pos", ("g",), operator.pos),
}


class _HostMath:
    """``tg`` in a template evaluated on the host: NumPy's functions (inf and nan at the edges,
    as in kernels, where math's would raise)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        row = MATH.get(name)
        if row is None or row.numpy_name is None:
            return getattr(math, name)
        return getattr(np, row.numpy_name)


HOST_TG = _HostMath()


def lookup(name: str) -> Primitive | None:
    """The row of ``tg.<name>`` (``abs`` included), or None."""
    return ABS if name == "abs" else MATH.get(name)


def template(text: str) -> ast.expr:
    """A partial's template as an expression tree (``tg.<name>`` calls, x/y/r/g names)."""
    return ast.parse(text, mode="eval").body


def names_g(text: str) -> bool:
    """Whether a template is the whole term (it names ``g``) rather than a factor."""
    return any(isinstance(n, ast.Name) and n.id == "g" for n in ast.walk(template(text)))
