"""A ``return`` in a work-item's code, where the work-item cannot simply stop: the CPU runs a
group's work-items in a loop, and on a GPU every work-item must reach each barrier."""

from __future__ import annotations

import ast


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
