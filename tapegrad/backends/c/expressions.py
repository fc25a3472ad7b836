"""C expressions with Python's semantics, in either dialect.

``//`` and ``%`` round towards minus infinity (for floats too), ``max(a, b)`` is ``b if b > a
else a`` (NaN as Python gives it), ``int(x)`` truncates, an ``int ** int`` is an integer, float
literals take the data's precision, ``and``/``or`` short-circuit, indices are 64-bit.  A tuple
is printed component by component (``tuple_parts``): C has no tuples, only structs.
"""

from __future__ import annotations

import ast
import math

import numpy as np

from tapegrad.backends.c.helpers import Helpers
from tapegrad.errors import KernelCompileError, KernelError, KernelSyntaxError, located
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.typerules import meets_float32
from tapegrad.frontend.types import Array, DType, Scalar, TupleT, Type, TypedKernel, float_of
from tapegrad.lang import primitives
from tapegrad.lang.primitives import is_expression

_C_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.BitAnd: "&", ast.BitOr: "|",
          ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_C_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def fail(tk: TypedKernel, node: ast.AST | None, message: str,
         cls: type[KernelError] = KernelSyntaxError) -> KernelError:
    """An error at ``node``'s line of ``tk``'s source (its definition's line without one)."""
    return located(node if node is not None else ast.Pass(lineno=tk.ir.lineno, col_offset=0),
                   tk.ir.filename, message, cls)


def bare(text: str) -> str:
    """``text`` without one pair of parentheses around all of it (``if ((a == b))`` draws a
    compiler warning)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(text) - 1:
            return text                     # (a) && (b): the first pair closes early
    return text[1:-1]


class Expressions:
    """Expressions of one function body ``tk``; ``helpers`` collects what they call."""

    def __init__(self, helpers: Helpers, tk: TypedKernel):
        self.h, self.tk, self.d = helpers, tk, helpers.d
        # types of nodes a backend pass made after typing (structure.py's shared values)
        self.added_types: dict[int, Type] = {}

    def T(self, node: ast.AST) -> Type:
        t = self.tk.types.get(id(node), self.added_types.get(id(node)))
        if t is None:
            raise self.fail(node, "tapegrad's bug: the C printer met an expression without a "
                                  "type; please report it with this kernel", KernelCompileError)
        return t

    def fail(self, node: ast.AST | None, message: str,
             cls: type[KernelError] = KernelSyntaxError) -> KernelError:
        return fail(self.tk, node, message, cls)

    def cname(self, name: str) -> str:
        """The user's variable ``name`` as the C code names it (names.py: its own, unless
        that is a name the printer derives or a C macro's)."""
        return self.h.cnames.get(name, name)

    # -- tuples: each component printed on its own ------------------------------------------
    def tuple_parts(self, node: ast.expr) -> list[tuple[str, Type]]:
        t = self.T(node)
        name = tg_name(node)
        r, W = self.tk.rank, self.tk.groupsize
        if name == "global_indices":
            return [(f"(_g{k} * {W[k]} + _l{k})", Scalar("int64")) for k in range(r)]
        if name == "local_indices":
            return [(f"_l{k}", Scalar("int64")) for k in range(r)]
        if name == "group_indices":
            return [(f"_g{k}", Scalar("int64")) for k in range(r)]
        if name == "ndrange":
            return [(f"_n{k}", Scalar("int64")) for k in range(r)]
        if name == "groupsize":
            return [(str(w), Scalar("int64")) for w in W]
        if isinstance(node, ast.Attribute) and node.attr == "shape":
            a = self.cname(node.value.id)
            return [(f"{a}_shape{k}", Scalar("int64")) for k in range(self.T(node.value).ndim)]
        if isinstance(node, ast.Name):
            return [(f"{self.cname(node.id)}_{k}", item) for k, item in enumerate(t.items)]
        if isinstance(node, ast.Tuple):
            return [(self.expr(e), self.T(e)) for e in node.elts]
        raise self.fail(node, "this tuple is not printed as C yet")

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> str:
        method = getattr(self, "expr_" + type(node).__name__, None)
        if method is None:
            raise self.fail(node, f"{type(node).__name__} is not printed as C")
        return method(node)

    def coerce(self, node: ast.expr, to: Type | None) -> str:
        """``node`` as a value of type ``to`` (float literals take its precision)."""
        if isinstance(to, Scalar) and isinstance(node, ast.Constant) \
                and not isinstance(node.value, bool):
            return self.literal(node.value, to.dtype)
        return self.cast_text(self.expr(node), self.tk.types.get(id(node)), to)

    def cast_text(self, text: str, src: Type | None, to: Type | None) -> str:
        if not (isinstance(to, Scalar) and isinstance(src, Scalar)) or src.dtype == to.dtype:
            return text
        if to.dtype == "bool":
            return f"({text} != 0)"
        return f"(({self.d.ctype(to.dtype)})({text}))"

    def literal(self, value: object, dtype: str) -> str:
        if dtype == "bool":
            return "true" if value else "false"
        if dtype in ("float32", "float64"):
            text = repr(float(value))
            if text in ("inf", "-inf", "nan"):
                text = {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[text]
                return f"(({self.d.ctype(dtype)}){text})"
            if "e" not in text and "." not in text:
                text += ".0"
            if dtype == "float64":
                return text
            # (a float literal past float32's range or below its normal numbers is one the C
            # compilers refuse (NVRTC: "floating constant is out of range"): as the CPU rounds
            # it, to an infinity, or a double rounded to a subnormal or zero by the cast)
            with np.errstate(over="ignore"):
                single = abs(float(np.float32(value)))
            if single == math.inf:
                return f"((float){'(-INFINITY)' if float(value) < 0 else 'INFINITY'})"
            if single < np.finfo(np.float32).tiny:
                return f"((float){text})"
            return text + "f"
        # (an int64 literal is 64-bit in C too, else BIG * BIG and 1 << 40 wrap at 32 bits)
        v, L = int(value), self.d.int64_suffix
        if v == -2 ** 63:          # (-9223372036854775808L would negate a literal past long's)
            return f"({v + 1}{L} - 1{L})"
        return f"{v}{L}" if dtype == "int64" else str(v)

    def truth(self, node: ast.expr) -> str:
        t = self.tk.types.get(id(node))
        text = self.expr(node)
        return text if t == Scalar("bool") else f"({text} != 0)"

    def expr_Constant(self, node: ast.Constant) -> str:
        t = self.T(node)
        return self.literal(node.value, t.dtype) if isinstance(t, Scalar) else repr(node.value)

    def expr_Name(self, node: ast.Name) -> str:
        t = self.tk.types.get(id(node))
        if isinstance(t, Scalar) and t.dtype == "bool" and node.id in self.tk.ir.params:
            return f"({self.cname(node.id)} != 0)"       # (a bool argument is passed as an int)
        return self.cname(node.id)

    def expr_Attribute(self, node: ast.Attribute) -> str:
        base = self.T(node.value)
        if isinstance(base, Array) and node.attr == "size":
            return "(" + " * ".join(f"{self.cname(node.value.id)}_shape{k}"
                                    for k in range(base.ndim)) + ")"
        if isinstance(base, Array) and node.attr == "ndim":
            return str(base.ndim)
        raise self.fail(node, f".{node.attr} is not printed as C")

    def subscript(self, node: ast.Subscript) -> str:
        a = self.cname(node.value.id)
        t = self.T(node.value)
        idx = node.slice
        parts = []
        for e in idx.elts if isinstance(idx, ast.Tuple) else [idx]:
            # (a tuple among the index's parts gives one index per component: A[I, k])
            parts += self.tuple_parts(e) if isinstance(self.T(e), TupleT) else \
                [(self.index_text(e), self.T(e))]
        flat = f"({parts[0][0]})"
        for k in range(1, len(parts)):
            flat = f"({flat} * {a}_shape{k} + ({parts[k][0]}))"
        if len(parts) != t.ndim:
            raise self.fail(node, f"{node.value.id} has {t.ndim} dimensions: index each")
        return f"{a}[{flat}]"

    def index_text(self, node: ast.expr) -> str:
        """One index of an array: a literal plain (``A[(i) * A_shape1 + (0)]``: an index is
        multiplied by 64-bit extents, or indexes alone)."""
        if isinstance(node, ast.Constant) and type(node.value) is int \
                and abs(node.value) < 2 ** 31:
            return str(node.value)
        return self.expr(node)

    def expr_Subscript(self, node: ast.Subscript) -> str:
        base = self.T(node.value)
        if isinstance(base, TupleT):
            parts = self.tuple_parts(node.value)
            try:
                return parts[ast.literal_eval(node.slice) % len(parts)][0]
            except ValueError:         # an index known at run time: pick the component
                return self.pick(parts, self.expr(node.slice), self.T(node))
        text = self.subscript(node)
        return f"({text} != 0)" if base.dtype == "bool" else text

    def pick(self, parts: list[tuple[str, Type]], k: str, t: Type) -> str:
        """Component ``k`` (C text) of a tuple of ``parts``, counted from the end where
        negative, as Python's ``t[k]``; past either end (Python's IndexError) 0, as on the
        CPU, which stops the work-item there."""
        n = len(parts)
        out = self.literal(0, t.dtype)
        for j in range(n - 1, -1, -1):
            out = f"({k} == {j} || {k} == {j - n} ? {parts[j][0]} : {out})"
        return out

    def expr_BinOp(self, node: ast.BinOp) -> str:
        t = self.T(node)
        op = type(node.op)
        lt, rt = self.T(node.left), self.T(node.right)
        if op is ast.Div:
            to = t if t.dtype != "float64" or (lt.is_float or rt.is_float) else Scalar("float64")
            return f"({self.coerce(node.left, to)} / {self.coerce(node.right, to)})"
        if op is ast.Pow:
            wide = Scalar("float64")
            if isinstance(node.right, ast.Constant) and node.right.value in (2, 3) \
                    and not isinstance(node.right.value, bool):
                # (as the CPU's: a float32 x**3 in double, rounded once)
                if t.dtype == "float32" and node.right.value == 3:
                    return f"((float)({' * '.join([self.coerce(node.left, wide)] * 3)}))"
                base = self.coerce(node.left, t)
                return "(" + " * ".join([base] * int(node.right.value)) + ")"
            if not t.is_float:
                return f"{self.h.helper('pow_i')}({self.expr(node.left)}, {self.expr(node.right)})"
            if t.dtype == "float32" and not rt.is_float:   # (to an integer power: in double)
                return (f"((float)pow({self.coerce(node.left, wide)}, "
                        f"{self.coerce(node.right, wide)}))")
            return f"pow({self.coerce(node.left, t)}, {self.coerce(node.right, t)})"
        if op in (ast.LShift, ast.RShift):
            # (as the CPU's: a count past 63 or negative gives 0, or the sign for >>)
            left, count = self.coerce(node.left, t), self.expr(node.right)
            beyond = "0" if op is ast.LShift else f"({left} >> 63)"
            k = node.right.value if isinstance(node.right, ast.Constant) \
                and type(node.right.value) is int else None
            if k is not None:
                return f"({left} {_C_OPS[op]} {k})" if 0 <= k < 64 else beyond
            return (f"((({count}) >= 0 && ({count}) < 64) ? ({left} {_C_OPS[op]} ({count})) "
                    f": {beyond})")
        if op in (ast.FloorDiv, ast.Mod):
            key = ("floordiv" if op is ast.FloorDiv else "mod") + ("_f" if t.is_float else "_i")
            fn = self.h.helper(key, t.dtype if t.is_float else None)
            return f"{fn}({self.coerce(node.left, t)}, {self.coerce(node.right, t)})"
        # (bit operations too: an int32 << 20 is an int64's, as on the CPU)
        return f"({self.coerce(node.left, t)} {_C_OPS[op]} {self.coerce(node.right, t)})"

    def expr_UnaryOp(self, node: ast.UnaryOp) -> str:
        if isinstance(node.op, ast.Not):
            return f"(!{self.truth(node.operand)})"
        t = self.T(node)
        if isinstance(node.op, ast.Invert) and t == Scalar("bool"):
            return f"(!{self.truth(node.operand)})"     # (~ of a bool is its not, as on the CPU)
        operand = self.coerce(node.operand, t) if isinstance(t, Scalar) else self.expr(node.operand)
        return {ast.USub: f"(-{operand})", ast.UAdd: operand,
                ast.Invert: f"(~{operand})"}[type(node.op)]

    def expr_BoolOp(self, node: ast.BoolOp) -> str:
        op = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + op.join(self.truth(v) for v in node.values) + ")"

    def expr_Compare(self, node: ast.Compare) -> str:
        # pair by pair, as the CPU's (numba_lower.py)
        operands = [node.left] + node.comparators
        terms = [f"({self.compared(a, b)} {_C_CMP[type(op)]} {self.compared(b, a)})"
                 for a, op, b in zip(operands, node.ops, operands[1:])]
        return terms[0] if len(terms) == 1 else "(" + " && ".join(terms) + ")"

    def compared(self, a: ast.expr, other: ast.expr) -> str:
        """Operand ``a`` of a comparison with ``other`` (typerules.meets_float32)."""
        return self.coerce(a, Scalar("float32")) if meets_float32(self.T(a), self.T(other)) \
            else self.expr(a)

    def expr_IfExp(self, node: ast.IfExp) -> str:
        t = self.T(node)
        return (f"({self.truth(node.test)} ? {self.coerce(node.body, t)} : "
                f"{self.coerce(node.orelse, t)})")

    def expr_Call(self, node: ast.Call) -> str:
        name = tg_name(node)
        t = self.tk.types.get(id(node))
        args = node.args
        if name is None:                            # a device function
            callee = self.tk.callees[id(node)]
            texts = []
            for a, at in zip(args, callee.argtypes):
                if isinstance(at, Array):
                    a_c = self.cname(a.id)
                    texts += [a_c] + [f"{a_c}_shape{k}" for k in range(at.ndim)]
                elif isinstance(at, TupleT):
                    texts += [self.cast_text(text, src, item) for (text, src), item
                              in zip(self.tuple_parts(a), at.items)]
                else:
                    texts.append(self.coerce(a, at))
            return f"{callee.symbol}({', '.join(texts)})"
        r, W = self.tk.rank, self.tk.groupsize
        if name == "global_index":
            text = f"(_g0 * {W[0]} + _l0)"
            for k in range(1, r):
                text = f"({text} * _n{k} + (_g{k} * {W[k]} + _l{k}))"
            return text
        if name == "local_index":
            text = "_l0"
            for k in range(1, r):
                text = f"({text} * {W[k]} + _l{k})"
            return text
        if name == "group_index":
            text = "_g0"
            for k in range(1, r):
                text = f"({text} * ((_n{k} + {W[k] - 1}) / {W[k]}) + _g{k})"
            return text
        if name in ("float32", "float64", "int32", "int64", "bool"):
            src = self.T(args[0])
            if name == "bool":
                return self.truth(args[0])
            if isinstance(src, DType):
                raise self.fail(node, "a dtype as a value is not printed as C")
            return f"(({self.d.ctype(name)})({self.expr(args[0])}))"
        if name == "where":
            return (f"({self.truth(args[0])} ? {self.coerce(args[1], t)} : "
                    f"{self.coerce(args[2], t)})")
        if name in ("min", "max"):
            # Python's: the first of equal ones, NaN as it falls; of more than two, a helper
            # per pair (a conditional would print its first operand twice, per argument)
            out = self.coerce(args[0], t)
            if len(args) > 2:
                fn = self.h.extremum_helper(name, t.dtype)
                for a in args[1:]:
                    out = f"{fn}({out}, {self.coerce(a, t)})"
                return out
            b = self.coerce(args[1], t)
            return f"(({b}) {'>' if name == 'max' else '<'} ({out}) ? ({b}) : ({out}))"
        if name in ("maximum", "minimum"):
            # NumPy's: a NaN is the result (the first if both are), else the first of equal
            # ones; a helper, so that each operand is printed and evaluated once (of ints,
            # Python's max and min: the same numbers)
            if t.is_float:
                test = f"x {'>=' if name == 'maximum' else '<='} y || x != x"
                fn = self.h.primitive_helper(primitives.Primitive(name, (None, None)),
                                             t.dtype, f"({test}) ? x : y")
            else:
                fn = self.h.extremum_helper(name[:3], t.dtype)
            return f"{fn}({self.coerce(args[0], t)}, {self.coerce(args[1], t)})"
        if name == "len":
            return f"{self.cname(args[0].id)}_shape0"
        if name.startswith("atomic_") or name == "group_reduce_add":
            arr, idx, value = args
            at = self.T(arr)
            element = self.subscript(ast.Subscript(value=arr, slice=idx, ctx=ast.Load()))
            if name == "group_reduce_add":
                fn = self.h.group_add_helper(at.dtype, at.space)
            else:
                fn = self.h.atomic_helper(name[len("atomic_"):], at.dtype, at.space)
            return f"{fn}(&{element}, {self.coerce(value, Scalar(at.dtype))})"
        row = primitives.lookup(name)
        if row is not None:
            return self.primitive(row, node, t)
        raise self.fail(node, f"tg.{name} is not printed as C yet")

    def primitive(self, row: primitives.Primitive, node: ast.Call, t: Type) -> str:
        args = node.args
        if row.result == "rounded" and not t.is_float:
            return self.expr(args[0])
        if row.name == "abs":
            x = self.coerce(args[0], t)
            return f"fabs({x})" if t.is_float else f"(({x}) < 0 ? -({x}) : ({x}))"
        if row.result == "bool":           # (of an int as of its double: finite, not NaN)
            return f"({row.name}({self.coerce(args[0], float_of(self.T(args[0])))}) != 0)"
        at = t if isinstance(t, Scalar) and t.is_float else Scalar("float64")
        texts = [self.coerce(a, at) for a in args]
        lowering = row.lowering_c
        if is_expression(lowering):
            return f"{self.h.primitive_helper(row, at.dtype, lowering)}({', '.join(texts)})"
        return f"{lowering}({', '.join(texts)})"
