"""Transposed tiles read from a transposed array: a tiled product's adjoint without scatters.

The adjoint of a tiled product (``tapegrad.ad.localgather``) needs one of its tiles
transposed, and copies it as each work-item loads its element::

    tile_b__t[lj, li] = B[t * 16 + li, j]

On the CPU one thread runs the whole group with its work-items as a vectorised loop along
``lj``, so that store is a scatter: 16 scattered stores per tile and per step, a sizeable
share of the adjoint's time.  Element ``[li, lj]`` of the copy is what work-item
``(lj, li)`` stores; that work-item's global indices are ``i - li + lj`` and ``j - lj + li``,
so each work-item can compute it itself::

    tile_b__t[li, lj] = B__T[j - lj + li, t * 16 + lj]

reading ``B__T``, the transpose of ``B``, along ``lj``: plain vector loads, no scatter.
``B__T`` is one transposed copy per launch, which the CPU lowering makes before the groups
run (``B__T`` is a parameter of the kernel the launcher does not pass; see
``derived_params``).  It costs one pass over ``B`` against one scattered store per element
of every tile loaded (measured: CHANGELOG.md, 'the figures that moved').

The rewrite applies to a store ``X[lj, li] = G[r, c]`` of a generated kernel launched in
full, square workgroups (every work-item ``(lj, li)`` exists), where ``X`` is local memory,
``G`` a rank-2 argument the kernel never writes, and ``r``, ``c`` arithmetic on the
work-item's indices and on names that are the same for the whole group.
"""

from __future__ import annotations

import ast
import copy
import dataclasses

from tapegrad.backends.structure import is_uniform
from tapegrad.frontend.ir import KernelIR, tg_name

SUFFIX = "__T"


def derived_params(params: list[str]) -> list[str]:
    """The parameters the kernel computes itself: ``G__T``, the transpose of parameter ``G``."""
    return [p for p in params if p.endswith(SUFFIX) and p[:-len(SUFFIX)] in params]


def transposed_operands(ir: KernelIR, groupsize: tuple[int, ...]) -> KernelIR:
    """``ir`` with every transposed tile copy read from a transposed array (see the module
    docstring), or ``ir`` itself.  Only for launches whose groups are all full."""
    if not ir.generated or len(groupsize) != 2 or groupsize[0] != groupsize[1]:
        return ir
    local = _indices(ir.body, "local_indices")
    glob = _indices(ir.body, "global_indices")
    if local is None or glob is None:
        return ir
    written = _written(ir.body) | set(ir.locals)
    fixed = _uniform_names(ir, set(local) | set(glob))
    body = copy.deepcopy(ir.body)
    sources: list[str] = []
    for stmts, k, looped in _statements(body):
        source = _rewrite(stmts, k, looped, ir.params, local, glob, written, fixed,
                          groupsize[0], body)
        if source is not None and source not in sources:
            sources.append(source)
    if not sources:
        return ir
    return dataclasses.replace(ir, body=body, params=ir.params + [g + SUFFIX for g in sources])


def _indices(body: list[ast.stmt], call: str) -> tuple[str, str] | None:
    """The names of ``a, b = tg.<call>()`` at the top level, assigned nowhere else."""
    found = [s for s in body if isinstance(s, ast.Assign) and tg_name(s.value) == call
             and isinstance(s.targets[0], ast.Tuple) and len(s.targets[0].elts) == 2
             and all(isinstance(e, ast.Name) for e in s.targets[0].elts)]
    if len(found) != 1:
        return None
    names = tuple(e.id for e in found[0].targets[0].elts)
    stores = [n for n in ast.walk(ast.Module(body=body, type_ignores=[]))
              if isinstance(n, ast.Name) and n.id in names and isinstance(n.ctx, ast.Store)]
    return names if len(stores) == 2 else None


def _written(body: list[ast.stmt]) -> set[str]:
    """Arrays the kernel stores into or updates atomically."""
    out = set()
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name):
            out.add(n.value.id)
        elif isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_") \
                and n.args and isinstance(n.args[0], ast.Name):
            out.add(n.args[0].id)
    return out


def _uniform_names(ir: KernelIR, items: set[str]) -> set[str]:
    """Names with one value per workgroup wherever they are read: parameters never assigned,
    and locals whose every assignment, outside any ``if`` or ``while``, computes a uniform
    value (``for`` targets from their range); found from the optimistic side, as loop-carried
    counters (``_trips2 = _trips2 + ...``) need."""
    assigned: dict[str, list[list[ast.expr]]] = {}
    varying: set[str] = set(items)

    def visit(stmts: list[ast.stmt], conditional: bool) -> None:
        for s in stmts:
            targets: list[ast.expr] = []
            values: list[ast.expr] = []
            if isinstance(s, ast.Assign):
                targets, values = s.targets, [s.value]
            elif isinstance(s, ast.AugAssign):
                targets, values = [s.target], [s.value, s.target]
            elif isinstance(s, ast.For):
                targets, values = [s.target], list(s.iter.args) \
                    if isinstance(s.iter, ast.Call) else [s.iter]
            for t in targets:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                        assigned.setdefault(n.id, []).append(values)
                        if conditional or isinstance(t, ast.Tuple):
                            varying.add(n.id)    # (tuples: judged as a whole, conservatively)
            if isinstance(s, ast.For):
                visit(s.body, conditional)
                visit(s.orelse, True)
            elif isinstance(s, (ast.If, ast.While)):
                visit(s.body, True)
                visit(s.orelse, True)
    visit(ir.body, False)
    uniform = (set(ir.params) | set(assigned)) - varying
    changed = True
    while changed:
        changed = False
        for name in sorted(uniform & set(assigned)):
            if not all(is_uniform(v, uniform) for values in assigned[name] for v in values):
                uniform.discard(name)
                changed = True
    return uniform


def _statements(body: list[ast.stmt], looped: bool = False
                ) -> list[tuple[list[ast.stmt], int, bool]]:
    """(statement list, position, whether the list is a loop's body) of the statements at
    the top level and in ``for`` loops (not under an ``if``: there only some work-items may
    run them)."""
    out = []
    for k, s in enumerate(body):
        out.append((body, k, looped))
        if isinstance(s, ast.For):
            out.extend(_statements(s.body, True))
    return out


def _alone_in_segment(stmts: list[ast.stmt], k: int, looped: bool, tile: str) -> bool:
    """Whether no other statement between the barriers around ``stmts[k]`` touches ``tile``:
    after the rewrite another work-item stores the element this one stored, so reading it
    back (or storing to the tile) before the next barrier would race.  A loop's body wraps
    around: its last barrier's segment runs on into the next iteration."""
    barriers = [p for p, s in enumerate(stmts) if _is_barrier(s)]
    if not barriers:
        return False
    before = [p for p in barriers if p < k]
    after = [p for p in barriers if p > k]
    if looped:
        start = before[-1] if before else barriers[-1] - len(stmts)
        end = after[0] if after else barriers[0] + len(stmts)
    else:
        start = before[-1] if before else -1
        end = after[0] if after else len(stmts)
    for p in range(start + 1, end):
        if p % len(stmts) != k and any(isinstance(n, ast.Name) and n.id == tile
                                       for n in ast.walk(stmts[p % len(stmts)])):
            return False
    return True


def _is_barrier(s: ast.stmt) -> bool:
    return isinstance(s, ast.Expr) and tg_name(s.value) == "synchronize"


_ARITHMETIC = (ast.Name, ast.Constant, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop,
               ast.Load, ast.expr_context)


def _rewrite(stmts: list[ast.stmt], k: int, looped: bool, params: list[str],
             local: tuple[str, str], glob: tuple[str, str], written: set[str], fixed: set[str],
             width: int, body: list[ast.stmt]) -> str | None:
    """Rewrite ``stmts[k]`` in place if it is a transposed tile copy from a global array;
    return that array's name."""
    s = stmts[k]
    li, lj = local
    i, j = glob
    if not (isinstance(s, ast.Assign) and len(s.targets) == 1
            and isinstance(s.targets[0], ast.Subscript)
            and isinstance(s.targets[0].value, ast.Name)
            and isinstance(s.targets[0].slice, ast.Tuple)
            and [getattr(e, "id", None) for e in s.targets[0].slice.elts] == [lj, li]
            and isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name)
            and isinstance(s.value.slice, ast.Tuple) and len(s.value.slice.elts) == 2):
        return None
    tile, source = s.targets[0].value.id, s.value.value.id
    if source not in params or source in written or not _square_local(body, tile, width) \
            or not _alone_in_segment(stmts, k, looped, tile):
        return None
    allowed = fixed | {li, lj, i, j}
    for e in s.value.slice.elts:
        for n in ast.walk(e):
            if not isinstance(n, _ARITHMETIC) or isinstance(n, ast.Name) and n.id not in allowed:
                return None
    # the element work-item (lj, li) would store: its indices in terms of this work-item's
    swap = {li: _name(lj), lj: _name(li), i: _shifted(i, li, lj), j: _shifted(j, lj, li)}
    r, c = (_substituted(e, swap) for e in s.value.slice.elts)
    s.targets[0].slice = ast.Tuple(elts=[_name(li), _name(lj)], ctx=ast.Load())
    s.value = ast.Subscript(value=_name(source + SUFFIX), ctx=ast.Load(),
                            slice=ast.Tuple(elts=[c, r], ctx=ast.Load()))
    ast.fix_missing_locations(s)          # (new nodes take the statement's line)
    return source


def _square_local(body: list[ast.stmt], name: str, width: int) -> bool:
    """Whether ``name`` is declared ``tg.localmem(dtype, (width, width))``."""
    for s in body:
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id == name and tg_name(s.value) == "localmem":
            shape = s.value.args[1] if len(s.value.args) > 1 else None
            return isinstance(shape, ast.Tuple) and [getattr(e, "value", None)
                                                     for e in shape.elts] == [width, width]
    return False


def _name(n: str) -> ast.Name:
    return ast.Name(id=n, ctx=ast.Load())


def _shifted(index: str, own: str, other: str) -> ast.expr:
    """``index - own + other``: the global index of the work-item whose local index is
    ``other`` where this one's is ``own``."""
    return ast.BinOp(left=ast.BinOp(left=_name(index), op=ast.Sub(), right=_name(own)),
                     op=ast.Add(), right=_name(other))


def _substituted(e: ast.expr, swap: dict[str, ast.expr]) -> ast.expr:
    class Swap(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            return copy.deepcopy(swap[node.id]) if node.id in swap else node
    return Swap().visit(copy.deepcopy(e))
