"""The CPU's expressions: what the CPU writes differently from the GPU for one expression."""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from tapegrad.backends.numba_lower import GridLowering
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, Scalar, TypedKernel


class CPULowering(GridLowering):
    """The CPU's expressions: promoted locals and private arrays in per-work-item slots,
    float32 powers through vmath, plain adds for atomics on memory one thread owns."""

    def __init__(self, tk: TypedKernel, promoted: set[str] | None = None,
                 per_item: set[str] | None = None):
        super().__init__(tk)
        self.promoted = promoted or set()
        self.per_item = per_item or set()     # private arrays with a slot per work-item

    def expr_Subscript(self, node: ast.Subscript) -> ast.expr:
        """``p[k]`` of a per-work-item private array is ``p__items[k, _li]``: indexing the
        slot directly, where a view per work-item would cost reference counting, with the
        work-item index last so that consecutive work-items touch consecutive elements
        (measured: CHANGELOG.md, 'the figures that moved')."""
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.per_item:
            idx = self.index(node.slice)
            parts = idx.elts if isinstance(idx, ast.Tuple) else [idx]
            return ast.Subscript(value=ast.Name(id=f"{base.id}__items", ctx=ast.Load()),
                                 slice=ast.Tuple(elts=parts + [ast.Name(id="_li", ctx=ast.Load())],
                                                 ctx=ast.Load()), ctx=ast.Load())
        return super().expr_Subscript(node)

    def load_name(self, node: ast.Name) -> ast.expr:
        if node.id in self.promoted:
            return ast.Subscript(value=ast.Name(id=f"{node.id}__items", ctx=ast.Load()),
                                 slice=ast.Name(id="_li", ctx=ast.Load()), ctx=ast.Load())
        return ast.Name(id=node.id, ctx=ast.Load())

    def atomic_symbol(self, name: str) -> str:
        return name

    vector_pow = True      # float32 x ** y through vmath.pow (CUDA keeps its own powf)

    def float32_pow(self, node: ast.expr, base: ast.expr, exponent: ast.expr) -> ast.expr | None:
        """``vmath.pow(base, exponent)`` when ``node`` is a float32 power with a float
        exponent (libm's powf is a call per element, which stops LLVM vectorising the loop);
        None otherwise."""
        t = self.T(node)
        if not (self.vector_pow and isinstance(t, Scalar) and t.dtype == "float32"
                and self.T(exponent).is_float):
            return None
        return ast.Call(func=ast.Attribute(value=ast.Name(id="vmath", ctx=ast.Load()),
                                           attr="pow", ctx=ast.Load()),
                        args=[self.coerce(base, t), self.coerce(exponent, t)], keywords=[])

    def expr_BinOp(self, node: ast.BinOp) -> ast.expr:
        if isinstance(node.op, ast.Pow) and not (
                isinstance(node.right, ast.Constant) and node.right.value in (2, 3)):
            call = self.float32_pow(node, node.left, node.right)
            if call is not None:
                return call
        return super().expr_BinOp(node)

    def expr_Call(self, node: ast.Call) -> ast.expr:
        name = tg_name(node)
        if name == "pow" and len(node.args) == 2:
            call = self.float32_pow(node, node.args[0], node.args[1])
            if call is not None:
                return call
        if name and name.startswith("atomic_"):
            array_t = self.T(node.args[0])
            if isinstance(array_t, Array) and array_t.space != "global":   # one thread per group
                call = super().expr_Call(node)
                call.func = ast.Name(id=f"plain_{name[len('atomic_'):]}", ctx=ast.Load())
                return call
        return super().expr_Call(node)


@functools.cache
def vmath_version() -> str:
    """A digest of the vmath package, written into every generated module: its functions
    are inlined into the kernels, so a change to them must change the module (and Numba's
    cache key)."""
    from tapegrad.backends.cpu import vmath
    return _digest(sorted(Path(vmath.__file__).parent.glob("*.py")))


@functools.cache
def version_of(*modules: str) -> str:
    """A digest of modules of this package (``"atomics"``, ...) whose functions generated
    modules import and Numba compiles into them: written next to the import, so that a change
    to that code changes the module text, which is Numba's cache key."""
    return _digest([Path(__file__).with_name(f"{m}.py") for m in modules])


ATOMICS = ("atomic_add", "atomic_sub", "atomic_min", "atomic_max")


def module_imports(kernels: list[TypedKernel]) -> list[str]:
    """A generated module's imports.  What it imports from tapegrad is compiled into its
    kernels, so each such line carries a digest of that code (``version_of``); atomics.py's
    only where ``kernels`` (a kernel and its device functions) use atomics, and fused.py only
    where they call ``tg.fma``, so that other kernels do not recompile when those change."""
    atomics = f"  # version {version_of('atomics')}" if uses_atomics(kernels) else ""
    fused = [f"from tapegrad.backends.cpu import fused  # version {version_of('fused')}"] \
        if _calls(kernels, lambda name: name == "fma") else []
    return [
        "import math", "import numba", "import numpy as np",
        f"from tapegrad.backends.cpu import vmath  # version {vmath_version()}",
        *fused,
        "from tapegrad.backends.cpu.atomics import " + ", ".join(ATOMICS) + atomics,
        "from tapegrad.backends.cpu.atomics import " + ", ".join(
            f"plain_{a[len('atomic_'):]}" for a in ATOMICS),
        "from tapegrad.backends.cpu.sums import group_sum",
        "from tapegrad.backends.cpu.copies import aligned_empty, stack_empty, transposed"
        f"  # version {version_of('copies', 'sums')} (copies.py, sums.py)"]


def uses_atomics(kernels: list[TypedKernel]) -> bool:
    """Whether any of ``kernels`` (a kernel and its device functions) calls an atomic, or
    adds a group's sum with one (``group_reduce_add``, an Active scalar's adjoint)."""
    return _calls(kernels, lambda name: name.startswith("atomic_") or name == "group_reduce_add")


def _calls(kernels: list[TypedKernel], which: Callable[[str], bool]) -> bool:
    return any(which(tg_name(n) or "") for k in kernels
               for n in ast.walk(ast.Module(body=k.ir.body, type_ignores=[])))


def _digest(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]
