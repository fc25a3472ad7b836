"""Resolve a kernel's names and bring its AST to the canonical form of ``ir.KernelIR``."""

from __future__ import annotations

import ast
import builtins
import math
import re
from typing import Any

import numpy as np

from tapegrad.errors import KernelSyntaxError, located
from tapegrad.frontend.ir import KernelIR, tg_call
from tapegrad.frontend.parse import Parsed
from tapegrad.lang import intrinsics as L
from tapegrad.lang.kernel import DeviceFunction, KernelFunction
from tapegrad.lang.primitives import ABS, MATH

# Casts: the callable a user writes -> canonical cast intrinsic.
_CASTS = {float: "float64", int: "int64", bool: "bool",
          np.float32: "float32", np.float64: "float64", np.int32: "int32", np.int64: "int64",
          np.bool_: "bool"}
# dtypes accepted as tg.localmem / tg.private element types
DTYPES = {np.float32: "float32", np.float64: "float64", np.int32: "int32", np.int64: "int64",
          np.bool_: "bool", float: "float64", int: "int64", bool: "bool"}

# the math module's functions that the oldest supported Python lacks (cbrt and exp2 came in
# 3.11, fma in 3.13): in a kernel they are tapegrad's
_LATER_MATH = ("cbrt", "exp2", "fma")
_HOST_API = ("autodiff", "gradient", "jacobian", "vjp", "jvp", "hvp", "Tape")


def _intrinsic_table() -> dict[int, str]:
    table: dict[int, str] = {}
    for name in ("index", "groupsize", "ndrange", "localmem", "private", "synchronize",
                 "atomic_add", "atomic_sub", "atomic_min", "atomic_max", "where"):
        table[id(getattr(L, name))] = name
    for name, fn in L.MATH_FUNCTIONS.items():
        table[id(fn)] = name
        if hasattr(math, name):
            table[id(getattr(math, name))] = name
    for row in (*MATH.values(), ABS):           # np.arcsin written in a kernel is tg.asin
        if row.numpy_name is not None:
            table[id(getattr(np, row.numpy_name))] = row.name
    table[id(np.minimum)] = "minimum"         # NumPy's rule, not Python's min: a NaN wins
    table[id(np.maximum)] = "maximum"
    table[id(np.where)] = "where"
    table[id(builtins.abs)] = "abs"
    table[id(builtins.min)] = "min"
    table[id(builtins.max)] = "max"
    table[id(builtins.len)] = "len"
    return table


_INTRINSICS = _intrinsic_table()


def resolve(parsed: Parsed, is_kernel: bool) -> KernelIR:
    """Produce the canonical ``KernelIR`` of a parsed kernel or device function."""
    tree = parsed.tree
    params = [a.arg for a in tree.args.args]
    local_names = set(params) | _assigned_names(tree)
    resolver = _Resolver(parsed, local_names)
    local_names = {resolver.renamed.get(n, n) for n in local_names}
    params = [resolver.renamed.get(p, p) for p in params]
    body = [resolver.visit(stmt) for stmt in tree.body if not _is_docstring(stmt)]
    body = [s for s in body if s is not None]
    return KernelIR(name=tree.name, params=params, body=body, filename=parsed.filename,
                    lineno=tree.lineno, is_kernel=is_kernel, funcs=resolver.funcs,
                    locals=local_names - set(params))


def _is_docstring(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str))


def _assigned_names(tree: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


_GENERATED_SUFFIX = re.compile(r"_(bar|dot)\d*$")


class _Resolver(ast.NodeTransformer):
    def __init__(self, parsed: Parsed, local_names: set[str]):
        self.parsed = parsed
        self.local_names = local_names
        self.funcs: dict[str, DeviceFunction] = {}
        self.statement_call: ast.expr | None = None   # the call an expression statement makes
        # a local named like the generated code's (`_k`, `_a1`: loop variables and adjoint
        # temporaries start with an underscore; `x_bar`, `x_dot`: the adjoint and tangent of
        # `x`) gets a name of its own; names with '__' and parameters starting with '_' are
        # refused earlier (frontend/checks.py)
        params = {a.arg for a in parsed.tree.args.args}
        self.renamed = {n: f"{n}__" for n in local_names
                        if n not in params and n.startswith("_") and n != "_"
                        or _GENERATED_SUFFIX.search(n)}
        if "tg" in local_names:
            raise KernelSyntaxError("a kernel may not have a local variable or parameter named "
                                    "'tg' (the name of the kernel language); rename it",
                                    parsed.filename, parsed.tree.lineno)

    def fail(self, node: ast.AST, message: str) -> KernelSyntaxError:
        return located(node, self.parsed.filename, message)

    # -- looking names up -------------------------------------------------------------------
    def lookup(self, node: ast.Name) -> Any:
        name = node.id
        if name in self.parsed.closure:
            return self.parsed.closure[name]
        if name in self.parsed.globals:
            return self.parsed.globals[name]
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise self.fail(node, f"name {name!r} is not defined; a kernel sees its parameters, "
                              "its locals, module-level constants, math and tapegrad functions, "
                              "and @tg.func device functions")

    def evaluate(self, node: ast.expr) -> tuple[bool, Any]:
        """(True, object) if ``node`` is a non-local name or an attribute chain rooted at one."""
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node)
            node = node.value
        if not isinstance(node, ast.Name) or node.id in self.local_names:
            return False, None
        obj = self.lookup(node)
        for attr_node in reversed(chain):
            attr = attr_node.attr
            if obj is math and not hasattr(math, attr) and attr in _LATER_MATH:
                obj = L.MATH_FUNCTIONS[attr]      # kernels read the same on every Python
                continue
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                hint = f"; write tg.{attr}" if attr in L.MATH_FUNCTIONS else ""
                raise self.fail(attr_node, f"{ast.unparse(attr_node)} does not exist{hint}"
                                ) from None
        return True, obj

    def as_value(self, node: ast.expr, obj: Any) -> ast.expr:
        """A global object used as a value: only numbers (and tuples of them) are frozen in."""
        if isinstance(obj, (bool, int, float, np.integer, np.floating, np.bool_)):
            value = obj.item() if isinstance(obj, np.generic) else obj
            return ast.copy_location(ast.Constant(value=value), node)
        if isinstance(obj, tuple) and all(isinstance(x, (bool, int, float)) for x in obj):
            elts = [ast.copy_location(ast.Constant(value=x), node) for x in obj]
            return ast.copy_location(ast.Tuple(elts=elts, ctx=ast.Load()), node)
        if isinstance(obj, (L._Marker,)):
            return ast.copy_location(ast.Name(id=f"tg_{obj.name}", ctx=ast.Load()), node)
        if (isinstance(obj, type) and obj in DTYPES) or isinstance(obj, np.dtype):
            dt = DTYPES.get(obj) or np.dtype(obj).name
            return ast.copy_location(ast.Constant(value=f"dtype:{dt}"), node)
        text = ast.unparse(node)
        if isinstance(obj, np.ndarray):
            raise self.fail(node, f"the global array {text!r} cannot be used inside a kernel: "
                                  "pass it as a kernel argument")
        raise self.fail(node, f"{text!r} is a {type(obj).__name__}; kernels can use numbers, "
                              "tuples of numbers, math and tapegrad functions, and @tg.func "
                              "device functions from outside their body")

    # -- expressions ----------------------------------------------------------------------
    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.renamed:
            return ast.copy_location(ast.Name(id=self.renamed[node.id], ctx=node.ctx), node)
        if node.id in self.local_names or node.id == "range":
            return node
        return self.as_value(node, self.lookup(node))

    def visit_Attribute(self, node: ast.Attribute) -> ast.expr:
        is_global, obj = self.evaluate(node)
        if is_global:
            return self.as_value(node, obj)
        base = node
        while isinstance(base, ast.Attribute):
            base = base.value
        if isinstance(node.value, ast.Name) and node.attr in ("shape", "size", "ndim", "dtype"):
            return node
        raise self.fail(node, f"{ast.unparse(node)}: the only attributes of kernel values are "
                              "x.shape, x.size, x.ndim and x.dtype of arrays")

    def visit_Call(self, node: ast.Call) -> ast.expr:
        is_global, obj = self.evaluate(node.func)
        if not is_global:
            raise self.fail(node, f"{ast.unparse(node.func)} is not callable in a kernel: call "
                                  "math and tapegrad functions or @tg.func device functions")
        if isinstance(node.func, ast.Name) and node.func.id == "range":
            raise self.fail(node, "range(...) may only appear as the iterable of a for loop")
        # (a stand-in tapegrad put in math's place while a capture records: its function)
        obj = getattr(obj, "tapegrad_stands_for", obj)
        self.reject_host_api(node, obj)
        args = [self.visit(a) for a in node.args]
        name = _INTRINSICS.get(id(obj))
        if name == "index":
            return self.index_call(node, args)
        if name == "synchronize" and node is not self.statement_call:
            raise self.fail(node, "tg.synchronize() is a workgroup barrier and returns nothing: "
                                  "it must be a statement of its own, on a line by itself "
                                  "(tg.synchronize()), not assigned or used in an expression")
        if name == "len":
            if len(args) != 1:
                raise self.fail(node, "len takes one array")
            shape = ast.Attribute(value=args[0], attr="shape", ctx=ast.Load())
            sub = ast.Subscript(value=shape, slice=ast.Constant(value=0), ctx=ast.Load())
            return ast.copy_location(sub, node)
        if name is not None:
            return tg_call(name, args, node)
        if isinstance(obj, (type, np.dtype)):
            cast = _CASTS.get(obj)
            if cast is None or len(args) != 1:
                raise self.fail(node, f"{ast.unparse(node.func)}(...) is not a supported cast; "
                                      "use float(x), int(x), bool(x), np.float32(x), "
                                      "np.float64(x), np.int32(x) or np.int64(x)")
            return tg_call(cast, args, node)
        if isinstance(obj, DeviceFunction):
            fname = node.func.id if isinstance(node.func, ast.Name) else obj.name
            fname = fname.replace(".", "_")
            self.funcs[fname] = obj
            call = ast.Call(func=ast.Name(id=fname, ctx=ast.Load()), args=args, keywords=[])
            return ast.copy_location(call, node)
        if isinstance(obj, KernelFunction):
            raise self.fail(node, f"{obj.name} is a @tg.kernel; kernels cannot launch kernels. "
                                  "To call it per work-item, make it a @tg.func device function")
        raise self.fail(node, _not_callable(ast.unparse(node.func), obj))

    def reject_host_api(self, node: ast.Call, obj: Any) -> None:
        """The seed's first mistake: differentiating from inside a kernel."""
        api_name = getattr(obj, "__name__", "")
        if getattr(obj, "__module__", "").startswith("tapegrad") and api_name in _HOST_API:
            raise self.fail(node, f"tg.{api_name} cannot be called inside a kernel: kernels are "
                                  "differentiated from the host. Write a host function that "
                                  "launches the kernel and differentiate that, e.g. "
                                  "tg.autodiff(tg.Reverse, run, tg.Active, tg.Duplicated(A, dA)) "
                                  "where run(A) launches the kernel and returns tg.sum(...)")

    def index_call(self, node: ast.Call, args: list[ast.expr]) -> ast.expr:
        space, kind = "Global", "Linear"
        given = list(args) + [None] * (2 - len(args))
        for kw in node.keywords:
            given[0 if kw.arg == "space" else 1] = self.visit(kw.value)
        for pos, value in enumerate(given[:2]):
            if value is None:
                continue
            marker = value.id[3:] if isinstance(value, ast.Name) and value.id.startswith("tg_") else None
            allowed = L.SPACES if pos == 0 else L.KINDS
            if marker not in allowed:
                what = "space (tg.Global, tg.Local or tg.Group)" if pos == 0 else \
                    "kind (tg.Linear or tg.NTuple)"
                raise self.fail(node, f"tg.index expects an index {what} here, got "
                                      f"{ast.unparse(value)}")
            if pos == 0:
                space = marker
            else:
                kind = marker
        if len(args) > 2:
            raise self.fail(node, "tg.index takes at most two arguments: tg.index(space, kind)")
        suffix = "index" if kind == "Linear" else "indices"
        return tg_call(f"{space.lower()}_{suffix}", [], node)

    # -- statements -----------------------------------------------------------------------
    def visit_For(self, node: ast.For) -> ast.stmt:
        node.target = self.visit(node.target)
        node.iter.args = [self.visit(a) for a in node.iter.args]
        node.body = [self.visit(s) for s in node.body]
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.stmt | None:
        if _is_docstring(node):
            return None
        self.statement_call = node.value   # where a barrier may stand (see visit_Call)
        node.value = self.visit(node.value)
        return node


def _not_callable(text: str, obj: Any) -> str:
    """Why ``obj`` (written ``text``) cannot be called in a kernel, in the user's terms."""
    if obj is np.fmax or obj is np.fmin:
        kind = obj.__name__[1:]
        return (f"{text} cannot be called in a kernel: it ignores a NaN argument, which "
                f"{kind}(a, b) (Python's rule: {kind}(1.0, nan) is 1.0, {kind}(nan, 1.0) is "
                f"nan) and np.{kind}imum(a, b) (NumPy's: a NaN is the result) do not. Write "
                f"one of those, with a test of your own where a NaN must be skipped "
                f"(b if a != a else a if b != b else {kind}(a, b))")
    what = "not a math function, a tapegrad intrinsic or a @tg.func device function"
    module = getattr(obj, "__module__", None) or ""
    if module == "numpy" or module.startswith("numpy."):
        return (f"{text} cannot be called in a kernel: it is a NumPy function on whole arrays, "
                f"and a kernel computes elements, one work-item each. Index the arrays "
                f"yourself (np.roll(A, 1)[i] is A[(i - 1) % n]; np.sum needs a loop or "
                f"tg.atomic_add), or call it on the host between launches ({what})")
    kind = f"a function of {module}" if callable(obj) and module else \
        f"a {type(obj).__name__}"
    return f"{text} cannot be called in a kernel: it is {kind}, {what}"
