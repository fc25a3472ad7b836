"""What Python code reaches by name: the global and attribute names a code object uses, and
how many levels of functions (and containers, objects) the walks that follow them go:
``capturing/outside.py`` (what a function reads from outside its arguments) and
``tape/hostmath.py`` (names bound to math's functions).

>>> list(code_names(compile("y = math.sqrt(x)", "<example>", "exec")))
['math', 'sqrt', 'x', 'y']
"""

from __future__ import annotations

from types import CodeType
from typing import Any

DEPTH = 4           # levels of functions, containers and objects followed


def code_names(code: Any) -> dict[str, None]:
    """The global and attribute names a code object uses, with those of the code nested in
    it (a comprehension's, a lambda's: same globals), in order."""
    names = dict.fromkeys(code.co_names)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            names.update(code_names(const))
    return names
