"""Arguments a kernel assigns to become per-work-item locals.

A kernel argument is one value for the whole launch.  When the body assigns to it
(``flag = flag - X[i]``), each work-item must start from the argument and change only its own
copy, as it would on a GPU; on the CPU, where one thread runs many work-items in a loop, a
plain assignment would leak into the next work-item.  So ::

    def k(Y, X, flag):               def k(Y, X, flag):
        i = tg.index()                   flag__local = flag
        flag = flag - X[i]      ->       i = tg.index()
        ...                              flag__local = flag__local - X[i]
"""

from __future__ import annotations

import ast
import re

from tapegrad.frontend.ir import KernelIR

SUFFIX = "__local"


def as_written(code: str) -> str:
    """Generated code's text with the arguments' local copies named as the user wrote them.

    >>> as_written("A[i + off__local]")
    'A[i + off]'
    """
    return re.sub(rf"\b(\w+){SUFFIX}\b", r"\1", code)


def local_copies_of_assigned_params(ir: KernelIR) -> KernelIR:
    """Rename every scalar parameter the body assigns to a local initialised from it."""
    body = ast.Module(body=ir.body, type_ignores=[])
    assigned = {n.id for n in ast.walk(body)
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in ir.params}
    # arrays (indexed, or asked for .shape & co.) keep their name: the type checker says
    # that an array argument cannot be reassigned, at the user's line
    arrays = {n.value.id for n in ast.walk(body)
              if isinstance(n, (ast.Subscript, ast.Attribute)) and isinstance(n.value, ast.Name)}
    assigned -= arrays
    if not assigned:
        return ir
    renamed = {p: f"{p}{SUFFIX}" for p in assigned}
    for n in ast.walk(body):
        if isinstance(n, ast.Name) and n.id in renamed:
            n.id = renamed[n.id]
    first = ir.body[0]
    copies = [ast.copy_location(ast.Assign(
        targets=[ast.copy_location(ast.Name(id=renamed[p], ctx=ast.Store()), first)],
        value=ast.copy_location(ast.Name(id=p, ctx=ast.Load()), first)), first)
        for p in ir.params if p in renamed]
    ir.body[:0] = copies
    ir.locals |= set(renamed.values())
    return ir
