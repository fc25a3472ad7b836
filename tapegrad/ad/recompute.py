"""Which stores the reverse sweep recomputes instead of saving and restoring.

A tiled kernel loads a tile of its inputs into local memory on every iteration::

    for t in range(A.shape[1] // TILE):
        tile_a[li, lj] = A[i, t * TILE + lj]
        tg.synchronize()
        ...reads of tile_a...
        tg.synchronize()

The reverse sweep needs, in reverse iteration ``t``, the tile as iteration ``t`` loaded it.
The general rule saves each overwritten element on the per-work-item stack and restores it;
but this value can simply be loaded again: it depends only on the loop counter, on values fixed
for the whole work-item, and on arrays the kernel never writes.  So the reverse body of each
iteration starts by redoing the store (then a barrier), and the stack is not used for it
(Tapenade calls this recomputation instead of storage).

The conditions, all checked here, make the recomputed value the one the forward sweep stored
and make redoing it safe: the store is a top-level statement of an outermost loop's body and
the only store to that memory; each iteration rewrites the whole memory (local memory the
shape of the workgroup, stored at the work-item's own local index; or private memory of one
element), so no later read can see an element from an earlier iteration; the memory is used
nowhere outside the loop, and in the body not before the store; for local memory, every read
follows a barrier after the store (so the previous reverse iteration's last read is behind a
barrier too).
"""

from __future__ import annotations

import ast

from tapegrad.ad.astutil import walk as _walk
from tapegrad.frontend.ir import tg_name


def recomputable_stores(loop: ast.For, body: list[ast.stmt], memory_kind: dict[str, str],
                        written: set[str], arrays: set[str], shapes: dict[str, tuple],
                        groupsize: tuple[int, ...]) -> list[ast.Assign]:
    """The stores in ``loop``'s body that the reverse sweep can redo instead of restoring.

    ``body`` is the whole kernel body, ``memory_kind`` maps local and private arrays to
    ``"localmem"``/``"private"`` and ``shapes`` to their static shapes, ``written`` are the
    arrays the kernel stores into (or updates atomically) and ``arrays`` its array parameters.
    """
    counts: dict[str, int] = {}
    for n in _walk(body):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            counts[n.id] = counts.get(n.id, 0) + 1
    written = set(written)
    for n in _walk(body):       # a device function kept as a call may write its arguments
        if isinstance(n, ast.Call) and tg_name(n) is None and not (
                isinstance(n.func, ast.Name) and n.func.id == "range"):
            written |= {a.id for a in n.args if isinstance(a, ast.Name)}
    own_local = _own_local_indices(body, counts)
    in_loop = {n.id for n in _walk(loop.body)
               if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    counter = loop.target.id if isinstance(loop.target, ast.Name) else None
    inside = {id(n) for n in _walk([loop])}
    found = []
    for k, s in enumerate(loop.body):
        if not (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Subscript)
                and isinstance(s.targets[0].value, ast.Name)):
            continue
        memory = s.targets[0].value.id
        if memory not in memory_kind:
            continue
        uses = [n for n in _walk(body) if isinstance(n, ast.Name) and n.id == memory
                and isinstance(n.ctx, ast.Load)]          # (its declaration is a Store)
        stores = [n for n in _walk(loop.body) if isinstance(n, ast.Subscript)
                  and isinstance(n.ctx, ast.Store) and _names(n.value) == {memory}]
        if len(stores) != 1 or any(id(u) not in inside for u in uses):
            continue
        if not _rewrites_all(s, memory_kind[memory], shapes.get(memory), groupsize, own_local):
            continue                                   # older elements could still be read
        if any(memory in _names(st) for st in loop.body[:k]):
            continue                                   # used before the store
        if memory_kind[memory] == "localmem" and not _reads_follow_barrier(loop.body[k + 1:],
                                                                           memory):
            continue
        if _depends_only_on_fixed_values(s, counter, counts, in_loop, written, arrays,
                                         memory_kind):
            found.append(s)
    return found


def _rewrites_all(s: ast.Assign, kind: str, shape: tuple | None, groupsize: tuple[int, ...],
                  own_local: set[str]) -> bool:
    """The store rewrites every element each iteration: private memory of one element, or
    local memory the workgroup's shape stored at the work-item's own local index."""
    if shape is None:
        return False
    if kind == "private":
        return all(d == 1 for d in shape)
    return tuple(shape) == tuple(groupsize) and ast.dump(s.targets[0].slice) in own_local


def _own_local_indices(body: list[ast.stmt], counts: dict[str, int]) -> set[str]:
    """``ast.dump`` of the expressions that are this work-item's own local index."""
    own = {ast.dump(ast.parse("tg.local_index()", mode="eval").body)}
    for s in body:
        if not (isinstance(s, ast.Assign) and tg_name(s.value) in ("local_index",
                                                                     "local_indices")):
            continue
        t = s.targets[0]
        names = [t] if isinstance(t, ast.Name) else list(getattr(t, "elts", []))
        if not all(isinstance(e, ast.Name) and counts.get(e.id) == 1 for e in names):
            continue
        if isinstance(t, ast.Name):
            own.add(ast.dump(ast.Name(id=t.id, ctx=ast.Load())))
        else:
            own.add(ast.dump(ast.Tuple(elts=[ast.Name(id=e.id, ctx=ast.Load()) for e in names],
                                       ctx=ast.Load())))
    return own


def _depends_only_on_fixed_values(s: ast.Assign, counter: str | None, counts: dict[str, int],
                                  in_loop: set[str], written: set[str], arrays: set[str],
                                  memory_kind: dict[str, str]) -> bool:
    for part in (s.targets[0].slice, s.value):
        for n in ast.walk(part):
            if isinstance(n, ast.Call) and tg_name(n) is None:
                return False                           # a device function kept as a call
            if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_"):
                return False
            if not isinstance(n, ast.Name) or isinstance(n.ctx, ast.Store):
                continue
            if n.id in arrays or n.id in memory_kind:
                if n.id in written or n.id in memory_kind:
                    return False                       # its contents change
            elif n.id != counter and (n.id in in_loop or counts.get(n.id, 0) > 1):
                return False                           # a local that changes
    return True


def _reads_follow_barrier(after: list[ast.stmt], memory: str) -> bool:
    """Every use of ``memory`` in ``after`` comes after a top-level barrier."""
    for s in after:
        if isinstance(s, ast.Expr) and tg_name(s.value) == "synchronize":
            return True
        if memory in _names(s):
            return False
    return True


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}

