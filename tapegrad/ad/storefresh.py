"""Storing into shadows that hold no values yet, instead of zeroing them and adding.

Reverse mode adds into shadows (Enzyme's convention), so a caller who wants the gradient
alone must zero the shadow first: one more pass over memory.  When the caller's shadow holds
no values yet (a new gradient, or ``tg.autodiff(..., accumulate=False)``), and every update of
it in the adjoint is a top-level ``S[own] += e`` at the work-item's own global index, the first
update can store instead::

    X_bar[i] += _a1 * a          ->          X_bar[i] = _a1 * a

Top level means every work-item runs it on every path, so when the launch's ndrange equals
the shadow's shape (the caller checks that at launch time) every element is written exactly
once by its own work-item and needs no zeros.  Shadows updated anywhere else (under a test,
in a loop, by an atomic, read back) keep the zero-then-add form.
"""

from __future__ import annotations

import ast
import copy

from tapegrad.ad.astutil import walk as _walk
from tapegrad.ad.gather import global_index_vars
from tapegrad.frontend.ir import KernelIR


def storable_shadows(ir: KernelIR, shadows: list[str], rank: int) -> list[str]:
    """The ``shadows`` whose every appearance in ``ir`` is a top-level ``S[own] += e``."""
    index_vars = global_index_vars(ir.body, rank)
    if index_vars is None or any(isinstance(n, ast.Return) for n in _walk(ir.body)):
        return []
    own = index_vars[0] if rank == 1 else tuple(index_vars)
    found = []
    for s in shadows:
        updates = [st for st in ir.body if _own_update(st, s, own)]
        uses = sum(isinstance(n, ast.Name) and n.id == s for n in _walk(ir.body))
        if updates and uses == len(updates):
            found.append(s)
    return found


def storing(ir: KernelIR, shadows: list[str], rank: int) -> KernelIR:
    """``ir`` with the first update of each of ``shadows`` (from ``storable_shadows``) made a
    store."""
    index_vars = global_index_vars(ir.body, rank)
    own = index_vars[0] if rank == 1 else tuple(index_vars)
    body = copy.deepcopy(ir.body)
    for s in shadows:
        k = next(k for k, st in enumerate(body) if _own_update(st, s, own))
        first = body[k]
        body[k] = ast.copy_location(ast.Assign(targets=[first.target], value=first.value),
                                    first)
    return KernelIR(name=f"{ir.name}_storing_{'_'.join(shadows)}", params=ir.params,
                    body=body, filename=ir.filename, lineno=ir.lineno, is_kernel=True,
                    funcs=ir.funcs, generated=True)


def _own_update(st: ast.stmt, shadow: str, own: str | tuple[str, ...]) -> bool:
    if not (isinstance(st, ast.AugAssign) and isinstance(st.op, ast.Add)
            and isinstance(st.target, ast.Subscript) and isinstance(st.target.value, ast.Name)
            and st.target.value.id == shadow):
        return False
    idx = st.target.slice
    if isinstance(own, str):
        return isinstance(idx, ast.Name) and idx.id == own
    return isinstance(idx, ast.Tuple) and tuple(
        e.id if isinstance(e, ast.Name) else None for e in idx.elts) == own

