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
the only store to that memory; the memory is used nowhere outside the loop, and in the body
not before the store; for local memory, every read follows a barrier after the store (so the
previous reverse iteration's last read is behind a barrier too).
"""

from __future__ import annotations

import ast

from tapegrad.frontend.ir import tg_name


def recomputable_stores(loop: ast.For, body: list[ast.stmt], memory_kind: dict[str, str],
                        written: set[str], arrays: set[str]) -> list[ast.Assign]:
    """The stores in ``loop``'s body that the reverse sweep can redo instead of restoring.

    ``body`` is the whole kernel body, ``memory_kind`` maps local and private arrays to
    ``"localmem"``/``"private"``, ``written`` are the arrays the kernel stores into (or updates
    atomically) and ``arrays`` its array parameters.
    """
    counts: dict[str, int] = {}
    for n in _walk(body):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            counts[n.id] = counts.get(n.id, 0) + 1
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
        if any(memory in _names(st) for st in loop.body[:k]):
            continue                                   # used before the store
        if memory_kind[memory] == "localmem" and not _reads_follow_barrier(loop.body[k + 1:],
                                                                           memory):
            continue
        if _depends_only_on_fixed_values(s, counter, counts, in_loop, written, arrays,
                                         memory_kind):
            found.append(s)
    return found


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


def _walk(body: list[ast.stmt]):
    return ast.walk(ast.Module(body=body, type_ignores=[]))
