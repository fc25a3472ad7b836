"""Range tests: conditions that bound a work-item's global index by values uniform in its
workgroup (``0 < i < n - 1 and j + 1 < m``).  A group can decide them once from its extreme
indices: the CPU lowering versions work-item loops on them (backends/cpu/versioning.py), the
gather transform folds a stencil's boundary tests in the interior (ad/gather.py).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from tapegrad.frontend.ir import tg_name

_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}


@dataclass
class RangeTest:
    """``index[dim] + offset <symbol> bound`` for every work-item of the group."""

    dim: int
    offset: int
    symbol: str
    bound: ast.expr


def range_tests(test: ast.expr, index_dims: dict[str, int],
                uniform: Callable[[ast.expr], bool]) -> list[RangeTest] | None:
    """``test`` as range tests, if it is a conjunction of comparisons between a global index
    (plus a constant) and values for which ``uniform`` holds (the same for a whole group)."""
    atoms: list[tuple[ast.expr, ast.cmpop, ast.expr]] = []

    def collect(e: ast.expr) -> bool:
        if tg_name(e) == "bool" and len(e.args) == 1:
            return collect(e.args[0])
        if isinstance(e, ast.BoolOp) and isinstance(e.op, ast.And):
            return all(collect(v) for v in e.values)
        if isinstance(e, ast.Compare):
            left = e.left
            for op, right in zip(e.ops, e.comparators):
                atoms.append((left, op, right))
                left = right
            return True
        return False

    if not collect(test) or not atoms:
        return None
    out = []
    for left, op, right in atoms:
        if type(op) not in _FLIP:
            return None
        side = _index_offset(left, index_dims)
        if side is None:
            side, op, right = _index_offset(right, index_dims), _FLIP[type(op)](), left
        if side is None or not uniform(right):
            return None
        out.append(RangeTest(side[0], side[1], _SYMBOL[type(op)], right))
    return out


def _index_offset(e: ast.expr, index_dims: dict[str, int]) -> tuple[int, int] | None:
    """``i`` -> (dim of i, 0); ``i + c`` / ``i - c`` -> (dim, +-c) for an int literal c."""
    if isinstance(e, ast.Name) and e.id in index_dims:
        return index_dims[e.id], 0
    if isinstance(e, ast.BinOp) and isinstance(e.op, (ast.Add, ast.Sub)) \
            and isinstance(e.left, ast.Name) and e.left.id in index_dims \
            and isinstance(e.right, ast.Constant) and type(e.right.value) is int:
        c = e.right.value
        return index_dims[e.left.id], (c if isinstance(e.op, ast.Add) else -c)
    return None
