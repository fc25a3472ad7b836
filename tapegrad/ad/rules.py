"""Derivative terms for the tangent and the adjoint transform, read from the primitive table.

The rules themselves are the rows of ``tapegrad/lang/primitives.py`` (one per function and
operator, shared with the host's tracked scalars); this module turns a row's template into the
expression one argument contributes: ``g * partial``, where ``g`` is that argument's tangent
(forward mode) or the result's cotangent (reverse mode).
"""

from __future__ import annotations

import ast
from functools import cache

from tapegrad.ad.astutil import mul, substituted
from tapegrad.lang import primitives

_CASTS_KEEP = ("float32", "float64")            # a float cast passes the derivative on
_CASTS_DROP = ("int32", "int64", "bool")        # a cast to int or bool has none


def call_partials(name: str) -> tuple[str | None, ...]:
    """The partial templates of ``tg.<name>``, one per argument (None: zero); KeyError when
    it has no rule."""
    if name in _CASTS_KEEP:
        return ("g",)
    if name in _CASTS_DROP:
        return (None,)
    row = primitives.lookup(name)
    if row is None:
        raise KeyError(name)
    return row.partials


def operator_partials(op: ast.operator | ast.unaryop,
                      args: list[ast.expr]) -> tuple[str | None, ...]:
    """The partial templates of an operator applied to ``args``; zero for ``//`` and the bit
    and logical operators."""
    kind = type(op).__name__
    if kind == "Pow" and isinstance(args[1], ast.Constant):
        p = args[1].value          # x ** 2: 2.0 * x ** 1, no guard against x = 0 needed
        return (None, None) if p == 0 else (f"{float(p)!r} * x ** {p - 1!r}", None)
    row = primitives.OPERATORS.get(kind)
    return row.partials if row is not None else (None,) * len(args)


def term(template: str, args: list[ast.expr], result: ast.expr, g: ast.expr) -> ast.expr:
    """What one argument contributes: the template with the arguments (``x``, ``y``, ``z``),
    ``r`` (and ``g``) filled in, times ``g`` unless the template names ``g`` itself."""
    env = {**dict(zip(primitives.PARAMS, args)), "r": result, "g": g}
    tree, whole = _parsed(template)
    filled = substituted(tree, env)
    return filled if whole else mul(g, filled)


@cache
def _parsed(template: str) -> tuple[ast.expr, bool]:
    return primitives.template(template), primitives.names_g(template)
