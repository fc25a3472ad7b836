"""Tidy an adjoint after a transform: dead code, loops that only count, doubled barriers, and
the per-work-item stack when nothing is pushed on it any more."""

from __future__ import annotations

import ast

from tapegrad.ad.adjoint import Adjoint
from tapegrad.ad.astutil import add as _add
from tapegrad.ad.astutil import assign as _assign
from tapegrad.ad.astutil import clone as _clone
from tapegrad.ad.astutil import const as _c
from tapegrad.ad.astutil import name as _n
from tapegrad.ad.astutil import neg as _neg
from tapegrad.ad.astutil import walk as _walk
from tapegrad.ad.deadcode import eliminate_dead_code
from tapegrad.frontend.ir import tg_call, tg_name

_STACK_NAMES = ("_fstack", "_istack", "_fsp", "_isp", "_stack_depth")


def tidy(adjoint: Adjoint) -> Adjoint:
    """Remove dead code (``tapegrad.ad.deadcode``), and the per-work-item stack when nothing
    is pushed on it any more (its overflow check and ``_status`` with it).  Run after each
    pass that can leave code dead (the reverse transform, the local-memory gathers)."""
    body, still = eliminate_dead_code(adjoint.ir.body, set(), set(adjoint.scratch))
    if _drop_unread_loads(body):
        body, still = eliminate_dead_code(body, set(), set(adjoint.scratch))
    body = _single_barriers(_count_idle_loops(body, body))
    adjoint.scratch = [a for a in adjoint.scratch if a in still]
    uses_stack = any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                     and n.value.id in ("_fstack", "_istack")
                     for n in ast.walk(ast.Module(body=body, type_ignores=[])))
    if adjoint.uses_status and not uses_stack:
        body = _without_stack(body)
        adjoint.uses_status, adjoint.stack_depth = False, 0
        adjoint.ir.params = [p for p in adjoint.ir.params if p != "_status"]
    adjoint.ir.body = body
    return adjoint


def _drop_unread_loads(body: list[ast.stmt]) -> bool:
    """In the forward sweep's loops, drop the stores the reverse sweep redoes when nothing in
    the forward sweep reads them (a tiled product's tiles, once its ``acc`` loop is dead)."""
    changed = False
    for loop in ast.walk(ast.Module(body=body, type_ignores=[])):
        for memory in getattr(loop, "_tg_recomputed", ()):
            stores = [s for s in loop.body if isinstance(s, ast.Assign)
                      and isinstance(s.targets[0], ast.Subscript)
                      and isinstance(s.targets[0].value, ast.Name)
                      and s.targets[0].value.id == memory]
            targets = {id(s.targets[0].value) for s in stores}
            if any(isinstance(n, ast.Name) and n.id == memory and id(n) not in targets
                   for n in ast.walk(loop)):
                continue
            loop.body = [s for s in loop.body if s not in stores] or [ast.Pass()]
            changed = True
    return changed


def _count_idle_loops(stmts: list[ast.stmt], whole: list[ast.stmt]) -> list[ast.stmt]:
    """A forward-sweep loop left with nothing but its trip count and barriers (its loads are
    redone in reverse) becomes ``count = max(0, -((start - stop) // step))`` and one barrier:
    the barriers separated nothing inside it, and each work-item need not run it."""
    out = []
    for s in stmts:
        count = _idle_counting_loop(s, whole)
        if count is not None:
            start, stop, step = s.iter.args
            trips = tg_call("max", [_c(0), _neg(ast.BinOp(
                left=ast.BinOp(left=_clone(start), op=ast.Sub(), right=_clone(stop)),
                op=ast.FloorDiv(), right=_clone(step)))])
            out.append(ast.copy_location(_assign(count, _add(_n(count), trips)), s))
            if any(is_barrier(b) for b in _walk(s.body)):
                # a loop holding barriers runs alike in every work-item of the group (it is
                # group-level control flow): one barrier after it keeps what they separated
                out.append(ast.copy_location(ast.Expr(value=tg_call("synchronize", [])), s))
            continue
        for attr in ("body", "orelse"):
            if isinstance(s, (ast.If, ast.For, ast.While)) and getattr(s, attr):
                setattr(s, attr, _count_idle_loops(getattr(s, attr), whole))
        out.append(s)
    return out


def _idle_counting_loop(s: ast.stmt, whole: list[ast.stmt]) -> str | None:
    """The trip counter of a forward-sweep loop ``for t in range(start, stop, step):`` whose
    body is only ``count = count + 1`` and barriers, when nothing reads ``t`` before assigning
    it again (the reverse loop sets ``t`` first); else None."""
    if not (isinstance(s, ast.For) and hasattr(s, "_tg_recomputed") and not s.orelse
            and isinstance(s.target, ast.Name) and len(s.iter.args) == 3):
        return None
    work = [b for b in s.body if not is_barrier(b)]
    if len(work) != 1 or not (isinstance(work[0], ast.Assign)
                              and isinstance(work[0].targets[0], ast.Name)):
        return None
    count = work[0].targets[0].id
    if ast.dump(work[0].value) != ast.dump(_add(_n(count), _c(1))):
        return None
    t = s.target.id
    # reads of t are fine only in the body of a loop that sets t first (the reverse loop)
    covered = set()
    for loop in _walk(whole):
        if isinstance(loop, (ast.For, ast.While)) and loop is not s and loop.body \
                and isinstance(loop.body[0], ast.Assign) \
                and isinstance(loop.body[0].targets[0], ast.Name) \
                and loop.body[0].targets[0].id == t:
            covered |= {id(m) for b in loop.body for m in ast.walk(b)}
    inside = {id(m) for m in ast.walk(s)}
    for m in _walk(whole):
        if isinstance(m, ast.Name) and m.id == t and isinstance(m.ctx, ast.Load) \
                and id(m) not in inside and id(m) not in covered:
            return None
    return count


def _single_barriers(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """Consecutive barriers are one barrier (what moved code leaves between them is gone)."""
    out: list[ast.stmt] = []
    for s in stmts:
        if is_barrier(s) and out and is_barrier(out[-1]):
            continue
        for attr in ("body", "orelse"):
            if isinstance(s, (ast.If, ast.For, ast.While)) and getattr(s, attr):
                setattr(s, attr, _single_barriers(getattr(s, attr)))
        out.append(s)
    return out



def _without_stack(stmts: list[ast.stmt]) -> list[ast.stmt]:
    """``stmts`` without the stack's declarations, pointer updates and overflow check."""
    out = []
    for s in stmts:
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) \
                and s.targets[0].id in _STACK_NAMES:
            continue
        if isinstance(s, ast.If) and any(isinstance(n, ast.Name) and n.id == "_status"
                                         for n in ast.walk(s)):
            continue                                   # the overflow check
        for attr in ("body", "orelse"):
            if isinstance(s, (ast.If, ast.For, ast.While)):
                setattr(s, attr, _without_stack(getattr(s, attr)))
                if attr == "body" and not s.body:
                    s.body = [ast.Pass()]
        out.append(s)
    return out


def is_barrier(s: ast.stmt) -> bool:
    return isinstance(s, ast.Expr) and tg_name(s.value) == "synchronize"
