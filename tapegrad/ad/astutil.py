"""Small builders for the AST the transforms generate (kernel-language code)."""

from __future__ import annotations

import ast
import copy


def name(id_: str, store: bool = False) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def const(v) -> ast.Constant:
    return ast.Constant(value=v)


def assign(target: ast.expr | str, value: ast.expr) -> ast.Assign:
    if isinstance(target, str):
        target = name(target, True)
    return ast.Assign(targets=[target], value=value)


def add(a: ast.expr, b: ast.expr) -> ast.expr:
    return ast.BinOp(left=a, op=ast.Add(), right=b)


def mul(a: ast.expr, b: ast.expr) -> ast.expr:
    return ast.BinOp(left=a, op=ast.Mult(), right=b)


def neg(a: ast.expr) -> ast.expr:
    return ast.UnaryOp(op=ast.USub(), operand=a)


def walk(stmts: list[ast.stmt]):
    """Every node of a statement list (``ast.walk`` takes one node)."""
    return ast.walk(ast.Module(body=stmts, type_ignores=[]))


def clone(e: ast.expr) -> ast.expr:
    return copy.deepcopy(e)


def substituted(e: ast.expr, env: dict[str, ast.expr]) -> ast.expr:
    """A copy of ``e`` with each name in ``env`` replaced by a copy of its expression."""
    class Sub(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            return clone(env[n.id]) if n.id in env else n
    return Sub().visit(clone(e))


def located_at(nodes: list[ast.stmt], like: ast.AST) -> list[ast.stmt]:
    """Give generated nodes the line of the user's statement they come from."""
    for node in nodes:
        for n in ast.walk(node):
            if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                n.lineno = getattr(like, "lineno", 1)
                n.col_offset = getattr(like, "col_offset", 0)
                n.end_lineno = n.lineno
                n.end_col_offset = n.col_offset
    return nodes
