"""The CPU's own workgroup shape for kernels that cannot tell their workgroups apart.

On the CPU one thread runs a whole workgroup as a loop nest, and only the innermost loop, along
one row of the group, is vectorised.  Workgroup sizes chosen for a GPU make short rows, and
a kernel runs markedly slower in them than in long ones, its gradient more so (measured:
CHANGELOG.md, 'the figures that moved').  A kernel that never asks for its
local index, its group index or the group size, and shares nothing within a group (no local
memory, no barriers), computes the same whatever the grouping, so the CPU runs it in groups
of its own shape (``_ROWS``) instead, for launches large enough that it matters
(``backend._ByLaunchSize``: 16384 work-items, rows of 256; other launches keep the launch's
groupsize).

It does so only where longer rows cannot hurt: when every array the kernel indexes with the
last dimension's global index takes it in its last subscript (``A[i, j + 1]``, not the
transpose's ``B[j, i]``, whose square tiles keep each cache line it writes in use).
"""

from __future__ import annotations

import ast
import dataclasses

from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, TypedKernel

# what a group shape shows: the work-item's place in its group, the group's place, its size,
# and what the group's work-items share
_OBSERVE_GROUPS = {"local_index", "local_indices", "group_index", "group_indices", "groupsize",
                   "localmem", "synchronize"}

# the shape the CPU runs such kernels in, per rank, chosen among the shapes tried on a 2-D
# stencil (measured: CHANGELOG.md, 'the figures that moved').  One row per group
# streams through memory in order; arrays of rows much shorter than 1024 would rather have
# several rows per group.  Rank 3 (not measured): rows of 256, four per group.
_ROWS = {1: (1024,), 2: (1, 1024), 3: (1, 4, 256)}
_ROW_ENOUGH = 256      # a launch whose groups have rows this long (and 1024 work-items) keeps them


def cpu_groupsize(tk: TypedKernel) -> tuple[int, ...]:
    """The groupsize the CPU runs ``tk`` in: its own (``_ROWS``) when the kernel cannot tell
    and its row-wise accesses gain from it, else the launch's."""
    ours = _ROWS.get(tk.rank)
    if ours is None or _covers(tk.groupsize, ours) or _observes_groups(tk) \
            or not _row_wise(tk):
        return tk.groupsize
    return ours


def with_cpu_groupsize(tk: TypedKernel) -> TypedKernel:
    """``tk`` with the groupsize the CPU runs it in."""
    size = cpu_groupsize(tk)
    if size == tk.groupsize:
        return tk
    return dataclasses.replace(tk, groupsize=size, launch_groupsize=tk.groupsize)


def _covers(size: tuple[int, ...], ours: tuple[int, ...]) -> bool:
    """The launch's groups already have rows and work-items enough (a CPU-minded choice is
    kept: (4, 256) runs a 256^2 stencil as fast as (1, 1024))."""
    items = 1
    for w in size:
        items *= w
    return size[-1] >= min(_ROW_ENOUGH, ours[-1]) and items >= 1024


def _observes_groups(tk: TypedKernel) -> bool:
    # (device functions cannot ask: the type checker refuses these intrinsics in them)
    return any(tg_name(n) in _OBSERVE_GROUPS
               for n in ast.walk(ast.Module(body=tk.ir.body, type_ignores=[])))


def _row_wise(tk: TypedKernel) -> bool:
    """Whether the last dimension's global index (and anything computed from it) appears in
    array subscripts only as their last component, and reaches no device function."""
    body = ast.Module(body=tk.ir.body, type_ignores=[])
    last = tk.rank - 1
    tainted: set[str] = set()

    def taints(e: ast.AST) -> bool:
        if isinstance(e, ast.Name):
            return e.id in tainted
        if isinstance(e, ast.Subscript):
            if tg_name(e.value) == "global_indices":       # tg.index(tg.Global, tg.NTuple)[k]
                return not (isinstance(e.slice, ast.Constant) and e.slice.value != last)
            if isinstance(e.value, ast.Name) and e.value.id in tainted:
                return True                      # a part of the indices' tuple
            return False        # a value loaded from an array: data, not the work-item's index
        if tg_name(e) == "global_index" and tk.rank > 1:
            return True                          # the linear index mixes all dimensions
        return any(taints(c) for c in ast.iter_child_nodes(e))

    changed = True
    while changed:                              # names computed from it, to a fixed point
        changed = False
        for n in ast.walk(body):
            if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                value = n.value
                if value is None:
                    continue
                for t in targets:
                    for name in _names_from(t, value, last, taints):
                        if name not in tainted:
                            tainted.add(name)
                            changed = True
            elif isinstance(n, ast.For) and isinstance(n.target, ast.Name) \
                    and taints(n.iter) and n.target.id not in tainted:
                tainted.add(n.target.id)
                changed = True
    for n in ast.walk(body):
        array, index = None, None
        if isinstance(n, ast.Subscript):
            array, index = n.value, n.slice
        elif (tg_name(n) or "").startswith("atomic_") and len(n.args) > 1:
            array, index = n.args[0], n.args[1]
        elif isinstance(n, ast.Call) and id(n) in tk.callees \
                and any(taints(a) for a in n.args):
            return False            # the device function may index with it in any position
        if isinstance(array, ast.Name) and _global_array(tk, array.id):
            parts = index.elts if isinstance(index, ast.Tuple) else [index]
            if any(taints(p) for p in parts[:-1]):
                return False
    return True


def _names_from(target: ast.AST, value: ast.AST, last: int, taints) -> list[str]:
    """The names in ``target`` that take the last global index, or a value computed from it,
    from ``value``."""
    if isinstance(target, ast.Name):        # (the whole tuple of indices taints its name)
        return [target.id] if taints(value) or tg_name(value) == "global_indices" else []
    if isinstance(target, ast.Tuple):
        if tg_name(value) == "global_indices":
            elt = target.elts[last] if last < len(target.elts) else None
            return [elt.id] if isinstance(elt, ast.Name) else []
        if isinstance(value, ast.Tuple) and len(value.elts) == len(target.elts):
            out = []
            for t, v in zip(target.elts, value.elts):
                out += _names_from(t, v, last, taints)
            return out
        return [n.id for n in ast.walk(target) if isinstance(n, ast.Name)] if taints(value) \
            else []
    return []


def _global_array(tk: TypedKernel, name: str) -> bool:
    """Whether ``name`` is an array in memory (not a work-item's private array)."""
    params = tk.ir.params
    t = tk.argtypes[params.index(name)] if name in params else tk.locals.get(name)
    return isinstance(t, Array) and t.space == "global"
