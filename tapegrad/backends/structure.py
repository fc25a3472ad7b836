"""Barrier structure of a kernel, shared by the backends.

A barrier (``tg.synchronize()``) splits a kernel body into *segments*: statements every
work-item runs between two barriers.  Statements that contain barriers (loops and branches)
run once per workgroup, so their bounds and conditions must be the same for every work-item;
``BarrierPlan`` finds the uniform values, decides what is computed at group level, which
index locals are cheap to recompute, and which locals are read across a barrier.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from tapegrad.backends.numba_lower import func_symbol
from tapegrad.errors import KernelSyntaxError, located
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import TupleT, TypedKernel
from tapegrad.frontend.unassigned import upward_exposed


def is_barrier(s: ast.stmt) -> bool:
    return isinstance(s, ast.Expr) and tg_name(s.value) == "synchronize"


def contains_barrier(s: ast.stmt) -> bool:
    return any(isinstance(n, ast.Expr) and tg_name(n.value) == "synchronize" for n in ast.walk(s))


def memory_decl(s: ast.stmt) -> str | None:
    """'localmem' / 'private' if ``s`` is ``x = tg.localmem(...)`` / ``tg.private(...)``."""
    if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name):
        name = tg_name(s.value)
        if name in ("localmem", "private"):
            return name
    return None


def names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


_UNIFORM_CALLS = {"groupsize", "ndrange", "group_index", "group_indices"}
_ITEM_CALLS = {"global_index", "global_indices", "local_index", "local_indices"}


def is_uniform(node: ast.expr, uniform: set[str], tuples: set[str] = frozenset()) -> bool:
    """True if ``node`` has the same value for every work-item of a workgroup.

    ``tuples``: names known to hold tuples (not arrays), whose elements may be read:
    ``gs[0]`` of a uniform tuple ``gs`` is uniform, ``A[0]`` of an array is not.
    """
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in uniform and n.id != "tg":
            return False
        if isinstance(n, ast.Subscript) and not _is_tuple_index(n, tuples):
            return False   # memory may differ between reads; treat element reads as varying
        if isinstance(n, ast.Call):
            name = tg_name(n)
            if name is None or name in _ITEM_CALLS or name.startswith("atomic_"):
                return False
    return True


def _is_tuple_index(n: ast.Subscript, tuples: set[str] = frozenset()) -> bool:
    """Whether ``n`` reads an element of a tuple (a shape, ``tg.groupsize()``, a local
    holding a tuple), which, unlike an array element, cannot change between reads."""
    return isinstance(n.value, ast.Attribute) and n.value.attr == "shape" or (
        isinstance(n.value, ast.Call) and tg_name(n.value) in _UNIFORM_CALLS) or (
        isinstance(n.value, ast.Name) and n.value.id in tuples)


def assigned_values(s: ast.stmt) -> dict[str, ast.expr]:
    """Each name the assignment ``s`` sets, with the expression its value comes from.

    ``x = e`` and ``x op= e`` give x: e.  A tuple target unpacking a tuple display of the same
    length is judged element by element (``a, b = (m, i)``: a from m, b from i), so one varying
    element does not make the others vary; any other tuple target takes the whole value for
    every name (``n, m = A.shape``: every element of a uniform tuple is uniform).  When the
    display reads one of the names it sets (``a, b = b, a``), element by element would misread
    the old values as new ones, so the whole value counts there too.  Empty when ``s`` sets no
    name (``A[i] = e``, or not an assignment).
    """
    if isinstance(s, ast.AugAssign):
        return {s.target.id: s.value} if isinstance(s.target, ast.Name) else {}
    if not isinstance(s, ast.Assign):
        return {}
    target, value = s.targets[0], s.value
    if isinstance(target, ast.Name):
        return {target.id: value}
    if not isinstance(target, ast.Tuple):
        return {}
    names = [e.id for e in target.elts if isinstance(e, ast.Name)]
    if (len(names) == len(target.elts) and isinstance(value, ast.Tuple)
            and len(value.elts) == len(names) and not set(names) & names_in(value)
            and not any(isinstance(e, ast.Starred) for e in value.elts)):
        return dict(zip(names, value.elts))
    return {n.id: value for n in ast.walk(target) if isinstance(n, ast.Name)}


def _unpacks_whole(s: ast.stmt) -> bool:
    """Whether ``s`` unpacks one tuple value into several names (``n, m = A.shape``), so its
    names are uniform together or not at all (they are computed by one statement)."""
    values = list(assigned_values(s).values())
    return len(values) > 1 and all(v is s.value for v in values)


def is_index_only(node: ast.expr, uniform: set[str]) -> bool:
    """True if ``node`` depends only on work-item indices and uniform values (cheap to redo)."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in uniform and n.id != "tg":
            return False
        if isinstance(n, ast.Subscript) and not _is_tuple_index(n):
            return False
        if isinstance(n, ast.Call):
            name = tg_name(n)
            if name is None or name.startswith("atomic_"):
                return False
    return True


@dataclass
class Barrier:
    """Where the kernel calls ``tg.synchronize()``."""
    stmt: ast.stmt


@dataclass
class Segment:
    """Consecutive statements run by every work-item between two barriers."""
    stmts: list[ast.stmt]
    uses: set[str] = field(default_factory=set)
    evaluates: list[str] = field(default_factory=list)   # per-item values group code needs


@dataclass
class GroupStmt:
    """A statement run once per workgroup: a uniform assignment, or control flow holding
    barriers (whose bodies are again lists of Segment/GroupStmt)."""
    stmt: ast.stmt
    blocks: list[list] = field(default_factory=list)
    header: str | None = None   # the control line, when its values were computed per item
    values: list[str] = field(default_factory=list)     # those values, in header order


class BarrierPlan:
    """How a kernel with barriers splits into per-work-item segments and group-level
    statements (run once per workgroup), and which locals each backend must keep per item.

    Built once per typed kernel; backends turn it into code: the CPU runs each segment as a
    loop over the group's work-items, a GPU guards each segment and puts a barrier between.
    """

    def __init__(self, tk: TypedKernel, body: list[ast.stmt], decls: list[ast.stmt],
                 written: list[ast.stmt] | None = None):
        self.tk = tk
        self.ir = tk.ir
        self.decls = decls
        self.tuples = self.tuple_names()
        uniform = self.uniform_names(body, decls)
        self.uniform = uniform
        # decided on the body as ``written`` when a backend dropped barriers from it: a name
        # assigned first thing after a barrier would become group-level, and each of its
        # assignments would split the work-item loop (cpu/phases.py)
        self.hoisted = self.group_level_names(written or body, uniform)
        self.runtime_values: dict[str, str] = {}   # name -> dtype, computed per item
        self.blocks = self.structure(body, uniform)
        # a loop run at group level sets its variable at group level, also when its bounds
        # were computed per work-item (adjoints): never a per-item slot to reload it from
        self.hoisted |= {g.stmt.target.id for g in _group_stmts(self.blocks)
                         if isinstance(g.stmt, ast.For) and isinstance(g.stmt.target, ast.Name)}
        self.segments = list(segments_of(self.blocks))
        self.cheap = self.cheap_locals(body, self.hoisted)
        self.exposed: set[str] = set()
        for seg in self.segments:
            seg.uses = set().union(*(names_in(s) for s in seg.stmts)) if seg.stmts else set()
            self.exposed |= upward_exposed(seg.stmts)
        self.check_returns()

    def fail(self, node: ast.AST, message: str) -> KernelSyntaxError:
        return located(node, self.ir.filename, message)

    def check_returns(self) -> None:
        """No segment may leave early: a return before a later barrier, or a break/continue
        out of a loop that holds a barrier, would make work-items skip barriers."""
        def walk(stmts: list[ast.stmt], depth: int) -> None:
            for s in stmts:
                if isinstance(s, (ast.Break, ast.Continue)) and depth == 0:
                    raise self.fail(s, f"{type(s).__name__.lower()} here would leave a loop "
                                       "that contains tg.synchronize(); such loops must run "
                                       "the same iterations for every work-item of a group")
                if isinstance(s, (ast.For, ast.While)):
                    walk(s.body, depth + 1)
                elif isinstance(s, ast.If):
                    walk(s.body, depth)
                    walk(s.orelse, depth)
        for seg in self.segments:
            walk(seg.stmts, 0)
        blocks = self.blocks
        for b in blocks[:-1] + [blk for blk in blocks[-1:] if not isinstance(blk, Segment)]:
            for seg in segments_of([b]):
                for node in ast.walk(ast.Module(body=seg.stmts, type_ignores=[])):
                    if isinstance(node, ast.Return):
                        raise self.fail(node, "return before a later tg.synchronize() is not "
                                              "supported: every work-item must reach each "
                                              "barrier; put the rest of the work under an if")

    def uniform_names(self, body: list[ast.stmt], decls: list[ast.stmt]) -> set[str]:
        """Names with one value per workgroup: arguments, local memory, group-level loop
        variables, and locals only ever assigned uniform values at group level.  A tuple
        assignment is judged name by name (see ``assigned_values``)."""
        uniform = set(self.ir.params) | {s.targets[0].id for s in decls
                                         if memory_decl(s) == "localmem"}
        # name -> the expressions each of its group-level assignments computes it from
        group_assigns: dict[str, list[list[ast.expr]]] = {}
        unpacks: list[set[str]] = []    # names set together by one tuple value
        declared: set[str] = set()
        anywhere: dict[str, int] = {}
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                anywhere[node.id] = anywhere.get(node.id, 0) + 1

        def visit(stmts: list[ast.stmt]) -> None:
            for s in stmts:
                values = assigned_values(s)
                if memory_decl(s):
                    declared.add(s.targets[0].id)   # an array, not a value
                elif values:
                    for name, value in values.items():
                        group_assigns.setdefault(name, []).append([value])
                    if _unpacks_whole(s):
                        unpacks.append(set(values))
                elif contains_barrier(s) and isinstance(s, (ast.If, ast.While)):
                    visit(s.body)
                    visit(s.orelse)
                elif contains_barrier(s) and isinstance(s, ast.For):
                    group_assigns.setdefault(s.target.id, []).append(list(s.iter.args))
                    visit(s.body)
        visit(body)
        candidates = {n for n, assigns in group_assigns.items()
                      if len(assigns) == anywhere.get(n, 0) and n not in self.ir.params
                      and n not in declared}
        uniform |= candidates
        changed = True
        while changed:
            changed = False
            for n in sorted(candidates & uniform):
                if not all(is_uniform(v, uniform, self.tuples)
                           for values in group_assigns[n] for v in values):
                    uniform.discard(n)
                    changed = True
            for names in unpacks:
                if names & uniform and not names <= uniform:
                    uniform -= names
                    changed = True
        return uniform

    def tuple_names(self) -> set[str]:
        """Arguments and locals that hold tuples (whose elements ``is_uniform`` may read)."""
        params = dict(zip(self.ir.params, self.tk.argtypes))
        return {n for n, t in {**params, **self.tk.locals}.items() if isinstance(t, TupleT)}

    def group_level_names(self, body: list[ast.stmt], uniform: set[str]) -> set[str]:
        """The uniform locals computed once per group: those that group-level control flow
        (loops and branches holding barriers) needs, directly or through other such locals.
        Other uniform locals stay ordinary work-item locals, so they do not split loops."""
        assigns: dict[str, list[ast.expr]] = {}   # name -> the values it is assigned from
        unpacks: dict[str, set[str]] = {}         # name -> the names one tuple value sets
        needed: set[str] = set()

        def visit(stmts: list[ast.stmt]) -> None:
            for s in stmts:
                values = assigned_values(s)
                whole = _unpacks_whole(s)
                for name, value in values.items():
                    assigns.setdefault(name, []).append(value)
                    if whole:
                        unpacks.setdefault(name, set()).update(values)
                if contains_barrier(s) and isinstance(s, (ast.For, ast.While, ast.If)):
                    exprs = s.iter.args if isinstance(s, ast.For) else [s.test]
                    for e in exprs:
                        needed.update(names_in(e))
                    if isinstance(s, ast.For):
                        needed.add(s.target.id)
                    # uniform values set at the top of a group-level body (a reverse loop's
                    # counter) are computed there once, where no segment has begun to split
                    for first in s.body:
                        if _single_target(first) is None:
                            break
                        needed.add(_single_target(first))
                    visit(s.body)
                    visit(s.orelse)
        visit(body)
        params = set(self.ir.params)
        todo = list(needed)
        while todo:
            name = todo.pop()
            # ``n, m = A.shape`` is computed once per group as a whole when one of its names
            # is needed (its names are uniform together), so all of them are group-level
            deps = set().union(*(names_in(v) for v in assigns.get(name, []))) | \
                unpacks.get(name, set())
            for dep in deps - needed:
                needed.add(dep)
                todo.append(dep)
        return (needed & uniform) | (uniform & (params | set(self.tk.locals) - set(assigns)))

    def cheap_locals(self, body: list[ast.stmt], uniform: set[str]) -> dict[str, ast.Assign]:
        """Item locals assigned once, at top level, from indices only: recomputed, not stored."""
        counts: dict[str, int] = {}
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                counts[node.id] = counts.get(node.id, 0) + 1
        cheap: dict[str, ast.Assign] = {}
        for s in body:
            if not isinstance(s, ast.Assign) or memory_decl(s):
                continue
            target = s.targets[0]
            names = [e.id for e in target.elts] if isinstance(target, ast.Tuple) else \
                [getattr(target, "id", None)]
            # only unchanging inputs: arguments never reassigned, and earlier cheap locals
            fixed = {p for p in self.ir.params if p not in counts}
            if (None not in names and all(counts.get(n) == 1 and n not in uniform for n in names)
                    and is_index_only(s.value, fixed | set(cheap))):
                for n in names:
                    cheap[n] = s
        return cheap

    def recomputed(self, segment: Segment) -> list[ast.stmt]:
        """The cheap locals' assignments a segment must redo, with what they depend on, in
        the kernel's order."""
        wanted: set[str] = set()
        todo = [n for n in segment.uses if n in self.cheap]
        while todo:
            n = todo.pop()
            if n in wanted:
                continue
            wanted.add(n)
            todo.extend(d for d in names_in(self.cheap[n].value) if d in self.cheap)
        out: list[ast.stmt] = []
        for n, s in self.cheap.items():   # insertion order is the kernel's order
            if n in wanted and s not in segment.stmts and s not in out:
                out.append(s)
        return out

    def structure(self, stmts: list[ast.stmt], uniform: set[str]) -> list:
        blocks: list = []
        pending: list[ast.stmt] = []

        def flush() -> None:
            if pending:
                blocks.append(Segment(list(pending)))
                pending.clear()

        for s in stmts:
            if memory_decl(s):
                continue
            if is_barrier(s):
                flush()
                blocks.append(Barrier(s))
            elif contains_barrier(s):
                flush()
                blocks.extend(self.group_control(s, uniform))
            elif set(assigned_values(s)) & self.hoisted:
                flush()
                group, item = self.split_assignment(s)
                blocks.extend(GroupStmt(g) for g in group)
                pending.extend(item)
            else:
                pending.append(s)
        flush()
        return blocks

    def split_assignment(self, s: ast.stmt) -> tuple[list[ast.stmt], list[ast.stmt]]:
        """``s``, which sets a group-level name, as (statements run once per group, statements
        run per work-item).  Only a tuple display mixing both kinds is split, one assignment
        per name: ``a, b = (m, i)`` with a group-level becomes ``a = m`` for the group and
        ``b = i`` per item (``assigned_values`` pairs names and elements only when the display
        reads none of the names it sets, so the order of the two does not matter)."""
        values = assigned_values(s)
        if set(values) <= self.hoisted:
            return [s], []
        # the names of a whole unpacked tuple are hoisted together (group_level_names), so
        # here the value is a display and each name has its own element
        group: list[ast.stmt] = []
        item: list[ast.stmt] = []
        for target, value in zip(s.targets[0].elts, s.value.elts):
            one = ast.copy_location(ast.Assign(targets=[target], value=value), s)
            (group if target.id in self.hoisted else item).append(one)
        return group, item

    def group_control(self, s: ast.stmt, uniform: set[str]) -> list:
        """Blocks for control flow that holds a barrier (run once per group).

        In the user's kernels its condition or bounds must be provably uniform.  Kernels made
        by a transform (adjoints) restore values per work-item, which no syntactic rule can
        see are uniform; there each work-item computes the values and work-item 0's are used.
        """
        why = ("must have the same value for every work-item of the group, because the "
               "statement contains tg.synchronize(); use only kernel arguments, constants, "
               "array shapes, tg.groupsize(), group indices and locals computed from them")
        exprs = s.iter.args if isinstance(s, ast.For) else [getattr(s, "test", None)]
        if not isinstance(s, (ast.For, ast.While, ast.If)):
            raise self.fail(s, "tg.synchronize() may only appear as a statement of its own, at "
                               "the top level or inside for/while/if whose condition is uniform")
        varying = [e for e in exprs if not is_uniform(e, uniform, self.tuples)]
        if varying and not self.ir.generated:
            what = "bounds of this loop" if isinstance(s, ast.For) else (
                "condition of this loop" if isinstance(s, ast.While) else "condition of this if")
            raise self.fail(varying[0], f"the {what} {why}")
        if not varying:
            if isinstance(s, ast.If):
                return [GroupStmt(s, [self.structure(s.body, uniform),
                                      self.structure(s.orelse, uniform)])]
            return [GroupStmt(s, [self.structure(s.body, uniform)])]
        names = []
        evaluate = []
        for e in exprs:
            name = f"_group_value{len(self.runtime_values)}"
            self.runtime_values[name] = "bool" if isinstance(s, (ast.While, ast.If)) else "int64"
            names.append(name)
            evaluate.append(ast.copy_location(ast.Assign(targets=[ast.Name(id=name, ctx=ast.Store())],
                                                         value=e), s))
        # the control line reads the values each backend shares: "{0}", "{1}"... stand for them
        slots = [f"{{{k}}}" for k in range(len(names))]
        if isinstance(s, ast.For):
            header = f"for {s.target.id} in range({', '.join(slots)}):"
            return [Segment(evaluate, evaluates=names),
                    GroupStmt(s, [self.structure(s.body, uniform)], header, names)]
        if isinstance(s, ast.While):
            body = self.structure(s.body, uniform) + [Segment(list(evaluate), evaluates=names)]
            return [Segment(evaluate, evaluates=names), GroupStmt(s, [body], "while {0}:", names)]
        return [Segment(evaluate, evaluates=names),
                GroupStmt(s, [self.structure(s.body, uniform), self.structure(s.orelse, uniform)],
                          "if {0}:", names)]

def check_barrier_rules(tk: TypedKernel) -> None:
    """Raise the user's error if ``tk``, a kernel as written, breaks the rules of barriers
    (bounds and conditions the same for the whole group, no early exit past a barrier).
    Kernels made from it by a transform are exempt from those checks (their restored values
    are uniform where no syntactic rule can see it), so the modes that launch only such
    kernels (an adjoint, a tangent) check the user's kernel first."""
    body = tk.ir.body
    if any(contains_barrier(s) for s in body):
        BarrierPlan(tk, [s for s in body if not memory_decl(s)],
                    [s for s in body if memory_decl(s)])


def _group_stmts(blocks: list):
    """Every GroupStmt in ``blocks``, nested ones too."""
    for b in blocks:
        if isinstance(b, GroupStmt):
            yield b
            for inner in b.blocks:
                yield from _group_stmts(inner)


def _single_target(s: ast.stmt) -> str | None:
    """The name assigned by ``x = ...`` or ``x op= ...``, else None."""
    if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name):
        return s.targets[0].id
    if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
        return s.target.id
    return None


def segments_of(blocks: list):
    for b in blocks:
        if isinstance(b, Segment):
            yield b
        elif isinstance(b, GroupStmt):
            for inner in b.blocks:
                yield from segments_of(inner)


def device_functions(tk: TypedKernel) -> list[TypedKernel]:
    """Every device-function specialisation ``tk`` reaches, callees before callers; each gets
    its ``symbol`` (two different functions of the same name get distinct ones)."""
    seen: dict[tuple, TypedKernel] = {}
    symbols: set[str] = set()

    def visit(k: TypedKernel) -> None:
        for callee in k.callees.values():
            key = (id(callee.ir), callee.argtypes)
            if key in seen:
                callee.symbol = seen[key].symbol
                continue
            visit(callee)
            base = sym = func_symbol(callee)
            n = 1
            while sym in symbols:
                n += 1
                sym = f"{base}_{n}"
            symbols.add(sym)
            callee.symbol = sym
            seen[key] = callee
    visit(tk)
    return list(seen.values())


