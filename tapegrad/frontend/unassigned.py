"""A local a work-item reads before assigning it reads 0, made explicit.

Python would raise UnboundLocalError where a local is read before any assignment reached it
(``x`` after ``for x in range(0)``, one assigned in one branch only, or read above its only
assignment); kernels read 0 there, as the GPUs' C declares every local (docs/language.md).
``zeroed_unassigned`` writes that 0 into the kernel as ``x = 0`` (its type's zero) at the top
of the work-item body, for each scalar local some path may read before assigning it:

- the CPU's kernels then start every work-item from it (not from an earlier work-item's
  value, or Numba's garbage);
- the derivative transforms see the 0 as the local's first value: a local read above its
  only assignment is then assigned twice, and the adjoint restores the 0 for the reads
  above (it used the later value: a wrong gradient), and the tangent kernel reads it too.
"""

from __future__ import annotations

import ast
import dataclasses

from tapegrad.frontend.types import BOOL, INT64, Scalar, TypedKernel


def upward_exposed(stmts: list[ast.stmt]) -> set[str]:
    """Names that ``stmts`` may read before assigning them (so their value comes from before)."""
    exposed: set[str] = set()

    def reads(e: ast.AST | None, assigned: set[str]) -> None:
        if e is not None:
            exposed.update(n.id for n in ast.walk(e) if isinstance(n, ast.Name)
                           and isinstance(n.ctx, ast.Load) and n.id not in assigned)

    def block(body: list[ast.stmt], assigned: set[str]) -> set[str]:
        assigned = set(assigned)
        for s in body:
            if isinstance(s, ast.Assign):
                reads(s.value, assigned)
                for target in s.targets:      # (generated code chains them: _lo = _hi = 0)
                    if isinstance(target, ast.Subscript):
                        reads(target, assigned)
                    else:
                        assigned |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(s, ast.AugAssign):
                reads(s.value, assigned)
                reads(s.target, assigned)
                if isinstance(s.target, ast.Name) and s.target.id not in assigned:
                    exposed.add(s.target.id)
            elif isinstance(s, ast.For):
                for a in s.iter.args:
                    reads(a, assigned)
                block(s.body, assigned | {s.target.id})
            elif isinstance(s, ast.While):
                reads(s.test, assigned)
                block(s.body, assigned)
            elif isinstance(s, ast.If):
                reads(s.test, assigned)
                assigned |= block(s.body, assigned) & block(s.orelse, assigned)
            else:
                reads(s, assigned)
        return assigned

    block(stmts, set())
    return exposed


def unassigned_scalars(tk: TypedKernel, body: list[ast.stmt] | None = None) -> list[str]:
    """The scalar locals that ``body`` (the kernel's, by default) may read before assigning
    them, in name order."""
    body = tk.ir.body if body is None else body
    return [name for name in sorted(upward_exposed(body))
            if isinstance(tk.locals.get(name), Scalar) and name not in tk.ir.params]


def zeroed_unassigned(tk: TypedKernel) -> TypedKernel:
    """``tk`` with ``x = 0`` (its type's zero) at the top of the work-item body for each
    scalar local it may read before assigning it; ``tk`` itself where there is none."""
    names = unassigned_scalars(tk) if tk.ir.body else []
    if not names:
        return tk
    first = tk.ir.body[0]
    types = dict(tk.types)
    inits: list[ast.stmt] = []
    for name in names:
        t = tk.locals[name]
        target = ast.Name(id=name, ctx=ast.Store())
        value = ast.Constant(value=False if t.dtype == "bool" else 0)
        types[id(target)], types[id(value)] = t, BOOL if t.dtype == "bool" else INT64
        init = ast.Assign(targets=[target], value=value)
        for node in (init, target, value):
            ast.copy_location(node, first)
        inits.append(init)
    ir = dataclasses.replace(tk.ir, body=inits + list(tk.ir.body))
    return dataclasses.replace(tk, ir=ir, types=types)
