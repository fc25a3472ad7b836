"""Rewrites of a work-item's code for the CPU's loops over work-items: a second copy of a body
gets names of its own (a ``return`` becomes leaving the loop's iteration: ``returns.py``)."""

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
