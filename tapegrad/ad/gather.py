"""Scatter to gather: stencil adjoints without atomics.

The adjoint of a stencil *scatters*: work-item ``i`` of ::

    Y[i] = X[i - 1] - 2.0 * X[i] + X[i + 1]

adds into ``X_bar[i - 1]``, ``X_bar[i]`` and ``X_bar[i + 1]``, so neighbouring work-items
update the same elements and need atomics (or private copies).  When every update of a shadow
``A_bar`` sits at a constant offset ``o`` from the work-item's own global index, the same sums
can be *gathered*: one work-item per element ``e`` of ``A_bar`` asks each work-item
``e - o`` (that exists) for the value it would have added at offset ``o``, and adds them all
once, with no atomic and in a loop the compiler can vectorise::

    def stencil1d_adjoint_gather_X_bar(Y, X, Y_bar, X_bar, _nd0):
        _gi = tg.global_index()
        _acc = 0.0
        if _gi >= 1 and _gi + 1 < _nd0 and _gi - 1 > 0 and _gi + 1 < X.size - 1:
            # work-items _gi + 1, _gi, _gi - 1 exist and pass the kernel's test
            # (i > 0 and i < X.size - 1): what each adds, as one sum (tapegrad/ad/factor.py)
            _acc = Y_bar[_gi + 1] - 2.0 * Y_bar[_gi] + Y_bar[_gi - 1]
        else:
            i = _gi + 1
            if i < _nd0:                         # that work-item exists
                ...
        X_bar[_gi] = X_bar[_gi] + _acc

Each gather kernel re-runs the adjoint body of the neighbouring work-items (so it applies only
to loop-free adjoints without barriers, local memory or stores to primal arrays: re-running
them must be pure), keeping only what feeds its own updates.  It runs over ``A_bar``'s shape,
*before* the rest of the adjoint (which no longer contains those updates): the rest consumes
output shadows that the gathers still read.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from tapegrad.ad.astutil import add, assign, const, name, substituted
from tapegrad.ad.deadcode import eliminate_dead_code
from tapegrad.ad.factor import factored_sum
from tapegrad.frontend.ir import KernelIR, tg_call, tg_name
from tapegrad.frontend.ranges import range_tests

MAX_OFFSET = 4        # per dimension: wider stencils keep their atomics
MAX_OFFSETS = 27      # distinct offset vectors per shadow (a 3-D 27-point stencil)

_INDEX_CALLS = {"global_index", "global_indices", "local_index", "local_indices",
                "group_index", "group_indices", "ndrange", "groupsize"}


@dataclass
class Gather:
    """A kernel that adds everything one shadow receives, launched over that shadow's shape
    with the original ndrange as its last parameters ``_nd0, _nd1, ...``."""

    target: str          # the shadow parameter it adds into
    ir: KernelIR
    fresh_ir: KernelIR   # the same storing instead of adding, for a shadow not yet written


def split_gathers(ir: KernelIR, shadows: list[str], rank: int) -> tuple[KernelIR, list[Gather]]:
    """The adjoint ``ir`` without its offset updates, and one gather kernel per shadow whose
    updates all sit at constant offsets (some non-zero).  Returns ``(ir, [])`` unchanged
    when the adjoint does not have the required shape."""
    index_vars = global_index_vars(ir.body, rank)
    if index_vars is None or not _pure_replay(ir.body, shadows):
        return ir, []
    gathers = []
    for target in shadows:
        offsets = _offsets(ir.body, target, index_vars)
        if offsets is None or not any(any(o) for o in offsets):
            continue
        gathers.append(Gather(target, _gather_kernel(ir, target, index_vars, offsets, False),
                              _gather_kernel(ir, target, index_vars, offsets, True)))
    if not gathers:
        return ir, []
    gathered = {g.target for g in gathers}
    rest = copy.copy(ir)
    rest.body = _without_updates(copy.deepcopy(ir.body), gathered)
    return rest, gathers


# -- applicability --------------------------------------------------------------------------

def global_index_vars(body: list[ast.stmt], rank: int) -> list[str] | None:
    """The names bound once, at the top level, to the global index (one per dimension);
    None if the kernel uses any other index intrinsic or reassigns them."""
    found: list[str] | None = None
    for s in body:
        if isinstance(s, ast.Assign) and tg_name(s.value) in ("global_index", "global_indices"):
            t = s.targets[0]
            if found is not None:
                return None
            if rank == 1 and tg_name(s.value) == "global_index" and isinstance(t, ast.Name):
                found = [t.id]
            elif (tg_name(s.value) == "global_indices" and isinstance(t, ast.Tuple)
                  and len(t.elts) == rank and all(isinstance(e, ast.Name) for e in t.elts)):
                found = [e.id for e in t.elts]
            else:
                return None
    if found is None:
        return None
    index_calls = stores = 0
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if tg_name(n) in _INDEX_CALLS:
            index_calls += 1
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in found:
            stores += 1
    return found if index_calls == 1 and stores == len(found) else None


def _pure_replay(body: list[ast.stmt], shadows: list[str]) -> bool:
    """Straight-line code and branches whose only effects are stores and atomics into
    shadows and per-group sums of Active scalars: re-running it elsewhere changes nothing."""
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, (ast.For, ast.While)):
            return False
        if isinstance(n, ast.Call) and tg_name(n) in ("synchronize", "localmem", "private"):
            return False
        if isinstance(n, ast.Call) and tg_name(n) is None:      # a kept device function
            return False
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and not (isinstance(n.value, ast.Name) and n.value.id in shadows):
            return False
        if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_") and not (
                tg_name(n) == "atomic_add" and n.args[0].id in shadows):
            return False
    for s in _statements(body):
        if isinstance(s, ast.Expr) and tg_name(s.value) not in ("atomic_add", "group_reduce_add"):
            return False
    return True


def _statements(body: list[ast.stmt]):
    for s in body:
        yield s
        if isinstance(s, ast.If):
            yield from _statements(s.body)
            yield from _statements(s.orelse)


def _offsets(body: list[ast.stmt], target: str, index_vars: list[str]
             ) -> list[tuple[int, ...]] | None:
    """The offset of each update of ``target`` (in order of first appearance), or None if
    ``target`` is used in any other way or at any other index."""
    updates = [s for s in _statements(body) if _update_of(s) == target]
    uses = sum(1 for n in ast.walk(ast.Module(body=body, type_ignores=[]))
               if isinstance(n, ast.Name) and n.id == target)
    if not updates or uses != len(updates):
        return None
    offsets: list[tuple[int, ...]] = []
    for s in updates:
        o = _offset(s.value.args[1], index_vars)
        if o is None:
            return None
        if o not in offsets:
            offsets.append(o)
    return offsets if len(offsets) <= MAX_OFFSETS else None


def _update_of(s: ast.stmt) -> str | None:
    if isinstance(s, ast.Expr) and tg_name(s.value) == "atomic_add":
        return s.value.args[0].id
    return None


def _offset(idx: ast.expr, index_vars: list[str]) -> tuple[int, ...] | None:
    parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
    if len(parts) != len(index_vars):
        return None
    out = []
    for var, p in zip(index_vars, parts):
        o = _component_offset(p, var)
        if o is None or abs(o) > MAX_OFFSET:
            return None
        out.append(o)
    return tuple(out)


def _component_offset(e: ast.expr, var: str) -> int | None:
    """``var`` -> 0, ``var + c`` / ``c + var`` -> c, ``var - c`` -> -c (c an int literal)."""
    if isinstance(e, ast.Name):
        return 0 if e.id == var else None
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        left, right = e.left, e.right
        if isinstance(left, ast.Name) and left.id == var:
            c = _int(right)
            return None if c is None else (c if isinstance(e.op, ast.Add) else -c)
        if isinstance(e.op, ast.Add) and isinstance(right, ast.Name) and right.id == var:
            return _int(left)
    return None


def _int(e: ast.expr) -> int | None:
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        c = _int(e.operand)
        return None if c is None else -c
    if isinstance(e, ast.Constant) and type(e.value) is int:
        return e.value
    return None


# -- the generated kernels ------------------------------------------------------------------

def _gather_kernel(ir: KernelIR, target: str, index_vars: list[str],
                   offsets: list[tuple[int, ...]], fresh: bool) -> KernelIR:
    """The gather kernel of ``target``; with ``fresh`` it stores its sums instead of adding
    them (every element is written once, so a shadow with no values yet needs no zeroing)."""
    rank = len(index_vars)
    own = [f"_gi{d}" if rank > 1 else "_gi" for d in range(rank)]
    nd = [f"_nd{d}" for d in range(rank)]
    first = ir.body[0]
    if rank == 1:
        head = [assign(own[0], tg_call("global_index", []))]
    else:
        head = [assign(ast.Tuple(elts=[name(g, True) for g in own], ctx=ast.Store()),
                       tg_call("global_indices", []))]
    head.append(assign("_acc", const(0.0)))
    inside: list[ast.stmt] = []      # every neighbour exists: no tests, reads hoisted
    core: list[ast.stmt] | None = []   # ... and passes its boundary tests: none left
    core_atoms: list[tuple[int, str, int, ast.expr]] = []
    edge: list[ast.stmt] = []        # some may not: each neighbour tested
    for o in sorted(offsets):
        item = [_shift(name(g), -k) for g, k in zip(own, o)]   # the work-item e - o
        exists = [ast.Compare(left=name(v), ops=[ast.GtE()], comparators=[const(0)])
                  for v, k in zip(index_vars, o) if k > 0] + [
                  ast.Compare(left=name(v), ops=[ast.Lt()], comparators=[name(n)])
                  for v, n in zip(index_vars, nd)]
        replay = _replay(copy.deepcopy(ir.body), target, index_vars, item, o, None)
        inside += replay
        folded = None if core is None else _fold_range_guards(
            copy.deepcopy(replay), ir, index_vars, o)
        if folded is None:
            core = None
        else:
            core += folded[0]
            core_atoms += folded[1]
        edge += _replay(copy.deepcopy(ir.body), target, index_vars, item, o, _conj(exists))
    tests = _neighbours_exist(own, offsets, nd)
    if core is not None and core_atoms:
        tests += _range_tests_on(own, core_atoms)
    fast = inside
    if core is not None and core_atoms:
        fast = factored_sum(core, "_acc") or core
    body = head + [ast.If(test=_conj(tests), body=fast or [ast.Pass()], orelse=edge)]
    at = ast.Tuple(elts=[name(g) for g in own], ctx=ast.Load()) if rank > 1 else name(own[0])
    store = ast.Subscript(value=name(target), slice=at, ctx=ast.Store())
    total = name("_acc") if fresh else add(ast.Subscript(
        value=name(target), slice=copy.deepcopy(at), ctx=ast.Load()), name("_acc"))
    body.append(assign(store, total))
    for s in body:
        for n in ast.walk(s):
            if "lineno" in n._attributes and not hasattr(n, "lineno"):
                ast.copy_location(n, first)
    return KernelIR(name=f"{ir.name}_{'store' if fresh else 'gather'}_{target}", params=ir.params + nd, body=body,
                    filename=ir.filename, lineno=ir.lineno, is_kernel=True, funcs=ir.funcs,
                    generated=True)


def _neighbours_exist(own: list[str], offsets: list[tuple[int, ...]], nd: list[str]
                      ) -> list[ast.expr]:
    """Range tests on the element's index ``own``: every neighbour ``e - o`` lies in the
    ndrange.  The CPU lowering decides them per row of a group and runs the rest of the row
    without them (backends/cpu/versioning.py), where LLVM vectorises a loop with no tests in
    it (measured: CHANGELOG.md, 'the figures that moved')."""
    tests: list[ast.expr] = []
    for d, (var, n) in enumerate(zip(own, nd)):
        hi = max(0, max(o[d] for o in offsets))
        lo = min(0, min(o[d] for o in offsets))
        if hi:
            tests.append(ast.Compare(left=name(var), ops=[ast.GtE()], comparators=[const(hi)]))
        tests.append(ast.Compare(left=_shift(name(var), -lo), ops=[ast.Lt()],
                                 comparators=[name(n)]))
    return tests


def _range_tests_on(own: list[str], atoms: list[tuple[int, str, int, ast.expr]]
                    ) -> list[ast.expr]:
    """``own[dim] + shift <symbol> bound`` for each atom, one test per (dim, symbol, bound)
    with the most demanding shift."""
    worst: dict[tuple, tuple[int, ast.expr]] = {}
    for dim, symbol, shift, bound in atoms:
        key = (dim, symbol, ast.dump(bound))
        upper = symbol in ("<", "<=")
        if key not in worst or (shift > worst[key][0] if upper else shift < worst[key][0]):
            worst[key] = (shift, bound)
    ops = {"<": ast.Lt, "<=": ast.LtE, ">": ast.Gt, ">=": ast.GtE}
    return [ast.Compare(left=_shift(name(own[dim]), shift), ops=[ops[symbol]()],
                        comparators=[copy.deepcopy(bound)])
            for (dim, symbol, _), (shift, bound) in worst.items()]


def _fold_range_guards(stmts: list[ast.stmt], ir: KernelIR, index_vars: list[str],
                       offset: tuple[int, ...]) -> tuple[list[ast.stmt], list[tuple]] | None:
    """The replay of work-item ``e - offset`` with its top-level boundary tests taken as
    passed, and the range tests ``(dim, symbol, shift, bound)`` on ``e`` under which they all
    pass (in a stencil's interior ``if 0 < i < n - 1:`` holds for every neighbour).  None
    when some top-level test is not a range test."""
    stores: dict[str, int] = {}
    for n in ast.walk(ast.Module(body=ir.body, type_ignores=[])):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            stores[n.id] = stores.get(n.id, 0) + 1
    fixed = set(ir.params) - set(stores)       # never reassigned: the same for every item
    known: dict[str, ast.expr] = {}            # uniform locals, as expressions of the fixed
    flags: dict[str, ast.expr] = {}

    def uniform(e: ast.expr) -> bool:
        for n in ast.walk(e):
            if isinstance(n, ast.Name) and n.id not in fixed:
                return False
            if isinstance(n, ast.Call) or (isinstance(n, ast.Subscript) and not (
                    isinstance(n.value, ast.Attribute) and n.value.attr == "shape")):
                return False
        return True

    out: list[ast.stmt] = []
    atoms: list[tuple[int, str, int, ast.expr]] = []
    for s in stmts:
        if isinstance(s, ast.Assign):
            t, value = s.targets[0], substituted(s.value, known)
            once = all(stores.get(e.id) == 1 for e in ast.walk(t) if isinstance(e, ast.Name))
            if once and isinstance(t, ast.Name) and uniform(value):
                known[t.id] = value
            elif once and isinstance(t, ast.Tuple) and isinstance(value, ast.Attribute) \
                    and value.attr == "shape" and uniform(value):
                for k, e in enumerate(t.elts):
                    known[e.id] = ast.Subscript(value=copy.deepcopy(value), slice=const(k),
                                                ctx=ast.Load())
            elif isinstance(t, ast.Name):
                flags[t.id] = s.value
            out.append(s)
            continue
        if not isinstance(s, ast.If):
            out.append(s)
            continue
        test = flags.get(s.test.id) if isinstance(s.test, ast.Name) else s.test
        ranges = None if test is None else range_tests(
            substituted(test, known), {v: d for d, v in enumerate(index_vars)}, uniform)
        if ranges is None:
            return None
        atoms += [(r.dim, r.symbol, r.offset - offset[r.dim], r.bound)   # index is e - offset
                  for r in ranges]
        out.extend(s.body)
    return _dead_code_removed(out), atoms


def _shift(e: ast.expr, k: int) -> ast.expr:
    if k == 0:
        return e
    op = ast.Add() if k > 0 else ast.Sub()
    return ast.BinOp(left=e, op=op, right=const(abs(k)))


def _conj(tests: list[ast.expr]) -> ast.expr:
    return tests[0] if len(tests) == 1 else ast.BoolOp(op=ast.And(), values=tests)


def _replay(body: list[ast.stmt], target: str, index_vars: list[str], item: list[ast.expr],
            offset: tuple[int, ...], exists: ast.expr | None) -> list[ast.stmt]:
    """The adjoint body of work-item ``item``, keeping only what its updates of ``target`` at
    ``offset`` need; those become ``_acc = _acc + value``.  With ``exists`` (a test) it runs
    only when that work-item exists; with None the caller knows it does."""
    def rewrite(stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            if isinstance(s, ast.Assign) and tg_name(s.value) in ("global_index", "global_indices"):
                out.append(s)    # split off below
            elif isinstance(s, ast.If):
                out.append(ast.If(test=s.test, body=rewrite(s.body), orelse=rewrite(s.orelse)))
                ast.copy_location(out[-1], s)
            elif isinstance(s, ast.Assign) and isinstance(s.targets[0], (ast.Name, ast.Tuple)):
                out.append(s)
            elif _update_of(s) == target and _offset(s.value.args[1], index_vars) == offset:
                out.append(ast.copy_location(assign("_acc", add(name("_acc"), s.value.args[2])), s))
            # anything else is an effect some other kernel makes: dropped
        return out

    stmts = rewrite(body)
    at = next(k for k, s in enumerate(stmts) if isinstance(s, ast.Assign)
              and tg_name(s.value) in ("global_index", "global_indices"))
    where = stmts[at]
    before, after = stmts[:at], stmts[at + 1:]
    index = [ast.copy_location(assign(v, copy.deepcopy(x)), where)
             for v, x in zip(index_vars, item)]
    if exists is None:     # the work-item exists: read its own elements before any branch
        loads, after = _hoist_own_loads(after, index_vars)
        return _dead_code_removed(before + index + loads + after)
    guarded = ast.copy_location(ast.If(test=exists, body=after, orelse=[]), where)
    return _dead_code_removed(before + index + [guarded])


def _hoist_own_loads(stmts: list[ast.stmt], index_vars: list[str]
                     ) -> tuple[list[ast.stmt], list[ast.stmt]]:
    """Top-level reads ``x = A[own index]``, and the same read opening both branches of a
    top-level ``if``/``else`` (how a reverse sweep reads an output's shadow), move ahead of
    the branches: the work-item reads them on every path, so they are in bounds, and the
    branches left without loads can become selects.  (The code stores nothing, so moving
    reads is safe.)"""
    def own_read(s: ast.stmt) -> ast.Subscript | None:
        if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) \
                and isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name):
            idx = s.value.slice
            parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
            if [getattr(p, "id", None) for p in parts] == index_vars:
                return s.value
        return None

    loads: list[ast.stmt] = []
    out: list[ast.stmt] = []
    for s in stmts:
        if own_read(s) is not None:
            loads.append(s)
            continue
        if isinstance(s, ast.If) and s.body and s.orelse:
            a, b = own_read(s.body[0]), own_read(s.orelse[0])
            if a is not None and b is not None and ast.dump(a) == ast.dump(b):
                tmp = f"_read{len(loads)}"
                loads.append(ast.copy_location(assign(tmp, copy.deepcopy(a)), s))
                s.body[0].value = name(tmp)
                s.orelse[0].value = name(tmp)
        out.append(s)
    return loads, out


def _without_updates(body: list[ast.stmt], targets: set[str]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for s in body:
        if _update_of(s) in targets:
            continue
        if isinstance(s, ast.If):
            s.body = _without_updates(s.body, targets) or [ast.Pass()]
            s.orelse = _without_updates(s.orelse, targets)
        out.append(s)
    return out


def _dead_code_removed(body: list[ast.stmt]) -> list[ast.stmt]:
    """Keep only what feeds ``_acc`` (the Active scalars' sums, for one, another kernel makes)."""
    return eliminate_dead_code(body, {"_acc"})[0]
