"""Zeroing a consumed shadow after the statement's updates, not between them.

The adjoint of ``Y[i] = f(X[i])`` reads ``Y_bar[i]``, zeroes it (the overwritten output's
shadow is consumed) and adds into ``X_bar``::

    _a1 = Y_bar[i]                       _a1 = Y_bar[i]
    Y_bar[i] = 0.0             ->        X_bar[i] = X_bar[i] + _a1 * cos(X[i])
    X_bar[i] = X_bar[i] + ...            Y_bar[i] = 0.0

Both orders compute the same (no two shadow parameters are one array: the runtime merges or
separates them before an adjoint runs), but on an NVIDIA H200 the first runs several times
slower than the second: a constant stored to the address just loaded holds back the
work-item's next loads (measured: docs/gpu.md, "Measured").  This pass moves each such store down its
statement list, past plain assignments that name neither its array nor a variable of its
index, and stops at anything else (a branch, a loop, a call such as a barrier or an atomic).
"""

from __future__ import annotations

import ast

from tapegrad.ad.astutil import walk


def sink_zero_stores(body: list[ast.stmt], shadows: set[str]) -> list[ast.stmt]:
    """``body`` with each ``S[idx] = <number>`` into one of ``shadows`` moved as late as it
    can go in its own statement list (nested lists too); changed in place and returned."""
    for st in body:
        for field in ("body", "orelse"):
            inner = getattr(st, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                sink_zero_stores(inner, shadows)
    k = len(body) - 1
    while k >= 0:
        st = body[k]
        if _zero_store(st, shadows):
            array = st.targets[0].value.id
            index = {n.id for n in ast.walk(st.targets[0].slice) if isinstance(n, ast.Name)}
            end = k
            while end + 1 < len(body) and _passable(body[end + 1], array, index):
                end += 1
            if end > k:
                body.insert(end, body.pop(k))
        k -= 1
    return body


def _zero_store(st: ast.stmt, shadows: set[str]) -> bool:
    if not (isinstance(st, ast.Assign) and len(st.targets) == 1
            and isinstance(st.value, ast.Constant)):
        return False
    target = st.targets[0]
    return (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
            and target.value.id in shadows)


def _passable(st: ast.stmt, array: str, index: set[str]) -> bool:
    """Whether a store into ``array`` at an index reading ``index`` may move below ``st``: a
    plain assignment that names neither the array nor assigns an index variable."""
    if not isinstance(st, (ast.Assign, ast.AugAssign)):
        return False
    for n in walk([st]):
        if isinstance(n, ast.Name) and (n.id == array or
                                        (n.id in index and isinstance(n.ctx, ast.Store))):
            return False
    return True
