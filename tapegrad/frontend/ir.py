"""The kernel IR: a canonical Python AST plus what the frontend learned about it.

Canonical form (what every later stage may assume):
- every kernel-language operation is a call ``tg.<name>(...)`` (``tg.sin``, ``tg.global_index``,
  ``tg.atomic_add``, ``tg.float32``...), whatever the user spelled (``math.sin``, ``np.sin``,
  ``abs``, ``float``, ``from tapegrad import index``);
- module-level and closure constants are inlined as literals;
- device-function calls are ``Name(id=<func name>)`` calls, listed in ``funcs``;
- the only other names are parameters, locals and ``range``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any


@dataclass
class KernelIR:
    name: str
    params: list[str]
    body: list[ast.stmt]
    filename: str
    lineno: int
    is_kernel: bool
    funcs: dict[str, Any] = field(default_factory=dict)   # name -> lang.Func
    locals: set[str] = field(default_factory=set)
    generated: bool = False   # made by a transform (not the user's own text)


def tg_call(name: str, args: list[ast.expr], like: ast.AST | None = None) -> ast.Call:
    """Build the canonical call ``tg.<name>(*args)``, located at ``like`` when given."""
    call = ast.Call(func=ast.Attribute(value=ast.Name(id="tg", ctx=ast.Load()), attr=name,
                                       ctx=ast.Load()), args=args, keywords=[])
    if like is not None:
        ast.copy_location(call, like)
        ast.copy_location(call.func, like)
        ast.copy_location(call.func.value, like)
    return call


def tg_name(node: ast.AST) -> str | None:
    """The intrinsic's name if ``node`` is a canonical ``tg.<name>(...)`` call, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "tg"):
        return node.func.attr
    return None
