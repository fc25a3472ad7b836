"""Check that a kernel stays inside the Python subset tapegrad compiles.

Runs at decoration time on the bare AST (no name is looked up yet), so a user learns about
unsupported syntax at the line they wrote it, before any launch.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

from tapegrad.errors import located
from tapegrad.frontend.parse import parse_function

_STATEMENT_HINTS = {
    ast.FunctionDef: "define it at module level and decorate it with @tg.func",
    ast.AsyncFunctionDef: "kernels cannot be async",
    ast.ClassDef: "define classes outside kernels",
    ast.With: "kernels have no context managers",
    ast.Try: "kernels cannot catch exceptions; check values with if instead",
    ast.Raise: "kernels cannot raise; write an error flag into an output array instead",
    ast.Assert: "kernels cannot assert; write an error flag into an output array instead",
    ast.Import: "import modules at the top of your file",
    ast.ImportFrom: "import modules at the top of your file",
    ast.Global: "kernels cannot assign globals; pass an output array",
    ast.Nonlocal: "kernels cannot assign outer variables; pass an output array",
    ast.Delete: "kernels cannot delete names or elements",
    ast.AnnAssign: "drop the annotation: types are inferred",
}
_EXPR_HINTS = {
    ast.Lambda: "use a @tg.func device function",
    ast.ListComp: "write a for loop",
    ast.SetComp: "write a for loop",
    ast.DictComp: "write a for loop",
    ast.GeneratorExp: "write a for loop",
    ast.List: "use a tuple, or tg.private(dtype, shape) for a small per-work-item array",
    ast.Dict: "kernels have no dictionaries",
    ast.Set: "kernels have no sets",
    ast.JoinedStr: "kernels have no strings",
    ast.Starred: "write the arguments out",
    ast.Slice: "index single elements, e.g. A[i, j], in a loop",
    ast.Await: "kernels cannot be async",
    ast.Yield: "kernels cannot yield",
    ast.YieldFrom: "kernels cannot yield",
    ast.NamedExpr: "assign on its own line",
}


def check_syntax(fn: Callable[..., Any], is_kernel: bool = True) -> None:
    """Raise a :class:`KernelSyntaxError` at the first construct tapegrad does not compile."""
    parsed = parse_function(fn)
    _Checker(parsed.filename, is_kernel).check_function(parsed.tree)


class _Checker(ast.NodeVisitor):
    def __init__(self, filename: str, is_kernel: bool):
        self.filename = filename
        self.is_kernel = is_kernel
        self.loop_depth = 0

    def fail(self, node: ast.AST, message: str):
        raise located(node, self.filename, message)

    def check_function(self, tree: ast.FunctionDef) -> None:
        if isinstance(tree, ast.AsyncFunctionDef):
            self.fail(tree, "kernels cannot be async functions")
        a = tree.args
        if a.vararg or a.kwarg or a.kwonlyargs or a.posonlyargs or a.defaults:
            self.fail(tree, f"{tree.name}: kernel and device-function parameters must be plain "
                            "positional names (no defaults, *args, **kwargs or keyword-only)")
        self.check_names(tree)
        for stmt in tree.body:
            self.visit(stmt)

    def check_names(self, tree: ast.FunctionDef) -> None:
        """Names with ``__`` belong to the code tapegrad generates (per-item slots, copies);
        so do names starting with an underscore, which locals may still use (the resolver
        renames them, frontend/resolve.py) but parameters may not."""
        for node in ast.walk(tree):
            param = isinstance(node, ast.arg)
            name = node.arg if param else \
                node.id if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) else None
            if name and ("__" in name or param and name.startswith("_")):
                what = "parameter" if param else "variable"
                self.fail(node, f"a kernel may not name a {what} {name!r}: names that contain "
                                "'__'" + (" or start with an underscore" if param else "")
                                + " are reserved for the code tapegrad generates from the "
                                "kernel, and would clash with it; rename it")

    def generic_visit(self, node: ast.AST) -> None:
        for kind, hint in _STATEMENT_HINTS.items():
            if isinstance(node, kind):
                self.fail(node, f"{type(node).__name__} statements are not supported in kernels: {hint}")
        for kind, hint in _EXPR_HINTS.items():
            if isinstance(node, kind):
                self.fail(node, f"{type(node).__name__} expressions are not supported in kernels: {hint}")
        super().generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if not isinstance(node.value, (bool, int, float)) and node.value is not None:
            self.fail(node, f"the constant {node.value!r} is not supported in kernels: only "
                            "numbers and booleans")

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring or a comment-like string
        if not isinstance(node.value, ast.Call):
            self.fail(node, "this expression's value is unused; a statement in a kernel is an "
                            "assignment, a call, or control flow")
        self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) != 1:
            self.fail(node, "chained assignment (a = b = ...) is not supported in kernels: "
                            "write one assignment per line")
        self._check_target(node.targets[0])
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult):
            self.fail(node, "@= is not supported in kernels; write the loops out")
        if not isinstance(node.target, (ast.Name, ast.Subscript)):
            self.fail(node, "augmented assignment needs a name or an element, like x += 1 or A[i] += 1")
        self._check_target(node.target)
        self.visit(node.value)

    def _check_target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Name):
            return
        if isinstance(target, ast.Tuple):
            for elt in target.elts:
                if not isinstance(elt, ast.Name):
                    self.fail(elt, "tuple assignment in kernels unpacks into plain names, like "
                                   "i, j = tg.index(tg.Global, tg.NTuple)")
            return
        if isinstance(target, ast.Subscript):
            self.visit(target)
            return
        if isinstance(target, ast.Attribute):
            self.fail(target, "kernels cannot assign attributes; write into array elements")
        self.fail(target, "this assignment target is not supported in kernels: assign to a "
                          "name, a tuple of names, or an array element")

    def visit_For(self, node: ast.For) -> None:
        if node.orelse:
            self.fail(node, "for ... else is not supported in kernels; use a flag variable")
        if not isinstance(node.target, ast.Name):
            self.fail(node.target, "a kernel for loop needs one loop variable: for k in range(n)")
        it = node.iter
        if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
                and 1 <= len(it.args) <= 3 and not it.keywords):
            self.fail(it, "kernel for loops iterate over range(...): write for k in range(n), "
                          "range(a, b) or range(a, b, step)")
        for arg in it.args:
            self.visit(arg)
        self._loop_body(node.body)

    def visit_While(self, node: ast.While) -> None:
        if node.orelse:
            self.fail(node, "while ... else is not supported in kernels; use a flag variable")
        self.visit(node.test)
        self._loop_body(node.body)

    def _loop_body(self, body: list[ast.stmt]) -> None:
        self.loop_depth += 1
        for stmt in body:
            self.visit(stmt)
        self.loop_depth -= 1

    def visit_Return(self, node: ast.Return) -> None:
        if self.is_kernel and node.value is not None:
            self.fail(node, "a kernel returns nothing: write its results into an output array "
                            "argument (B[i] = ...); device functions (@tg.func) may return values")
        if node.value is not None:
            self.visit(node.value)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Call) or any(k.arg == "ndrange" for k in node.keywords):
            inner = node.func.func if isinstance(node.func, ast.Call) else node.func
            what = ast.unparse(inner)
            self.fail(node, f"a kernel cannot launch a kernel ({what}(backend)(..., ndrange=...)): "
                            "launches happen on the host. Launch both from the host function, "
                            f"one after the other, or make {what} a @tg.func device function and "
                            f"call it here with this work-item's index ({what}(B, A, i))")
        if node.keywords and not _keywords_allowed(node):
            self.fail(node, "keyword arguments are not supported in kernel calls (except "
                            "tg.index(space=..., kind=...)); pass them by position")
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.fail(node, "the @ operator is not supported in kernels; write the loops out "
                            "(see examples/matmul.py)")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        idx = node.slice
        elts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
        for e in elts:
            if isinstance(e, ast.Slice):
                self.fail(e, "slices are not supported in kernels: index single elements, "
                             "e.g. A[i, j], and loop over the range you need")
        self.generic_visit(node)


def _keywords_allowed(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "index" and all(k.arg in ("space", "kind") for k in node.keywords)
