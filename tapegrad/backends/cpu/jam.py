"""Rows of a full workgroup jammed: several work-items' bodies interleaved in one loop.

The CPU runs a workgroup as a loop nest whose innermost loop, along one row of the group, LLVM
vectorises.  A work-item whose body carries a value through a loop of known length (a tiled
product's ``acc += tile_a[li, k] * tile_b[k, lj]``) then makes one chain of dependent
additions per row: one vector of the row waits on the latency of each addition in turn, and
a float32 row of 16 work-items is one AVX-512 vector.  With the rows jammed, ``JAM`` rows'
work-items run in one iteration, their chains independent, each ``tile_b[k, lj]`` loaded
once for them: a float32 tiled product's primal took 2.3 ms instead of 3.3 (512², 2-core
AVX-512 EPYC).  LLVM vectorises the jammed loop only with constant bounds (with the group's
``_lim1`` it gained nothing), so it runs full groups (``_lim... ==`` the group size) and
the loop as written runs the others.  float64 rows, two vectors each, ran slower jammed by
four: float32 kernels only (``passes.py``).

A body that adds into per-thread copies (a tiled product's adjoint, whose shadow tiles are
flushed into ``A_bar__priv`` in the loop that computes them) is not jammed, but its full
groups get the loop with constant bounds (``constant_bounds``): the same statements in the
same order, so the same bits; LLVM then vectorises the row at full width.  The float32 tiled
matmul's adjoint (512², 2-core EPYC, alternating old/new processes) took 10.7-13.0 ms
instead of 16.6-22.7 on one thread; float64's did not gain (not copied: ``passes.py``).

A tile that the group copies from an input (``tile_a[li, lj] = A[i, t * TILE + lj]``) lives
on the task's stack (``scratch.py``: small, and nothing adds into it), and the copy's full
groups get constant extents (``tile_copies``, where the copy is straight-line assignments):
LLVM then knows that the tile aliases none of the kernel's arrays, and each row's copy is
one vector load and store, where the heap tile left a scalar loop (and a stack tile with the
group's ``_lim1``, a call to memcpy per row).
The float32 tiled matmul (512², 2-core EPYC, alternating processes, best of 25): primal 2.48
-> 2.15 ms, gradient 6.52 -> 5.46 ms; the same bits.

Only bodies that cannot tell the order of work-items apart are jammed: assignments to names
and loops of a constant number of trips over them, reads of any memory, and stores only into
the work-item's own slots (``x__items[_li]``); every name the body assigns is the work-item's
own (assigned before it is read).  Each work-item computes exactly what it computed before,
in the same order: the results are the same bits.
"""

from __future__ import annotations

import ast
import copy

JAM = 4                       # rows per jammed iteration
_PURE_MODULES = {"np", "vmath", "math", "fused"}
_PURE_NAMES = {"min", "max", "abs", "int", "float"}


def full_groups(block: list[str], rank: int, groupsize: tuple[int, ...],
                into_thread_copies: bool, stacked: set[str]) -> list[str] | None:
    """``block`` (a 2-D work-item loop nest, as for ``jam_rows``) with a version for full
    groups: its rows jammed, or where it adds into per-thread copies (``into_thread_copies``)
    its loops with constant bounds, or where it copies into tiles on the stack (``stacked``)
    its copy with constant extents; None where none applies."""
    lines = jam_rows(block, rank, groupsize)
    if lines is None and into_thread_copies:
        lines = constant_bounds(block, rank, groupsize)
    if lines is None:
        lines = tile_copies(block, rank, groupsize, stacked)
    return lines


def jam_rows(block: list[str], rank: int, groupsize: tuple[int, ...]) -> list[str] | None:
    """``block``: the lines of a 2-D work-item loop nest (``for _l0 in range(_lim0):`` ...,
    without indentation of its own); the same nest with a jammed version for full groups,
    or None where the body does not qualify."""
    body = _item_body(block, rank)
    if body is None or groupsize[0] % JAM or groupsize[1] < 8:
        return None
    owned = _owned_names(body)
    if owned is None or not any(isinstance(s, ast.For) for s in body):
        return None
    owned.add("_l0")
    copies = []
    for c in range(JAM):
        start = ast.parse(f"_l0 = _lq + {c}").body[0]
        copies.append([_renamed(s, owned, c) for s in [start, *body]])
    rows, columns = groupsize
    full = [f"# a full group: {JAM} rows' work-items at a time, their chains independent "
            "(jam.py)",
            f"for _lq in range(0, {rows}, {JAM}):",
            f"    for _l1 in range({columns}):"]
    for s in _interleaved(copies):
        full.extend("        " + line for line in ast.unparse(s).splitlines())
    # (after the loop as written the names hold the last work-item's values, code after it
    # may read them: the last copy's are the same work-item's)
    full.extend(f"{name} = {name}__j{JAM - 1}" for name in sorted(owned))
    return _full_groups_apart(full, block, groupsize)


def constant_bounds(block: list[str], rank: int, groupsize: tuple[int, ...]) -> list[str] | None:
    """``block`` (as for ``jam_rows``) with a copy for full groups whose work-item loops have
    the group's constant extents, or None where its body has no loop of constant length (the
    work whose row LLVM then vectorises)."""
    body = _item_body(block, rank)
    if body is None or not any(isinstance(s, ast.For) and _constant_range(s.iter)
                               for st in body for s in ast.walk(st)):
        return None
    return _constant_extents(block, groupsize, "the loops' bounds constant, so LLVM "
                                               "vectorises each row at full width")


def tile_copies(block: list[str], rank: int, groupsize: tuple[int, ...],
                stacked: set[str]) -> list[str] | None:
    """``block`` (as for ``jam_rows``) with a copy for full groups with constant extents
    where its body is straight-line assignments of values it reads, storing into a tile on
    the task's stack (``stacked``, scratch.py) among others, or None: each row's copy is
    then a vector load and store, where the group's ``_lim1`` left a scalar loop or a call
    to memcpy per row (LLVM knows that a tile on the stack aliases none of the kernel's
    arrays)."""
    body = _item_body(block, rank)
    if body is None or not all(isinstance(s, ast.Assign) and _pure(s.value) for s in body):
        return None
    if not any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
               and t.value.id in stacked for s in body for t in s.targets):
        return None
    return _constant_extents(block, groupsize, "each row of a tile one vector")


def _constant_extents(block: list[str], groupsize: tuple[int, ...], why: str) -> list[str]:
    rows, columns = groupsize
    headers = {"for _l0 in range(_lim0):": f"for _l0 in range({rows}):",
               "    for _l1 in range(_lim1):": f"    for _l1 in range({columns}):"}
    full = [f"# a full group with constant extents: {why} (jam.py)"]
    full.extend(headers.pop(line, line) for line in block)   # (each header once: the nest's)
    return _full_groups_apart(full, block, groupsize)


def _full_groups_apart(full: list[str], block: list[str], groupsize: tuple[int, ...]
                       ) -> list[str]:
    """``full`` for the groups the ndrange does not cut, ``block`` as written for the others."""
    rows, columns = groupsize
    return [f"if _lim0 == {rows} and _lim1 == {columns}:", *("    " + line for line in full),
            "else:", *("    " + line for line in block)]


def _item_body(block: list[str], rank: int) -> list[ast.stmt] | None:
    """The body of ``block``'s 2-D work-item loop nest, or None where it is not one."""
    if rank != 2:
        return None
    try:
        node = ast.parse("\n".join(block)).body
    except SyntaxError:
        return None
    for d in range(rank):
        if len(node) != 1 or not _is_item_loop(node[0], d):
            return None
        node = node[0].body
    return node


def _is_item_loop(s: ast.stmt, d: int) -> bool:
    return (isinstance(s, ast.For) and isinstance(s.target, ast.Name)
            and s.target.id == f"_l{d}" and not s.orelse
            and ast.unparse(s.iter) == f"range(_lim{d})")


def _owned_names(body: list[ast.stmt]) -> set[str] | None:
    """The names ``body`` assigns, each the work-item's own (stored before it is read); None
    where the body is not one to jam."""
    counters: set[str] = set()

    def qualifies(stmts: list[ast.stmt]) -> bool:
        for s in stmts:
            if isinstance(s, ast.For):
                if not (isinstance(s.target, ast.Name) and not s.orelse
                        and _constant_range(s.iter)) or not qualifies(s.body):
                    return False
                counters.add(s.target.id)
            elif isinstance(s, (ast.Assign, ast.AugAssign)):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                if not _pure(s.value) or not all(_target_ok(t) for t in targets):
                    return False
            else:
                return False
        return True

    if not qualifies(body):
        return None
    owned: set[str] = set()
    for s in body:
        for n in _in_order(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                owned.add(n.id)
    owned -= counters
    seen: set[str] = set()
    for s in body:              # (a name read before the body stores it would carry a value
        for n in _in_order(s):  # from the work-item before)
            if isinstance(n, ast.Name):
                if isinstance(n.ctx, ast.Store):
                    seen.add(n.id)
                elif n.id in owned and n.id not in seen:
                    return None
    return owned


def _in_order(s: ast.stmt):
    """The names of ``s`` in execution order: an assignment's value before its targets, a
    loop's body after its header (its counter a store)."""
    if isinstance(s, ast.Assign):
        yield from ast.walk(s.value)
        for t in s.targets:
            yield from ast.walk(t)
    elif isinstance(s, ast.AugAssign):
        yield from ast.walk(s.value)
        if isinstance(s.target, ast.Name):          # (x += v reads x before it stores it)
            yield ast.Name(id=s.target.id, ctx=ast.Load())
        yield from ast.walk(s.target)
    elif isinstance(s, ast.For):
        yield from ast.walk(s.iter)
        yield s.target
        for t in s.body:
            yield from _in_order(t)
    else:
        yield from ast.walk(s)


def _constant_range(e: ast.expr) -> bool:
    return (isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id == "range"
            and not e.keywords and 1 <= len(e.args) <= 3
            and all(isinstance(a, ast.Constant) and type(a.value) is int for a in e.args))


def _pure(e: ast.expr) -> bool:
    """Whether ``e`` only reads: its calls are conversions and math."""
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            f = n.func
            ok = (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                  and f.value.id in _PURE_MODULES) or (
                isinstance(f, ast.Name) and f.id in _PURE_NAMES)
            if not ok:
                return False
        elif isinstance(n, (ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield)):
            return False
    return True


def _target_ok(t: ast.expr) -> bool:
    """A name, a tuple of names, or the work-item's own slot ``x__items[_li]``."""
    if isinstance(t, ast.Name):
        return True
    if isinstance(t, ast.Tuple):
        return all(isinstance(e, ast.Name) for e in t.elts)
    return (isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
            and t.value.id.endswith("__items") and isinstance(t.slice, ast.Name)
            and t.slice.id == "_li")


def _renamed(s: ast.stmt, owned: set[str], c: int) -> ast.stmt:
    """``s`` for the work-item of jammed copy ``c``: its own names suffixed."""
    s = copy.deepcopy(s)
    for n in ast.walk(s):
        if isinstance(n, ast.Name) and n.id in owned:
            n.id = f"{n.id}__j{c}"
    return s


def _interleaved(copies: list[list[ast.stmt]]) -> list[ast.stmt]:
    """The copies' statements one statement at a time, each loop once with its bodies
    interleaved the same way (the copies share its counter)."""
    out: list[ast.stmt] = []
    for group in zip(*copies):
        if isinstance(group[0], ast.For):
            loop = copy.copy(group[0])
            loop.body = _interleaved([g.body for g in group])
            out.append(loop)
        else:
            out.extend(group)
    return out
