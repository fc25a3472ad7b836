"""Local-memory adjoints in gather form: a tiled product's reverse sweep without atomics.

The adjoint of ``acc += tile_a[li, k] * tile_b[k, lj]`` (``for k in range(16)``, a 16 x 16
workgroup) adds, in every work-item and every ``k``, into two local-memory shadows::

    tg.atomic_add(tile_a_bar, (li, k), acc_bar * tile_b[k, lj])
    tg.atomic_add(tile_b_bar, (k, lj), acc_bar * tile_a[li, k])

so the 16 work-items of a row (column) update the same elements: atomics on a GPU, and on
the CPU a chain of read-modify-writes that no compiler vectorises, many times slower than the
primal product (measured: CHANGELOG.md, 'the figures that moved').  Element
``(p, q)`` of ``tile_a_bar`` receives exactly the values of the work-items ``(p, f)`` at
``k = q``, for every ``f``; so each work-item can *gather* the sum for its own element, once
its neighbours' ``acc_bar`` is in local memory::

    _share_acc_bar[li, lj] = acc_bar
    tile_b__t[lj, li] = tile_b[li, lj]    # rows read across work-items: a transposed copy
    tg.synchronize()
    _sum = 0.0
    for _f in range(16):                  # (tg.fma: where the device has FMA, _fused_sums)
        _sum = tg.fma(_share_acc_bar[li, _f], tile_b__t[_f, lj], _sum)
    tile_a_bar[li, lj] = tile_a_bar[li, lj] + _sum
    ...                                   # tile_b_bar alike, over the other local index

The pass applies to a loop ``for _r in range(C)`` of a rank-2 workgroup whose body is only
``k = _r`` (or ``C - 1 - _r``), the bookkeeping that keeps a scalar unchanged, and
``tg.atomic_add(L_bar, index, value)`` into local-memory shadows, where ``index`` holds
``k`` at one position ``d`` and the local index ``d'`` at the other (``C`` equal to the
workgroup size along ``d``) and ``value`` reads only local memory, ``k``, the local indices,
constants and scalars the loop does not change; every other use of those shadows must be at
the work-item's own element.  The launch's workgroups must all be full (the gather sums over
every work-item of a group; runtime/adjoint.py compiles the atomic form for other ndranges).
Anything else is left as it is.
"""

from __future__ import annotations

import ast
import copy

from tapegrad.ad.astutil import assign, const, name, walk
from tapegrad.frontend.ir import KernelIR, tg_call, tg_name


def gather_local_updates(ir: KernelIR, groupsize: tuple[int, ...], fuse: bool = True
                         ) -> KernelIR:
    """``ir`` with every matching loop of local-memory updates in gather form, their sums'
    products added with ``tg.fma`` where ``fuse`` (the device has an FMA instruction; without
    one each would be a call into libm).  Only for launches whose workgroups are all full (the
    ndrange a multiple of the groupsize): a gather sums over every work-item of the group,
    and one the ndrange cuts off never ran."""
    if len(groupsize) != 2:
        return ir
    local = _local_indices(ir.body)
    decls = {s.targets[0].id: s for s in ir.body if isinstance(s, ast.Assign)
             and isinstance(s.targets[0], ast.Name) and tg_name(s.value) == "localmem"}
    if local is None or not decls:
        return ir
    body = copy.deepcopy(ir.body)
    shares: dict[str, tuple] = {}      # new local arrays -> (dtype, zeroed at the start)
    changed = _rewrite(body, ir, local, decls, groupsize, shares, body)
    if not changed:
        return ir
    if fuse:
        _fused_sums(body)
    head = []
    for array, (dtype, zeroed) in shares.items():
        head.append(assign(array, tg_call("localmem", [copy.deepcopy(dtype), ast.Tuple(
            elts=[const(w) for w in groupsize], ctx=ast.Load())])))
        if zeroed:
            head.append(_zeroed_by_first_item(array, groupsize))
    out = copy.copy(ir)
    out.body = _located(head, ir.body[0]) + body
    return out


def _local_indices(body: list[ast.stmt]) -> list[str] | None:
    for s in body:
        if isinstance(s, ast.Assign) and tg_name(s.value) == "local_indices" \
                and isinstance(s.targets[0], ast.Tuple) and len(s.targets[0].elts) == 2:
            return [e.id for e in s.targets[0].elts]
    return None


def _rewrite(stmts: list[ast.stmt], ir: KernelIR, local: list[str], decls: dict,
             groupsize: tuple[int, ...], shares: dict, whole: list[ast.stmt]) -> bool:
    """Loops in ``stmts`` and in the loops below it that already hold barriers (the whole
    group runs them alike, so one more barrier there is allowed); never inside an ``if``."""
    changed = False
    synchronised = stmts is whole or any(
        isinstance(s, ast.Expr) and tg_name(s.value) == "synchronize" for s in stmts)
    for k in range(len(stmts) - 1, -1, -1):
        s = stmts[k]
        if not isinstance(s, ast.For):
            continue
        replacement = _gathered(s, local, decls, groupsize, shares, whole) \
            if synchronised else None
        if replacement is not None:
            stmts[k:k + 1] = _located(replacement, s)
            _copy_where_loaded(stmts, local)
            changed = True
        elif _rewrite(s.body, ir, local, decls, groupsize, shares, whole):
            stmts[k:k] = _hoisted_shares(s)
            changed = True
    return changed


def _copy_where_loaded(stmts: list[ast.stmt], local: list[str]) -> None:
    """A transposed copy ``X__t[lj, li] = X[li, lj]`` of an element this work-item stored
    earlier in ``stmts`` (``X[li, lj] = e``, a tile load redone by the reverse sweep) copies
    ``e`` itself, right after that store: no separate pass over the tile (and ``X`` may then
    be read by nothing at all)."""
    own = ast.dump(_own(local))
    for c in [s for s in stmts if getattr(s, "_tg_transposed", None)]:
        array, at = c._tg_transposed, stmts.index(c)
        for p in range(at - 1, -1, -1):
            st = stmts[p]
            if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Subscript) \
                    and isinstance(st.targets[0].value, ast.Name) \
                    and st.targets[0].value.id == array:
                if ast.dump(st.targets[0].slice) != own \
                        or not _unchanged(st.value, stmts[p + 1:at]):
                    break
                c.value = copy.deepcopy(st.value)
                stmts.remove(c)
                stmts.insert(p + 1, c)
                break
            if any(isinstance(n, ast.Name) and n.id == array for n in ast.walk(st)):
                break                                   # X used in between


def _unchanged(value: ast.expr, between: list[ast.stmt]) -> bool:
    """Nothing in ``between`` assigns a name ``value`` reads or stores into an array it
    reads."""
    reads = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    for n in walk(between):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id in reads:
            return False
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) \
                and isinstance(n.value, ast.Name) and n.value.id in reads:
            return False
        if isinstance(n, ast.Call) and (tg_name(n) is None               # a device function
                                        or tg_name(n).startswith("atomic_")):
            return False
    return True


def _hoisted_shares(loop: ast.For) -> list[ast.stmt]:
    """The ``_share_s[li, lj] = s`` stores at the top level of ``loop``'s body whose scalar
    the loop never assigns: taken out of the loop, to run once before it.  A barrier inside
    the loop still separates them from the gathers that read them, and nothing in the loop
    writes them again."""
    assigned = {n.id for n in ast.walk(loop) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Store)}
    hoisted = [s for s in loop.body if getattr(s, "_tg_share", None)
               and s._tg_share not in assigned]
    loop.body = [s for s in loop.body if s not in hoisted] or [ast.Pass()]
    return hoisted


def _gathered(loop: ast.For, local: list[str], decls: dict, groupsize: tuple[int, ...],
              shares: dict, whole: list[ast.stmt]) -> list[ast.stmt] | None:
    trips = _constant_range(loop)
    if trips is None or not isinstance(loop.target, ast.Name):
        return None
    counter = loop.target.id
    k_name, updates = None, []
    body, aliases = _without_carries(loop.body)
    for s in body:
        if k_name is None and isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name) \
                and _walks_range(s.value, counter, trips):
            k_name = s.targets[0].id
        elif isinstance(s, ast.Expr) and tg_name(s.value) == "atomic_add" \
                and isinstance(s.value.args[0], ast.Name) and s.value.args[0].id in decls:
            updates.append(s.value)
        else:
            return None
    if k_name is None or not updates:
        return None
    targets = {u.args[0].id for u in updates}
    assigned_in_loop = {n.id for s in body for n in ast.walk(s)
                        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    plans = []
    for u in updates:
        plan = _update_plan(u, k_name, local, groupsize, trips, targets, aliases,
                            assigned_in_loop - {k_name} - set(aliases), decls)
        if plan is None or not _only_own_uses(whole, u.args[0].id, local, loop):
            return None
        plans.append(plan)
    out: list[ast.stmt] = []
    used = sorted({s for plan in plans for s in plan[2]})
    for scalar in used:
        dtype = decls[plans[0][0]].value.args[0]
        shares.setdefault(f"_share_{scalar}", (dtype, True))
        out.append(assign(ast.Subscript(value=name(f"_share_{scalar}", False),
                                        slice=_own(local), ctx=ast.Store()), name(scalar)))
        out[-1]._tg_share = scalar
    # a tile read along a row across the work-items (tile_b[lj, _f]) is strided: read a
    # transposed copy instead (tile_b__t[_f, lj]), each work-item copying its own element
    flipped = sorted({a for plan in plans for a in _transpose_rows(plan[1], local, decls)
                      if _square(decls[a], groupsize)})
    for array in flipped:
        shares.setdefault(f"{array}__t", (decls[array].value.args[0], False))
        out.append(assign(ast.Subscript(value=name(f"{array}__t", False), slice=ast.Tuple(
            elts=[name(local[1]), name(local[0])], ctx=ast.Load()), ctx=ast.Store()),
            ast.Subscript(value=name(array), slice=_own(local), ctx=ast.Load())))
        out[-1]._tg_transposed = array
    if used or flipped:
        out.append(ast.Expr(value=tg_call("synchronize", [])))
    plans = [(t, _read_transposed(v, flipped, local), sc, n) for t, v, sc, n in plans]
    for target, value, _, free_size in plans:
        out.append(assign("_sum", const(0.0)))
        out.append(ast.For(target=name("_f", True), iter=ast.Call(
            func=name("range"), args=[const(free_size)], keywords=[]),
            body=[_marked(assign("_sum", ast.BinOp(left=name("_sum"), op=ast.Add(),
                                                   right=value)))],
            orelse=[]))
        own = ast.Subscript(value=name(target), slice=_own(local), ctx=ast.Load())
        out.append(assign(ast.Subscript(value=name(target, False), slice=_own(local),
                                        ctx=ast.Store()),
                          ast.BinOp(left=own, op=ast.Add(), right=name("_sum"))))
    # the loop's variables end as the loop would leave them
    out.append(assign(counter, const(trips - 1)))
    out += [assign(alias, name(scalar)) for alias, scalar in aliases.items()]
    last = copy.deepcopy(next(s for s in body if isinstance(s, ast.Assign)
                              and isinstance(s.targets[0], ast.Name)
                              and s.targets[0].id == k_name))
    out.append(last)
    return out


def _transpose_rows(value: ast.expr, local: list[str], decls: dict) -> set[str]:
    """Local arrays ``value`` reads at ``[<innermost local index>, _f]``."""
    row = ast.dump(ast.Tuple(elts=[name(local[1]), name("_f")], ctx=ast.Load()))
    return {n.value.id for n in ast.walk(value) if isinstance(n, ast.Subscript)
            and isinstance(n.value, ast.Name) and n.value.id in decls
            and ast.dump(n.slice) == row}


def _square(decl: ast.Assign, groupsize: tuple[int, ...]) -> bool:
    shape = ast.unparse(decl.value.args[1]).replace(" ", "").strip("()").rstrip(",")
    return groupsize[0] == groupsize[1] and shape == f"{groupsize[0]},{groupsize[1]}"


def _read_transposed(value: ast.expr, flipped: list[str], local: list[str]) -> ast.expr:
    row = ast.dump(ast.Tuple(elts=[name(local[1]), name("_f")], ctx=ast.Load()))

    class Flip(ast.NodeTransformer):
        def visit_Subscript(self, n: ast.Subscript) -> ast.expr:
            self.generic_visit(n)
            if isinstance(n.value, ast.Name) and n.value.id in flipped \
                    and ast.dump(n.slice) == row:
                return ast.Subscript(value=name(f"{n.value.id}__t"), slice=ast.Tuple(
                    elts=[name("_f"), name(local[1])], ctx=ast.Load()), ctx=ast.Load())
            return n

    return Flip().visit(copy.deepcopy(value))


def _constant_range(loop: ast.For) -> int | None:
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" \
            and len(it.args) == 1 and isinstance(it.args[0], ast.Constant) \
            and type(it.args[0].value) is int and not loop.orelse:
        return it.args[0].value
    return None


def _walks_range(e: ast.expr, counter: str, trips: int) -> bool:
    """``counter`` or ``trips - 1 - counter`` (as the reverse sweep spells it)."""
    if isinstance(e, ast.Name):
        return e.id == counter
    text = ast.unparse(e).replace(" ", "")
    return text in (f"{trips - 1}+{counter}*-1", f"{trips - 1}-{counter}")


def _fused_sums(body: list[ast.stmt]) -> None:
    """Each gathered ``_sum = _sum + x * y`` as ``_sum = tg.fma(x, y, _sum)``: one rounding
    where there were two, and the FMA instruction on a CPU (in place)."""
    for n in walk(body):
        if getattr(n, "_tg_sum", False) and isinstance(n.value.right, ast.BinOp) \
                and isinstance(n.value.right.op, ast.Mult):
            product = n.value.right
            n.value = tg_call("fma", [product.left, product.right, name("_sum")])


def _marked(sum_step: ast.Assign) -> ast.Assign:
    sum_step._tg_sum = True
    return sum_step


def _without_carries(body: list[ast.stmt]) -> tuple[list[ast.stmt], dict[str, str]]:
    """``body`` without the statements that carry a scalar's shadow through unchanged,
    ``_a = s; s = 0.0; ... s = s + _a`` (the adjoint of ``acc = acc + ...`` or of
    ``acc = tg.fma(..., acc)``: nothing between reads or writes ``s``), and alias -> scalar."""
    out, aliases, skip = [], {}, set()
    for at, st in enumerate(body):
        if at in skip:
            continue
        add = _carry_end(body, at)
        if add is None:
            out.append(st)
            continue
        aliases[st.targets[0].id] = st.value.id
        skip.update((at + 1, add))
    return out, aliases


def _carry_end(body: list[ast.stmt], at: int) -> int | None:
    """Where ``body[at]`` (``_a = s``) starts a carry: the position of its ``s = s + _a``."""
    a = body[at]
    if not (isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Name)
            and isinstance(a.value, ast.Name)) or at + 1 >= len(body):
        return None
    alias, scalar = a.targets[0].id, a.value.id
    b = body[at + 1]
    if not (isinstance(b, ast.Assign) and isinstance(b.targets[0], ast.Name)
            and b.targets[0].id == scalar and isinstance(b.value, ast.Constant)
            and b.value.value == 0.0):
        return None
    for end in range(at + 2, len(body)):
        c = body[end]
        if isinstance(c, ast.Assign) and isinstance(c.targets[0], ast.Name) \
                and c.targets[0].id == scalar \
                and ast.unparse(c.value).replace(" ", "") == f"{scalar}+{alias}":
            return end
        names = [n for n in ast.walk(c) if isinstance(n, ast.Name)]
        if any(n.id == scalar or n.id == alias and isinstance(n.ctx, ast.Store) for n in names):
            return None
    return None


def _update_plan(u: ast.Call, k: str, local: list[str], groupsize: tuple[int, ...],
                 trips: int, targets: set[str], aliases: dict[str, str],
                 changed: set[str], decls: dict) -> tuple | None:
    """(target, value with the gather's substitutions, scalars it shares, free size)."""
    target, index, value = u.args[0].id, u.args[1], u.args[2]
    parts = index.elts if isinstance(index, ast.Tuple) else []
    names = [p.id if isinstance(p, ast.Name) else None for p in parts]
    if len(names) != 2 or names.count(k) != 1:
        return None
    d = names.index(k)
    other = 1 - d
    if names[other] != local[other] or trips != groupsize[d]:
        return None
    shape = decls[target].value.args[1]
    if ast.unparse(shape).replace(" ", "").strip("()").rstrip(",") != \
            f"{groupsize[0]},{groupsize[1]}":
        return None
    # the element (li, lj) of this work-item gets, from work-item (.., f at d, ..) at k = its
    # own local index d: substitute local[d] -> _f and k -> local[d] at once
    for n in ast.walk(value):   # arrays other than local memory (arguments, private arrays)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and not (
                n.value.id in decls and tg_name(decls[n.value.id].value) == "localmem"):
            return None         # cannot be shared between work-items as a scalar
    scalars: set[str] = set()
    for n in ast.walk(value):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if n.id in targets or n.id in changed:
                return None
            if n.id in (k, *local) or n.id in decls or n.id == "tg":
                continue
            scalars.add(aliases.get(n.id, n.id))
        if isinstance(n, ast.Call) and tg_name(n) is None:
            return None
    renamed = _substitute(value, {local[d]: "_f", k: local[d]}, aliases, scalars, local)
    return target, renamed, scalars, groupsize[d]


def _substitute(value: ast.expr, names: dict[str, str], aliases: dict[str, str],
                scalars: set[str], local: list[str]) -> ast.expr:
    """Rename at once; a shared scalar ``s`` becomes ``_share_s[<renamed local indices>]``."""
    index = [names.get(v, v) for v in local]

    class Rename(ast.NodeTransformer):
        def visit_Name(self, n: ast.Name) -> ast.expr:
            scalar = aliases.get(n.id, n.id)
            if scalar in scalars:
                return ast.Subscript(value=name(f"_share_{scalar}"), slice=ast.Tuple(
                    elts=[name(v) for v in index], ctx=ast.Load()), ctx=ast.Load())
            return name(names[n.id]) if n.id in names else n

    return Rename().visit(copy.deepcopy(value))


def _only_own_uses(body: list[ast.stmt], target: str, local: list[str], loop: ast.For) -> bool:
    """Outside ``loop``, ``target`` is read and written only at the work-item's own element
    (or zeroed whole by one work-item, as adjoints initialise local shadows)."""
    inside = {id(n) for n in ast.walk(loop)}
    own = ast.dump(_own(local))
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if id(n) in inside or not (isinstance(n, ast.Name) and n.id == target) \
                or isinstance(n.ctx, ast.Store):           # its declaration
            continue
        parent = _parent_subscript(body, n)
        if parent is None:
            return False
        if ast.dump(parent.slice) == own:
            continue
        if isinstance(parent.ctx, ast.Store) and isinstance(parent.slice, ast.Tuple) and all(
                isinstance(e, ast.Name) and e.id.startswith("_z") for e in parent.slice.elts):
            continue                              # the zeroing loop of the declarations
        return False
    return True


def _parent_subscript(body: list[ast.stmt], node: ast.Name) -> ast.Subscript | None:
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Subscript) and n.value is node:
            return n
    return None


def _own(local: list[str]) -> ast.Tuple:
    return ast.Tuple(elts=[name(v) for v in local], ctx=ast.Load())


def _zeroed_by_first_item(array: str, groupsize: tuple[int, ...]) -> ast.stmt:
    store = ast.Subscript(value=name(array, False), slice=ast.Tuple(
        elts=[name("_z0"), name("_z1")], ctx=ast.Load()), ctx=ast.Store())
    inner = ast.For(target=name("_z1", True), iter=ast.Call(
        func=name("range"), args=[const(groupsize[1])], keywords=[]),
        body=[assign(store, const(0.0))], orelse=[])
    outer = ast.For(target=name("_z0", True), iter=ast.Call(
        func=name("range"), args=[const(groupsize[0])], keywords=[]), body=[inner], orelse=[])
    first = ast.Compare(left=tg_call("local_index", []), ops=[ast.Eq()], comparators=[const(0)])
    return ast.If(test=first, body=[outer], orelse=[])


def _located(stmts: list[ast.stmt], where: ast.stmt) -> list[ast.stmt]:
    for s in stmts:
        for n in ast.walk(s):
            if "lineno" in n._attributes and not hasattr(n, "lineno"):
                ast.copy_location(n, where)
    return stmts
