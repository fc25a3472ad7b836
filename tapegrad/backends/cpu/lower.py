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
import functools
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tapegrad.backends.cpu.definite import unassigned_locals
from tapegrad.backends.cpu.outline import outline_task
from tapegrad.backends.cpu.passes import Plan, bounds_checked, is_integral, plan
from tapegrad.backends.cpu.transposed import SUFFIX, derived_params
from tapegrad.backends.cpu.versioning import Versions, plan_versions
from tapegrad.backends.numba_lower import (
    GridLowering,
    ModuleWriter,
    emit_statements,
    helper_lines,
    helpers_used,
    row_major,
)
from tapegrad.backends.structure import (
    Barrier,
    BarrierPlan,
    Segment,
    contains_barrier,
    device_functions,
    memory_decl,
)
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, Scalar, TypedKernel

ATOMICS = ("atomic_add", "atomic_sub", "atomic_min", "atomic_max")
BAND = 8      # rows of workgroups a tiled 2-D kernel runs down before the next column
EDGE_COLUMNS = 32   # at most this many columns per row go to the column pass (split_item_loop)


@dataclass
class Lowered:
    """A generated module: its source, the kernel's symbol and the line map for errors."""

    source: str
    symbol: str
    user_line: dict[int, int]
    filename: str
    # (argument position, ndim) of each array whose atomics add into per-thread copies: the
    # launcher passes those copies (all zero; the kernel leaves them zero)
    pools: tuple = ()
    passes: str = ""      # what the CPU's passes did (passes.Plan.describe)


_MERGE_BLOCK = 4096     # at most this many elements per parallel task merging 1-D copies


class CPULowering(GridLowering):
    """The CPU's expressions: promoted locals and private arrays in per-work-item slots,
    float32 powers through vmath, plain adds for atomics on memory one thread owns."""

    def __init__(self, tk: TypedKernel, promoted: set[str] | None = None,
                 per_item: set[str] | None = None):
        super().__init__(tk)
        self.promoted = promoted or set()
        self.per_item = per_item or set()     # private arrays with a slot per work-item

    def expr_Subscript(self, node: ast.Subscript) -> ast.expr:
        """``p[k]`` of a per-work-item private array is ``p__items[k, _li]``: indexing the
        slot directly, where a view per work-item would cost reference counting, with the
        work-item index last so that consecutive work-items touch consecutive elements
        (measured: docs/performance.md, 'Measurements behind the code')."""
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.per_item:
            idx = self.index(node.slice)
            parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
            return ast.Subscript(value=ast.Name(id=f"{base.id}__items", ctx=ast.Load()),
                                 slice=ast.Tuple(elts=parts + [ast.Name(id="_li", ctx=ast.Load())],
                                                 ctx=ast.Load()), ctx=ast.Load())
        return super().expr_Subscript(node)

    def load_name(self, node: ast.Name) -> ast.expr:
        if node.id in self.promoted:
            return ast.Subscript(value=ast.Name(id=f"{node.id}__items", ctx=ast.Load()),
                                 slice=ast.Name(id="_li", ctx=ast.Load()), ctx=ast.Load())
        return ast.Name(id=node.id, ctx=ast.Load())

    def atomic_symbol(self, name: str) -> str:
        return name

    vector_pow = True      # float32 x ** y through vmath.pow (CUDA keeps its own powf)

    def float32_pow(self, node: ast.expr, base: ast.expr, exponent: ast.expr) -> ast.expr | None:
        """``vmath.pow(base, exponent)`` when ``node`` is a float32 power with a float
        exponent (libm's powf is a call per element, which stops LLVM vectorising the loop);
        None otherwise."""
        t = self.T(node)
        if not (self.vector_pow and isinstance(t, Scalar) and t.dtype == "float32"
                and self.T(exponent).is_float):
            return None
        return ast.Call(func=ast.Attribute(value=ast.Name(id="vmath", ctx=ast.Load()),
                                           attr="pow", ctx=ast.Load()),
                        args=[self.coerce(base, t), self.coerce(exponent, t)], keywords=[])

    def expr_BinOp(self, node: ast.BinOp) -> ast.expr:
        if isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant) and node.right.value in (2, 3)):
            call = self.float32_pow(node, node.left, node.right)
            if call is not None:
                return call
        return super().expr_BinOp(node)

    def expr_Call(self, node: ast.Call) -> ast.expr:
        name = tg_name(node)
        if name == "pow" and len(node.args) == 2:
            call = self.float32_pow(node, node.args[0], node.args[1])
            if call is not None:
                return call
        if name and name.startswith("atomic_"):
            array_t = self.T(node.args[0])
            if isinstance(array_t, Array) and array_t.space != "global":   # one thread per group
                call = super().expr_Call(node)
                call.func = ast.Name(id=f"plain_{name[len('atomic_'):]}", ctx=ast.Load())
                return call
        return super().expr_Call(node)


@functools.cache
def vmath_version() -> str:
    """A digest of the vmath package, written into every generated module: its functions
    are inlined into the kernels, so a change to them must change the module (and Numba's
    cache key)."""
    from tapegrad.backends.cpu import vmath
    digest = hashlib.sha256()
    for path in sorted(Path(vmath.__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def lower_kernel(tk: TypedKernel, off: frozenset[str] = frozenset()) -> Lowered:
    """Generate the Numba module for one specialised kernel, without the passes in ``off``
    (passes.py)."""
    return _KernelWriter(tk, plan(tk, off)).write()


class _KernelWriter(ModuleWriter):
    """Writes the module as the passes' plan says (passes.py); what it keeps of its own is
    where it is in the writing."""

    # arrays known, in the loop being written, to add into per-thread copies (True) or with
    # atomics (False); the others choose per statement
    known_private: dict[str, bool] = {}
    # edge-column passes to emit after the group loop (split_item_loop), where they may run
    column_passes: list[Callable[[int], None]] | None = None

    def __init__(self, tk: TypedKernel, plan: Plan):
        super().__init__(tk)
        self.plan = plan

    # -- the whole module ---------------------------------------------------------------
    def write(self) -> Lowered:
        out, ir = self.out, self.ir
        out.emit(f"# Generated by tapegrad from {ir.name} ({ir.filename}:{ir.lineno}) for the "
                 f"CPU: rank {self.rank}, groupsize {self.W}.", 0)
        if self.tk.launch_groupsize:
            out.emit(f"# Launched with groupsize {self.tk.launch_groupsize}: the kernel cannot tell "
                     "its workgroups apart, so the CPU runs it in longer rows "
                     "(tapegrad/backends/cpu/rows.py).", 0)
        out.emit("# Read it to see what runs; edits are overwritten.  The CPU passes:", 0)
        for line in self.plan.describe().splitlines():
            out.emit(f"#   {line}", 0)
        out.emit("import math", 0)
        out.emit("import numba", 0)
        out.emit("import numpy as np", 0)
        out.emit(f"from tapegrad.backends.cpu import vmath  # version {vmath_version()}", 0)
        out.emit("from tapegrad.backends.cpu.atomics import " + ", ".join(ATOMICS), 0)
        out.emit("from tapegrad.backends.cpu.atomics import " + ", ".join(
            f"plain_{a[len('atomic_'):]}" for a in ATOMICS), 0)
        out.emit("from tapegrad.backends.cpu.sums import group_sum", 0)
        out.emit("from tapegrad.backends.cpu.copies import aligned_empty, transposed", 0)
        for row in helpers_used([self.tk, *device_functions(self.tk)], CPULowering.target):
            out.blank()
            out.blank()
            out.emit(f"@numba.njit(cache=True, nogil=True{_checks()})", 0)
            for line in helper_lines(row, CPULowering.target):
                out.emit(line, 0)
        for callee in device_functions(self.tk):
            out.blank()
            out.blank()
            self.write_function(callee)
        out.blank()
        out.blank()
        self.write_kernel()
        pools = tuple((ir.params.index(a), nd) for a, nd in self.plan.private_sums.items())
        return Lowered(out.source(), ir.name, out.user_line, ir.filename, pools,
                       self.plan.describe())

    def write_function(self, callee: TypedKernel) -> None:
        out = self.out
        out.emit(f"@numba.njit(cache=True, nogil=True{_checks()})", 0)
        out.emit(f"def {callee.symbol}({', '.join(callee.ir.params)}):", 0)
        emit_statements(callee.ir.body, CPULowering(callee), out, 1)

    def write_kernel(self) -> None:
        """The kernel: ``_nchunks`` parallel tasks (one per thread), each running a contiguous
        run of workgroups, with its scratch memory (local memory, per-item slots, adjoint
        stacks) allocated once per task rather than once per group."""
        out, ir, r = self.out, self.ir, self.rank
        debug = bounds_checked()   # bounds checks run serially: Numba cannot raise from threads
        derived = derived_params(ir.params)     # made here, not passed (transposed.py)
        params = ([p for p in ir.params if p not in derived] + [f"_n{d}" for d in range(r)]
                  + [f"_groups{d}" for d in range(r)]
                  + ["_nchunks"] + [f"{a}__pool" for a in self.plan.private_sums])
        out.emit(f"@numba.njit(parallel={not debug}, cache=True, nogil=True{_checks()})", 0)
        out.emit(f"def {ir.name}({', '.join(params)}):", 0)
        for p in derived:
            out.emit(f"{p} = transposed({p[:-len(SUFFIX)]})   # read along rows where {p[:-len(SUFFIX)]} "
                     "would be read down columns", 1)
        self.privatize_start()
        out.emit(f"_total = {' * '.join(f'_groups{d}' for d in range(r))}", 1)
        out.emit(f"for _c in {'range' if debug else 'numba.prange'}(_nchunks):", 1)
        loop = len(out.lines) - 1
        self.emit_unassigned(unassigned_locals(self.tk), "", 2)

        body = list(self.plan.body)
        self.group_sums = [n for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                           if isinstance(n, ast.Expr) and tg_name(n.value) == "group_reduce_add"]
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
            self.open_group_loop()
            stmts = [s for s in body if not memory_decl(s)]
            low = CPULowering(self.tk)
            if self.plan.scaled:
                out.emit("# the loop twice: adding each term without its scale (the value read at "
                         "the element it adds to, 1 here) into per-thread copies, which the merge "
                         "multiplies by it (scaledsums.py); or the terms as written", 3)
                out.emit("if _scaled:", 3)
                self.known_private = dict.fromkeys(self.plan.scaled, True)
                ones: list[ast.Constant] = []
                try:
                    self.versioned_item_loop(self.with_unit_scales(stmts, ones), low, 4)
                finally:   # types are keyed by node id: leave none for ids Python reuses
                    for one in ones:
                        del self.tk.types[id(one)]
                out.emit("else:", 3)
                self.known_private = {}
                self.versioned_item_loop(stmts, low, 4)
            else:
                # (only here: after the group loop, the split rows' edge columns run column
                # by column, see split_item_loop)
                self.column_passes = [] if self.plan.edge_columns else None
                self.versioned_item_loop(stmts, low, 3)
                for column_pass in self.column_passes or ():
                    column_pass(2)
                self.column_passes = None
        for k, call in enumerate(self.group_sums):   # one atomic per workgroup
            low = CPULowering(self.tk)
            arr, idx = call.value.args[0], call.value.args[1]
            out.emit(f"atomic_add({ast.unparse(low.expr(arr))}, {ast.unparse(low.index(idx))}, "
                     f"group_sum(_group_sum{k}))", 3)
        if self.plan.outline:
            outline_task(out, loop, len(out.lines))
        self.privatize_merge()

    def emit_unassigned(self, zeros: dict[str, str], suffix: str, depth: int) -> None:
        """``name<suffix> = zero`` for the locals the task may read before assigning them
        (definite.py): else Numba's parallel-loop pass takes them for values from outside
        the loop and recurses without end looking for a reduction in them."""
        if zeros:
            self.out.emit("# locals that some path reads before assigning them, as Numba "
                          "sees it (definite.py)", depth)
        for name, zero in zeros.items():
            self.out.emit(f"{name}{suffix} = {zero}", depth)

    def open_group_loop(self) -> None:
        """This task's run of workgroups; a group's position in the grid (row-major, or in
        bands of rows for tiled 2-D kernels that add into per-thread copies: ``banded``) and
        its number of valid work-items per dimension (work-items past the ndrange never run)."""
        out, r, W = self.out, self.rank, self.W
        total = 1
        for w in W:
            total *= w
        for k, _ in enumerate(self.group_sums):
            # one slot per work-item, summed when the group is done: a running sum would be
            # one chain of dependent adds, which LLVM may not reorder into vector lanes
            out.emit(f"_group_sum{k} = aligned_empty(({total},), np.float64)", 2)
        out.emit("for _g in range(_c * _total // _nchunks, (_c + 1) * _total // _nchunks):", 2)
        rest = "_g"
        if self.plan.banded:
            # down a band of BAND rows of groups, then the next column: the tiles a group
            # reads and the slabs of the per-thread copies it adds to are used again by the
            # next groups while they are in cache (row by row, each row of groups went
            # through all of B and of B_bar's copy)
            out.emit(f"_gband = _g // ({BAND} * _groups1)", 3)
            out.emit(f"_grows = min({BAND}, _groups0 - _gband * {BAND})", 3)
            out.emit(f"_gin = _g - _gband * {BAND} * _groups1", 3)
            out.emit("_g1 = _gin // _grows", 3)
            out.emit(f"_g0 = _gband * {BAND} + _gin % _grows", 3)
            rest = None
        for d in range(r - 1, -1, -1):
            if rest is None:
                break
            if d == 0:
                out.emit(f"_g0 = {rest}", 3)
            else:
                out.emit(f"_g{d} = {rest} % _groups{d}", 3)
                out.emit(f"_r{d} = {rest} // _groups{d}", 3)
                rest = f"_r{d}"
        for d in range(r):
            out.emit(f"_lim{d} = min({W[d]}, _n{d} - _g{d} * {W[d]})", 3)
        cut = " or ".join(f"_lim{d} < {W[d]}" for d in range(r))
        for k, call in enumerate(self.group_sums):
            if self.once_per_item(call):   # every slot is stored, unless the group is cut
                out.emit(f"if {cut}:", 3)
                out.emit(f"_group_sum{k}[:] = 0.0", 4)
            else:
                out.emit(f"_group_sum{k}[:] = 0.0", 3)

    # -- per-thread copies instead of atomics (passes.py decides which) -----------------
    def privatize_start(self) -> None:
        out = self.out
        if not self.plan.private_sums:
            return
        for a in self.plan.private_sums:
            # the launcher passes one zeroed copy per task when they pay (see _Launcher.pools),
            # else a single element: new memory on every launch would cost a page fault per 4 KiB
            out.emit(f"_private_{a} = {a}__pool.shape[0] == _nchunks and "
                     f"{a}__pool.size == _nchunks * {a}.size", 1)
            out.emit(f"{a}__priv = {a}__pool", 1)
        if self.plan.scaled:
            out.emit("_scaled = " + " and ".join(
                f"_private_{a} and {c.source}.shape == {a}.shape"
                for a, c in self.plan.scaled.items()), 1)

    def with_unit_scales(self, stmts: list[ast.stmt], ones: list[ast.Constant]
                         ) -> list[ast.stmt]:
        """``stmts`` with each scale of a per-thread sum (scaledsums.py) set to one (the new
        constants, typed for the time they are lowered, go into ``ones``)."""
        out = []
        for s in stmts:
            if any(s is c.assign for c in self.plan.scaled.values()):
                one = ast.Constant(value=1.0)
                self.tk.types[id(one)] = Scalar("float64")   # a literal: cast to the local's
                ones.append(one)
                s = ast.copy_location(ast.Assign(targets=s.targets, value=one), s)
            out.append(s)
        return out

    def privatize_merge(self) -> None:
        """Add the per-task copies into the arrays (and zero them for the next launch), the
        tasks' loop outside the last dimension's, so that the innermost loop runs along
        contiguous rows and LLVM vectorises it (with the tasks innermost it did not: 0.25-0.5
        ms of a 512^2 float32 matmul adjoint's 6)."""
        out = self.out
        for a, nd in self.plan.private_sums.items():
            out.emit(f"if _private_{a}:", 1)
            idx = ", ".join(f"_m{d}" for d in range(nd))
            last = f"_m{nd - 1}"
            if nd == 1:       # blocks of the one dimension are the parallel tasks
                out.emit(f"_mb = min({_MERGE_BLOCK}, max(1024, -(-{a}.shape[0] // _nchunks)))",
                         2)        # (at least one block per thread when there is work for it)
                out.emit(f"for _b in numba.prange(({a}.shape[0] + _mb - 1) // _mb):", 2)
                rows = f"range(_b * _mb, min({a}.shape[0], (_b + 1) * _mb))"
            else:
                out.emit(f"for _m0 in numba.prange({a}.shape[0]):", 2)
                for d in range(1, nd - 1):
                    out.emit(f"for _m{d} in range({a}.shape[{d}]):", 2 + d)
                rows = f"range({a}.shape[{nd - 1}])"
            inner = 2 + max(nd - 1, 1)     # inside the prange and the middle dimensions
            out.emit("for _t in range(_nchunks):", inner)
            out.emit(f"for {last} in {rows}:", inner + 1)
            term = f"{a}__priv[_t, {idx}]"
            if a in self.plan.scaled:
                # (an element no term went to stays as it was, also where its scale is inf
                # or nan: 0 * inf would be nan)
                out.emit(f"_p = {term}", inner + 2)
                term = f"({self.plan.scaled[a].source}[{idx}] * _p if _scaled and _p != 0 else _p)"
            out.emit(f"{a}[{idx}] += {term}", inner + 2)
            out.emit(f"{a}__priv[_t, {idx}] = 0", inner + 2)   # zero again for the next launch

    def special(self, s: ast.stmt, depth: int, low: CPULowering) -> bool:
        if isinstance(s, ast.Expr) and tg_name(s.value) in ("atomic_add", "atomic_sub") \
                and getattr(s.value.args[0], "id", None) in self.plan.private_sums:
            arr, idx, value = s.value.args
            a = arr.id
            index = low.index(idx)
            parts = index.elts if isinstance(index, ast.Tuple) else [index]
            target = f"{a}__priv[_c, {', '.join(ast.unparse(p) for p in parts)}]"
            op = "+=" if tg_name(s.value) == "atomic_add" else "-="
            element = Scalar(self.tk.types[id(arr)].dtype)
            add = f"{target} {op} {ast.unparse(low.coerce(value, element))}"
            known = self.known_private.get(a)      # (decided outside this loop: write_blocks)
            if known is not None:
                self.out.emit(add if known else ast.unparse(low.expr(s.value)), depth)
                return True
            self.out.emit(f"if _private_{a}:", depth)
            self.out.emit(add, depth + 1)
            self.out.emit("else:", depth)
            self.out.emit(ast.unparse(low.expr(s.value)), depth + 1)
            return True
        return self.special_group_sum(s, depth, low)

    def once_per_item(self, call: ast.stmt) -> bool:
        """Whether every work-item that runs runs ``call`` exactly once (a top-level
        statement of a body without ``return``): then it may store into its slot."""
        body = self.ir.body
        return any(s is call for s in body) and not any(
            isinstance(n, ast.Return) for n in ast.walk(ast.Module(body=body, type_ignores=[])))

    def special_group_sum(self, s: ast.stmt, depth: int, low: CPULowering) -> bool:
        """``tg.group_reduce_add(arr, idx, v)``: add v to the work-item's slot of the group's
        sum; the slots' sum goes into arr[idx] with one atomic when the group is done."""
        if isinstance(s, ast.Expr) and tg_name(s.value) == "group_reduce_add":
            k = next(k for k, c in enumerate(self.group_sums) if c is s)
            slot = row_major([f"_l{d}" for d in range(self.rank)], [str(w) for w in self.W])
            op = "=" if self.once_per_item(s) else "+="
            self.out.emit(f"_group_sum{k}[{slot}] {op} {ast.unparse(low.expr(s.value.args[2]))}",
                          depth)
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
            # the work-item index last: a work-item loop then walks each slot contiguously
            self.out.emit(f"{name}__items = aligned_empty({shape + (total,)}, np.{dtype})", 2)
        else:
            self.out.emit(f"{name} = aligned_empty({shape}, np.{dtype})", 2)

    # -- work-item loops ----------------------------------------------------------------
    def versioned_item_loop(self, stmts: list[ast.stmt], low: CPULowering, depth: int) -> None:
        """The work-item loop, with its first ``if`` decided once per group where possible
        (see versioning.py)."""
        plan = plan_versions(stmts, self.ir.params, self.rank, partial(is_integral, self.tk)) \
            if self.plan.versioning else None
        if plan is None:
            self.item_loop(stmts, low, depth, set())
            return
        out = self.out
        if plan.prelude:
            emit_statements(plan.prelude, low, out, depth)
        if plan.uniform is None:
            self.split_item_loop(plan, low, depth)
            return
        out.emit(f"if {ast.unparse(low.truth(plan.uniform))}:", depth)
        for k, stmts_k in enumerate((plan.then, plan.otherwise)):
            if k:
                out.emit("else:", depth)
            self.item_loop(stmts_k, low, depth + 1, set())
            if not stmts_k:
                out.emit("pass", depth + 1)

    def split_item_loop(self, plan: Versions, low: CPULowering, depth: int) -> None:
        """Range tests on the global index: each row of the group (its innermost index range)
        runs the version without the tests over the part where they all hold, ``[_lo, _hi)``,
        and the else branch over the rest, where one fails (the split is exact: the tests are
        integer comparisons of an index).  A stencil's interior groups run whole rows without
        tests, and so do the inner parts of the rows of its edge groups.

        In a 2-D kernel whose else branch has branches of its own (a stencil's adjoint, which
        tests each neighbour) the few edge columns of the rows where the row tests hold run
        after the task's groups, column by column down the rows (``column_pass``): there the
        column tests are the same for every element, and the branches cost next to nothing
        (measured: docs/performance.md, 'Measurements behind the code')."""
        out, last = self.out, self.rank - 1
        for d in range(last):
            out.emit(f"for _l{d} in range(_lim{d}):", depth + d)
        inner = depth + last
        rows, lows, highs = [], ["0"], [f"_lim{last}"]
        for t in plan.ranges:
            bound = _additive(low.expr(t.bound))
            shift = f" + {t.offset}" if t.offset > 0 else f" - {-t.offset}" if t.offset else ""
            if t.dim < last:      # decided per row
                rows.append(f"(_g{t.dim} * {self.W[t.dim]} + _l{t.dim}{shift} {t.symbol} {bound})")
                continue
            # _g * W + _l + offset <symbol> bound, solved for _l
            unshift = f" - {t.offset}" if t.offset > 0 else f" + {-t.offset}" if t.offset else ""
            free = f"{bound} - _g{last} * {self.W[last]}{unshift}"
            {"<": highs, "<=": highs, ">": lows, ">=": lows}[t.symbol].append(
                free + (" + 1" if t.symbol in ("<=", ">") else ""))
        lo = f"min(_lim{last}, max({', '.join(lows)}))"
        hi = f"max(_lo, min({', '.join(highs)}))"
        by_columns = (self.rank == 2 and self.column_passes is not None
                      and any(isinstance(n, ast.If) for st in plan.otherwise
                              for n in ast.walk(st)))
        if rows:
            out.emit(f"if {' and '.join(rows)}:", inner)
            out.emit(f"_lo = {lo}", inner + 1)
            out.emit(f"_hi = {hi}", inner + 1)
            out.emit("else:", inner)
            out.emit("_lo = _hi = 0", inner + 1)
        else:
            out.emit(f"_lo = {lo}", inner)
            out.emit(f"_hi = {hi}", inner)
        self.item_loop(plan.then, low, inner, set(),
                       last_loop=(f"_l{last} in range(_lo, _hi)", None))
        rest = (f"_k in range(_lo + _lim{last} - _hi)",
                f"_l{last} = _k if _k < _lo else _k - _lo + _hi")
        if not by_columns:
            # the rest of the row, [0, _lo) and [_hi, _lim), in one loop: one copy of the body
            self.item_loop(plan.otherwise, low, inner, set(), last_loop=rest)
            return
        # here: the rows whose tests fail (_hi = 0: all of the row is the rest), and those
        # whose rest is too wide for the column pass.  (One copy of the body: a second one
        # for the failing rows, or a flag telling them apart, made the kernel slower.)
        out.emit(f"if _hi == 0 or _lo + _lim{last} - _hi > {EDGE_COLUMNS}:", inner)
        self.item_loop(plan.otherwise, low, inner + 1, set(), last_loop=rest)
        test = " and ".join(rows) or "True"

        def column_pass(depth: int) -> None:
            """The rest of the rows that passed their tests, when it is a few columns: for
            each column, down the task's groups in that column of groups."""
            out.emit("# the edge columns of the rows whose row tests hold, column by column "
                     "(split_item_loop)", depth)
            if plan.prelude:
                emit_statements(plan.prelude, low, out, depth)
            # (the body's locals get this pass's names below: they need values of their own)
            stored = {n.id for st in plan.otherwise for n in ast.walk(st)
                      if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            unassigned = unassigned_locals(self.tk, plan.otherwise)
            self.emit_unassigned({n: z for n, z in unassigned.items() if n in stored},
                                 "__col", depth)
            out.emit("_gfirst = _c * _total // _nchunks", depth)
            out.emit("_gend = (_c + 1) * _total // _nchunks", depth)
            out.emit("for _g1 in range(_groups1):", depth)
            d = depth + 1
            out.emit(f"_lim1 = min({self.W[1]}, _n1 - _g1 * {self.W[1]})", d)
            out.emit(f"_lo = {lo}", d)
            out.emit(f"_hi = {hi}", d)
            out.emit("_rest = _lo + _lim1 - _hi", d)
            out.emit(f"if _hi == 0 or _rest > {EDGE_COLUMNS}:", d)
            out.emit("continue", d + 1)
            out.emit("for _k in range(_rest):", d)
            out.emit(rest[1], d + 1)
            # the groups of this column among the task's run [_gfirst, _gend), row-major
            out.emit("for _g0 in range(max(0, -((_g1 - _gfirst) // _groups1)), "
                     "(_gend - 1 - _g1) // _groups1 + 1):", d + 1)
            if self.W[0] == 1:
                # (groups of one row, the CPU's rows: a loop of _lim0 = 1 trips kept LLVM
                # from hoisting the column's tests; this one it removes)
                header = "_l0 in range(1)"
            else:
                out.emit(f"_lim0 = min({self.W[0]}, _n0 - _g0 * {self.W[0]})", d + 2)
                header = "_l0 in range(_lim0)"
            # (the row test around the body: as `if not ...: continue` it sent Numba's
            # parallel-loop lowering into the same endless recursion)
            body_at = self.item_loop(plan.otherwise, low, d + 2, set(),
                                     last_loop=(header, None), guard=test)
            _rename_assigned(out.lines, body_at, "__col")

        self.column_passes.append(column_pass)

    def item_loop(self, stmts: list[ast.stmt], low: CPULowering, depth: int,
                  rebind: set[str], recompute: list[ast.stmt] = (),
                  last_loop: tuple[str, str | None] | None = None, guard: str | None = None
                  ) -> int:
        """Emit ``for _l... in range(_lim...)`` running ``stmts`` for each valid work-item;
        with ``last_loop = (header, index)`` only the innermost loop, as ``for header:``
        (the outer ones are open already), with ``index`` computing ``_l<last>`` from it;
        with ``guard``, the work-items for which that test holds.  Returns the index of the
        body's first line in the printer's lines."""
        out, r, W = self.out, self.rank, self.W
        if not stmts:
            return len(out.lines)
        if last_loop is None:
            for d in range(r):
                out.emit(f"for _l{d} in range(_lim{d}):", depth + d)
            inner = depth + r
        else:
            out.emit(f"for {last_loop[0]}:", depth)
            inner = depth + 1
            if last_loop[1]:
                out.emit(last_loop[1], inner)
        if guard:
            out.emit(f"if {guard}:", inner)
            inner += 1
        body_at = len(out.lines)
        needs_li = bool(low.promoted or rebind)
        if needs_li:
            out.emit(f"_li = {row_major([f'_l{d}' for d in range(r)], [str(w) for w in W])}",
                     inner)
        body = list(recompute) + list(stmts)
        indexed = {n.value for st in body for n in ast.walk(st) if isinstance(n, ast.Subscript)}
        bare = {n.id for st in body for n in ast.walk(st)
                if isinstance(n, ast.Name) and n not in indexed}
        for name in sorted(rebind & bare):   # a private array used whole (passed on)
            out.emit(f"{name} = {name}__items[..., _li]", inner)
        # promoted locals live in plain variables inside the loop: loaded once per work-item,
        # stored back if assigned.  Through ``x__items[_li]`` every use is a memory access
        # that LLVM must redo after each store to local memory (they might alias).
        used = {n.id for st in body for n in ast.walk(st) if isinstance(n, ast.Name)}
        cached = sorted(used & low.promoted)
        stored = {n.id for st in body for n in ast.walk(st)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        if cached:
            low = CPULowering(self.tk, low.promoted - set(cached), low.per_item)
        for name in cached:
            out.emit(f"{name} = {name}__items[_li]", inner)
        body, needs_flag = _eliminate_returns(body)
        if needs_flag:
            out.emit("_returned = False", inner)
        emit_statements(body, low, out, inner, lambda s, d: self.special(s, d, low))
        for name in cached:
            if name in stored:
                out.emit(f"{name}__items[_li] = {name}", inner)
        return body_at

    # -- kernels with barriers ----------------------------------------------------------
    def write_with_barriers(self, body: list[ast.stmt], decls: list[ast.stmt]) -> None:
        plan = BarrierPlan(self.tk, body, decls, written=self.ir.body)
        local_arrays = {s.targets[0].id for s in decls}
        private = {s.targets[0].id for s in decls if memory_decl(s) == "private"}
        item_locals = set(self.tk.locals) - plan.hoisted - local_arrays
        # one thread runs the whole group, so a local needs a slot per work-item when some
        # segment reads a value from before it began: another segment wrote it, or the same
        # segment in an earlier iteration of a group-level loop
        promoted = {n for n in item_locals if n in plan.exposed and n not in plan.cheap}
        promoted |= set(plan.runtime_values)
        for n in sorted(promoted - set(plan.runtime_values)):
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
            dtype = plan.runtime_values.get(n) or self.tk.locals[n].dtype
            self.out.emit(f"{n}__items = aligned_empty(({total},), np.{dtype})", 2)
        for s in decls:
            self.allocate(s, per_item=memory_decl(s) == "private")
        self.open_group_loop()
        low = CPULowering(self.tk, promoted, private)
        self.barrier_plan = plan
        self.private = private
        self.write_blocks(plan.blocks, low, 3)

    def write_blocks(self, blocks: list, low: CPULowering, depth: int) -> None:
        out = self.out
        if all(isinstance(b, Barrier) for b in blocks):
            out.emit("pass", depth)
        for b in blocks:
            if isinstance(b, Barrier):
                continue   # the next segment is a new loop over the work-items
            if isinstance(b, Segment):
                rebind = {n for n in self.private if n in b.uses}
                recompute = self.barrier_plan.recomputed(b)
                copies = [a for a in self.plan.private_sums if a in b.uses]
                if not copies:
                    self.item_loop(b.stmts, low, depth, rebind, recompute)
                    continue
                # the loop twice, as the launch adds into per-thread copies or not: with the
                # choice inside, LLVM did not vectorise the loop (a tiled product's adjoint
                # whose shadow tiles are flushed in the loop that updates them)
                out.emit("# the same loop twice: adding into per-thread copies (when they pay) "
                         "or with atomics, chosen once: a choice per element would keep LLVM "
                         "from vectorising it", depth)
                out.emit(f"if {' and '.join(f'_private_{a}' for a in copies)}:", depth)
                self.known_private = dict.fromkeys(copies, True)
                self.item_loop(b.stmts, low, depth + 1, rebind, recompute)
                out.emit("else:", depth)
                self.known_private = {copies[0]: False} if len(copies) == 1 else {}
                self.item_loop(b.stmts, low, depth + 1, rebind, recompute)
                self.known_private = {}
                continue
            s = b.stmt
            out.at(s, depth)
            if isinstance(s, (ast.Assign, ast.AugAssign)):
                emit_statements([s], low, out, depth)
            elif b.header is not None:
                out.emit(b.header.format(*(f"{v}__items[0]" for v in b.values)), depth)
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


def _rename_assigned(lines: list[str], start: int, suffix: str) -> None:
    """Give the names assigned in ``lines[start:]`` (generated code, comments aside) the
    ``suffix`` there.  The column pass is a second copy of the rest's body in the same
    function; with the same local names in both, Numba's parallel-loop lowering follows a
    cycle of copies and recurses until Python stops it (``parfor.cyclic_lookup``)."""
    assigned: set[str] = set()
    for line in lines[start:]:
        code = line.strip()
        m = re.match(r"([A-Za-z_][\w, ]*?)\s*(?:[-+*/%&|^]|//|\*\*)?=(?!=)", code)
        if m and not code.startswith(("#", "for ", "if ", "elif ", "while ")):
            assigned.update(n.strip() for n in m.group(1).split(","))
    if not assigned:
        return
    name = re.compile(r"\b(" + "|".join(sorted(map(re.escape, assigned))) + r")\b")
    for k in range(start, len(lines)):
        if not lines[k].lstrip().startswith("#"):
            lines[k] = name.sub(lambda m: m.group(1) + suffix, lines[k])


def _additive(e: ast.expr) -> str:
    """``e`` as source that stays one term when ``- x`` is appended."""
    text = ast.unparse(e)
    simple = isinstance(e, (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Call)) or (
        isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div,
                                                        ast.FloorDiv, ast.Mod, ast.Pow)))
    return text if simple else f"({text})"


def _checks() -> str:
    """``TAPEGRAD_BOUNDSCHECK=1`` compiles kernels with index checks (slower; for debugging)."""
    return ", boundscheck=True" if bounds_checked() else ""


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
