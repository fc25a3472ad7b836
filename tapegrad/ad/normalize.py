"""Passes that bring kernel IR to the small form the derivative transforms work on.

After ``normalize``:
- no device-function call remains (each is inlined; its locals are renamed ``_<f><k>_<name>``);
- no ``return``, ``break`` or ``continue`` remains (each sets a flag, and the statements after it
  run under ``if not flag``; a for-loop whose body broke runs its remaining iterations empty,
  and its variable is set back to the value it broke at);
- every augmented assignment is a plain one (``x = x + e``), except ``A[idx] += e`` and
  ``A[idx] -= e`` on arrays, whose adjoints do not consume the shadow;
- tuple assignments from tuple displays are split into scalar assignments.
Every new node carries the line of the user's statement it came from.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any

from tapegrad.errors import KernelSyntaxError, located
from tapegrad.frontend.ir import KernelIR, tg_name


def normalize(ir: KernelIR, func_ir: Callable[[Any], KernelIR],
              keep: Callable[[Any], bool] = lambda func: False) -> KernelIR:
    """Inline device functions (except those ``keep`` names: they carry their own derivative
    rules), then remove exits, augmented and tuple assignments."""
    inliner = _Inliner(ir, func_ir, keep)
    body = inliner.block(ir.body)
    body = lower_augmented(body)
    body = split_tuple_assignments(body)
    body = remove_exits(body, ir)
    out = KernelIR(name=ir.name, params=list(ir.params), body=body, filename=ir.filename,
                   lineno=ir.lineno, is_kernel=ir.is_kernel, funcs=inliner.kept, locals=set())
    out.locals = assigned_names(body) - set(ir.params)
    return out


def assigned_names(body: list[ast.stmt]) -> set[str]:
    mod = ast.Module(body=body, type_ignores=[])
    return {n.id for n in ast.walk(mod) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _name(id_: str, store: bool = False) -> ast.Name:
    return ast.Name(id=id_, ctx=ast.Store() if store else ast.Load())


def _assign(target: str, value: ast.expr, like: ast.AST) -> ast.Assign:
    node = ast.Assign(targets=[_name(target, True)], value=value)
    return _locate(node, like)


def _locate(node: ast.AST, like: ast.AST) -> ast.AST:
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            n.lineno = getattr(like, "lineno", 1)
            n.col_offset = getattr(like, "col_offset", 0)
            n.end_lineno = getattr(like, "end_lineno", n.lineno)
            n.end_col_offset = getattr(like, "end_col_offset", n.col_offset)
    return node


# -- inlining -------------------------------------------------------------------------------

class _Inliner:
    def __init__(self, ir: KernelIR, func_ir: Callable[[Any], KernelIR],
                 keep: Callable[[Any], bool]):
        self.ir = ir
        self.func_ir = func_ir
        self.keep = keep
        self.kept: dict[str, Any] = {}
        self.count = 0
        self.stack: list[str] = []

    def block(self, stmts: list[ast.stmt], funcs: dict[str, Any] | None = None) -> list[ast.stmt]:
        funcs = self.ir.funcs if funcs is None else funcs
        out: list[ast.stmt] = []
        for s in stmts:
            out.extend(self.stmt(s, funcs))
        return out

    def stmt(self, s: ast.stmt, funcs: dict[str, Any]) -> list[ast.stmt]:
        pre: list[ast.stmt] = []
        s = copy.copy(s)
        if isinstance(s, ast.While) and _has_call(s.test, funcs):
            # the test runs before every iteration: while True: <inlined>; if not test: break
            test = self.expr(s.test, funcs, pre, s)
            exit_ = ast.If(test=ast.UnaryOp(op=ast.Not(), operand=test), body=[ast.Break()],
                           orelse=[])
            body = pre + [_locate(exit_, s)] + self.block(s.body, funcs)
            return [_locate(ast.While(test=ast.Constant(value=True), body=body, orelse=[]), s)]
        for field in ("value", "test"):
            if hasattr(s, field) and getattr(s, field) is not None:
                setattr(s, field, self.expr(getattr(s, field), funcs, pre, s))
        if isinstance(s, ast.Assign):       # (copies: the kernel's own IR stays as it was)
            s.targets = [copy.copy(t) for t in s.targets]
            targets = s.targets
        elif isinstance(s, ast.AugAssign):
            s.target = copy.copy(s.target)
            targets = [s.target]
        else:
            targets = []
        for t in targets:
            if isinstance(t, ast.Subscript):
                t.slice = self.expr(t.slice, funcs, pre, s)
        if isinstance(s, ast.For):
            s.iter = copy.copy(s.iter)
            s.iter.args = [self.expr(a, funcs, pre, s) for a in s.iter.args]
        for field in ("body", "orelse"):
            if hasattr(s, field):
                setattr(s, field, self.block(getattr(s, field), funcs))
        return pre + [s]

    def expr(self, e: ast.expr, funcs: dict[str, Any], pre: list[ast.stmt], at: ast.stmt
             ) -> ast.expr:
        """Copy ``e``, replacing device calls by their results (inlined into ``pre``).  A
        call that Python evaluates only on a condition (a branch of ``x if c else y``, an
        operand after the first of ``and``/``or``, a comparison after the first of a chain)
        is inlined under that condition: ``pre`` gets an ``if`` that computes the part into
        a temporary (its derivative must not run where the primal did not: sqrt(-0.5) in the
        branch not taken gave a NaN gradient, a write in it a wrong one)."""
        inliner = self

        def conditional(node: ast.expr) -> bool:
            return _has_call(node, {n: f for n, f in funcs.items() if not inliner.keep(f)})

        class Rewrite(ast.NodeTransformer):
            def visit_IfExp(self, node: ast.IfExp) -> ast.expr:
                if not (conditional(node.body) or conditional(node.orelse)):
                    return self.generic_visit(node)
                test = self.visit(node.test)
                t = inliner.temporary("if")
                pre.append(_locate(ast.If(test=test, body=inliner.part(t, node.body, funcs, at),
                                          orelse=inliner.part(t, node.orelse, funcs, at)), at))
                return _name(t)

            def visit_BoolOp(self, node: ast.BoolOp) -> ast.expr:
                if not any(conditional(v) for v in node.values[1:]):
                    return self.generic_visit(node)
                t = inliner.temporary("bool")
                pre.append(_assign(t, self.visit(node.values[0]), at))
                rest: list[ast.stmt] = []
                for v in reversed(node.values[1:]):   # (a and b and c: c only if b held)
                    test = _name(t) if isinstance(node.op, ast.And) else \
                        ast.UnaryOp(op=ast.Not(), operand=_name(t))
                    rest = [_locate(ast.If(test=test, body=inliner.part(t, v, funcs, at)
                                           + rest, orelse=[]), at)]
                pre.extend(rest)
                return _name(t)

            def visit_Compare(self, node: ast.Compare) -> ast.expr:
                if not any(conditional(c) for c in node.comparators[1:]):
                    return self.generic_visit(node)
                # a < b < c: each comparator once, into a temporary, as Python evaluates it
                t, left, links = inliner.temporary("bool"), self.visit(node.left), []
                for op, c in zip(node.ops, node.comparators):
                    m = inliner.temporary("cmp")
                    links.append((left, op, c, m))
                    left = _name(m)

                def link(left: ast.expr, op: ast.cmpop, c: ast.expr, m: str) -> list[ast.stmt]:
                    return inliner.part(m, c, funcs, at) + [_assign(t, ast.Compare(
                        left=left, ops=[op], comparators=[_name(m)]), at)]
                rest: list[ast.stmt] = []
                for parts in reversed(links[1:]):
                    rest = [_locate(ast.If(test=_name(t), body=link(*parts) + rest, orelse=[]),
                                    at)]
                pre.extend(link(*links[0]) + rest)
                return _name(t)

            def visit_Call(self, node: ast.Call) -> ast.expr:
                self.generic_visit(node)
                if tg_name(node) is None and isinstance(node.func, ast.Name) \
                        and node.func.id in funcs:
                    func = funcs[node.func.id]
                    if inliner.keep(func):
                        inliner.kept[node.func.id] = func
                        return node
                    return inliner.inline(func, node, pre, at)
                return node

        return Rewrite().visit(copy.deepcopy(e))

    def temporary(self, kind: str) -> str:
        self.count += 1
        return f"_{kind}{self.count}"

    def part(self, target: str, e: ast.expr, funcs: dict[str, Any], at: ast.stmt
             ) -> list[ast.stmt]:
        """Statements that compute ``e`` into ``target``, its device calls inlined."""
        inner: list[ast.stmt] = []
        value = self.expr(e, funcs, inner, at)
        return inner + [_assign(target, value, at)]

    def inline(self, func: Any, call: ast.Call, pre: list[ast.stmt], at: ast.stmt) -> ast.expr:
        callee = self.func_ir(func)
        if callee.name in self.stack:
            raise located(call, self.ir.filename, f"{callee.name} calls itself; recursion is "
                                                  "not supported on devices: write a loop")
        self.count += 1
        prefix = f"_{callee.name}{self.count}_"
        assigned = assigned_names(callee.body)
        rename: dict[str, ast.expr] = {}
        for param, arg in zip(callee.params, call.args):
            if isinstance(arg, ast.Name) and param not in assigned:
                rename[param] = arg
            else:
                pre.append(_assign(prefix + param, arg, at))
                rename[param] = _name(prefix + param)
        for local in assigned - set(callee.params):
            rename[local] = _name(prefix + local)
        for param in set(callee.params) & assigned:
            rename.setdefault(param, _name(prefix + param))

        class Rename(ast.NodeTransformer):
            def visit_Name(self, node: ast.Name) -> ast.expr:
                new = rename.get(node.id)
                if new is None:
                    return node
                return ast.Name(id=new.id, ctx=node.ctx) if isinstance(new, ast.Name) else new

        body = [Rename().visit(copy.deepcopy(s)) for s in callee.body]
        body = [_locate(s, at) for s in body]
        self.stack.append(callee.name)
        body = self.block(body, callee.funcs)
        self.stack.pop()
        result = prefix[:-1]
        width = _return_width(callee.body)
        body = _returns_to_assignments(body, result, width)
        pre.extend(remove_exits(body, self.ir, function_result=True))
        if width:
            return ast.Tuple(elts=[_name(f"{result}_{k}") for k in range(width)], ctx=ast.Load())
        return _name(result)


def _has_call(e: ast.expr, funcs: dict[str, Any]) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs
               for n in ast.walk(e))


def _return_width(body: list[ast.stmt]) -> int:
    """Number of values when a function returns tuple displays, else 0."""
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple):
            return len(n.value.elts)
    return 0


def _returns_to_assignments(body: list[ast.stmt], result: str, width: int) -> list[ast.stmt]:
    class R(ast.NodeTransformer):
        def visit_Return(self, node: ast.Return) -> Any:
            if node.value is None:
                return node
            if width:
                if not isinstance(node.value, ast.Tuple) or len(node.value.elts) != width:
                    raise KernelSyntaxError("a device function that returns a tuple must return "
                                            f"a tuple of {width} on every path")
                assigns = [_assign(f"{result}_{k}", e, node) for k, e in enumerate(node.value.elts)]
            else:
                assigns = [_assign(result, node.value, node)]
            return assigns + [_locate(ast.Return(value=None), node)]

        def visit_FunctionDef(self, node: Any) -> Any:
            return node

    out = []
    for s in body:
        new = R().visit(s)
        out.extend(new if isinstance(new, list) else [new])
    return out


# -- augmented and tuple assignments ---------------------------------------------------------

def lower_augmented(body: list[ast.stmt]) -> list[ast.stmt]:
    """``x op= e`` -> ``x = x op e``; ``A[i] op= e`` likewise unless op is + or -."""
    out = []
    for s in body:
        if isinstance(s, ast.AugAssign) and (isinstance(s.target, ast.Name) or not isinstance(
                s.op, (ast.Add, ast.Sub))):
            load = copy.deepcopy(s.target)
            load.ctx = ast.Load()
            value = ast.BinOp(left=load, op=s.op, right=s.value)
            s = _locate(ast.Assign(targets=[s.target], value=value), s)
        elif isinstance(s, (ast.If, ast.For, ast.While)):
            s = copy.copy(s)
            s.body = lower_augmented(s.body)
            s.orelse = lower_augmented(s.orelse)
        out.append(s)
    return out


def split_tuple_assignments(body: list[ast.stmt]) -> list[ast.stmt]:
    """``a, b = e1, e2`` -> ``_t1 = e1; _t2 = e2; a = _t1; b = _t2`` (simultaneous semantics)."""
    out: list[ast.stmt] = []
    counter = [0]

    def walk(stmts: list[ast.stmt]) -> list[ast.stmt]:
        res = []
        for s in stmts:
            if (isinstance(s, ast.Assign) and isinstance(s.targets[0], ast.Tuple)
                    and isinstance(s.value, ast.Tuple)
                    and len(s.value.elts) == len(s.targets[0].elts)):
                temps = []
                for e in s.value.elts:
                    counter[0] += 1
                    temps.append(f"_tup{counter[0]}")
                    res.append(_assign(temps[-1], e, s))
                for target, tmp in zip(s.targets[0].elts, temps):
                    res.append(_assign(target.id, _name(tmp), s))
                continue
            if isinstance(s, (ast.If, ast.For, ast.While)):
                s = copy.copy(s)
                s.body = walk(s.body)
                s.orelse = walk(s.orelse)
            res.append(s)
        return res

    out = walk(body)
    return out


# -- exits ------------------------------------------------------------------------------------

def remove_exits(body: list[ast.stmt], ir: KernelIR, function_result: bool = False
                 ) -> list[ast.stmt]:
    """Replace return/break/continue by flags and guards (see the module docstring)."""
    remover = _ExitRemover()
    new_body, sets = remover.block(body, None)
    if "ret" in {kind for kind, _ in sets} or remover.used_ret:
        flag = remover.ret_flag
        new_body = [_locate(_assign(flag, ast.Constant(value=False), body[0]), body[0])] + new_body
    return new_body


class _ExitRemover:
    _serial = 0

    def __init__(self):
        _ExitRemover._serial += 1
        self.ret_flag = f"_returned{_ExitRemover._serial}"
        self.used_ret = False
        self.loops = 0

    def block(self, stmts: list[ast.stmt], loop: tuple[str, str] | None
              ) -> tuple[list[ast.stmt], set[tuple[str, str]]]:
        """Rewrite a statement list; return it and the flags (kind, name) it may set that
        the enclosing code must respect."""
        out: list[ast.stmt] = []
        may_set: set[tuple[str, str]] = set()
        for k, s in enumerate(stmts):
            new, sets = self.stmt(s, loop)
            out.extend(new)
            if sets:
                may_set |= sets
                rest, rest_sets = self.block(stmts[k + 1:], loop)
                may_set |= rest_sets
                if rest:
                    guard = _not_any([name for _, name in sorted(sets)])
                    out.append(_locate(ast.If(test=guard, body=rest, orelse=[]), stmts[k + 1]))
                break
        return out, may_set

    def stmt(self, s: ast.stmt, loop: tuple[str, str] | None
             ) -> tuple[list[ast.stmt], set[tuple[str, str]]]:
        if isinstance(s, ast.Return):
            self.used_ret = True
            return [_assign(self.ret_flag, ast.Constant(value=True), s)], {("ret", self.ret_flag)}
        if isinstance(s, ast.Break):
            # (the loop runs on, empty: its variable keeps counting, so keep it as it was)
            keep = [_assign(loop[3], _name(loop[2]), s)] if loop[2] else []
            return keep + [_assign(loop[0], ast.Constant(value=True), s)], {("brk", loop[0])}
        if isinstance(s, ast.Continue):
            return [_assign(loop[1], ast.Constant(value=True), s)], {("cnt", loop[1])}
        if isinstance(s, ast.If):
            body, s1 = self.block(s.body, loop)
            orelse, s2 = self.block(s.orelse, loop)
            return [_locate(ast.If(test=s.test, body=body, orelse=orelse), s)], s1 | s2
        if isinstance(s, (ast.For, ast.While)):
            self.loops += 1
            target = s.target.id if isinstance(s, ast.For) and \
                isinstance(s.target, ast.Name) else None
            names = (f"_break{self._serial}_{self.loops}", f"_continue{self._serial}_{self.loops}",
                     target, f"_broke_at{self._serial}_{self.loops}")
            body, sets = self.block(s.body, names)
            inner = {k for k in sets if k[1] not in names}
            uses_break = ("brk", names[0]) in sets
            uses_cont = ("cnt", names[1]) in sets
            if uses_cont:
                body = [_assign(names[1], ast.Constant(value=False), s)] + body
            stop = [names[0]] if uses_break else []
            stop += [name for kind, name in inner if kind == "ret"]
            pre = [_assign(names[0], ast.Constant(value=False), s)] if uses_break else []
            after: list[ast.stmt] = []
            if isinstance(s, ast.For):
                if stop:
                    body = [_locate(ast.If(test=_not_any(stop), body=body, orelse=[]), s)]
                new = ast.For(target=s.target, iter=s.iter, body=body, orelse=[])
                if uses_break and target:      # after a break, the variable it broke at
                    pre.append(_assign(names[3], ast.Constant(value=0), s))
                    after = [_locate(ast.If(test=_name(names[0]), body=[
                        _assign(target, _name(names[3]), s)], orelse=[]), s)]
            else:
                test = s.test if not stop else ast.BoolOp(op=ast.And(), values=[
                    _not_any(stop), s.test])
                new = ast.While(test=test, body=body, orelse=[])
            return pre + [_locate(new, s)] + after, inner
        return [s], set()


def _not_any(names: list[str]) -> ast.expr:
    if len(names) == 1:
        return ast.UnaryOp(op=ast.Not(), operand=_name(names[0]))
    return ast.UnaryOp(op=ast.Not(), operand=ast.BoolOp(op=ast.Or(),
                                                        values=[_name(n) for n in names]))
