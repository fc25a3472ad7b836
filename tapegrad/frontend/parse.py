"""Parse a user's Python function into an AST whose line numbers are the user's own."""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tapegrad.errors import KernelSyntaxError


@dataclass
class Parsed:
    """A function's definition, where it came from, and the names it can see."""

    tree: ast.FunctionDef
    filename: str
    globals: dict[str, Any]
    closure: dict[str, Any]


def parse_function(fn: Callable[..., Any]) -> Parsed:
    """Return ``fn``'s ``FunctionDef`` with ``lineno``/``col_offset`` as in its file.

    Decorators are dropped: the caller already knows what ``fn`` is.
    """
    filename = inspect.getsourcefile(fn) or inspect.getfile(fn)
    if fn.__name__ == "<lambda>":      # (its source line is no definition to parse)
        raise KernelSyntaxError(
            "a kernel or device function is defined with def, not lambda: "
            "def f(x): return ...", filename, fn.__code__.co_firstlineno)
    try:
        lines, first_line = inspect.getsourcelines(fn)
    except (OSError, TypeError) as exc:
        raise KernelSyntaxError(
            f"tapegrad cannot read the source of {fn.__qualname__!r} ({exc}); kernels must be "
            "defined in a file (or in source registered with linecache), not typed into an "
            "interactive prompt that keeps no source.") from None
    source = "".join(lines)
    dedented = textwrap.dedent(source)
    indent = len(lines[0]) - len(lines[0].lstrip())
    module = ast.parse(dedented)
    tree = next(n for n in module.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    ast.increment_lineno(module, first_line - 1)
    for node in ast.walk(module):
        if hasattr(node, "col_offset"):
            node.col_offset += indent
    tree.decorator_list = []
    closure = {}
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
            try:
                closure[name] = cell.cell_contents
            except ValueError:  # an empty cell: the name is not bound yet
                pass
    return Parsed(tree, filename, fn.__globals__, closure)
