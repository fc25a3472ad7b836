"""The reverse transform: a typed, normalized kernel -> its adjoint kernel (kernel language).

The adjoint kernel runs, per work-item, the kernel's body again (the *forward sweep*, which
saves what it overwrites on a per-work-item stack), then the *reverse sweep*, which walks the
statements backwards, restores what was overwritten and propagates adjoints with the rules of
``rules.py``.  Stores to arrays the kernel never reads are skipped in the forward sweep (the
primal launch already made them); arrays the kernel both reads and writes are given to the
adjoint as scratch copies of their values before the primal launch (``Adjoint.scratch``).

Semantics (Enzyme's): shadows accumulate; ``A[idx] = e`` consumes ``A_bar[idx]`` (reads it,
then zeroes it); ``A[idx] += e`` and atomic adds do not.  A read ``A[idx]`` adds into
``A_bar[idx]`` with a plain add when every read of ``A`` uses the work-item's own global index,
and with ``tg.atomic_add`` otherwise.  Active scalar arguments get the sum over all work-items,
reduced per workgroup in local memory, then one atomic add per group.
"""

from __future__ import annotations

import ast
import copy

from tapegrad.ad.activity import Transform
from tapegrad.ad.adjoint import Adjoint
from tapegrad.ad.astutil import add as _add
from tapegrad.ad.astutil import assign as _assign
from tapegrad.ad.astutil import clone as _clone
from tapegrad.ad.astutil import const as _c
from tapegrad.ad.astutil import located_at as _at
from tapegrad.ad.astutil import mul as _mul
from tapegrad.ad.astutil import name as _n
from tapegrad.ad.astutil import neg as _neg
from tapegrad.ad.astutil import walk as _walk
from tapegrad.ad.backprop import ExpressionAdjoints
from tapegrad.ad.ownership import own_index_reads, reassigned_locals
from tapegrad.ad.recompute import recomputable_stores
from tapegrad.ad.tidy import is_barrier, tidy
from tapegrad.frontend.ir import KernelIR, tg_call, tg_name
from tapegrad.frontend.types import Array, Scalar, TupleT, TypedKernel

DEFAULT_STACK = 256


def reverse_kernel(tk: TypedKernel, activity: tuple[str, ...], stack_depth: int | None = None,
                   discard: frozenset[str] = frozenset()) -> Adjoint:
    """Build the adjoint of ``tk`` (a typed, normalized kernel).

    ``activity[k]`` is ``"const"``, ``"dup"`` (an array with a shadow) or ``"active"`` (a float
    scalar whose derivative is wanted) for parameter ``k``.  Overwritten elements of the
    shadows of the ``discard`` parameters are left as they are instead of being zeroed (a
    tape's reverse sweep asks for this when nothing reads those shadows afterwards).
    """
    return _Reverse(tk, activity, stack_depth, discard).build()


class _Reverse(ExpressionAdjoints, Transform):
    def __init__(self, tk: TypedKernel, activity: tuple[str, ...], stack_depth: int | None,
                 discard: frozenset[str] = frozenset()):
        super().__init__(tk, activity)
        self.discard = discard
        self.requested_depth = stack_depth
        self.loop_depth = 0
        self.uses_stack = {"f": False, "i": False}
        self.static_pushes = 0
        self.rules: dict[str, object] = {}
        self.recomputed: set[int] = set()   # stores the reverse sweep redoes (recompute.py)

    # -- analyses ---------------------------------------------------------------------------
    def analyse(self) -> None:
        tk, body = self.tk, self.body
        arrays = {p for p, t in zip(self.ir.params, tk.argtypes) if isinstance(t, Array)}
        self.global_arrays = arrays
        self.loaded: set[str] = set()
        self.written: set[str] = set()
        self.atomic_targets: set[str] = set()
        mod = ast.Module(body=body, type_ignores=[])
        for n in ast.walk(mod):
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) \
                    and isinstance(n.ctx, ast.Load):
                self.loaded.add(n.value.id)
            if isinstance(n, (ast.Assign, ast.AugAssign)):
                target = n.targets[0] if isinstance(n, ast.Assign) else n.target
                if isinstance(target, ast.Subscript):
                    self.written.add(target.value.id)
            if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_"):
                self.atomic_targets.add(n.args[0].id)
        # stores to arrays never read are not redone by the forward sweep
        self.replayed = {a for a in self.written | self.atomic_targets
                         if a in self.loaded or a not in arrays}
        self.scratch = sorted(a for a in arrays if a in self.replayed)
        # not zeroing a consumed shadow is only safe when nothing in this adjoint reads that
        # element again: the array is never read, and each work-item stores to it once
        self.discard = {a for a in self.discard if _only_stored(mod, a)
                        and _stores_per_path(body, a) <= 1}
        self.activity_analysis()
        self.saved = self.saved_locals()
        self.own = own_index_reads(self.body, self.memory_kind, self.tk.rank)

    def saved_locals(self) -> set[str]:
        """Locals whose old value must be saved when they are reassigned."""
        saved = reassigned_locals(self.body)
        saved -= set(self.memory_kind)
        for n in saved:
            if isinstance(self.tk.locals.get(n), TupleT):
                node = next(x for x in ast.walk(ast.Module(body=self.body, type_ignores=[]))
                            if isinstance(x, ast.Name) and x.id == n)
                raise self.fail(node, f"{n} holds a tuple and is reassigned; differentiated "
                                      "kernels need it unpacked into scalars")
        return saved

    # -- stacks -----------------------------------------------------------------------------
    def push(self, value: ast.expr, is_float: bool, saves: tuple | None = None
             ) -> list[ast.stmt]:
        """Save ``value`` on the per-work-item stack.  ``saves`` names the user value this
        keeps (("local", x) or ("array", A)); such saves are dropped later when the reverse
        sweep never reads that value (control-flow saves have none and always stay)."""
        kind = "f" if is_float else "i"
        stack, sp = f"_{kind}stack", f"_{kind}sp"
        store = ast.Subscript(value=_n(stack), slice=_n(sp), ctx=ast.Store())
        guard = ast.Compare(left=_n(sp), ops=[ast.Lt()], comparators=[_n("_stack_depth")])
        out = [ast.If(test=guard, body=[_assign(store, value)], orelse=[]),
               _assign(sp, _add(_n(sp), _c(1)))]
        for node in out:
            node._tg_save = saves
            node._tg_push = (kind, self.loop_depth == 0)
        return out

    def pop(self, target: ast.expr, is_float: bool, saves: tuple | None = None
            ) -> list[ast.stmt]:
        kind = "f" if is_float else "i"
        stack, sp = f"_{kind}stack", f"_{kind}sp"
        load = ast.Subscript(value=_n(stack), slice=_n(sp), ctx=ast.Load())
        guard = ast.Compare(left=_n(sp), ops=[ast.Lt()], comparators=[_n("_stack_depth")])
        out = [_assign(sp, ast.BinOp(left=_n(sp), op=ast.Sub(), right=_c(1))),
               ast.If(test=guard, body=[_assign(target, load)], orelse=[])]
        for node in out:
            node._tg_save = saves
        return out

    def drop_unneeded_saves(self, fwd: list[ast.stmt], rev: list[ast.stmt]
                            ) -> tuple[list[ast.stmt], list[ast.stmt]]:
        """A value needs saving before it is overwritten only if the reverse sweep reads it
        (in a partial derivative, an index or a condition); drop the other saves.

        E.g. ``acc = acc + a[k] * b[k]`` in a loop: the reverse reads a, b and k but never
        acc, so acc is not pushed every iteration."""
        read = set()
        for n in ast.walk(ast.Module(body=rev, type_ignores=[])):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                read.add(("local", n.id))
            if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load) \
                    and isinstance(n.value, ast.Name):
                read.add(("array", n.value.id))

        def keep(stmts: list[ast.stmt]) -> list[ast.stmt]:
            out = []
            for s in stmts:
                saves = getattr(s, "_tg_save", None)
                if saves is not None and saves not in read:
                    continue
                for attr in ("body", "orelse"):
                    if isinstance(s, (ast.If, ast.For, ast.While)) and not hasattr(s, "_tg_save"):
                        setattr(s, attr, keep(getattr(s, attr)) or (
                            [ast.Pass()] if attr == "body" else []))
                out.append(s)
            return out

        fwd, rev = keep(fwd), keep(rev)
        self.uses_stack = {"f": False, "i": False}
        self.static_pushes = 0
        for n in ast.walk(ast.Module(body=fwd, type_ignores=[])):
            push = getattr(n, "_tg_push", None)
            if push is not None and isinstance(n, ast.If):
                self.uses_stack[push[0]] = True
                self.static_pushes += push[1]
        return fwd, rev

    def local_is_float(self, name: str) -> bool:
        t = self.tk.locals.get(name) or self.tk.argtypes[self.ir.params.index(name)]
        return isinstance(t, Scalar) and t.is_float

    def element_is_float(self, array: str) -> bool:
        if array in self.memory_kind:
            decl = next(s for s in self.decls if s.targets[0].id == array)
            return self.tk.static_shapes[id(decl.value)][0].startswith("float")
        t = self.tk.argtypes[self.ir.params.index(array)]
        return t.dtype.startswith("float")

    # -- the sweeps -------------------------------------------------------------------------
    def build(self) -> Adjoint:
        self.analyse()
        body = [s for s in self.body if s not in self.decls]
        fwd, rev = self.block(body)
        fwd, rev = self.drop_unneeded_saves(fwd, rev)
        ir, tk = self.ir, self.tk
        shadow_params, shadow_of = [], {}
        for p in ir.params:
            if self.activity[p] == "dup":
                shadow_params.append(f"{p}_bar")
                shadow_of[f"{p}_bar"] = p
        scalar_params = [p for p in ir.params if self.activity[p] == "active"]
        out_params = [f"{p}_bar_out" for p in scalar_params]
        depth = 0
        uses_status = any(self.uses_stack.values())
        if uses_status:
            has_loop = any(isinstance(n, (ast.For, ast.While))
                           for n in ast.walk(ast.Module(body=body, type_ignores=[])))
            depth = self.requested_depth or (DEFAULT_STACK if has_loop
                                             else max(1, self.static_pushes))
        head: list[ast.stmt] = [copy.deepcopy(d) for d in self.decls]
        head += self.shadow_declarations()
        if uses_status:
            head.append(_assign("_stack_depth", _c(depth)))
            for kind, dtype in (("f", "float64"), ("i", "int64")):
                if self.uses_stack[kind]:
                    head.append(_assign(f"_{kind}stack", tg_call("private", [
                        _c(f"dtype:{dtype}"), ast.Tuple(elts=[_c(depth)], ctx=ast.Load())])))
                    head.append(_assign(f"_{kind}sp", _c(0)))
        inits: list[ast.stmt] = []
        for name in sorted(self.active_names):
            inits.append(_assign(f"{name}_bar", _c(0.0)))
        for name in sorted(self.saved - set(ir.params)):
            t = tk.locals.get(name)
            zero = 0.0 if (isinstance(t, Scalar) and t.is_float) else (
                False if t == Scalar("bool") else 0)
            inits.append(_assign(name, _c(zero)))
        inits += self.zero_shadow_locals()
        check: list[ast.stmt] = []
        if uses_status:
            sps = [_n(f"_{k}sp") for k in "fi" if self.uses_stack[k]]
            worst = sps[0] if len(sps) == 1 else tg_call("max", sps)
            check.append(ast.If(
                test=ast.Compare(left=_clone(worst), ops=[ast.Gt()], comparators=[_n("_stack_depth")]),
                body=[ast.Expr(value=tg_call("atomic_max", [_n("_status"), _c(0), _clone(worst)]))],
                orelse=[]))
        tail = self.scalar_reductions(scalar_params)
        first = self.body[0] if self.body else None
        new_body = _at(head + inits, first) + fwd + _at(check, first) + rev + _at(tail, first)
        params = list(ir.params) + shadow_params + out_params + (["_status"] if uses_status else [])
        adj = KernelIR(name=f"{ir.name}_adjoint", params=params, body=new_body,
                       filename=ir.filename, lineno=ir.lineno, is_kernel=True,
                       funcs={**ir.funcs, **self.rules}, generated=True)
        return tidy(Adjoint(adj, shadow_of, scalar_params, list(self.scratch), depth,
                            uses_status))

    def shadow_declarations(self) -> list[ast.stmt]:
        out = []
        for s in self.decls:
            name = s.targets[0].id
            if name in self.active_arrays:
                decl = copy.deepcopy(s)
                decl.targets = [_n(f"{name}_bar", True)]
                out.append(decl)
        return out

    def zero_shadow_locals(self) -> list[ast.stmt]:
        """Shadows of local/private arrays start at zero (they accumulate)."""
        out = []
        needs_barrier = False
        for s in self.decls:
            name = s.targets[0].id
            if name not in self.active_arrays:
                continue
            shape = self.tk.static_shapes[id(s.value)][1]
            idx = [f"_z{k}" for k in range(len(shape))]
            store = ast.Subscript(value=_n(f"{name}_bar"),
                                  slice=ast.Tuple(elts=[_n(i) for i in idx], ctx=ast.Load())
                                  if len(idx) > 1 else _n(idx[0]), ctx=ast.Store())
            loop: ast.stmt = _assign(store, _c(0.0))
            for k in reversed(range(len(shape))):
                loop = ast.For(target=_n(idx[k], True), iter=ast.Call(
                    func=_n("range"), args=[_c(shape[k])], keywords=[]), body=[loop], orelse=[])
            if self.memory_kind[name] == "localmem":
                first = ast.Compare(left=tg_call("local_index", []), ops=[ast.Eq()],
                                    comparators=[_c(0)])
                out.append(ast.If(test=first, body=[loop], orelse=[]))
                needs_barrier = True
            else:
                out.append(loop)
        if needs_barrier:
            out.append(ast.Expr(value=tg_call("synchronize", [])))
        return out

    def scalar_reductions(self, scalars: list[str]) -> list[ast.stmt]:
        """Sum each Active scalar's adjoint over all work-items: backends reduce within a
        workgroup first, then add the group's sum with one atomic."""
        return [ast.Expr(value=tg_call("group_reduce_add", [_n(f"{p}_bar_out"), _c(0),
                                                            _n(f"{p}_bar")])) for p in scalars]

    def block(self, stmts: list[ast.stmt]) -> tuple[list[ast.stmt], list[ast.stmt]]:
        """Forward and reverse code of a statement list (reverse already reversed)."""
        fwd: list[ast.stmt] = []
        rev_parts: list[list[ast.stmt]] = []
        for s in stmts:
            f, r = self.stmt(s)
            fwd.extend(_at(f, s))
            rev_parts.append(_at(r, s))
        rev = [x for part in reversed(rev_parts) for x in part]
        return fwd, rev

    def stmt(self, s: ast.stmt) -> tuple[list[ast.stmt], list[ast.stmt]]:
        if isinstance(s, ast.Assign):
            return self.assign(s)
        if isinstance(s, ast.AugAssign):
            return self.accumulate(s)
        if isinstance(s, ast.Expr):
            name = tg_name(s.value)
            if name == "synchronize":
                return [s], [copy.deepcopy(s)]
            if name and name.startswith("atomic_"):
                return self.atomic(s)
            return [s], []
        if isinstance(s, ast.If):
            return self.branch(s)
        if isinstance(s, ast.For):
            return self.for_loop(s)
        if isinstance(s, ast.While):
            return self.while_loop(s)
        if isinstance(s, ast.Pass):
            return [], []
        raise self.fail(s, f"{type(s).__name__} cannot be differentiated here")

    def check_no_atomic_results(self, e: ast.expr) -> None:
        for n in ast.walk(e):
            if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_"):
                raise self.atomic_result_error(n)

    def assign(self, s: ast.Assign) -> tuple[list[ast.stmt], list[ast.stmt]]:
        target = s.targets[0]
        self.check_no_atomic_results(s.value)
        fwd: list[ast.stmt] = []
        rev: list[ast.stmt] = []
        if isinstance(target, ast.Name):
            name = target.id
            if name in self.saved:
                fwd += self.push(_n(name), self.local_is_float(name), ("local", name))
            fwd.append(s)
            if name in self.active_names:
                adj = self.fresh("a")
                rev += [_assign(adj, _n(f"{name}_bar")), _assign(f"{name}_bar", _c(0.0))]
            if name in self.saved:
                rev += self.pop(_n(name, True), self.local_is_float(name), ("local", name))
            if name in self.active_names:
                rev += self.backprop(s.value, _n(adj))
            return fwd, rev
        if isinstance(target, ast.Tuple):
            names = [e.id for e in target.elts]
            for name in names:
                if name in self.saved:
                    fwd += self.push(_n(name), self.local_is_float(name), ("local", name))
            fwd.append(s)
            for name in reversed(names):
                if name in self.saved:
                    rev += self.pop(_n(name, True), self.local_is_float(name), ("local", name))
            return fwd, rev
        # a store A[idx] = e
        array = target.value.id
        replay = array in self.replayed
        saved = replay and id(s) not in self.recomputed   # else redone in the reverse sweep
        if replay:
            if saved:
                old = ast.Subscript(value=_n(array), slice=_clone(target.slice), ctx=ast.Load())
                fwd += self.push(old, self.element_is_float(array), ("array", array))
            fwd.append(s)
        if array in self.active_arrays:
            adj = self.fresh("a")
            shadow = ast.Subscript(value=_n(f"{array}_bar"), slice=_clone(target.slice),
                                   ctx=ast.Load())
            rev.append(_assign(adj, shadow))
            if array not in self.discard:     # consumed: the old value's shadow starts at 0
                rev.append(_assign(ast.Subscript(value=_n(f"{array}_bar"),
                                                 slice=_clone(target.slice), ctx=ast.Store()),
                                   _c(0.0)))
        if saved:
            restore = ast.Subscript(value=_n(array), slice=_clone(target.slice), ctx=ast.Store())
            rev += self.pop(restore, self.element_is_float(array), ("array", array))
        if array in self.active_arrays:
            rev += self.backprop(s.value, _n(adj))
        return fwd, rev

    def accumulate(self, s: ast.AugAssign) -> tuple[list[ast.stmt], list[ast.stmt]]:
        """``A[idx] += e`` / ``-= e``: the adjoint reads the shadow without consuming it."""
        target = s.target
        array = target.value.id
        self.check_no_atomic_results(s.value)
        fwd: list[ast.stmt] = []
        rev: list[ast.stmt] = []
        if array in self.replayed:
            old = ast.Subscript(value=_n(array), slice=_clone(target.slice), ctx=ast.Load())
            fwd += self.push(old, self.element_is_float(array), ("array", array))
            fwd.append(s)
            restore = ast.Subscript(value=_n(array), slice=_clone(target.slice), ctx=ast.Store())
            rev += self.pop(restore, self.element_is_float(array), ("array", array))
        if array in self.active_arrays and self.active(s.value):
            adj = self.fresh("a")
            shadow = ast.Subscript(value=_n(f"{array}_bar"), slice=_clone(target.slice),
                                   ctx=ast.Load())
            g: ast.expr = _n(adj)
            rev += [_assign(adj, shadow)]
            if isinstance(s.op, ast.Sub):
                g = _neg(g)
            rev += self.backprop(s.value, g)
        return fwd, rev

    def atomic(self, s: ast.Expr) -> tuple[list[ast.stmt], list[ast.stmt]]:
        call = s.value
        name = tg_name(call)
        array = call.args[0].id
        if array in self.memory_kind:
            if array not in self.active_arrays and not self.active(call.args[2]):
                # (a count in local memory: nothing to differentiate, but the forward sweep
                # must count again, as it recomputes what the kernel's local memory held)
                return [copy.deepcopy(s)], []
            raise self.fail(s, f"tg.{name} of a differentiated value on local or private "
                               "memory cannot be differentiated yet; accumulate into an "
                               "argument array instead")
        if array in self.loaded and self.read_by_tangent_only(array):
            raise self.fail(s, f"tg.{name} has no second derivative in tapegrad (tg.hvp "
                               "differentiates its tangent, which reads the element); find the "
                               "extreme without atomics, which both modes differentiate")
        if array in self.loaded:
            raise self.fail(s, f"the kernel both reads {array} and updates it with tg.{name}; "
                               "the reads would depend on the order of the atomics, so this "
                               "cannot be differentiated")
        if array in self.active_arrays and name in ("atomic_min", "atomic_max"):
            return [], self.extremum(call)
        if array not in self.active_arrays or not self.active(call.args[2]):
            return [], []
        adj = self.fresh("a")
        shadow = ast.Subscript(value=_n(f"{array}_bar"), slice=_clone(call.args[1]), ctx=ast.Load())
        g: ast.expr = _n(adj)
        if name == "atomic_sub":
            g = _neg(g)
        return [], [_assign(adj, shadow)] + self.backprop(call.args[2], g)

    def read_by_tangent_only(self, array: str) -> bool:
        """Whether every read of ``array`` is one a tangent kernel made to follow an atomic
        extreme (forward.py), so that this is tg.hvp differentiating that tangent."""
        return all(getattr(n, "_tg_extreme", None)
                   for n in ast.walk(ast.Module(body=self.body, type_ignores=[]))
                   if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
                   and isinstance(n.value, ast.Name) and n.value.id == array)

    def extremum(self, call: ast.Call) -> list[ast.stmt]:
        """The adjoint of ``tg.atomic_max(A, idx, c)`` (``min``) for a constant ``c``: where
        ``c`` beats what ``A[idx]`` held before the launch (the adjoint reads the arguments as
        the primal launch saw them), the element's shadow is consumed (Python's ``max(old,
        c)`` keeps ``old`` at a tie).  Whichever work-items ran first, the element ends as
        the largest constant exactly where one beats the old value."""
        name, array = tg_name(call), call.args[0].id
        if self.active(call.args[2]):
            raise self.extremum_error(call)
        others = [n for n in ast.walk(ast.Module(body=self.body, type_ignores=[]))
                  if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_")
                  and n.args[0].id == array and tg_name(n) != name]
        if array in self.written or others:
            raise self.extremum_error(call, f"into {array}, which the kernel also changes "
                                            "otherwise, has no adjoint: it would not know "
                                            "which value the constant met")
        old = ast.Subscript(value=_n(array), slice=_clone(call.args[1]), ctx=ast.Load())
        beats = ast.Compare(left=_clone(call.args[2]),
                            ops=[ast.Gt() if name == "atomic_max" else ast.Lt()],
                            comparators=[old])
        shadow = ast.Subscript(value=_n(f"{array}_bar"), slice=_clone(call.args[1]),
                               ctx=ast.Store())
        return [ast.If(test=beats, body=[_assign(shadow, _c(0.0))], orelse=[])]

    def branch(self, s: ast.If) -> tuple[list[ast.stmt], list[ast.stmt]]:
        flag = self.fresh("branch")
        test = copy.deepcopy(s.test)
        self.check_no_atomic_results(test)
        f_body, r_body = self.block(s.body)
        f_else, r_else = self.block(s.orelse)
        fwd: list[ast.stmt] = [_assign(flag, tg_call("bool", [test])),
                               ast.If(test=_n(flag), body=f_body or [ast.Pass()], orelse=f_else)]
        rev: list[ast.stmt] = []
        if self.loop_depth:
            fwd += self.push(_n(flag), False)
            rev += self.pop(_n(flag, True), False)
        if r_body or r_else:
            rev.append(ast.If(test=_n(flag), body=r_body or [ast.Pass()], orelse=r_else))
        return fwd, rev

    def for_loop(self, s: ast.For) -> tuple[list[ast.stmt], list[ast.stmt]]:
        args = s.iter.args
        start = args[0] if len(args) > 1 else _c(0)
        stop = args[1] if len(args) > 1 else args[0]
        step = args[2] if len(args) > 2 else _c(1)
        count, first, stride = self.fresh("trips"), self.fresh("start"), self.fresh("step")
        k = s.target.id
        if any(isinstance(n, ast.Name) and n.id == k and isinstance(n.ctx, ast.Store)
               for n in _walk(s.body)):
            raise self.fail(s, f"the loop variable {k} is assigned inside the loop; the "
                               "derivative would restore it to the loop's value, not yours. "
                               f"Assign to another name ({k}2 = ...)")
        redo: list[ast.stmt] = []
        if self.loop_depth == 0:
            shapes = {d.targets[0].id: self.tk.static_shapes[id(d.value)][1]
                      for d in self.decls if id(d.value) in self.tk.static_shapes}
            stores = recomputable_stores(s, self.body, self.memory_kind,
                                         self.written | self.atomic_targets, self.global_arrays,
                                         shapes, tuple(self.tk.groupsize))
            self.recomputed |= {id(st) for st in stores}
            redo = [copy.deepcopy(st) for st in stores]
        self.loop_depth += 1
        f_body, r_body = self.block(s.body)
        self.loop_depth -= 1
        recomputed = frozenset(st.targets[0].value.id for st in redo)
        if redo:     # each reverse iteration starts by loading again what its forward one did
            if any(self.memory_kind[st.targets[0].value.id] == "localmem" for st in redo) \
                    and not (r_body and is_barrier(r_body[0])):
                redo.append(ast.Expr(value=tg_call("synchronize", [])))
            r_body = _at(redo, s) + r_body
        fwd: list[ast.stmt] = []
        rev: list[ast.stmt] = []
        if k in self.saved:
            fwd += self.push(_n(k), False, ("local", k))
        if all(isinstance(a, ast.Constant) and type(a.value) is int for a in args):
            # a trip count known at compile time: nothing to count or save
            values = [a.value for a in args]
            start_v = values[0] if len(values) > 1 else 0
            step_v = values[2] if len(values) > 2 else 1
            trips = len(range(*values))
            fwd.append(ast.For(target=_n(k, True), iter=copy.deepcopy(s.iter), body=f_body or
                               [ast.Pass()], orelse=[]))
            fwd[-1]._tg_recomputed = recomputed
            back = self.fresh("rev")
            k_value = _add(_c(start_v + (trips - 1) * step_v), _mul(_n(back), _c(-step_v)))
            rev.append(ast.For(target=_n(back, True), iter=ast.Call(
                func=_n("range"), args=[_c(trips)], keywords=[]),
                body=[_assign(k, k_value)] + (r_body or []), orelse=[]))
            if k in self.saved:
                rev += self.pop(_n(k, True), False, ("local", k))
            return fwd, rev
        fwd += [_assign(first, copy.deepcopy(start)), _assign(stride, copy.deepcopy(step)),
                _assign(count, _c(0))]
        loop = ast.For(target=_n(k, True), iter=ast.Call(
            func=_n("range"), args=[_n(first), copy.deepcopy(stop), _n(stride)], keywords=[]),
            body=[_assign(count, _add(_n(count), _c(1)))] + f_body, orelse=[])
        loop._tg_recomputed = recomputed
        fwd.append(loop)
        if self.loop_depth:
            for v in (count, first, stride):
                fwd += self.push(_n(v), False)
            for v in (stride, first, count):
                rev += self.pop(_n(v, True), False)
        back = self.fresh("rev")
        # k runs backwards: the r-th reverse iteration is forward iteration count - 1 - r
        k_value = _add(_n(first), _mul(ast.BinOp(left=ast.BinOp(left=_n(count), op=ast.Sub(),
                                                                right=_c(1)),
                                                 op=ast.Sub(), right=_n(back)), _n(stride)))
        rev.append(ast.For(target=_n(back, True), iter=ast.Call(func=_n("range"), args=[_n(count)],
                                                                keywords=[]),
                           body=[_assign(k, k_value)] + (r_body or []), orelse=[]))
        if k in self.saved:
            rev += self.pop(_n(k, True), False, ("local", k))
        return fwd, rev

    def while_loop(self, s: ast.While) -> tuple[list[ast.stmt], list[ast.stmt]]:
        count = self.fresh("trips")
        self.check_no_atomic_results(s.test)
        self.loop_depth += 1
        f_body, r_body = self.block(s.body)
        self.loop_depth -= 1
        fwd: list[ast.stmt] = [_assign(count, _c(0)), ast.While(
            test=copy.deepcopy(s.test), body=[_assign(count, _add(_n(count), _c(1)))] + f_body,
            orelse=[])]
        rev: list[ast.stmt] = []
        if self.loop_depth:
            fwd += self.push(_n(count), False)
            rev += self.pop(_n(count, True), False)
        back = self.fresh("rev")
        rev.append(ast.For(target=_n(back, True), iter=ast.Call(func=_n("range"), args=[_n(count)],
                                                                keywords=[]),
                           body=r_body or [ast.Pass()], orelse=[]))
        return fwd, rev


def _stores_per_path(stmts: list[ast.stmt], array: str) -> int:
    """The most stores (plain or augmented) to ``array`` that one work-item can run on one
    path through ``stmts``; 2 for any store inside a loop."""
    most = 0
    for s in stmts:
        if isinstance(s, ast.If):
            most += max(_stores_per_path(s.body, array), _stores_per_path(s.orelse, array))
        elif isinstance(s, (ast.For, ast.While)):
            most += 2 * min(1, _stores_per_path(s.body, array))
        elif isinstance(s, (ast.Assign, ast.AugAssign)):
            t = s.targets[0] if isinstance(s, ast.Assign) else s.target
            most += isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) \
                and t.value.id == array
    return most


def _only_stored(mod: ast.Module, array: str) -> bool:
    """``array`` appears only as the target of stores and in ``array.shape``."""
    allowed = set()
    for n in ast.walk(mod):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store):
            allowed.add(id(n.value))
        if isinstance(n, ast.Attribute) and n.attr == "shape":
            allowed.add(id(n.value))
    return all(id(n) in allowed for n in ast.walk(mod)
               if isinstance(n, ast.Name) and n.id == array)
