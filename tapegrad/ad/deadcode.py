"""Dead code in generated kernels: a backward liveness sweep.

An adjoint re-runs its work-item's forward body, but the reverse sweep often needs only part
of it: in a tiled matrix product the forward ``acc += a[k] * b[k]`` is never read again
(``C[i, j] = acc`` has an adjoint that needs ``C_bar`` only), and in ``Y[i] = Y[i] + X[i]``
the replayed store to the scratch copy of ``Y`` is read by nothing, so neither ``Y``'s old
contents nor ``X``'s are needed (and a tape need not keep them).  This pass removes

- assignments to locals that nothing reads afterwards (their values computed without
  effects),
- stores to the ``scratch`` arrays (the adjoint's private copies) that nothing reads
  afterwards, and to local or private arrays that nothing reads at all (a stack slot whose
  pop was itself dead),
- branches and loops left empty, when nothing reads their loop variable afterwards.

Loops are handled by iterating their liveness to a fixed point; ``break``, ``continue`` and
``return`` are covered because everything live after a loop stays live inside it.
"""

from __future__ import annotations

import ast
import copy

from tapegrad.frontend.ir import tg_name

_EFFECTS = ("atomic_", "group_reduce", "synchronize", "localmem", "private")
METADATA = ("shape", "size", "ndim", "dtype")    # attributes that are not an array's contents


def eliminate_dead_code(body: list[ast.stmt], live_out: set[str], scratch: set[str] = frozenset()
                        ) -> tuple[list[ast.stmt], set[str]]:
    """``body`` (copied) without dead code, given the names ``live_out`` read after it, and
    which of the ``scratch`` arrays are still stored to."""
    kept = copy.deepcopy(body)
    unread: set[str] = set()
    while True:   # dropping the last read of a memory makes its stores dead: sweep again
        kept, _ = _sweep(kept, set(live_out), set(scratch) | unread)
        now = _never_read_memory(kept)
        if now <= unread:
            return kept, {a for a in scratch if _stored(kept, a)}
        unread |= now


def _never_read_memory(body: list[ast.stmt]) -> set[str]:
    """Local and private arrays declared in ``body`` that nothing reads (only stored to)."""
    declared = {s.targets[0].id for s in ast.walk(ast.Module(body=body, type_ignores=[]))
                if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name)
                and tg_name(s.value) in ("private", "localmem")}
    stored_into = {id(t.value) for s in ast.walk(ast.Module(body=body, type_ignores=[]))
                   if isinstance(s, ast.Assign) for t in s.targets
                   if isinstance(t, ast.Subscript)}
    read = {n.id for n in ast.walk(ast.Module(body=body, type_ignores=[]))
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and id(n) not in stored_into}
    return declared - read


def _sweep(stmts: list[ast.stmt], live: set[str], scratch: set[str]
           ) -> tuple[list[ast.stmt], set[str]]:
    kept: list[ast.stmt] = []
    for s in reversed(stmts):
        s, live = _statement(s, live, scratch)
        if s is not None:
            kept.append(s)
    return kept[::-1], live


def _statement(s: ast.stmt, live: set[str], scratch: set[str]) -> tuple[ast.stmt | None, set[str]]:
    if isinstance(s, ast.Assign):
        target = s.targets[0]
        if isinstance(target, (ast.Name, ast.Tuple)):
            names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            if not names & live and pure(s.value):
                return None, live
            return s, (live - names) | names_read(s.value)
        if isinstance(target, ast.Subscript):
            array = target.value.id if isinstance(target.value, ast.Name) else None
            if array in scratch and array not in live and pure(s.value):
                return None, live
            return s, live | names_read(s.value) | names_read(target.slice)
    if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
        if s.target.id not in live and pure(s.value):
            return None, live
        return s, live | {s.target.id} | names_read(s.value)
    if isinstance(s, ast.If):
        s.body, in_body = _sweep(s.body, set(live), scratch)
        s.orelse, in_else = _sweep(s.orelse, set(live), scratch)
        if not s.body and not s.orelse and pure(s.test):
            return None, live
        s.body = s.body or [ast.Pass()]
        return s, in_body | in_else | names_read(s.test)
    if isinstance(s, (ast.For, ast.While)):
        header = s.iter if isinstance(s, ast.For) else s.test
        targets = {n.id for n in ast.walk(s.target) if isinstance(n, ast.Name)} \
            if isinstance(s, ast.For) else set()
        original = s.body
        inside = set(live) | names_read(header)
        while True:          # what one iteration reads flows back to the one before
            body, entry = _sweep(copy.deepcopy(original), set(inside), scratch)
            grown = inside | entry
            if grown == inside:
                break
            inside = grown
        s.body = body
        if not body and not targets & live and pure(header) and not s.orelse:
            return None, live
        s.body = body or [ast.Pass()]
        return s, inside | names_read(header)
    if isinstance(s, ast.Pass):
        return None, live
    # stores and updates of arrays, calls, returns, ...: kept, with everything they read
    return s, live | names_read(s)


def pure(e: ast.AST) -> bool:
    """No effects: calls only to intrinsics that compute a value."""
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            if isinstance(n.func, ast.Name) and n.func.id == "range":
                continue
            called = tg_name(n)
            if called is None or called.startswith(_EFFECTS):
                return False
    return True


def names_read(node: ast.AST) -> set[str]:
    """Names ``node`` reads: locals, and arrays whose elements (or any use) it reads; an
    array's shape is not its contents."""
    metadata = {id(n.value) for n in ast.walk(node)
                if isinstance(n, ast.Attribute) and n.attr in METADATA}
    stored = {id(n.value) for n in ast.walk(node)
              if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
              and not isinstance(node, ast.AugAssign)}
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load) and id(n) not in metadata | stored}


def has_effects(body: list[ast.stmt]) -> bool:
    """Whether ``body`` stores into any array or calls anything but pure intrinsics (the rest
    of an adjoint whose updates all went to gathers, and whose output shadows need no
    zeroing, has none: it need not run)."""
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
               for s in body for n in ast.walk(s)) or not all(pure(s) for s in body)


def _stored(body: list[ast.stmt], array: str) -> bool:
    return any(isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
               and isinstance(n.value, ast.Name) and n.value.id == array
               for s in body for n in ast.walk(s))
