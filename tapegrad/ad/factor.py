"""A chain of accumulations becomes one sum, common factors taken out once.

A stencil's gathered adjoint adds one term per neighbour, each its own product::

    _d3 = _a2 * alpha               # _a2 = T_new_bar[_gi0 + 1, _gi1]
    _acc = _acc + _d3
    ...                             # four more neighbours, each times alpha
    _acc = _acc + -_d3 * 4.0

thirteen floating-point operations per element in one chain of dependent adds, where the
primal stencil takes seven.  Written as one sum with ``alpha`` taken out once ::

    _acc = T_new_bar[_gi0, _gi1] + alpha * (T_new_bar[_gi0 + 1, _gi1] + ... - 4.0 * T_new_bar[_gi0, _gi1])

the same sum takes eight, and the factor is applied once per element instead of once per
term (measured: CHANGELOG.md, 'the figures that moved').  The sum is
reassociated, so it rounds differently (by an ulp or so of its terms), as any two orders
of a gathered sum do.

The pass takes straight-line code whose only value read afterwards is the accumulator, and
which stores nothing (a gather's interior path: ``tapegrad.ad.gather``).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from tapegrad.ad.astutil import assign, const, mul, substituted


@dataclass
class _Term:
    """``coef * factor_1 * factor_2 * ...``; factors are expressions the pass does not look
    into (loads, names, calls, quotients), compared by their text."""

    coef: float
    factors: list[ast.expr] = field(default_factory=list)

    def keys(self) -> list[str]:
        return [ast.dump(f) for f in self.factors]


def factored_sum(stmts: list[ast.stmt], acc: str) -> list[ast.stmt] | None:
    """``stmts`` as one assignment ``acc = <sum>``, given that ``acc`` is zero before them,
    that they store nothing, and that nothing but ``acc`` is read after them; None when
    they are not straight-line assignments to names, or nothing would be gained."""
    env: dict[str, ast.expr] = {acc: const(0.0)}
    updates = 0
    for s in stmts:
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1
                and isinstance(s.targets[0], ast.Name)):
            return None
        target = s.targets[0].id
        updates += target == acc
        env[target] = substituted(s.value, env)   # (earlier values substituted already)
    if updates < 2:
        return None
    terms = [t for t in _terms(env[acc]) if t.coef != 0.0 or t.factors]
    if not terms:
        return None
    total = _emit(terms)
    if _repeated_call(total):
        return None
    return [ast.copy_location(assign(acc, total), stmts[-1])]


def _repeated_call(e: ast.expr) -> bool:
    """Whether a call occurs twice in ``e``: substituting a temporary into two terms that
    keep it would compute it twice (a load twice costs nothing: LLVM reads it once)."""
    seen = set()
    for n in ast.walk(e):
        if isinstance(n, ast.Call):
            k = ast.dump(n)
            if k in seen:
                return True
            seen.add(k)
    return False


def _terms(e: ast.expr) -> list[_Term]:
    """``e`` as a sum of products; products of two sums stay one factor each (multiplying
    them out would cost operations, not save them)."""
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)):
        right = _terms(e.right)
        if isinstance(e.op, ast.Sub):
            right = [_Term(-t.coef, t.factors) for t in right]
        return _terms(e.left) + right
    if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
        return [_Term(-t.coef, t.factors) for t in _terms(e.operand)]
    if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Mult):
        left, right = _terms(e.left), _terms(e.right)
        if len(left) == 1 and len(right) == 1:
            return [_Term(left[0].coef * right[0].coef, left[0].factors + right[0].factors)]
        return [_Term(1.0, [_emit(left), _emit(right)])]
    if isinstance(e, ast.Constant) and type(e.value) in (int, float):
        return [_Term(float(e.value))]
    return [_Term(1.0, [e])]


def _emit(terms: list[_Term]) -> ast.expr:
    """The sum of ``terms`` (at least one): the factor shared by the most terms (two or
    more) taken out of them, then the next, and so on; the rest added in their order."""
    out: list[tuple[float, ast.expr]] = []    # (sign, expression)
    rest = list(terms)
    while True:
        counts: dict[str, int] = {}
        for t in rest:
            for k in set(t.keys()):
                counts[k] = counts.get(k, 0) + 1
        best = max(counts, key=lambda k: counts[k], default=None)
        if best is None or counts[best] < 2:
            break
        group, keep = [], []
        for t in rest:
            keys = t.keys()
            if best in keys:
                at = keys.index(best)
                factor = t.factors[at]
                group.append(_Term(t.coef, t.factors[:at] + t.factors[at + 1:]))
            else:
                keep.append(t)
        inner = _emit(group)
        out.append((1.0, mul(copy.deepcopy(factor), inner)))
        rest = keep
    for t in rest:
        out.append(_product(t))
    expr: ast.expr | None = None
    for coef, e in out:
        if expr is None:
            expr = e if coef > 0 else ast.UnaryOp(op=ast.USub(), operand=e)
        else:
            expr = ast.BinOp(left=expr, op=ast.Add() if coef > 0 else ast.Sub(), right=e)
    return expr


def _product(t: _Term) -> tuple[float, ast.expr]:
    """(sign, |coef| * factors...) of one term."""
    sign = -1.0 if t.coef < 0 else 1.0
    mag = abs(t.coef)
    if not t.factors:
        return sign, const(mag)
    e = copy.deepcopy(t.factors[0])
    for f in t.factors[1:]:
        e = mul(e, copy.deepcopy(f))
    return sign, e if mag == 1.0 else mul(const(mag), e)
