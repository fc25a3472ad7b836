"""Per-thread sums whose every term is scaled by the value of the element it is added to.

A gather's adjoint adds ``v * g`` into ``X_bar[idx[i]]``, where ``v = X[idx[i]]`` is the
value of the very element the term is added to (``Y[i] = X[idx[i]] ** 2``: ``g = 2 *
Y_bar[i]``).  Per element, ``sum_i v * g_i = X[k] * sum_i g_i``: when the adds go into
per-thread copies (lower.py's privatisation), the work-item loop can add ``g`` alone, with
``v`` set to one, which drops the random read of ``X`` per work-item, and the merge
multiplies each element's sum by ``X[k]`` once (measured: CHANGELOG.md, 'the figures
that moved').

It applies when the add's value is linear in ``v`` (every term has exactly one factor ``v``)
and nothing else uses ``v`` or what is computed from it; this module only finds such adds, by
following straight-line statements of the work-item's body (it gives up at the first loop or
branch that touches ``v``'s values).
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass

from tapegrad.ad.access import array_access
from tapegrad.backends.structure import names_in
from tapegrad.frontend.ir import KernelIR, tg_name

ZERO = "zero"       # the degree of a literal zero: it is a term of every degree


@dataclass(frozen=True)
class ScaledSum:
    """The adds into ``array`` scale by ``factor = source[index]``, assigned by ``assign``."""

    array: str
    factor: str
    source: str
    assign: ast.Assign


def scaled_sums(ir: KernelIR, private: dict[str, int], arrays: set[str]
                ) -> dict[str, ScaledSum]:
    """The per-thread sums (``private``: the privatised arrays) whose single add statement,
    at the top level of ``ir``'s body, is linear in a local read from an array parameter (of
    ``arrays``) at the add's own index, before it."""
    body = ir.body
    tree = ast.Module(body=body, type_ignores=[])
    written = array_access(ir, among=names_in(tree))[1]
    stores = Counter(n.id for n in ast.walk(tree)
                     if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
    found = {}
    for a in private:
        adds = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and tg_name(n) in ("atomic_add", "atomic_sub")
                and isinstance(n.args[0], ast.Name) and n.args[0].id == a]
        if len(adds) != 1:
            continue
        at = next((k for k, s in enumerate(body)
                   if isinstance(s, ast.Expr) and s.value is adds[0]), None)
        index = adds[0].args[1]
        # the index means one element all along: its locals assigned once, its arrays unwritten
        if at is None or any(stores[n] > 1 or n in written for n in names_in(index)):
            continue
        for k, s in enumerate(body[:at]):
            source = _own_read(s, ast.dump(index), arrays, written | set(private))
            if source is not None and stores[s.targets[0].id] == 1 and _linear_in(body, k, at):
                found[a] = ScaledSum(a, s.targets[0].id, source, s)
                break
    return found


def _own_read(s: ast.stmt, index: str, arrays: set[str], written: set[str]) -> str | None:
    """The array read when ``s`` is ``v = A[index]``, ``A`` a parameter the kernel does not
    write."""
    if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) \
            and isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name) \
            and s.value.value.id in arrays and s.value.value.id not in written \
            and ast.dump(s.value.slice) == index:
        return s.value.value.id
    return None


def _linear_in(body: list[ast.stmt], k: int, at: int) -> bool:
    """Whether the value added at ``body[at]`` is linear in the local assigned (once) at
    ``body[k]`` and nothing else uses that local or values computed from it."""
    v = body[k].targets[0].id
    degree: dict[str, object] = {}      # locals whose value depends on v (or is zero)
    for j, s in enumerate(body[:at]):
        if j == k:
            degree[v] = 1
            continue
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0],
                                                                            ast.Name):
            d = _degree(s.value, degree)
            if d is None:
                return False
            degree[s.targets[0].id] = d
        elif isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name):
            d = _degree(ast.BinOp(left=ast.Name(id=s.target.id, ctx=ast.Load()), op=s.op,
                                  right=s.value), degree)
            if d is None:
                return False
            degree[s.target.id] = d
        elif _depends(s, degree):
            return False
        else:                      # (names it assigns hold values independent of v)
            for n in ast.walk(s):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    degree[n.id] = 0
    add = body[at].value
    if _depends(add.args[1], degree) or _degree(add.args[2], degree) != 1:
        return False
    return not any(_depends(s, degree) for s in body[at + 1:])


def _depends(node: ast.AST, degree: dict[str, object]) -> bool:
    """Whether ``node`` uses a local whose value depends on the tracked one."""
    return any(isinstance(n, ast.Name) and degree.get(n.id, 0) not in (0, ZERO)
               for n in ast.walk(node))


def _degree(e: ast.expr, degree: dict[str, object]) -> object:
    """The degree of ``e`` as a polynomial in the tracked local (``ZERO`` for a literal zero),
    None when it is not a monomial of one degree."""
    if isinstance(e, ast.Name):
        return degree.get(e.id, 0)
    if isinstance(e, ast.Constant):
        return ZERO if e.value == 0 and not isinstance(e.value, bool) else 0
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        return _degree(e.operand, degree)
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        left, right = _degree(e.left, degree), _degree(e.right, degree)
        if left is None or right is None:
            return None
        if isinstance(e.op, ast.Mult):
            return ZERO if ZERO in (left, right) else left + right
        if isinstance(e.op, ast.Div):
            return left if right == 0 else None
        return right if left == ZERO else left if right == ZERO or left == right else None
    return None if _depends(e, degree) else 0
