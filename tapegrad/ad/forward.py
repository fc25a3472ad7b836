"""The tangent transform: a typed, normalized kernel -> a kernel computing values and tangents.

Each assignment ``x = e`` becomes ``x_dot = <tangent of e>`` followed by ``x = e`` (the tangent
first, since ``e`` may read the old ``x``); each store ``A[idx] = e`` also stores the tangent
into ``A_dot[idx]``.  Control flow, barriers and local memory keep their structure, so no
stack is needed and a tangent launch costs about one primal launch.  With batch width ``k``
every tangent exists ``k`` times (``x_dot0 ... x_dot{k-1}``), computed in the same launch.

Tangents of expressions use the same partial-derivative table as the reverse transform
(``rules.py``).  Tangent arrays are written, not accumulated (Enzyme's forward semantics).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from tapegrad.ad import rules
from tapegrad.ad.activity import SELECTIONS, Transform
from tapegrad.ad.astutil import add, assign, clone, const, name
from tapegrad.frontend.ir import KernelIR, tg_call, tg_name
from tapegrad.frontend.types import Array, TypedKernel


@dataclass
class Tangent:
    """The tangent kernel and how to call it."""

    ir: KernelIR
    tangent_params: list[tuple[str, int]]   # (primal parameter, batch slot), in order
    width: int


def tangent_kernel(tk: TypedKernel, activity: tuple[str, ...], width: int = 1) -> Tangent:
    """Build the tangent kernel of ``tk`` for ``width`` directions at once."""
    return _Forward(tk, activity, width).build()


class _Forward(Transform):
    def __init__(self, tk: TypedKernel, activity: tuple[str, ...], width: int):
        super().__init__(tk, activity)
        self.width = width
        self.rules: dict[str, object] = {}
        self.loads = 0                   # locals made by shared_loads

    def dot(self, base: str, j: int) -> str:
        return f"{base}_dot" if self.width == 1 else f"{base}_dot{j}"

    def build(self) -> Tangent:
        self.activity_analysis()
        ir = self.ir
        body: list[ast.stmt] = []
        for s in self.body:
            if s in self.decls:
                body.append(s)
                if s.targets[0].id in self.active_arrays:
                    for j in range(self.width):
                        decl = copy.deepcopy(s)
                        decl.targets = [name(self.dot(s.targets[0].id, j), True)]
                        body.append(decl)
            else:
                body.extend(self.stmt(s))
        params = list(ir.params)
        tangent_params = []
        for p in ir.params:
            if self.activity[p] in ("dup", "active"):
                for j in range(self.width):
                    params.append(self.dot(p, j))
                    tangent_params.append((p, j))
        out = KernelIR(name=f"{ir.name}_tangent", params=params, body=body, filename=ir.filename,
                       lineno=ir.lineno, is_kernel=True, funcs={**ir.funcs, **self.rules},
                       generated=True)
        return Tangent(out, tangent_params, self.width)

    # -- statements -------------------------------------------------------------------------
    def block(self, stmts: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in stmts:
            out.extend(self.stmt(s))
        return out

    def stmt(self, s: ast.stmt) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        if isinstance(s, ast.Assign):
            target = s.targets[0]
            if isinstance(target, ast.Name) and target.id in self.active_names:
                for j in range(self.width):
                    out.append(assign(self.dot(target.id, j), self.tangent_or_zero(s.value, j)))
            elif isinstance(target, ast.Subscript) and target.value.id in self.active_arrays:
                for j in range(self.width):
                    store = ast.Subscript(value=name(self.dot(target.value.id, j)),
                                          slice=clone(target.slice), ctx=ast.Store())
                    out.append(assign(store, self.tangent_or_zero(s.value, j)))
                out, s = self.shared_loads(out, s)
            out.append(s)
        elif isinstance(s, ast.AugAssign):   # A[idx] += e / -= e (the rest is normalized away)
            array = s.target.value.id
            if array in self.active_arrays and self.active(s.value):
                for j in range(self.width):
                    store = ast.Subscript(value=name(self.dot(array, j)),
                                          slice=clone(s.target.slice), ctx=ast.Store())
                    out.append(ast.AugAssign(target=store, op=s.op, value=self.tangent(s.value, j)))
                out, s = self.shared_loads(out, s)
            out.append(s)
        elif isinstance(s, ast.Expr):
            call_name = tg_name(s.value)
            if call_name and call_name.startswith("atomic_"):
                out.extend(self.atomic(s, call_name))      # (s among them)
            else:
                out.append(s)
        elif isinstance(s, ast.If):
            out.append(ast.If(test=s.test, body=self.block(s.body) or [ast.Pass()],
                              orelse=self.block(s.orelse)))
        elif isinstance(s, ast.For):
            out.append(ast.For(target=s.target, iter=s.iter, body=self.block(s.body) or
                               [ast.Pass()], orelse=[]))
        elif isinstance(s, ast.While):
            out.append(ast.While(test=s.test, body=self.block(s.body) or [ast.Pass()], orelse=[]))
        else:
            out.append(s)
        for node in out:   # generated statements carry the user's line
            for n in ast.walk(node):
                if "lineno" in n._attributes and getattr(n, "lineno", None) is None:
                    ast.copy_location(n, s)
        return out

    def shared_loads(self, tangents: list[ast.stmt],
                     s: ast.Assign | ast.AugAssign) -> tuple[list[ast.stmt], ast.stmt]:
        """The array elements that a store ``s`` reads and its tangents read again (``cos(X[i])``
        beside ``sin(X[i])``), each loaded once into a local first.  Between the tangent's
        store and ``s`` the compiler cannot know that ``X`` was not written, so it would load
        it again and compute again what the two share (the argument reduction of ``sin`` and
        ``cos``).  Only loads ``s`` makes whatever happens are moved (not those in one branch
        of ``a if c else b``); the value ``s`` stores is computed before the tangents' stores
        as well."""
        if not _shared(s, tangents):
            return tangents, s
        s, tangents = copy.deepcopy(s), copy.deepcopy(tangents)
        first: list[ast.stmt] = []
        while (load := _shared(s, tangents)) is not None:   # (inner ones first: X[idx[i]]
            local = self.fresh("_ld")                        # becomes X[_ld1], then _ld2)
            first.append(assign(local, clone(load)))
            text = ast.dump(load)
            for node in (s, *tangents):
                _replace(node, text, local)
        # (the value too, before the tangents' stores: what it shares with them, table
        # lookups included, is then computed once)
        value = self.fresh("_value")
        first.append(assign(value, s.value))
        s.value = name(value)
        return first + tangents, s

    def fresh(self, prefix: str) -> str:
        """A new local's name: ``prefix`` and a number no name of the kernel has."""
        taken = set(self.tk.locals) | set(self.ir.params)
        while True:
            self.loads += 1
            if f"{prefix}{self.loads}" not in taken:
                return f"{prefix}{self.loads}"

    def atomic(self, s: ast.Expr, call_name: str) -> list[ast.stmt]:
        """The atomic ``s`` with its tangents: an add's adds the value's tangent; where a
        constant beats what the element holds, a min's or max's element has tangent 0
        (Python's ``max(old, c)`` keeps ``old`` at a tie).  Read before the atomic: a value
        the element held, old or a constant brought since, so the tangent ends exactly where
        the largest constant beats the old value, whichever work-items ran first."""
        call = s.value
        array = call.args[0].id
        if array not in self.active_arrays:
            return [s]
        if call_name in ("atomic_min", "atomic_max"):
            if self.active(call.args[2]):
                raise self.extremum_error(call)
            held = ast.Subscript(value=name(array), slice=clone(call.args[1]), ctx=ast.Load())
            held._tg_extreme = call_name      # (reverse.py: tg.hvp's refusal names it)
            beats = ast.Compare(left=clone(call.args[2]),
                                ops=[ast.Gt() if call_name == "atomic_max" else ast.Lt()],
                                comparators=[held])
            ends = [assign(ast.Subscript(value=name(self.dot(array, j)),
                                         slice=clone(call.args[1]), ctx=ast.Store()), const(0.0))
                    for j in range(self.width)]
            return [ast.If(test=beats, body=ends, orelse=[]), s]
        if not self.active(call.args[2]):
            return [s]
        return [ast.Expr(value=tg_call(call_name, [name(self.dot(array, j)), clone(call.args[1]),
                                                   self.tangent(call.args[2], j)]))
                for j in range(self.width)] + [s]

    # -- expressions ------------------------------------------------------------------------
    def tangent_or_zero(self, e: ast.expr, j: int) -> ast.expr:
        t = self.tangent(e, j)
        return t if t is not None else const(0.0)

    def tangent(self, e: ast.expr, j: int) -> ast.expr | None:
        """The tangent of ``e`` in direction ``j``, or None when it is zero."""
        if not self.active(e):
            return None
        if isinstance(e, ast.Name):
            return name(self.dot(e.id, j))
        if isinstance(e, ast.Subscript):
            return ast.Subscript(value=name(self.dot(e.value.id, j)), slice=clone(e.slice),
                                 ctx=ast.Load())
        if isinstance(e, (ast.BinOp, ast.UnaryOp)):
            return self.operator(e, j)
        if isinstance(e, ast.IfExp):
            return ast.IfExp(test=clone(e.test), body=self.tangent_or_zero(e.body, j),
                             orelse=self.tangent_or_zero(e.orelse, j))
        if isinstance(e, ast.Call):
            return self.call(e, j)
        return None

    def operator(self, e: ast.BinOp | ast.UnaryOp, j: int) -> ast.expr | None:
        args = [e.left, e.right] if isinstance(e, ast.BinOp) else [e.operand]
        terms = []
        for arg, p in zip(args, rules.operator_partials(e.op, args)):
            t = self.tangent(arg, j) if p is not None else None
            if t is not None:
                terms.append(rules.term(p, args, e, t))
        return _sum(terms)

    def call(self, e: ast.Call, j: int) -> ast.expr | None:
        call_name = tg_name(e)
        args = e.args
        if call_name is None:   # a device function with a hand-written forward rule
            self.check_rule_arrays(e)
            func = self.ir.funcs[e.func.id]
            rule = f"{e.func.id}_forward"
            self.rules[rule] = func.forward_rule
            scalars = [a for a in args if not isinstance(self.T(a), Array)]
            dots = [self.tangent_or_zero(a, j) for a in scalars]
            return ast.Call(func=name(rule), args=[clone(a) for a in args] + dots, keywords=[])
        if call_name.startswith("atomic_"):
            raise self.atomic_result_error(e)
        if call_name == "where":
            return ast.IfExp(test=clone(args[0]), body=self.tangent_or_zero(args[1], j),
                             orelse=self.tangent_or_zero(args[2], j))
        if call_name in SELECTIONS:   # the argument returned's (Transform.selection)
            test, a, b = self.selection(e)
            return ast.IfExp(test=test, body=self.tangent_or_zero(a, j),
                             orelse=self.tangent_or_zero(b, j))
        try:
            parts = rules.call_partials(call_name)
        except KeyError:
            raise self.fail(e, f"tg.{call_name} has no derivative rule") from None
        terms = []
        for arg, p in zip(args, parts):
            t = self.tangent(arg, j) if p is not None else None
            if t is not None:
                terms.append(rules.term(p, args, e, t))
        if call_name in ("float32", "float64") and terms:
            return tg_call(call_name, [_sum(terms)])
        return _sum(terms)


def _sum(terms: list[ast.expr]) -> ast.expr | None:
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = add(out, t)
    return out


def _shared(s: ast.stmt, tangents: list[ast.stmt]) -> ast.Subscript | None:
    """The first load ``s``'s value makes whatever the data that a tangent makes too."""
    return next((e for e in _unconditional_loads(s.value)
                 if any(_contains(t, e) for t in tangents)), None)


def _unconditional_loads(e: ast.expr) -> list[ast.Subscript]:
    """The array element loads evaluating ``e`` makes whatever the data, inner ones first."""
    out: list[ast.Subscript] = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.IfExp):
            visit(n.test)                 # (its branches: one or the other)
            return
        if isinstance(n, ast.BoolOp):
            visit(n.values[0])            # (the rest: only if the first does not decide)
            return
        if isinstance(n, ast.Call) and tg_name(n) == "where":
            visit(n.args[0])              # (printed as a ? b : c: one branch runs)
            return
        for child in ast.iter_child_nodes(n):
            visit(child)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) \
                and isinstance(n.ctx, ast.Load):
            out.append(n)

    visit(e)
    return out


def _contains(tree: ast.AST, e: ast.expr) -> bool:
    text = ast.dump(e)
    return any(isinstance(n, ast.Subscript) and ast.dump(n) == text for n in ast.walk(tree))


def _replace(tree: ast.AST, text: str, local: str) -> None:
    """Every load of ``tree`` that dumps as ``text`` becomes the local ``local``."""
    for n in ast.walk(tree):
        for field_, value in ast.iter_fields(n):
            if isinstance(value, ast.Subscript) and isinstance(value.ctx, ast.Load) \
                    and ast.dump(value) == text:
                setattr(n, field_, ast.copy_location(name(local), value))
            elif isinstance(value, list):
                for k, item in enumerate(value):
                    if isinstance(item, ast.Subscript) and isinstance(item.ctx, ast.Load) \
                            and ast.dump(item) == text:
                        value[k] = ast.copy_location(name(local), item)
