"""Where a bounds-checked kernel indexed outside an array: the user's line, the array, the index.

Numba's bounds checks (``TAPEGRAD_BOUNDSCHECK=1``) raise a bare ``IndexError`` with no place
and no numbers.  The generated kernel is plain Python, so the launch is run again by the
Python interpreter on copies of the arrays (the user's arrays are not touched again); NumPy's
``IndexError`` then comes with a traceback into the generated module, whose line map gives
the user's line, and with the frame's variables, with which the subscripts of that line are
evaluated to find the one out of range.  Only small launches are replayed (the interpreter
takes about a microsecond per operation); for others the plain message stays.

>>> values = {"A": np.zeros(8), "i": 7}
>>> outside("B[i] = A[i + 1] * 2.0", values)
'A[i + 1] with index 8, but A has shape (8,)'
"""

from __future__ import annotations

import ast
from types import TracebackType
from typing import Any

import numpy as np

REPLAY_ITEMS = 1 << 16      # work-items the interpreter replays at most (about a second)


def report(py_func: Any, args: tuple, rest: tuple, items: int, lowered: Any,
           path: str) -> tuple[str, int | None] | None:
    """(what went wrong, the user's line) for an out-of-bounds launch of ``py_func`` (the
    generated kernel) with ``args`` (the user's arguments) and ``rest`` (sizes, thread count,
    per-thread copies); None when the replay is too long or finds nothing."""
    if items > REPLAY_ITEMS:
        return None
    copies = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    rest = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in rest)
    try:
        with np.errstate(all="ignore"):
            py_func(*copies, *rest)
    except (IndexError, OverflowError) as exc:     # (a negative index into np.uint64: overflow)
        frame = _generated_frame(exc.__traceback__, path)
        if frame is None:
            return None
        lineno, variables = frame
        user = lowered.user_line.get(lineno)
        code = _user_code(lowered.source, lineno)
        found = outside(code, variables) if code else None
        if found is None:
            found = f"{code}: {exc}" if code else str(exc)
        return found, user
    except Exception:       # the replay itself failed (a helper only Numba can run)
        return None
    return None


def _generated_frame(tb: TracebackType | None, path: str) -> tuple[int, dict] | None:
    """The line and the variables of the innermost frame in the generated module."""
    found = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == str(path):
            found = tb.tb_lineno, dict(tb.tb_frame.f_locals)
        tb = tb.tb_next
    return found


def _user_code(source: str, lineno: int) -> str | None:
    """The user's statement that generated line ``lineno`` comes from: the comment
    ``# file.py:N  code`` the generator writes above each statement's code."""
    lines = source.splitlines()
    for k in range(min(lineno, len(lines)) - 1, -1, -1):
        text = lines[k].strip()
        if text.startswith("# ") and ".py:" in text.split()[1]:
            return text.split(None, 2)[2] if len(text.split(None, 2)) > 2 else None
    return None


def outside(code: str, variables: dict) -> str | None:
    """The first subscript of ``code`` whose index falls outside its array, evaluated with
    ``variables``, described for the user; None if none is found."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
            continue
        array = variables.get(node.value.id)
        if not isinstance(array, np.ndarray):
            continue
        try:
            index = eval(compile(ast.Expression(node.slice), "<index>", "eval"),  # noqa: S307
                         {"__builtins__": {}}, variables)
        except Exception:
            continue
        index = index if isinstance(index, tuple) else (index,)
        if not all(isinstance(k, (int, np.integer)) for k in index):
            continue
        if len(index) > array.ndim or any(
                not 0 <= int(k) < n for k, n in zip(index, array.shape)):
            shown = ", ".join(str(int(k)) for k in index)
            return (f"{ast.unparse(node)} with index {shown}, but {node.value.id} has shape "
                    f"{array.shape}")
    return None
