"""Adjoints through one expression, for the reverse transform (``reverse.py``): a value's
adjoint ``g`` spread into its active leaves (locals' ``_bar`` variables, arrays' shadows)
with the partial derivatives of ``rules.py``; a mixin of ``_Reverse``, whose analyses
(activity, ownership of indices, types) it reads."""

from __future__ import annotations

import ast

from tapegrad.ad import rules
from tapegrad.ad.activity import SELECTIONS
from tapegrad.ad.astutil import add as _add
from tapegrad.ad.astutil import assign as _assign
from tapegrad.ad.astutil import clone as _clone
from tapegrad.ad.astutil import const as _c
from tapegrad.ad.astutil import name as _n
from tapegrad.frontend.ir import tg_call, tg_name
from tapegrad.frontend.types import Array


class ExpressionAdjoints:
    """``backprop``: the statements adding ``g * d e / d leaf`` for an expression ``e``."""

    def backprop(self, e: ast.expr, g: ast.expr) -> list[ast.stmt]:
        """Statements adding ``g * d e / d (each active leaf)`` into the leaves' adjoints."""
        if not self.active(e):
            return []
        if isinstance(e, ast.Name):
            return [_assign(f"{e.id}_bar", _add(_n(f"{e.id}_bar"), g))]
        if isinstance(e, ast.Subscript):
            array = e.value.id
            shadow = f"{array}_bar"
            if self.own.get(array) == "plain":
                target = ast.Subscript(value=_n(shadow), slice=_clone(e.slice), ctx=ast.Store())
                return [ast.AugAssign(target=target, op=ast.Add(), value=g)]
            return [ast.Expr(value=tg_call("atomic_add", [_n(shadow), _clone(e.slice), g]))]
        out: list[ast.stmt] = []
        if not isinstance(g, (ast.Name, ast.Constant, ast.UnaryOp)):
            tmp = self.fresh("d")
            out.append(_assign(tmp, g))
            g = _n(tmp)
        if isinstance(e, (ast.BinOp, ast.UnaryOp)):
            args = [e.left, e.right] if isinstance(e, ast.BinOp) else [e.operand]
            for arg, p in zip(args, rules.operator_partials(e.op, args)):
                if p is not None:
                    out += self.backprop(arg, rules.term(p, args, e, _clone(g)))
            return out
        if isinstance(e, ast.IfExp):
            return out + [ast.If(test=_clone(e.test), body=self.backprop(e.body, g) or [ast.Pass()],
                                 orelse=self.backprop(e.orelse, _clone(g)))]
        if isinstance(e, ast.Call):
            return out + self.backprop_call(e, g)
        return out

    def backprop_call(self, e: ast.Call, g: ast.expr) -> list[ast.stmt]:
        name = tg_name(e)
        args = e.args
        if name is None:   # a device function with a hand-written reverse rule
            self.check_rule_arrays(e)
            func = self.ir.funcs[e.func.id]
            rule = f"{e.func.id}_reverse"
            self.rules[rule] = func.reverse_rule
            result = self.fresh("rule")
            out: list[ast.stmt] = [_assign(result, ast.Call(
                func=_n(rule), args=[_clone(a) for a in args] + [_clone(g)], keywords=[]))]
            scalars = [a for a in args if not isinstance(self.T(a), Array)]
            for k, arg in enumerate(scalars):
                part = _n(result) if len(scalars) == 1 else ast.Subscript(
                    value=_n(result), slice=_c(k), ctx=ast.Load())
                out += self.backprop(arg, part)
            return out
        if name == "where":
            return [ast.If(test=_clone(args[0]), body=self.backprop(args[1], g) or [ast.Pass()],
                           orelse=self.backprop(args[2], _clone(g)))]
        if name in SELECTIONS:   # to the argument returned (max(a, b, c) = max(max(a, b), c))
            test, a, b = self.selection(e)
            return [ast.If(test=test, body=self.backprop(a, g) or [ast.Pass()],
                           orelse=self.backprop(b, _clone(g)))]
        try:
            parts = rules.call_partials(name)
        except KeyError:
            raise self.fail(e, f"tg.{name} has no derivative rule") from None
        out: list[ast.stmt] = []
        for arg, p in zip(args, parts):
            if p is not None and self.active(arg):
                out += self.backprop(arg, rules.term(p, args, e, _clone(g)))
        return out
