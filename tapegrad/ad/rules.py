"""Derivative rules: one entry per primitive, shared by the tangent and the adjoint transform.

Each rule gives the partial derivatives of ``r = f(x)`` or ``r = f(x, y)`` as kernel-language
expressions in the arguments ``x``, ``y`` and the result ``r``.  Forward mode computes
``r_dot = sum(partial_k * arg_k_dot)``; reverse mode adds ``r_bar * partial_k`` to
``arg_k_bar``.  Adding a primitive touches this table only.

Conventions at non-differentiable points (documented in docs/autodiff.md):
- ``abs'(0) = 0``; ``floor``, ``ceil``, ``trunc``, comparisons and casts to int give 0;
- ``min``/``max``/``where`` send the whole derivative to the argument that was chosen, and at a
  tie ``max(a, b)``/``min(a, b)`` choose ``a``;
- ``sqrt'(0)``, ``log'(0)`` follow the formulas (inf), as in every AD tool.
"""

from __future__ import annotations

import ast

from tapegrad.ad.astutil import substituted

UNARY = {
    "sin": "tg.cos(x)",
    "cos": "-tg.sin(x)",
    "tan": "1.0 + r * r",
    "asin": "1.0 / tg.sqrt(1.0 - x * x)",
    "acos": "-1.0 / tg.sqrt(1.0 - x * x)",
    "atan": "1.0 / (1.0 + x * x)",
    "sinh": "tg.cosh(x)",
    "cosh": "tg.sinh(x)",
    "tanh": "1.0 - r * r",
    "asinh": "1.0 / tg.sqrt(x * x + 1.0)",
    "acosh": "1.0 / tg.sqrt(x * x - 1.0)",
    "atanh": "1.0 / (1.0 - x * x)",
    "exp": "r",
    "expm1": "r + 1.0",
    "log": "1.0 / x",
    "log1p": "1.0 / (1.0 + x)",
    "log2": "1.0 / (x * 0.6931471805599453)",
    "log10": "1.0 / (x * 2.302585092994046)",
    "sqrt": "0.5 / r",
    "erf": "1.1283791670955126 * tg.exp(-x * x)",
    "erfc": "-1.1283791670955126 * tg.exp(-x * x)",
    "fabs": "tg.copysign(1.0, x) if x != 0.0 else 0.0 * x",
    "abs": "tg.copysign(1.0, x) if x != 0.0 else 0.0 * x",
}

BINARY = {
    "atan2": ("y / (x * x + y * y)", "-x / (x * x + y * y)"),   # atan2(x=y_coord, y=x_coord)
    "hypot": ("x / r if r != 0.0 else 0.0 * r", "y / r if r != 0.0 else 0.0 * r"),
    "pow": ("y * tg.pow(x, y - 1.0) if y != 0.0 else 0.0 * x",
            "r * tg.log(x) if x > 0.0 else 0.0 * x"),
    "copysign": ("tg.copysign(1.0, x) * tg.copysign(1.0, y) if x != 0.0 else 0.0 * x", "0.0 * y"),
    "fmod": ("1.0 + 0.0 * x", "-tg.trunc(x / y) * 1.0"),
}

ZERO = {"floor", "ceil", "trunc", "isnan", "isinf", "isfinite", "int32", "int64", "bool"}
IDENTITY = {"float32", "float64"}


def partials(name: str, args: list[ast.expr], result: ast.expr) -> list[ast.expr | None]:
    """The partial derivative expressions of ``tg.<name>(*args)``; None where it is zero."""
    if name in ZERO:
        return [None] * len(args)
    if name in IDENTITY:
        return [ast.Constant(value=1.0)]
    if name in UNARY:
        return [_instantiate(UNARY[name], {"x": args[0], "r": result})]
    if name in BINARY:
        env = {"x": args[0], "y": args[1], "r": result}
        return [_instantiate(t, env) for t in BINARY[name]]
    raise KeyError(name)


def _instantiate(template: str, env: dict[str, ast.expr]) -> ast.expr:
    return substituted(ast.parse(template, mode="eval").body, env)
