"""Calls that write memory run exactly once, in Python's order.

An atomic (``tg.atomic_add`` & co.), or a call of a device function that stores into an array
or uses an atomic (itself or through the functions it calls), changes memory.  Printers may
repeat an operand's text (``x**2`` is ``x * x``, ``max(a, b)`` a conditional, ``A[k] += v`` in
C ``A[k] = A[k] + v``, ``a < b < c`` in C ``a < b && b < c``) or leave C to pick the order of
operands, so each such call that Python evaluates unconditionally is hoisted into a fresh local
assigned just before its statement (for ``elif``: inside the ``else``, before the inner if)::

    Out[tg.atomic_add(C, 0, 1)] += 1    ->    _once0 = tg.atomic_add(C, 0, 1)
                                              Out[_once0] += 1

An operand that reads memory and comes before such a call in Python's order goes first, into a
local of its own.  A call that is the whole value of an assignment, a return or a statement
stays as written.  A call Python evaluates only sometimes (after ``and``/``or``, in a branch of
``x if c else y``, after a chain's first comparison, in a ``while`` test) stays where it is,
unless a printer may repeat or skip it there: then the kernel is refused, at the call.
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from typing import Any, NamedTuple

from tapegrad.errors import located
from tapegrad.frontend.ir import KernelIR, tg_name

PREFIX = "_once"   # (users' locals starting with '_' are renamed: frontend/resolve.py)


class Operand(NamedTuple):
    """Where an operand sits (``holder.field``, or ``holder.field[index]``) and how it runs."""

    holder: ast.AST
    field: str
    index: int | None = None
    sometimes: str | None = None   # why Python evaluates it only sometimes, if it does
    repeated: bool = False         # a printer may evaluate it twice, or skip it
    whole: bool = False            # the whole value of its statement: never hoisted

    def get(self) -> ast.expr:
        value = getattr(self.holder, self.field)
        return value if self.index is None else value[self.index]

    def set(self, node: ast.expr) -> None:
        if self.index is None:
            setattr(self.holder, self.field, node)
        else:
            getattr(self.holder, self.field)[self.index] = node


def evaluate_once(ir: KernelIR, func_ir: Callable[[Any], KernelIR]) -> KernelIR:
    """``ir`` with each call that writes memory evaluated once, in Python's order (a copy
    when a call moves; ``func_ir`` gives a device function's IR)."""
    writes = _Writes(func_ir)
    if not any(writes.call(n, ir.funcs)
               for n in ast.walk(ast.Module(body=ir.body, type_ignores=[]))):
        return ir
    rewrite = _Hoist(ir, writes)
    body = rewrite.block(copy.deepcopy(ir.body))
    if not rewrite.names:
        return ir
    out = copy.copy(ir)
    out.body, out.locals = body, ir.locals | set(rewrite.names)
    return out


class _Writes:
    """Which calls write memory."""

    def __init__(self, func_ir: Callable[[Any], KernelIR]):
        self.func_ir = func_ir
        self.known: dict[int, bool] = {}

    def call(self, node: ast.AST, funcs: dict[str, Any]) -> bool:
        if not isinstance(node, ast.Call):
            return False
        name = tg_name(node)
        if name is not None:
            return name.startswith("atomic_") or name == "group_reduce_add"
        func = funcs.get(node.func.id) if isinstance(node.func, ast.Name) else None
        return func is not None and self.function(func)

    def function(self, func: Any) -> bool:
        if id(func) not in self.known:
            self.known[id(func)] = False     # (a recursive call is refused when typed)
            ir = self.func_ir(func)
            body = ast.Module(body=ir.body, type_ignores=[])
            private = {t.id for s in ast.walk(body) if isinstance(s, ast.Assign)
                       and tg_name(s.value) == "private" for t in s.targets
                       if isinstance(t, ast.Name)}  # per-work-item scratch is no effect
            self.known[id(func)] = any(
                isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store)
                and not (isinstance(n.value, ast.Name) and n.value.id in private)
                or self.call(n, ir.funcs) for n in ast.walk(body))
        return self.known[id(func)]


# Operators whose right operand a printer may read more than once: an integer ``a // b``
# tests ``b == -1``, a shift tests its count's range, an integer power its exponent's sign.
# (Types are not known here: a float's // and ** count too, so a call that writes memory in
# a branch there is refused though its printer would read it once.)
_REPEATS_RIGHT = (ast.FloorDiv, ast.LShift, ast.RShift, ast.Pow)


def _operands(e: ast.expr) -> list[Operand]:
    """``e``'s operands in Python's order of evaluation."""
    if isinstance(e, ast.BoolOp):        # (printed && and ||: numbers' `x or y` is refused)
        op = "and" if isinstance(e.op, ast.And) else "or"
        return [Operand(e, "values", k, f"after `{op}`" if k else None)
                for k in range(len(e.values))]
    if isinstance(e, ast.IfExp):
        branch = "in a branch of `x if c else y`"
        return [Operand(e, "test"), Operand(e, "body", sometimes=branch),
                Operand(e, "orelse", sometimes=branch)]
    if isinstance(e, ast.Compare):       # a chain repeats its middle operands
        n = len(e.comparators)
        return [Operand(e, "left")] + [
            Operand(e, "comparators", k, "after the first comparison of a chain" if k else None,
                    k < n - 1) for k in range(n)]
    if isinstance(e, ast.BinOp):         # x ** 2 is x * x; see _REPEATS_RIGHT
        power = isinstance(e.op, ast.Pow)
        return [Operand(e, "left", repeated=power),
                Operand(e, "right", repeated=isinstance(e.op, _REPEATS_RIGHT))]
    if isinstance(e, ast.UnaryOp):
        return [Operand(e, "operand")]
    if isinstance(e, ast.Call):          # min, max, abs: conditionals; where picks one
        repeated = tg_name(e) in ("min", "max", "abs", "where")
        return [Operand(e, "args", k, repeated=repeated) for k in range(len(e.args))]
    if isinstance(e, ast.Subscript):     # a tuple's element at a run-time index: a conditional
        return [Operand(e, "value", repeated=isinstance(e.value, ast.Tuple)),
                Operand(e, "slice", repeated=True)]
    if isinstance(e, ast.Tuple):
        return [Operand(e, "elts", k) for k in range(len(e.elts))]
    if isinstance(e, ast.Attribute):
        return [Operand(e, "value")]
    return []


def _statement_operands(s: ast.stmt) -> list[Operand]:
    """The expressions of ``s`` itself (not of its blocks), in Python's order."""
    if isinstance(s, (ast.Expr, ast.Return)) and s.value is not None:
        return [Operand(s, "value", whole=True)]
    if isinstance(s, ast.Assign):        # the value, then the target's index
        t = s.targets[0]
        return [Operand(s, "value", whole=True)] + (
            [Operand(t, "slice")] if isinstance(t, ast.Subscript) else [])
    if isinstance(s, ast.AugAssign):     # the target's index (printed twice in C), the value
        t, repeats = s.target, isinstance(s.op, _REPEATS_RIGHT)
        return ([Operand(t, "slice", repeated=True)] if isinstance(t, ast.Subscript) else []) \
            + [Operand(s, "value", whole=not repeats, repeated=repeats)]
    if isinstance(s, ast.If):
        return [Operand(s, "test")]
    if isinstance(s, ast.While):
        return [Operand(s, "test", sometimes="in a while loop's test")]
    if isinstance(s, ast.For):
        return [Operand(s.iter, "args", k) for k in range(len(s.iter.args))]
    return []


class _Hoist:
    def __init__(self, ir: KernelIR, writes: _Writes):
        self.ir, self.writes = ir, writes
        self.names: list[str] = []
        self.taken = set(ir.params) | ir.locals

    def writes_memory(self, e: ast.AST) -> bool:
        return self.writes.call(e, self.ir.funcs)

    def block(self, body: list[ast.stmt]) -> list[ast.stmt]:
        out: list[ast.stmt] = []
        for s in body:
            if isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Subscript) \
                    and self.hoists(s.value):
                s = self.spelled_out(s)
            self.sequence(_statement_operands(s), None, False, out)
            for field in ("body", "orelse"):
                if hasattr(s, field):
                    setattr(s, field, self.block(getattr(s, field)))
            out.append(s)
        return out

    def sequence(self, operands: list[Operand], sometimes: str | None, repeated: bool,
                 pre: list[ast.stmt]) -> None:
        """Rewrite ``operands``, putting what is hoisted into ``pre``.  An operand that reads
        memory goes into a local too when a later operand's call is hoisted before it."""
        for k, o in enumerate(operands):
            why = sometimes or o.sometimes
            node = self.operand(o.get(), why, repeated or o.repeated, o.whole, pre)
            later = any(self.hoists(p.get(), p.whole) for p in operands[k + 1:]
                        if not (sometimes or p.sometimes))
            if later and why is None and self.reads_memory(node):
                node = self.hoist(node, pre)
            o.set(node)

    def operand(self, e: ast.expr, sometimes: str | None, repeated: bool, whole: bool,
                pre: list[ast.stmt]) -> ast.expr:
        effect = self.writes_memory(e)
        if effect and sometimes and repeated:
            raise self.refuse(e, sometimes)
        if effect and not sometimes:
            repeated = False        # its operands go into its own statement
        self.sequence(_operands(e), sometimes, repeated, pre)
        return self.hoist(e, pre) if effect and not sometimes and not whole else e

    def spelled_out(self, s: ast.AugAssign) -> ast.Assign:
        """``A[k] op= v`` whose ``v`` hoists a call, as ``A[k] = A[k] op v``: Python reads
        ``A[k]`` before it runs ``v``, and the read, an operand now, is hoisted first (a
        call that writes ``A[k]`` must not change the value it is combined with).  An index
        that writes memory too is refused: it would run twice."""
        t = s.target
        if self.writes_memory(t.slice):
            raise located(t, self.ir.filename,
                          f"`{ast.unparse(s).strip()}`: both the index and the value write "
                          "memory in one augmented assignment; compute the index into a local "
                          "on its own line first (`k = ...`) and use A[k]")
        load = ast.copy_location(ast.Subscript(value=copy.deepcopy(t.value),
                                               slice=copy.deepcopy(t.slice), ctx=ast.Load()), t)
        value = ast.copy_location(ast.BinOp(left=load, op=s.op, right=s.value), s.value)
        return ast.copy_location(ast.Assign(targets=[t], value=value), s)

    def hoists(self, e: ast.expr, whole: bool = False) -> bool:
        """Whether rewriting ``e`` (evaluated unconditionally) hoists a call."""
        return self.writes_memory(e) and not whole or any(
            self.hoists(o.get()) for o in _operands(e) if o.sometimes is None)

    def reads_memory(self, e: ast.expr) -> bool:
        return any(isinstance(n, ast.Subscript)
                   or isinstance(n, ast.Call) and (tg_name(n) is None or self.writes_memory(n))
                   for n in ast.walk(e))

    def hoist(self, e: ast.expr, pre: list[ast.stmt]) -> ast.Name:
        name = f"{PREFIX}{len(self.names)}"
        while name in self.taken:
            name += "_"
        self.names.append(name)
        self.taken.add(name)
        target = ast.copy_location(ast.Name(id=name, ctx=ast.Store()), e)
        pre.append(ast.copy_location(ast.Assign(targets=[target], value=e), e))
        return ast.copy_location(ast.Name(id=name, ctx=ast.Load()), e)

    def refuse(self, call: ast.expr, sometimes: str) -> Exception:
        text = ast.unparse(call)
        if sometimes.startswith("in a while"):
            instead = (f"write `while True:` and begin its body with `v = {text}` and "
                       "`if not <the test, using v>: break`")
        else:
            instead = (f"assign it to a local on its own line first (`v = {text}`, inside an "
                       "`if` when it must run only sometimes) and use v here")
        return located(call, self.ir.filename,
                       f"{text} writes memory and Python evaluates it only sometimes here "
                       f"({sometimes}), at a place where tapegrad's generated code may evaluate "
                       f"it twice or not at all: {instead}")
