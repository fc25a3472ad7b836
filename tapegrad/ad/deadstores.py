"""Dead stores in an adjoint's forward replay.

An adjoint re-runs its work-item's forward body.  A kernel that reads and overwrites an
array (``Y[i] = Y[i] + X[i]``) gets that array as a scratch copy of its old contents, so the
replay can redo the store.  When nothing after the store reads the array again, the replayed
store is dead, and so are the reads that only fed it: dropping it means the adjoint needs
neither the copy nor, here, ``X``'s contents -- and a tape need not keep them.

Only loop-free bodies are treated (a store inside a loop may feed the next iteration).
"""

from __future__ import annotations

import ast
import copy

from tapegrad.frontend.ir import tg_name

_EFFECT_CALLS = ("atomic_", "group_reduce", "synchronize")


def drop_dead_stores(body: list[ast.stmt], scratch: set[str]) -> tuple[list[ast.stmt], set[str]]:
    """``body`` without stores to ``scratch`` arrays that nothing reads afterwards, and the
    scratch arrays that are still stored to."""
    if any(isinstance(n, (ast.For, ast.While)) for s in body for n in ast.walk(s)):
        return body, {a for a in scratch if _stored(body, a)}
    kept, _ = _sweep(copy.deepcopy(body), set(), scratch)
    return kept, {a for a in scratch if _stored(kept, a)}


def _sweep(stmts: list[ast.stmt], read_later: set[str], scratch: set[str]
           ) -> tuple[list[ast.stmt], set[str]]:
    kept: list[ast.stmt] = []
    for s in reversed(stmts):
        if isinstance(s, ast.If):
            s.body, in_body = _sweep(s.body, set(read_later), scratch)
            s.orelse, in_else = _sweep(s.orelse, set(read_later), scratch)
            s.body = s.body or [ast.Pass()]
            read_later = in_body | in_else | _arrays_read(s.test)
        elif _dead(s, read_later, scratch):
            continue
        else:
            read_later = read_later | _arrays_read(s)
        kept.append(s)
    return kept[::-1], read_later


def _dead(s: ast.stmt, read_later: set[str], scratch: set[str]) -> bool:
    if not (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Subscript)):
        return False
    array = s.targets[0].value
    return (isinstance(array, ast.Name) and array.id in scratch and array.id not in read_later
            and not _has_effects(s.value))


def _has_effects(e: ast.expr) -> bool:
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            called = tg_name(n)
            if called is None or called.startswith(_EFFECT_CALLS):
                return True
    return False


def _arrays_read(node: ast.AST) -> set[str]:
    """Arrays whose elements ``node`` may read (an augmented store reads its target; any
    other use of an array's name, e.g. as an argument, counts as a read)."""
    read = set()
    stored = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and not isinstance(node, ast.AugAssign):
            stored.add(id(n.value))
        if isinstance(n, ast.Attribute) and n.attr in ("shape", "size", "ndim", "dtype"):
            stored.add(id(n.value))          # metadata, not contents
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and id(n) not in stored:
            read.add(n.id)
    return read


def _stored(body: list[ast.stmt], array: str) -> bool:
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
               and isinstance(n.value, ast.Name) and n.value.id == array
               for s in body for n in ast.walk(s))
