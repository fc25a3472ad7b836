"""C statements of one function body: assignments (tuples component by component), Python's
``for ... in range`` (``range_loop``), ``while``, ``if``, ``return``, each under a
``// file:line`` comment tying it to the user's line.
"""

from __future__ import annotations

import ast
import re

from tapegrad.backends.c.expressions import Expressions, bare
from tapegrad.backends.c.helpers import Helpers
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import TupleT, TypedKernel, arith


class Body(Expressions):
    """The printed lines of one function body."""

    def __init__(self, helpers: Helpers, tk: TypedKernel):
        super().__init__(helpers, tk)
        self.lines: list[str] = []

    def emit(self, text: str, depth: int) -> None:
        self.lines.append("    " * depth + text)

    def fresh(self, name: str) -> str:
        """``name`` for a variable of the printer's own, made unlike every user's."""
        while name in self.h.user_names:
            name += "_"
        return name

    def range_bounds(self, args: list[ast.expr]) -> tuple[str, str, str]:
        if len(args) == 1:
            return "0", self.expr(args[0]), "1"
        if len(args) == 2:
            return self.expr(args[0]), self.expr(args[1]), "1"
        return tuple(self.expr(a) for a in args)

    # -- statements -------------------------------------------------------------------------
    def statements(self, body: list[ast.stmt], depth: int) -> None:
        for s in body:
            self.statement(s, depth)

    def statement(self, s: ast.stmt, depth: int) -> None:
        if hasattr(s, "lineno") and not isinstance(s, (ast.Break, ast.Continue)):
            self.emit(f"// {self.tk.ir.filename.rsplit('/', 1)[-1]}:{s.lineno}", depth)
        if isinstance(s, ast.Assign) and getattr(s.targets[0], "id", None) == "_returned":
            self.emit("_returned = true;", depth)        # (returns.py: leaving a loop)
        elif isinstance(s, ast.Assign):
            self.assign(s.targets[0], s.value, depth)
        elif isinstance(s, ast.AugAssign):
            combined = ast.BinOp(left=s.target, op=s.op, right=s.value)
            t = self.T(s.target)
            self.tk.types[id(combined)] = arith(s.op, t, self.T(s.value))
            try:
                self.emit(f"{self.target(s.target)} = {self.coerce(combined, t)};", depth)
            finally:
                del self.tk.types[id(combined)]
        elif isinstance(s, ast.Expr):
            if tg_name(s.value) == "synchronize":
                self.emit(self.d.barrier, depth)
            elif not isinstance(s.value, ast.Constant):
                self.emit(f"{self.expr(s.value)};", depth)
        elif isinstance(s, ast.If):
            self.emit(f"if ({bare(self.truth(s.test))}) {{", depth)
            self.statements(s.body, depth + 1)
            if s.orelse:
                self.emit("} else {", depth)
                self.statements(s.orelse, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, ast.While):
            self.emit(f"while ({bare(self.truth(s.test))}) {{", depth)
            self.statements(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, ast.For):
            self.for_range(s, depth)
        elif isinstance(s, ast.Return):
            ret = self.tk.return_type
            if s.value is None or self.tk.ir.is_kernel:
                self.emit("return;", depth)
            elif isinstance(ret, TupleT):
                items = ", ".join(self.cast_text(text, src, item) for (text, src), item
                                  in zip(self.tuple_parts(s.value), ret.items))
                self.emit(f"{{ tg_tuple_{self.tk.symbol} _r = {{{items}}}; return _r; }}", depth)
            else:
                self.emit(f"return {self.coerce(s.value, ret)};", depth)
        elif isinstance(s, ast.Break):
            self.emit("break;", depth)
        elif isinstance(s, ast.Continue):
            if getattr(s, "_tg_item_exit", False):     # a return: invalid from here on
                self.emit("_valid = false;", depth)
            self.emit("continue;", depth)
        elif isinstance(s, ast.Pass):
            pass
        else:
            raise self.fail(s, f"{type(s).__name__} is not printed as C")

    def for_range(self, s: ast.For, depth: int) -> None:
        self.range_loop(s, self.range_bounds(s.iter.args), depth)
        self.statements(s.body, depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def range_loop(self, s: ast.For, bounds: tuple[str, str, str], depth: int) -> None:
        """Opens ``for <target> in range(start, stop, step)`` (C text ``bounds``) with
        Python's semantics; the caller prints the body at ``depth + 2`` and closes two braces.

        The bounds are evaluated once; a negative step counts down and a step of 0 runs no
        iteration (Python raises ValueError; the CPU runs none).  A counter of the printer's
        own runs the loop and the user's variable takes its value at the top of each
        iteration, so that assigning to the variable in the body leaves the iteration alone
        and after the loop the variable holds its last value (unchanged if none ran)::

            {
                const long _stop_k_5 = N[i];
                for (long _k_5 = 0L; _k_5 < _stop_k_5; _k_5 += 1) {
                    k = _k_5;
                    ...
        """
        start, stop, step = bounds
        target = self.cname(s.target.id)
        i, n = (self.fresh(f"_{kind}{s.target.id}_{s.lineno}") for kind in ("", "stop_"))
        self.emit("{", depth)
        self.emit(f"const {self.d.int64} {n} = {stop};", depth + 1)
        literal = re.fullmatch(r"\(?(-?\d+)L{0,2}\)?", step)
        if literal:
            k = int(literal.group(1))
            test = f"{i} < {n}" if k > 0 else f"{i} > {n}" if k < 0 else "0"
        else:
            st = self.fresh(f"_step_{s.target.id}_{s.lineno}")
            self.emit(f"const {self.d.int64} {st} = {step};", depth + 1)
            test, step = f"({st} > 0 ? {i} < {n} : {st} < 0 && {i} > {n})", st
        self.emit(f"for ({self.d.int64} {i} = {start}; {test}; {i} += {step}) {{", depth + 1)
        self.emit(f"{target} = {i};", depth + 2)

    def assign(self, target: ast.expr, value: ast.expr, depth: int) -> None:
        if isinstance(value, ast.Call) and tg_name(value) is None \
                and isinstance(self.T(value), TupleT):       # a device function's tuple
            callee = self.tk.callees[id(value)]
            self.emit("{", depth)
            self.emit(f"const tg_tuple_{callee.symbol} _t = {self.expr(value)};", depth + 1)
            names = [self.target(e) for e in target.elts] if isinstance(target, ast.Tuple) \
                else [f"{self.cname(target.id)}_{k}" for k in range(len(self.T(value).items))]
            for k, name in enumerate(names):
                self.emit(f"{name} = _t.v{k};", depth + 1)
            self.emit("}", depth)
            return
        if isinstance(target, ast.Tuple):
            parts = self.tuple_parts(value)
            if isinstance(value, ast.Tuple) and len(parts) > 1:
                # a, b = b, a: every value is read before any name is assigned
                self.emit("{", depth)
                for k, (e, part) in enumerate(zip(target.elts, parts)):
                    t = self.T(e)
                    self.emit(f"const {self.d.ctype(t.dtype)} _swap{k} = "
                              f"{self.cast_text(part[0], part[1], t)};", depth + 1)
                for k, e in enumerate(target.elts):
                    self.emit(f"{self.target(e)} = _swap{k};", depth + 1)
                self.emit("}", depth)
                return
            for e, part in zip(target.elts, parts):
                t = self.T(e)
                self.emit(f"{self.target(e)} = {self.cast_text(part[0], part[1], t)};", depth)
            return
        t = self.T(target)
        if isinstance(t, TupleT):
            for k, (text, src) in enumerate(self.tuple_parts(value)):
                self.emit(f"{self.cname(target.id)}_{k} = "
                          f"{self.cast_text(text, src, t.items[k])};", depth)
            return
        self.emit(f"{self.target(target)} = {self.coerce(value, t)};", depth)

    def target(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return self.cname(node.id)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        raise self.fail(node, "this assignment target is not printed as C")

