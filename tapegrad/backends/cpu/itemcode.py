"""Rewrites of a work-item's code for the CPU's loops over work-items: a ``return`` becomes
leaving the loop's iteration, a second copy of a body gets names of its own."""

from __future__ import annotations

import ast
import re


def rename_assigned(lines: list[str], start: int, suffix: str) -> None:
    """Give the names assigned in ``lines[start:]`` (generated code, comments aside) the
    ``suffix`` there.  The column pass is a second copy of the rest's body in the same
    function; with the same local names in both, Numba's parallel-loop lowering follows a
    cycle of copies and recurses until Python stops it (``parfor.cyclic_lookup``)."""
    assigned: set[str] = set()
    for line in lines[start:]:
        code = line.strip()
        m = re.match(r"([A-Za-z_][\w, ]*?)\s*(?:[-+*/%&|^]|//|\*\*)?=(?!=)", code)
        if m and not code.startswith(("#", "for ", "if ", "elif ", "while ")):
            assigned.update(n.strip() for n in m.group(1).split(","))
    if not assigned:
        return
    name = re.compile(r"\b(" + "|".join(sorted(map(re.escape, assigned))) + r")\b")
    for k in range(start, len(lines)):
        if not lines[k].lstrip().startswith("#"):
            lines[k] = name.sub(lambda m: m.group(1) + suffix, lines[k])


def additive(e: ast.expr) -> str:
    """``e`` as source that stays one term when ``- x`` is appended."""
    text = ast.unparse(e)
    simple = isinstance(e, (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Call)) or (
        isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div,
                                                        ast.FloorDiv, ast.Mod, ast.Pow)))
    return text if simple else f"({text})"


def eliminate_returns(body: list[ast.stmt]) -> tuple[list[ast.stmt], bool]:
    """Turn ``return`` in a work-item's code into leaving the work-item loop iteration.

    At loop depth 0 a return becomes ``continue`` (of the work-item loop); inside the user's
    loops it sets ``_returned`` and breaks, and each enclosing loop is followed by a check.
    """
    needs_flag = False

    def mark(node: ast.stmt) -> ast.stmt:
        node._tg_item_exit = True
        return node

    def rewrite(stmts: list[ast.stmt], depth: int) -> tuple[list[ast.stmt], bool]:
        nonlocal needs_flag
        out: list[ast.stmt] = []
        found = False
        for s in stmts:
            if isinstance(s, ast.Return):
                found = True
                if depth == 0:
                    out.append(ast.copy_location(mark(ast.Continue()), s))
                else:
                    needs_flag = True
                    flag = ast.parse("_returned = True").body[0]
                    out.append(ast.copy_location(flag, s))
                    out.append(ast.copy_location(ast.Break(), s))
                continue
            if isinstance(s, ast.If):
                body, f1 = rewrite(s.body, depth)
                orelse, f2 = rewrite(s.orelse, depth)
                new = ast.copy_location(ast.If(test=s.test, body=body, orelse=orelse), s)
                out.append(new)
                found |= f1 or f2
            elif isinstance(s, (ast.For, ast.While)):
                body, f = rewrite(s.body, depth + 1)
                new = (ast.For(target=s.target, iter=s.iter, body=body, orelse=[])
                       if isinstance(s, ast.For) else ast.While(test=s.test, body=body, orelse=[]))
                out.append(ast.copy_location(new, s))
                if f:
                    found = True
                    exit_stmt = mark(ast.Continue()) if depth == 0 else ast.Break()
                    check = ast.If(test=ast.Name(id="_returned", ctx=ast.Load()),
                                   body=[ast.copy_location(exit_stmt, s)], orelse=[])
                    out.append(ast.copy_location(check, s))
            else:
                out.append(s)
        return out, found

    new_body, _ = rewrite(body, 0)
    return new_body, needs_flag
