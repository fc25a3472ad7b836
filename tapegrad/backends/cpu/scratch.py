"""Where a generated CPU task's local memory comes from: the stack or the heap.

A tile of local memory on the task's stack (``copies.stack_empty``) is one that LLVM knows
aliases none of the kernel's arrays, so a full group's copy of an input into it (given
constant extents by ``jam.tile_copies``) is one vector load and store per row.  A tile that
the kernel adds into (an adjoint's shadow tiles) ran slower there: a float32 tiled matmul's
adjoint (512², 2-core EPYC) took 6.9-7.8 ms against 5.3-5.8 with its shadow tiles on the
heap.  Only speed depends on the choice; the results are the same bits.
"""

from __future__ import annotations

import ast

import numpy as np

from tapegrad.backends.cpu.copies import STACK_ARRAYS

STACK_BYTES = 4096      # the most bytes of one array on the stack (a 32 x 32 float32 tile)
STACK_TOTAL = 32768     # the most bytes on the stack in all, per task


class Scratch:
    """The line that makes each local-memory array of one task: on the stack while it is
    small (``STACK_BYTES``) and fits in what is left of ``STACK_TOTAL`` (first come, first
    placed), and unless the kernel stores into it a value computed from it
    (``accumulated``); from the heap (``aligned_empty``) otherwise, and always where
    ``accumulated`` is None (the jam pass left out).

    >>> s = Scratch(set())
    >>> s.line("tile", (16, 16), "float32")
    'tile = stack_empty(np.float32, 16, 16)'
    >>> s.line("big", (64, 64), "float64")
    'big = aligned_empty((64, 64), np.float64)'
    """

    def __init__(self, accumulated: set[str] | None) -> None:
        self.accumulated = accumulated
        self.on_stack = 0
        self.stacked: set[str] = set()     # the names of those on the stack

    def line(self, name: str, shape: tuple[int, ...], dtype: str) -> str:
        size = np.dtype(dtype).itemsize
        for d in shape:
            size *= d
        if (STACK_ARRAYS and self.accumulated is not None and name not in self.accumulated
                and 0 < size <= STACK_BYTES and self.on_stack + size <= STACK_TOTAL):
            self.on_stack += size
            self.stacked.add(name)
            return f"{name} = stack_empty({numpy_name(dtype)}, {', '.join(map(str, shape))})"
        return f"{name} = aligned_empty({shape}, {numpy_name(dtype)})"


def accumulated(body: list[ast.stmt]) -> set[str]:
    """The arrays into which ``body`` stores a value computed from the same array
    (``x[i] = x[i] + v``, ``x[i] = 2 * x[j]``), adds with ``+=``, or adds with atomics; as
    written (not through a temporary, nor inside a device function).

    >>> code = "t[i] = t[i] + s; u[i] = v[i]; tg.atomic_add(w, i, 1.0)"
    >>> sorted(accumulated(ast.parse(code).body))
    ['t', 'w']
    """
    names = set()
    for n in ast.walk(ast.Module(body=list(body), type_ignores=[])):
        if isinstance(n, ast.AugAssign):
            targets = [n.target]
        elif isinstance(n, ast.Assign):
            targets = [t for t in n.targets if isinstance(t, ast.Subscript) and any(
                isinstance(r, ast.Name) and r.id == _base(t) for r in ast.walk(n.value))]
        elif isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Name) and (
                getattr(n.func, "attr", getattr(n.func, "id", "")).startswith("atomic_")):
            names.add(n.args[0].id)
            continue
        else:
            continue
        names.update(b for b in map(_base, targets) if b)
    return names


def _base(t: ast.expr) -> str | None:
    return t.value.id if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) else None


def numpy_name(dtype: str) -> str:
    """NumPy's name for ``dtype`` in generated code (``np.bool_``: NumPy 1.x has no
    ``np.bool``)."""
    return "np.bool_" if dtype == "bool" else f"np.{dtype}"
