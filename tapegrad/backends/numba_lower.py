"""Turning typed kernel-language code into Numba Python (the CPU backend's lowering).

``ExprLowering`` rewrites expressions (intrinsics to Numba calls, explicit casts so that Numba
computes exactly the types tapegrad inferred); ``Printer`` writes statements out as source text,
with a comment tying each block to the user's line and a map from generated to user lines.
The CPU's lowering subclasses ``ExprLowering`` for work-item indices and memory (GPUs get C
from ``tapegrad.backends.c.printer`` instead).
"""

from __future__ import annotations

import ast
import linecache
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tapegrad.errors import KernelCompileError, KernelSyntaxError, located
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.typerules import meets_float32
from tapegrad.frontend.types import Scalar, TupleT, Type, TypedKernel
from tapegrad.lang import primitives
from tapegrad.lang.primitives import Primitive, is_expression

_NUMPY_CAST = {"float32": "np.float32", "float64": "np.float64", "int32": "np.int32",
               "int64": "np.int64", "bool": "bool"}


def name_call(func: str, args: list[ast.expr]) -> ast.Call:
    """``func(*args)`` where ``func`` may be dotted (``math.sin``)."""
    parts = func.split(".")
    f: ast.expr = ast.Name(id=parts[0], ctx=ast.Load())
    for p in parts[1:]:
        f = ast.Attribute(value=f, attr=p, ctx=ast.Load())
    return ast.Call(func=f, args=args, keywords=[])


def cast(node: ast.expr, to: str) -> ast.expr:
    """Convert ``node`` to dtype ``to`` (folding literal constants)."""
    if isinstance(node, ast.Constant) and to in ("float64", "int64") and not isinstance(node.value, bool):
        return ast.Constant(value=float(node.value) if to == "float64" else int(node.value))
    return name_call(_NUMPY_CAST[to], [node])


def func_symbol(callee: TypedKernel) -> str:
    """A deterministic, readable name for one specialisation of a device function."""
    sig = "_".join(_short(t) for t in callee.argtypes) or "void"
    return f"{callee.name}__{sig}"


def _short(t: Type) -> str:
    if isinstance(t, Scalar):
        return {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64",
                "bool": "b"}[t.dtype] + ("w" if t.weak else "")
    if isinstance(t, TupleT):
        return "t" + "".join(_short(i) for i in t.items)
    return f"{_short(Scalar(t.dtype))}a{t.ndim}"


class ExprLowering:
    """Lower the expressions of one typed kernel or device function to Numba Python."""

    target = "numba"          # which lowering of the primitive table's rows it writes

    def __init__(self, tk: TypedKernel):
        self.tk = tk

    # hooks for backends
    def index_expr(self, name: str, node: ast.Call) -> ast.expr:
        raise NotImplementedError

    def load_name(self, node: ast.Name) -> ast.expr:
        return ast.Name(id=node.id, ctx=ast.Load())

    def atomic_symbol(self, name: str) -> str:
        return f"tg_{name}"

    def store_target(self, node: ast.expr) -> ast.expr:
        return self.expr(node)

    # the rewriting
    def T(self, node: ast.AST) -> Type:
        return self.tk.types[id(node)]

    def coerce(self, node: ast.expr, to: Type | None) -> ast.expr:
        """Lower ``node`` and convert it to ``to`` when Numba would pick another type."""
        out = self.expr(node)
        src = self.tk.types.get(id(node))
        if isinstance(to, Scalar) and isinstance(src, Scalar) and src.dtype != to.dtype:
            if to.dtype == "float32" or src.dtype == "bool" or to.dtype in ("bool", "int32"):
                return cast(out, to.dtype)
            if to.dtype == "float64" and not src.is_float:
                return cast(out, "float64")
        return out

    def expr(self, node: ast.expr) -> ast.expr:
        method = getattr(self, "expr_" + type(node).__name__)
        return method(node)

    def expr_Constant(self, node: ast.Constant) -> ast.expr:
        return ast.Constant(value=node.value)

    def expr_Name(self, node: ast.Name) -> ast.expr:
        return self.load_name(node)

    def expr_Tuple(self, node: ast.Tuple) -> ast.expr:
        return ast.Tuple(elts=[self.expr(e) for e in node.elts], ctx=ast.Load())

    def expr_BinOp(self, node: ast.BinOp) -> ast.expr:
        t = self.T(node)
        if isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) \
                and node.right.value in (2, 3) and not isinstance(node.right.value, bool):
            # x**2 -> x * x: exact, fast and type-preserving; a float32 x**3 in float64 (x*x
            # is exact there), rounded once to float32, as a float32 to an integer power is
            wide = t.dtype == "float32" and node.right.value == 3
            base = cast(self.expr(node.left), "float64") if wide else self.coerce(node.left, t)
            out = base
            for _ in range(int(node.right.value) - 1):
                out = ast.BinOp(left=out, op=ast.Mult(), right=base)
            return cast(out, "float32") if wide else out
        if isinstance(node.op, ast.Div) and not self.T(node.left).is_float \
                and not self.T(node.right).is_float:
            return ast.BinOp(left=self.expr(node.left), op=ast.Div(), right=self.expr(node.right))
        if isinstance(node.op, ast.Pow) and t.dtype == "float32":
            if not self.T(node.right).is_float:
                # Numba's integer power multiplies in the base's type: in float32 the error
                # grows with the exponent (121 ulp at x**194); in float64, rounded once.  The
                # exponent as a float too: Numba's float ** negative int raises at 0 (IEEE,
                # NumPy and the GPUs give inf), and a raise inside a parallel task is lost
                left = cast(self.expr(node.left), "float64")
                right = cast(self.expr(node.right), "float64")
                return cast(ast.BinOp(left=left, op=ast.Pow(), right=right), "float32")
            return ast.BinOp(left=self.coerce(node.left, t), op=ast.Pow(),
                             right=self.coerce(node.right, t))
        if isinstance(node.op, ast.Pow) and not t.is_float:
            return self.int_power(node)
        if isinstance(node.op, ast.FloorDiv) and not t.is_float \
                and _constant_int(node.right) in (None, -1):
            # (Numba's most negative int // -1 is 0; NumPy's and the GPUs' wrap to itself)
            # (the divisor is read twice: frontend/once.py counts it as repeated)
            left, right = self.coerce(node.left, t), self.coerce(node.right, t)
            return ast.IfExp(test=ast.Compare(left=right, ops=[ast.NotEq()],
                                              comparators=[ast.Constant(value=-1)]),
                             body=ast.BinOp(left=left, op=ast.FloorDiv(), right=right),
                             orelse=ast.UnaryOp(op=ast.USub(),
                                                operand=cast(self.expr(node.left), t.dtype)))
        if isinstance(node.op, (ast.LShift, ast.RShift)):
            return self.shift(node)
        if isinstance(node.op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
            return ast.BinOp(left=self.expr(node.left), op=node.op, right=self.expr(node.right))
        return ast.BinOp(left=self.coerce(node.left, t), op=node.op,
                         right=self.coerce(node.right, t))

    def shift(self, node: ast.BinOp) -> ast.expr:
        """``a << b``, ``a >> b`` in int64, NumPy's for a count ``b`` past 63 or negative: 0,
        or ``a``'s sign for ``>>`` (LLVM's shift by those is undefined: the vectorised and
        the scalar loop gave different values).  (``b`` is read up to three times:
        frontend/once.py counts it as repeated.)"""
        left, count = self.coerce(node.left, Scalar("int64")), self.expr(node.right)
        shifted = ast.BinOp(left=left, op=node.op, right=count)
        k = _constant_int(node.right)
        if k is not None and 0 <= k < 64:
            return shifted
        beyond = ast.Constant(value=0) if isinstance(node.op, ast.LShift) else \
            ast.BinOp(left=left, op=ast.RShift(), right=ast.Constant(value=63))
        within = ast.BoolOp(op=ast.And(), values=[
            ast.Compare(left=count, ops=[ast.GtE()], comparators=[ast.Constant(value=0)]),
            ast.Compare(left=count, ops=[ast.Lt()], comparators=[ast.Constant(value=64)])])
        return ast.IfExp(test=within, body=shifted, orelse=beyond)

    def int_power(self, node: ast.BinOp) -> ast.expr:
        """``a ** b`` of two integers: Numba's, except that ``0 ** b`` for ``b < 0`` is 0
        (docs/language.md; Numba gives the most negative int).  (``a`` and ``b`` are read
        twice: frontend/once.py counts both operands of ``**`` as repeated.)"""
        left, right = self.coerce(node.left, self.T(node)), self.expr(node.right)
        power = ast.BinOp(left=left, op=ast.Pow(), right=right)
        k = _constant_int(node.right)
        if k is not None and k >= 0:
            return power
        zero_base = ast.IfExp(test=ast.Compare(left=self.expr(node.right), ops=[ast.Eq()],
                                               comparators=[ast.Constant(value=0)]),
                              body=ast.Constant(value=1), orelse=ast.Constant(value=0))
        return ast.IfExp(test=ast.Compare(left=self.expr(node.left), ops=[ast.NotEq()],
                                          comparators=[ast.Constant(value=0)]),
                         body=power, orelse=zero_base)

    def expr_UnaryOp(self, node: ast.UnaryOp) -> ast.expr:
        t, src = self.T(node), self.tk.types.get(id(node.operand))
        operand = self.expr(node.operand)
        if isinstance(node.op, ast.USub) and isinstance(t, Scalar) and isinstance(src, Scalar) \
                and not t.is_float and t.dtype != src.dtype:
            operand = cast(operand, t.dtype)    # -int32 is int64: -(-2**31) must not wrap
        return ast.UnaryOp(op=node.op, operand=operand)

    def expr_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        return ast.BoolOp(op=node.op, values=[self.truth(v) for v in node.values])

    def truth(self, node: ast.expr) -> ast.expr:
        out = self.expr(node)
        if self.T(node) == Scalar("bool"):
            return out
        return ast.Compare(left=out, ops=[ast.NotEq()], comparators=[ast.Constant(value=0)])

    def expr_Compare(self, node: ast.Compare) -> ast.expr:
        # pair by pair (a < b < c is a < b and b < c; operands are pure here), each pair's
        # weak float or integer meeting float32 data in float32 (typerules.meets_float32)
        operands = [node.left] + node.comparators
        pairs = [ast.Compare(left=self.compared(a, b), ops=[op],
                             comparators=[self.compared(b, a)])
                 for a, op, b in zip(operands, node.ops, operands[1:])]
        return pairs[0] if len(pairs) == 1 else ast.BoolOp(op=ast.And(), values=pairs)

    def compared(self, a: ast.expr, other: ast.expr) -> ast.expr:
        """Operand ``a`` of a comparison with ``other``."""
        return self.coerce(a, Scalar("float32")) if meets_float32(self.T(a), self.T(other)) \
            else self.expr(a)

    def expr_IfExp(self, node: ast.IfExp) -> ast.expr:
        t = self.T(node)
        return ast.IfExp(test=self.expr(node.test), body=self.coerce(node.body, t),
                         orelse=self.coerce(node.orelse, t))

    def expr_Attribute(self, node: ast.Attribute) -> ast.expr:
        return ast.Attribute(value=self.expr(node.value), attr=node.attr, ctx=ast.Load())

    def expr_Subscript(self, node: ast.Subscript) -> ast.expr:
        base = self.T(node.value)
        if isinstance(base, TupleT):   # tuples: a plain (possibly constant, negative) index
            k = _constant_int(node.slice)
            if k is None:
                return self.picked(node)
            idx = ast.Constant(value=k % len(base.items))
            return ast.Subscript(value=self.expr(node.value), slice=idx, ctx=ast.Load())
        return ast.Subscript(value=self.expr(node.value), slice=self.index(node.slice),
                             ctx=ast.Load())

    def picked(self, node: ast.Subscript) -> ast.expr:
        """``t[k]`` with ``k`` known at run time: component ``j`` where ``k`` is ``j`` or
        ``j - len(t)``, else 0, as the GPUs' C does (Numba would raise IndexError inside the
        launch, stopping that work-item and the rest of its task)."""
        n, t = len(self.T(node.value).items), self.T(node)
        out: ast.expr = cast(ast.Constant(value=0), t.dtype) if isinstance(t, Scalar) \
            else ast.Constant(value=0)
        for j in reversed(range(n)):
            k = self.expr(node.slice)
            test = ast.BoolOp(op=ast.Or(), values=[
                ast.Compare(left=k, ops=[ast.Eq()], comparators=[ast.Constant(value=j)]),
                ast.Compare(left=self.expr(node.slice), ops=[ast.Eq()],
                            comparators=[ast.Constant(value=j - n)])])
            item = ast.Subscript(value=self.expr(node.value), slice=ast.Constant(value=j),
                                 ctx=ast.Load())
            out = ast.IfExp(test=test, body=item, orelse=out)
        return out

    def index(self, node: ast.expr) -> ast.expr:
        """An array index: tuple-valued parts (``A[I, k]``) flattened, and each part made
        unsigned.

        Kernel indices never wrap around (as on every GPU): ``A[-1]`` is out of bounds, not
        the last element.  Saying so to Numba with an unsigned index drops its wrap-around
        test, which otherwise keeps LLVM from vectorising the work-item loop (measured:
        CHANGELOG.md, 'the figures that moved').
        """
        parts = node.elts if isinstance(node, ast.Tuple) else [node]
        flat: list[ast.expr] = []
        for p in parts:
            t = self.T(p)
            low = self.expr(p)
            if isinstance(t, TupleT):
                flat.extend(ast.Subscript(value=low, slice=ast.Constant(value=k), ctx=ast.Load())
                            for k in range(len(t.items)))
            else:
                flat.append(low)
        flat = [f if isinstance(f, ast.Constant) else name_call("np.uint64", [f]) for f in flat]
        return flat[0] if len(flat) == 1 else ast.Tuple(elts=flat, ctx=ast.Load())

    def primitive_call(self, row: Primitive, node: ast.Call, t: Type) -> ast.expr:
        """A math function, as the row of the primitive table lowers it for this target."""
        if row.result == "rounded" and not _is_float(t):
            return self.expr(node.args[0])       # floor of an integer: itself
        fn = row.lowering(self.target)
        if fn == "math.fabs" and isinstance(t, Scalar) and t.dtype == "float32":
            fn = "abs"                           # (Numba's math.fabs of a float32 is a float64)
        if row.arity == 1:
            src = self.tk.types.get(id(node.args[0]))
            integers = isinstance(t, Scalar) and isinstance(src, Scalar) and not t.is_float \
                and not src.is_float and src.dtype != t.dtype
            # (abs of an int32 is an int64: abs(-2**31) must not wrap)
            args = [cast(self.expr(node.args[0]), t.dtype) if integers
                    else self.expr(node.args[0])]
        else:
            args = [self.coerce(a, t) for a in node.args]
        if not is_expression(fn):
            return name_call(fn, args)
        call = name_call(_HELPER_PREFIX + row.name, args)    # (helper_lines)
        return cast(call, "float32") if isinstance(t, Scalar) and t.dtype == "float32" else call

    def expr_Call(self, node: ast.Call) -> ast.expr:
        name = tg_name(node)
        if name is None:   # a device function
            callee = self.tk.callees[id(node)]
            return name_call(callee.symbol or func_symbol(callee),
                             [self.expr(a) for a in node.args])
        t = self.T(node)
        args = node.args
        if name.endswith(("_index", "_indices")) or name in ("ndrange", "groupsize"):
            return self.index_expr(name, node)
        row = primitives.lookup(name)
        if row is not None:
            return self.primitive_call(row, node, t)
        if name in ("min", "max"):
            return name_call(name, [self.coerce(a, t) for a in args])
        if name in ("maximum", "minimum"):   # NumPy's (Numba's np.maximum: a NaN wins)
            return name_call(f"np.{name}", [self.coerce(a, t) for a in args])
        if name == "where":
            return ast.IfExp(test=self.truth(args[0]), body=self.coerce(args[1], t),
                             orelse=self.coerce(args[2], t))
        if name in _NUMPY_CAST:
            return cast(self.expr(args[0]), name)
        if name.startswith("atomic_"):
            arr_t = self.T(args[0])
            value = self.coerce(args[2], Scalar(arr_t.dtype))
            return name_call(self.atomic_symbol(name),
                             [self.expr(args[0]), self.index(args[1]), value])
        raise NotImplementedError(f"tg.{name} in an expression")


class GridLowering(ExprLowering):
    """What the CPU and GPU lowerings share: index intrinsics in the names both writers give
    a work-item's place (``_g<d>`` its group, ``_l<d>`` its place in it, ``_n<d>`` the
    ndrange), and short-circuit tests that need no branches."""

    def __init__(self, tk: TypedKernel):
        super().__init__(tk)
        self.rank = tk.rank
        self.W = tk.groupsize

    def index_expr(self, name: str, node: ast.Call) -> ast.expr:
        r, W = self.rank, self.W
        glob = [f"(_g{d} * {W[d]} + _l{d})" for d in range(r)]
        if name == "global_indices":
            text = "(" + ", ".join(glob) + ",)"
        elif name == "global_index":
            text = glob[0] if r == 1 else row_major(glob, [f"_n{d}" for d in range(r)])
        elif name == "local_indices":
            text = "(" + ", ".join(f"_l{d}" for d in range(r)) + ",)"
        elif name == "local_index":
            text = row_major([f"_l{d}" for d in range(r)], [str(w) for w in W])
        elif name == "group_indices":
            text = "(" + ", ".join(f"_g{d}" for d in range(r)) + ",)"
        elif name == "group_index":
            text = "_g"
        elif name == "ndrange":
            text = "(" + ", ".join(f"_n{d}" for d in range(r)) + ",)"
        else:  # groupsize
            text = "(" + ", ".join(str(w) for w in W) + ",)"
        return ast.parse(text, mode="eval").body


    def expr_BoolOp(self, node: ast.BoolOp) -> ast.expr:
        """``a and b`` of tests that are safe to evaluate in any case (comparisons of
        indices, shapes, scalars) as ``(a) & (b)``: no branch per operand.  The tests that
        guard an adjoint's reads near the edges of an array are such chains; in the scalar
        loop over a stencil's edge work-items their branches cost a large part of the edges'
        time (measured: CHANGELOG.md, 'the figures that moved')."""
        if not all(self.eager_safe(v) for v in node.values):
            return super().expr_BoolOp(node)
        op = ast.BitAnd() if isinstance(node.op, ast.And) else ast.BitOr()
        out = self.truth(node.values[0])
        for v in node.values[1:]:
            out = ast.BinOp(left=out, op=op, right=self.truth(v))
        return out

    def eager_safe(self, e: ast.expr) -> bool:
        """Whether evaluating ``e`` can neither fail nor cost: names, constants, comparisons,
        +, -, *, bit operations, shapes and tuple elements at constant indices (no array
        loads, no calls, no division, no tuple index that an earlier test may be keeping in
        range: short-circuiting may be guarding them)."""
        if isinstance(e, (ast.Name, ast.Constant)):
            return True
        if isinstance(e, ast.Attribute):
            return e.attr in ("shape", "size", "ndim") and self.eager_safe(e.value)
        if isinstance(e, ast.Subscript):     # a tuple's element at a constant index (checked
            k = e.slice                        # when typed: another index may be out of range)
            if isinstance(k, ast.UnaryOp) and isinstance(k.op, ast.USub):
                k = k.operand
            return isinstance(self.tk.types.get(id(e.value)), TupleT) \
                and isinstance(k, ast.Constant) and self.eager_safe(e.value)
        if isinstance(e, ast.BinOp):
            return isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.BitAnd, ast.BitOr,
                                     ast.BitXor)) \
                and self.eager_safe(e.left) and self.eager_safe(e.right)
        if isinstance(e, (ast.Compare, ast.BoolOp, ast.UnaryOp)):
            return all(self.eager_safe(c) for c in ast.iter_child_nodes(e)
                       if isinstance(c, ast.expr))
        return False


def row_major(idx: list[str], dims: list[str]) -> str:
    """The row-major linear index of ``idx`` in a box of extents ``dims``."""
    text = idx[0]
    for d in range(1, len(idx)):
        text = f"({text}) * {dims[d]} + {idx[d]}"
    return text


def helpers_used(kernels: list[TypedKernel], target: str) -> list[Primitive]:
    """The primitives the kernels apply (floor and its kin to a float) whose lowering for
    ``target`` is an expression, in the table's order: each becomes a helper function."""
    used = set()
    for k in kernels:
        for n in ast.walk(ast.Module(body=k.ir.body, type_ignores=[])):
            row = primitives.lookup(tg_name(n)) if isinstance(n, ast.Call) else None
            if row is not None and is_expression(row.lowering(target)) and (
                    row.result != "rounded" or _is_float(k.types.get(id(n)))):
                used.add(row.name)
    return [row for name, row in primitives.MATH.items() if name in used]


def helper_lines(row: Primitive, target: str) -> list[str]:
    """A primitive's helper function (put the backend's decorator above it)."""
    params = ", ".join(primitives.PARAMS[:row.arity])
    return [f"def {_HELPER_PREFIX}{row.name}({params}):", f"    return {row.lowering(target)}"]


_HELPER_PREFIX = "_tg_"


def _is_float(t: Type | None) -> bool:
    return isinstance(t, Scalar) and t.is_float


def _constant_int(node: ast.expr) -> int | None:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    # whether its result may depend on the order of its atomics (float additions into shared
    # arrays, not per-thread copies; an atomic's old value used): tg.deterministic runs it
    # serially (backends/determinism.py)
    unordered_atomics: bool = False
    # the parallel task's arguments for a launch of one workgroup (outline.py
    # one_group_call); None where there is none
    one_group: tuple | None = None


class Printer:
    """Accumulates generated source lines and remembers which user line each came from."""

    def __init__(self, filename: str):
        self.lines: list[str] = []
        self.user_line: dict[int, int] = {}   # generated line number (1-based) -> user line
        self.filename = filename
        self.current_user_line: int | None = None
        self._last_comment: int | None = None

    def emit(self, text: str, depth: int) -> None:
        self.lines.append("    " * depth + text)
        if self.current_user_line is not None:
            self.user_line[len(self.lines)] = self.current_user_line

    def at(self, node: ast.AST, depth: int) -> None:
        """Mark that what follows comes from ``node``'s user line; comment it once."""
        line = getattr(node, "lineno", None)
        if line is None:
            return
        self.current_user_line = line
        if line != self._last_comment:
            text = linecache.getline(self.filename, line).strip()
            self.lines.append("    " * depth + f"# {os.path.basename(self.filename)}:{line}  {text}")
            self._last_comment = line

    def blank(self) -> None:
        self.lines.append("")
        self.current_user_line = None
        self._last_comment = None

    def source(self) -> str:
        return "\n".join(self.lines) + "\n"


def emit_statements(body: list[ast.stmt], low: ExprLowering, out: Printer, depth: int,
                    special: Callable[[ast.stmt, int], bool] | None = None) -> None:
    """Print ``body`` as Numba Python at indentation ``depth``.

    ``special(stmt, depth)`` lets a backend print some statements itself (returning True).
    """
    if not body:
        out.emit("pass", depth)
    for s in body:
        out.at(s, depth)
        if special is not None and special(s, depth):
            continue
        if isinstance(s, ast.Assign):
            target = s.targets[0]
            if isinstance(target, ast.Tuple):
                value = low.expr(s.value)
                names = [ast.unparse(low.store_target(e)) for e in target.elts]
                one = "," if len(names) == 1 else ""     # (n, = A.shape unpacks one element)
                if any("[" in n for n in names):   # promoted names: unpack via temporaries
                    tmps = [f"_t{k}" for k in range(len(names))]
                    out.emit(f"{', '.join(tmps)}{one} = {ast.unparse(value)}", depth)
                    for n, tmp in zip(names, tmps):
                        out.emit(f"{n} = {tmp}", depth)
                else:
                    out.emit(f"{', '.join(names)}{one} = {ast.unparse(value)}", depth)
            else:
                t = low.tk.types.get(id(target))
                out.emit(f"{ast.unparse(low.store_target(target))} = "
                         f"{ast.unparse(low.coerce(s.value, t))}", depth)
        elif isinstance(s, ast.AugAssign):
            t = low.T(s.target)
            # (an array's A[k] op= v as Numba's own, except the operators that expr_BinOp
            # lowers itself: integer //, shifts, powers)
            if isinstance(s.target, ast.Name) or isinstance(s.op, _LOWERED_APART):
                combined = ast.BinOp(left=s.target, op=s.op, right=s.value)
                low.tk.types[id(combined)] = _arith_type(low, s)
                value = low.coerce(combined, t)
                out.emit(f"{ast.unparse(low.store_target(s.target))} = {ast.unparse(value)}", depth)
            else:
                # (a weak float or an integer meets float32 data in float32; float64 data
                # stays float64, the sum rounded once at the store)
                value = low.coerce(s.value, t) if meets_float32(low.T(s.value), t) \
                    else low.expr(s.value)
                op = _AUG[type(s.op)]
                out.emit(f"{ast.unparse(low.store_target(s.target))} {op}= {ast.unparse(value)}", depth)
        elif isinstance(s, ast.Expr):
            out.emit(ast.unparse(low.expr(s.value)), depth)
        elif isinstance(s, ast.If):
            out.emit(f"if {ast.unparse(low.expr(s.test))}:", depth)
            emit_statements(s.body, low, out, depth + 1, special)
            if s.orelse:
                out.emit("else:", depth)
                emit_statements(s.orelse, low, out, depth + 1, special)
        elif isinstance(s, ast.While):
            out.emit(f"while {ast.unparse(low.expr(s.test))}:", depth)
            emit_statements(s.body, low, out, depth + 1, special)
        elif isinstance(s, ast.For):
            lowered = [low.expr(a) for a in s.iter.args]
            if len(lowered) == 3 and _constant_int(s.iter.args[2]) is None:
                # a step of 0 runs no iteration, as on the GPUs (Numba would raise
                # ValueError inside the launch, stopping the rest of its task)
                step = f"_step_{getattr(s.target, 'id', 'k')}"
                out.emit(f"{step} = {ast.unparse(lowered[2])}", depth)
                start = ast.unparse(lowered[0])
                lowered[1] = ast.parse(f"({ast.unparse(lowered[1])}) if {step} != 0 else "
                                       f"{start}", mode="eval").body
                lowered[2] = ast.parse(f"{step} if {step} != 0 else 1", mode="eval").body
            args = ", ".join(ast.unparse(a) for a in lowered)
            target = ast.unparse(low.store_target(s.target))
            if "[" in target:   # a promoted loop variable: loop over a plain name, then store
                out.emit(f"for _k_{s.target.id} in range({args}):", depth)
                out.emit(f"{target} = _k_{s.target.id}", depth + 1)
            else:
                out.emit(f"for {target} in range({args}):", depth)
            emit_statements(s.body, low, out, depth + 1, special)
        elif isinstance(s, ast.Return):
            if s.value is None:
                out.emit("return", depth)
            else:
                value = low.coerce(s.value, low.tk.return_type)
                out.emit(f"return {ast.unparse(value)}", depth)
        elif isinstance(s, (ast.Break, ast.Continue, ast.Pass)):
            out.emit(type(s).__name__.lower(), depth)
        else:
            raise NotImplementedError(type(s).__name__)


_LOWERED_APART = (ast.FloorDiv, ast.LShift, ast.RShift, ast.Pow)
_AUG = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
        ast.Mod: "%", ast.Pow: "**", ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^",
        ast.LShift: "<<", ast.RShift: ">>"}


def _arith_type(low: ExprLowering, s: ast.AugAssign) -> Type:
    from tapegrad.frontend.types import arith
    return arith(s.op, low.T(s.target), low.T(s.value))


def compile_error(exc: Exception, lowered: Any, path: str, compiler: str) -> KernelCompileError:
    """A Numba failure on generated code, reported at the user's line (via the line map)."""
    text = str(exc)
    user_line = None
    for m in re.finditer(r'File "([^"]+)", line (\d+)', text):
        if m.group(1).endswith(os.path.basename(path)):
            user_line = lowered.user_line.get(int(m.group(2)))
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "compilation failed")
    first = re.sub(r"\x1b\[[0-9;]*m", "", first)
    return KernelCompileError(
        f"{compiler} could not compile the generated code for this line: {first}. The generated "
        f"kernel is {path}; if your kernel is valid, this is a tapegrad bug.",
        lowered.filename, user_line)


class ModuleWriter:
    """What the backends' module writers share: the typed kernel, the printer, the shape."""

    def __init__(self, tk: TypedKernel):
        self.tk = tk
        self.ir = tk.ir
        self.out = Printer(tk.ir.filename)
        self.rank = tk.rank
        self.W = tk.groupsize

    def fail(self, node: ast.AST, message: str) -> KernelSyntaxError:
        return located(node, self.ir.filename, message)
