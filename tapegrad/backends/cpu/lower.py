"""Lower a typed kernel to a Numba CPU function.

Each workgroup is one iteration of a ``numba.prange`` loop (one parallel task); its work-items
are an ordinary loop inside it.  A barrier (``tg.synchronize()``) splits the work-item loop in
two (loop fission): every item finishes the part before the barrier before any item starts the
part after it.  A local that lives across a barrier gets one slot per work-item (a *promoted*
local, ``x__items[_li]``), unless it is cheap to recompute (an index), in which case each part
recomputes it.  Statements that contain barriers run once per workgroup, so their conditions
and loop bounds must be the same for every work-item of the group (checked here).

Generated layout (1-D, groupsize 256):

    @numba.njit(parallel=True, cache=True)
    def saxpy(Y, a, X, _n0, _groups0):
        for _g in numba.prange(_groups0):
            _g0 = _g
            _lim0 = min(256, _n0 - _g0 * 256)      # work-items past ndrange never run
            for _l0 in range(_lim0):
                i = _g0 * 256 + _l0
                Y[i] = a * X[i] + Y[i]
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from tapegrad.backends.numba_lower import ExprLowering, Printer, emit_statements, func_symbol
from tapegrad.errors import KernelSyntaxError, located
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import TypedKernel

ATOMICS = ("atomic_add", "atomic_sub", "atomic_min", "atomic_max")


@dataclass
class Lowered:
    """A generated module: its source, the kernel's symbol and the line map for errors."""

    source: str
    symbol: str
    user_line: dict[int, int]
    filename: str


# -- analysis helpers ----------------------------------------------------------------------

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


def is_uniform(node: ast.expr, uniform: set[str]) -> bool:
    """True if ``node`` has the same value for every work-item of a workgroup."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id not in uniform and n.id != "tg":
            return False
        if isinstance(n, ast.Subscript) and not _is_tuple_index(n):
            return False   # memory may differ between reads; treat element reads as varying
        if isinstance(n, ast.Call):
            name = tg_name(n)
            if name is None or name in _ITEM_CALLS or name.startswith("atomic_"):
                return False
    return True


def _is_tuple_index(n: ast.Subscript) -> bool:
    return isinstance(n.value, ast.Attribute) and n.value.attr == "shape" or (
        isinstance(n.value, ast.Call) and tg_name(n.value) in _UNIFORM_CALLS)


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


# -- structure of a kernel with barriers -----------------------------------------------------

@dataclass
class Segment:
    """Consecutive statements run by every work-item between two barriers."""
    stmts: list[ast.stmt]
    uses: set[str] = field(default_factory=set)


@dataclass
class GroupStmt:
    """A statement run once per workgroup: a uniform assignment, or control flow holding
    barriers (whose bodies are again lists of Segment/GroupStmt)."""
    stmt: ast.stmt
    blocks: list[list] = field(default_factory=list)
    header: str | None = None   # the control line, when its values were computed per item


class CPULowering(ExprLowering):
    def __init__(self, tk: TypedKernel, promoted: set[str] | None = None):
        super().__init__(tk)
        self.promoted = promoted or set()
        self.rank = tk.rank
        self.W = tk.groupsize

    def load_name(self, node: ast.Name) -> ast.expr:
        if node.id in self.promoted:
            return ast.Subscript(value=ast.Name(id=f"{node.id}__items", ctx=ast.Load()),
                                 slice=ast.Name(id="_li", ctx=ast.Load()), ctx=ast.Load())
        return ast.Name(id=node.id, ctx=ast.Load())

    def atomic_symbol(self, name: str) -> str:
        return name

    def index_expr(self, name: str, node: ast.Call) -> ast.expr:
        r, W = self.rank, self.W
        glob = [f"(_g{d} * {W[d]} + _l{d})" for d in range(r)]
        if name == "global_indices":
            text = "(" + ", ".join(glob) + ",)"
        elif name == "global_index":
            text = glob[0] if r == 1 else _row_major(glob, [f"_n{d}" for d in range(r)])
        elif name == "local_indices":
            text = "(" + ", ".join(f"_l{d}" for d in range(r)) + ",)"
        elif name == "local_index":
            text = _row_major([f"_l{d}" for d in range(r)], [str(w) for w in W])
        elif name == "group_indices":
            text = "(" + ", ".join(f"_g{d}" for d in range(r)) + ",)"
        elif name == "group_index":
            text = "_g"
        elif name == "ndrange":
            text = "(" + ", ".join(f"_n{d}" for d in range(r)) + ",)"
        else:  # groupsize
            text = "(" + ", ".join(str(w) for w in W) + ",)"
        return ast.parse(text, mode="eval").body


def _row_major(idx: list[str], dims: list[str]) -> str:
    text = idx[0]
    for d in range(1, len(idx)):
        text = f"({text}) * {dims[d]} + {idx[d]}"
    return text


def lower_kernel(tk: TypedKernel) -> Lowered:
    """Generate the Numba module for one specialised kernel."""
    return _KernelWriter(tk).write()


class _KernelWriter:
    def __init__(self, tk: TypedKernel):
        self.tk = tk
        self.ir = tk.ir
        self.out = Printer(tk.ir.filename)
        self.rank = tk.rank
        self.W = tk.groupsize

    def fail(self, node: ast.AST, message: str) -> KernelSyntaxError:
        return located(node, self.ir.filename, message)

    # -- the whole module ---------------------------------------------------------------
    def write(self) -> Lowered:
        out, ir = self.out, self.ir
        out.emit(f"# Generated by tapegrad from {ir.name} ({ir.filename}:{ir.lineno}) for the "
                 f"CPU: rank {self.rank}, groupsize {self.W}.", 0)
        out.emit("# Read it to see what runs; edits are overwritten.", 0)
        out.emit("import math", 0)
        out.emit("import numba", 0)
        out.emit("import numpy as np", 0)
        out.emit("from tapegrad.backends.cpu.atomics import " + ", ".join(ATOMICS), 0)
        for callee in _device_functions(self.tk):
            out.blank()
            out.blank()
            self.write_function(callee)
        out.blank()
        out.blank()
        self.write_kernel()
        return Lowered(out.source(), ir.name, out.user_line, ir.filename)

    def write_function(self, callee: TypedKernel) -> None:
        out = self.out
        out.emit(f"@numba.njit(cache=True, nogil=True{_checks()})", 0)
        out.emit(f"def {callee.symbol}({', '.join(callee.ir.params)}):", 0)
        emit_statements(callee.ir.body, CPULowering(callee), out, 1)

    def write_kernel(self) -> None:
        out, ir, r, W = self.out, self.ir, self.rank, self.W
        params = ir.params + [f"_n{d}" for d in range(r)] + [f"_groups{d}" for d in range(r)]
        debug = bool(_checks())   # bounds checks run serially: Numba cannot raise from threads
        out.emit(f"@numba.njit(parallel={not debug}, cache=True, nogil=True{_checks()})", 0)
        out.emit(f"def {ir.name}({', '.join(params)}):", 0)
        total = " * ".join(f"_groups{d}" for d in range(r))
        out.emit(f"for _g in {'range' if debug else 'numba.prange'}({total}):", 1)
        # the group's position in the group grid (row-major) and its number of valid items
        rest = "_g"
        for d in range(r - 1, -1, -1):
            if d == 0:
                out.emit(f"_g0 = {rest}", 2)
            else:
                out.emit(f"_g{d} = {rest} % _groups{d}", 2)
                out.emit(f"_r{d} = {rest} // _groups{d}", 2)
                rest = f"_r{d}"
        for d in range(r):
            out.emit(f"_lim{d} = min({W[d]}, _n{d} - _g{d} * {W[d]})", 2)

        body = ir.body
        self.group_sums = [n for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                           if isinstance(n, ast.Expr) and tg_name(n.value) == "group_reduce_add"]
        for k, _ in enumerate(self.group_sums):
            out.emit(f"_group_sum{k} = 0.0", 2)
        decls = [s for s in body if memory_decl(s)]
        for s in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(s, ast.stmt) and memory_decl(s) and s not in decls:
                raise self.fail(s, "declare tg.localmem / tg.private at the top level of the "
                                   "kernel body, not inside a loop or a branch")
        if any(contains_barrier(s) for s in body):
            self.write_with_barriers(body, decls)
        else:
            for s in decls:
                self.allocate(s, per_item=False)
            stmts = [s for s in body if not memory_decl(s)]
            low = CPULowering(self.tk)
            self.item_loop(stmts, low, 2, set())
        for k, call in enumerate(self.group_sums):   # one atomic per workgroup
            low = CPULowering(self.tk)
            arr, idx = call.value.args[0], call.value.args[1]
            out.emit(f"atomic_add({ast.unparse(low.expr(arr))}, {ast.unparse(low.index(idx))}, "
                     f"_group_sum{k})", 2)

    def special(self, s: ast.stmt, depth: int, low: CPULowering) -> bool:
        """``tg.group_reduce_add(arr, idx, v)``: add v to the group's private sum; the sum goes
        into arr[idx] with one atomic when the group is done."""
        if isinstance(s, ast.Expr) and tg_name(s.value) == "group_reduce_add":
            k = next(k for k, c in enumerate(self.group_sums) if c is s)
            self.out.emit(f"_group_sum{k} += {ast.unparse(low.expr(s.value.args[2]))}", depth)
            return True
        return False

    def allocate(self, s: ast.Assign, per_item: bool) -> None:
        dtype, shape = self.tk.static_shapes[id(s.value)]
        name = s.targets[0].id
        self.out.at(s, 2)
        if per_item:
            total = 1
            for w in self.W:
                total *= w
            self.out.emit(f"{name}__items = np.empty({(total,) + shape}, np.{dtype})", 2)
        else:
            self.out.emit(f"{name} = np.empty({shape}, np.{dtype})", 2)

    # -- work-item loops ----------------------------------------------------------------
    def item_loop(self, stmts: list[ast.stmt], low: CPULowering, depth: int,
                  rebind: set[str], recompute: list[ast.stmt] = ()) -> None:
        """Emit ``for _l... in range(_lim...)`` running ``stmts`` for each valid work-item."""
        out, r, W = self.out, self.rank, self.W
        if not stmts:
            return
        for d in range(r):
            out.emit(f"for _l{d} in range(_lim{d}):", depth + d)
        inner = depth + r
        needs_li = bool(low.promoted or rebind)
        if needs_li:
            out.emit(f"_li = {_row_major([f'_l{d}' for d in range(r)], [str(w) for w in W])}",
                     inner)
        for name in sorted(rebind):
            out.emit(f"{name} = {name}__items[_li]", inner)
        body = list(recompute) + list(stmts)
        body, needs_flag = _eliminate_returns(body)
        if needs_flag:
            out.emit("_returned = False", inner)
        self._check_no_loop_exits(body)
        emit_statements(body, low, out, inner, lambda s, d: self.special(s, d, low))

    def _check_no_loop_exits(self, body: list[ast.stmt]) -> None:
        """break/continue must have their loop inside the same work-item loop."""
        def walk(stmts: list[ast.stmt], depth: int) -> None:
            for s in stmts:
                if isinstance(s, (ast.Break, ast.Continue)) and depth == 0 and not getattr(
                        s, "_tg_item_exit", False):
                    raise self.fail(s, f"{type(s).__name__.lower()} here would leave a loop "
                                       "that contains tg.synchronize(); such loops must run "
                                       "the same iterations for every work-item of a group")
                if isinstance(s, (ast.For, ast.While)):
                    walk(s.body, depth + 1)
                elif isinstance(s, ast.If):
                    walk(s.body, depth)
                    walk(s.orelse, depth)
        walk(body, 0)

    # -- kernels with barriers ----------------------------------------------------------
    def write_with_barriers(self, body: list[ast.stmt], decls: list[ast.stmt]) -> None:
        uniform = self.uniform_names(body, decls)
        self.hoisted = self.group_level_names(body, uniform)
        self.runtime_values: dict[str, str] = {}
        blocks = self.structure(body, uniform)
        segments = list(_segments(blocks))
        cheap = self.cheap_locals(body, self.hoisted)
        users: dict[str, int] = {}
        exposed: set[str] = set()
        for seg in segments:
            seg.uses = set().union(*(names_in(s) for s in seg.stmts)) if seg.stmts else set()
            exposed |= upward_exposed(seg.stmts)
            for name in seg.uses:
                users[name] = users.get(name, 0) + 1
        local_arrays = {s.targets[0].id for s in decls}
        private = {s.targets[0].id for s in decls if memory_decl(s) == "private"}
        item_locals = set(self.tk.locals) - self.hoisted - local_arrays
        # a local needs a slot per work-item when some part reads a value from before it
        # began: another part wrote it, or the same part in an earlier loop iteration
        promoted = {n for n in item_locals if n in exposed and n not in cheap}
        promoted |= set(self.runtime_values)
        for n in sorted(promoted - set(self.runtime_values)):
            t = self.tk.locals[n]
            if not hasattr(t, "dtype"):
                stmt = next(s for s in ast.walk(ast.Module(body=body, type_ignores=[]))
                            if isinstance(s, ast.Name) and s.id == n)
                raise self.fail(stmt, f"{n} holds a tuple and lives across tg.synchronize(); "
                                      "unpack it into scalars (a, b = t) before the barrier")
        total = 1
        for w in self.W:
            total *= w
        for n in sorted(promoted):
            dtype = self.runtime_values.get(n) or self.tk.locals[n].dtype
            self.out.emit(f"{n}__items = np.empty({total}, np.{dtype})", 2)
        for s in decls:
            self.allocate(s, per_item=memory_decl(s) == "private")
        for b in blocks[:-1] + [blk for blk in blocks[-1:] if not isinstance(blk, Segment)]:
            for seg in _segments([b]):
                for node in ast.walk(ast.Module(body=seg.stmts, type_ignores=[])):
                    if isinstance(node, ast.Return):
                        raise self.fail(node, "return before a later tg.synchronize() is not "
                                              "supported: every work-item must reach each "
                                              "barrier; put the rest of the work under an if")
        low = CPULowering(self.tk, promoted)
        self.cheap = cheap
        self.private = private
        self.write_blocks(blocks, low, 2)

    def uniform_names(self, body: list[ast.stmt], decls: list[ast.stmt]) -> set[str]:
        """Names with one value per workgroup: arguments, local memory, group-level loop
        variables, and locals only ever assigned uniform values at group level."""
        uniform = set(self.ir.params) | {s.targets[0].id for s in decls
                                         if memory_decl(s) == "localmem"}
        group_assigns: dict[str, list[ast.Assign]] = {}
        anywhere: dict[str, int] = {}
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                anywhere[node.id] = anywhere.get(node.id, 0) + 1

        def visit(stmts: list[ast.stmt]) -> None:
            for s in stmts:
                if _single_target(s):
                    group_assigns.setdefault(_single_target(s), []).append(s)
                elif contains_barrier(s) and isinstance(s, (ast.If, ast.While)):
                    visit(s.body)
                    visit(s.orelse)
                elif contains_barrier(s) and isinstance(s, ast.For):
                    group_assigns.setdefault(s.target.id, []).append(s)
                    visit(s.body)
        visit(body)
        candidates = {n for n, assigns in group_assigns.items()
                      if len(assigns) == anywhere.get(n, 0) and n not in self.ir.params
                      and not any(memory_decl(a) for a in assigns if isinstance(a, ast.Assign))}
        uniform |= candidates
        changed = True
        while changed:
            changed = False
            for n in sorted(candidates & uniform):
                for a in group_assigns[n]:
                    values = a.iter.args if isinstance(a, ast.For) else [a.value]
                    if not all(is_uniform(v, uniform) for v in values):
                        uniform.discard(n)
                        changed = True
                        break
        return uniform

    def group_level_names(self, body: list[ast.stmt], uniform: set[str]) -> set[str]:
        """The uniform locals computed once per group: those that group-level control flow
        (loops and branches holding barriers) needs, directly or through other such locals.
        Other uniform locals stay ordinary work-item locals, so they do not split loops."""
        assigns: dict[str, list[ast.stmt]] = {}
        needed: set[str] = set()

        def visit(stmts: list[ast.stmt]) -> None:
            for s in stmts:
                name = _single_target(s)
                if name is not None:
                    assigns.setdefault(name, []).append(s)
                if contains_barrier(s) and isinstance(s, (ast.For, ast.While, ast.If)):
                    exprs = s.iter.args if isinstance(s, ast.For) else [s.test]
                    for e in exprs:
                        needed.update(names_in(e))
                    if isinstance(s, ast.For):
                        needed.add(s.target.id)
                    visit(s.body)
                    visit(s.orelse)
        visit(body)
        params = set(self.ir.params)
        todo = list(needed)
        while todo:
            name = todo.pop()
            for a in assigns.get(name, []):
                for dep in names_in(a.value) - needed:
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
                blocks.append(Segment([]))   # marks the barrier: the next segment starts anew
            elif contains_barrier(s):
                flush()
                blocks.extend(self.group_control(s, uniform))
            elif _single_target(s) in self.hoisted:
                flush()
                blocks.append(GroupStmt(s))
            else:
                pending.append(s)
        flush()
        return [b for b in blocks if not (isinstance(b, Segment) and not b.stmts)]

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
        varying = [e for e in exprs if not is_uniform(e, uniform)]
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
        values = [f"{n}__items[0]" for n in names]
        if isinstance(s, ast.For):
            header = f"for {s.target.id} in range({', '.join(values)}):"
            return [Segment(evaluate), GroupStmt(s, [self.structure(s.body, uniform)], header)]
        if isinstance(s, ast.While):
            body = self.structure(s.body, uniform) + [Segment(list(evaluate))]
            return [Segment(evaluate), GroupStmt(s, [body], f"while {values[0]}:")]
        return [Segment(evaluate), GroupStmt(s, [self.structure(s.body, uniform),
                                                 self.structure(s.orelse, uniform)],
                                             f"if {values[0]}:")]

    def write_blocks(self, blocks: list, low: CPULowering, depth: int) -> None:
        out = self.out
        if not blocks:
            out.emit("pass", depth)
        for b in blocks:
            if isinstance(b, Segment):
                rebind = {n for n in self.private if n in b.uses}
                recompute = self.recomputed(b)
                self.item_loop(b.stmts, low, depth, rebind, recompute)
                continue
            s = b.stmt
            out.at(s, depth)
            if isinstance(s, (ast.Assign, ast.AugAssign)):
                emit_statements([s], low, out, depth)
            elif b.header is not None:
                out.emit(b.header, depth)
                self.write_blocks(b.blocks[0], low, depth + 1)
                if len(b.blocks) > 1 and b.blocks[1]:
                    out.emit("else:", depth)
                    self.write_blocks(b.blocks[1], low, depth + 1)
            elif isinstance(s, ast.For):
                args = ", ".join(ast.unparse(low.expr(a)) for a in s.iter.args)
                out.emit(f"for {s.target.id} in range({args}):", depth)
                self.write_blocks(b.blocks[0], low, depth + 1)
            elif isinstance(s, ast.While):
                out.emit(f"while {ast.unparse(low.expr(s.test))}:", depth)
                self.write_blocks(b.blocks[0], low, depth + 1)
            else:
                out.emit(f"if {ast.unparse(low.expr(s.test))}:", depth)
                self.write_blocks(b.blocks[0], low, depth + 1)
                if b.blocks[1]:
                    out.emit("else:", depth)
                    self.write_blocks(b.blocks[1], low, depth + 1)


def upward_exposed(stmts: list[ast.stmt]) -> set[str]:
    """Names that ``stmts`` may read before assigning them (so their value comes from before)."""
    exposed: set[str] = set()

    def reads(e: ast.AST | None, assigned: set[str]) -> None:
        if e is not None:
            exposed.update(n.id for n in ast.walk(e) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Load) and n.id not in assigned)

    def block(body: list[ast.stmt], assigned: set[str]) -> set[str]:
        assigned = set(assigned)
        for s in body:
            if isinstance(s, ast.Assign):
                reads(s.value, assigned)
                target = s.targets[0]
                if isinstance(target, ast.Subscript):
                    reads(target, assigned)
                else:
                    assigned |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(s, ast.AugAssign):
                reads(s.value, assigned)
                reads(s.target, assigned)
                if isinstance(s.target, ast.Name) and s.target.id not in assigned:
                    exposed.add(s.target.id)
            elif isinstance(s, ast.For):
                for a in s.iter.args:
                    reads(a, assigned)
                block(s.body, assigned | {s.target.id})
            elif isinstance(s, ast.While):
                reads(s.test, assigned)
                block(s.body, assigned)
            elif isinstance(s, ast.If):
                reads(s.test, assigned)
                assigned |= block(s.body, assigned) & block(s.orelse, assigned)
            else:
                reads(s, assigned)
        return assigned

    block(stmts, set())
    return exposed


def _single_target(s: ast.stmt) -> str | None:
    """The name assigned by ``x = ...`` or ``x op= ...``, else None."""
    if isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Name):
        return s.targets[0].id
    if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
        return s.target.id
    return None


def _checks() -> str:
    """``TAPEGRAD_BOUNDSCHECK=1`` compiles kernels with index checks (slower; for debugging)."""
    return ", boundscheck=True" if os.environ.get("TAPEGRAD_BOUNDSCHECK") == "1" else ""


def _segments(blocks: list):
    for b in blocks:
        if isinstance(b, Segment):
            yield b
        else:
            for inner in b.blocks:
                yield from _segments(inner)


def _device_functions(tk: TypedKernel) -> list[TypedKernel]:
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


def _eliminate_returns(body: list[ast.stmt]) -> tuple[list[ast.stmt], bool]:
    """Turn ``return`` in a work-item's code into leaving the work-item loop iteration.

    At loop depth 0 a return becomes ``continue`` (of the work-item loop); inside the user's
    loops it sets ``_returned`` and breaks, and each enclosing loop is followed by a check.
    """
    needs_flag = False

    def mark(node: ast.stmt) -> ast.stmt:
        node._tg_item_exit = True
        return node

    def rewrite(stmts: list[ast.stmt], depth: int) -> tuple[list[ast.stmt], bool]:
        nonlocal needs_flag
        out: list[ast.stmt] = []
        found = False
        for s in stmts:
            if isinstance(s, ast.Return):
                found = True
                if depth == 0:
                    out.append(ast.copy_location(mark(ast.Continue()), s))
                else:
                    needs_flag = True
                    flag = ast.parse("_returned = True").body[0]
                    out.append(ast.copy_location(flag, s))
                    out.append(ast.copy_location(ast.Break(), s))
                continue
            if isinstance(s, ast.If):
                body, f1 = rewrite(s.body, depth)
                orelse, f2 = rewrite(s.orelse, depth)
                new = ast.copy_location(ast.If(test=s.test, body=body, orelse=orelse), s)
                out.append(new)
                found |= f1 or f2
            elif isinstance(s, (ast.For, ast.While)):
                body, f = rewrite(s.body, depth + 1)
                new = (ast.For(target=s.target, iter=s.iter, body=body, orelse=[])
                       if isinstance(s, ast.For) else ast.While(test=s.test, body=body, orelse=[]))
                out.append(ast.copy_location(new, s))
                if f:
                    found = True
                    exit_stmt = mark(ast.Continue()) if depth == 0 else ast.Break()
                    check = ast.If(test=ast.Name(id="_returned", ctx=ast.Load()),
                                   body=[ast.copy_location(exit_stmt, s)], orelse=[])
                    out.append(ast.copy_location(check, s))
            else:
                out.append(s)
        return out, found

    new_body, _ = rewrite(body, 0)
    return new_body, needs_flag
