"""Barriers the CPU does not need: phases that pass data only through work-items' own elements.

On the CPU one thread runs a whole workgroup, each segment between two barriers as one loop
over the group's work-items (lower.py), so a barrier orders every statement before it, for
all work-items, before every statement after it.  Two segments ``P; tg.synchronize(); N``
can run as one loop, each work-item running ``P`` and then ``N``, when no work-item's ``N``
touches what another work-item's ``P`` touches (and one of them writes).  That holds when
every memory element both segments use, with a write on one side, is an element the
work-item owns:

    tile_a_bar[li, lj] = tile_a_bar[li, lj] + s      # P: this work-item's element
    tg.synchronize()
    A_bar[i, t * 16 + lj] += tile_a_bar[li, lj]      # N: the same element
    tile_a_bar[li, lj] = 0.0

The adjoint of a tiled product has this shape (the gathered tile shadows of
``tapegrad.ad.localgather`` are each written by their own work-item): merged, the shadow
tile's element stays in a register between its update and its flush, and one loop over the
group's work-items goes (measured: CHANGELOG.md, 'the figures that moved').

A GPU keeps these barriers: there the end of a loop's body is no barrier, and the merged
segment would race with the next iteration's first one.  On the CPU it is, which is also why
a statement list keeps at least one of its barriers (a loop without any would become one
work-item's loop, its iterations no longer in step across the group).

An element is owned when it is indexed by exactly the work-item's local or global index names
(``X[li, lj]`` after ``li, lj = tg.local_indices()``, or ``X[i]`` after
``i = tg.global_index()``), the same ones wherever the segments use that array.  Atomic
additions (``atomic_add`` / ``atomic_sub`` statements) to an array the other segment does
not read commute with everything else there.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from tapegrad.backends.structure import contains_barrier, is_barrier, memory_decl
from tapegrad.frontend.ir import tg_name

_INDEX_CALLS = ("local_indices", "local_index", "global_indices", "global_index")
_ADDITIONS = ("atomic_add", "atomic_sub")


def merged_phases(body: list[ast.stmt], arrays: set[str], aliases: set[str]
                  ) -> list[ast.stmt]:
    """``body`` without the barriers that order nothing on the CPU (see the module
    docstring).  ``arrays``: the names of the kernel's memory (array arguments, local
    memory); ``aliases``: other names that may refer to an array (a segment using one keeps
    its barriers; a safety net: the type checker refuses second names for arrays and arrays
    inside tuples).  Statements are shared with ``body``, not copied (typing is keyed on
    them); a loop or branch whose body changes is a shallow copy."""
    owned = _owned_indices(body)
    if not owned:
        return body
    rules = _Rules(arrays, aliases, owned)
    return _merged(body, rules)


@dataclass
class _Rules:
    arrays: set[str]
    aliases: set[str]
    owned: set[tuple[str, ...]]    # the index displays that name a work-item's own element


def _owned_indices(body: list[ast.stmt]) -> set[tuple[str, ...]]:
    """Index names bound once, at the top level, to the work-item's indices: ``(li, lj)``
    for ``li, lj = tg.local_indices()``, ``(i,)`` for ``i = tg.global_index()``."""
    stores: dict[str, int] = {}
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
    out = set()
    for s in body:
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1
                and tg_name(s.value) in _INDEX_CALLS):
            continue
        target = s.targets[0]
        elts = target.elts if isinstance(target, ast.Tuple) else [target]
        names = tuple(getattr(e, "id", None) for e in elts)
        if None not in names and all(stores.get(n) == 1 for n in names):
            out.add(names)
    return out


def _merged(stmts: list[ast.stmt], rules: _Rules) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    changed = False
    for s in stmts:
        if isinstance(s, (ast.For, ast.While, ast.If)) and contains_barrier(s):
            inner = copy.copy(s)
            inner.body = _merged(s.body, rules)
            inner.orelse = _merged(s.orelse, rules) if s.orelse else s.orelse
            if inner.body is not s.body or inner.orelse is not s.orelse:
                s, changed = inner, True
        out.append(s)
    k = 0
    while k < len(out):
        if is_barrier(out[k]) and _removable(out, k, rules):
            del out[k]
            changed = True
        else:
            k += 1
    return out if changed else stmts


def _removable(stmts: list[ast.stmt], k: int, rules: _Rules) -> bool:
    """Whether the barrier ``stmts[k]`` may go: another barrier stays in the list, and the
    segments on either side share only owned elements."""
    if sum(contains_barrier(s) for s in stmts) < 2:
        return False
    start = k
    while start > 0 and not contains_barrier(stmts[start - 1]):
        start -= 1
    end = k + 1
    while end < len(stmts) and not contains_barrier(stmts[end]):
        end += 1
    before, after = stmts[start:k], stmts[k + 1:end]
    if not before or not after:
        return True        # an empty segment: the barrier next to this one orders the rest
    uses_before, uses_after = _uses(before, rules), _uses(after, rules)
    if uses_before is None or uses_after is None:
        return False
    for name in set(uses_before) & set(uses_after):
        both = uses_before[name] + uses_after[name]
        if not any(u.writes for u in both):
            continue                   # read on both sides: nothing to order
        if all(u.kind == "add" for u in both):
            continue                   # additions commute
        keys = {u.key for u in both}
        if len(keys) != 1 or None in keys:
            return False               # another work-item's element, or the whole array
    return True


@dataclass(frozen=True)
class _Use:
    kind: str                          # "read", "write" (or read and write), "add", "whole"
    key: tuple[str, ...] | None        # the owned index display, or None

    @property
    def writes(self) -> bool:
        return self.kind != "read"


def _uses(stmts: list[ast.stmt], rules: _Rules) -> dict[str, list[_Use]] | None:
    """Each array the statements use, with how; None when they use something this pass does
    not follow (an alias, a return or a loop exit that would skip the other segment)."""
    uses: dict[str, list[_Use]] = {}
    seen: set[int] = set()          # nodes already judged as part of a larger use
    tree = ast.Module(body=stmts, type_ignores=[])
    for node in ast.walk(tree):
        if isinstance(node, (ast.Return, ast.Break, ast.Continue)):
            return None
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Subscript):
            seen.add(id(node.target))      # read and written: a write
            _add(uses, node.target, "write", rules)
        elif isinstance(node, ast.Expr) and tg_name(node.value) in _ADDITIONS \
                and isinstance(node.value.args[0], ast.Name):
            seen.add(id(node.value.args[0]))
            uses.setdefault(node.value.args[0].id, []).append(_Use("add", None))
        elif isinstance(node, ast.Assign) and memory_decl(node):
            seen.add(id(node.targets[0]))  # tile = tg.localmem(...): no contents yet
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            seen.add(id(node.value))       # X.shape, X.size: not the contents
        elif isinstance(node, ast.Subscript) and id(node) not in seen:
            if isinstance(node.value, ast.Attribute) or tg_name(node.value):
                continue                   # X.shape[0], tg.groupsize()[0]: a tuple's element
            if not isinstance(node.value, ast.Name) or node.value.id in rules.aliases:
                return None                # X[i][j], V[i]: an element of some view
            seen.add(id(node.value))
            _add(uses, node, "write" if isinstance(node.ctx, ast.Store) else "read", rules)
        elif isinstance(node, ast.Name) and id(node) not in seen:
            if node.id in rules.aliases:
                return None
            if node.id in rules.arrays:     # passed whole (a call, an atomic's old value)
                uses.setdefault(node.id, []).append(_Use("whole", None))
    return uses


def _add(uses: dict[str, list[_Use]], node: ast.Subscript, kind: str, rules: _Rules) -> None:
    name = node.value.id
    if name not in rules.arrays:
        return                        # a tuple's element (shapes, index tuples)
    index = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    key = tuple(getattr(e, "id", None) for e in index)
    uses.setdefault(name, []).append(_Use(kind, key if key in rules.owned else None))
