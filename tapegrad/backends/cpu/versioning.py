"""Deciding a work-item loop's first ``if`` outside the loop (loop versioning).

The CPU runs a workgroup's work-items as a loop.  When the first top-level ``if`` of the
kernel can be decided without looking at each work-item, the lowering emits one work-item
loop per outcome and LLVM vectorises each on its own (it does not version loops this large
by itself):

- a test that is the same for every work-item (arguments never reassigned, group indices,
  ndrange, groupsize, array shapes): one loop with the ``if`` branch, one with the ``else``;
- a range test on the global index (``0 < i < n - 1 and j + 1 < m``, bounds the same for the
  whole group): each row of the group (its innermost index range) is split where the test
  holds, ``[_lo, _hi)``, which runs without the ``if`` (a stencil's interior), and the rest,
  which runs the loop as written.  Generated kernels spell the test
  ``_branch1 = tg.bool(...)`` once and test ``if _branch1:`` in both sweeps: every such
  top-level ``if`` goes.

This module finds the ``if`` and says how to decide it; ``lower.py`` emits the loops.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from tapegrad.backends.structure import is_uniform
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.ranges import RangeTest, range_tests


@dataclass
class Versions:
    prelude: list[ast.stmt]            # uniform locals the test reads (n, m = T.shape)
    uniform: ast.expr | None           # a test the same for every work-item, or
    ranges: list[RangeTest]            # range tests that must hold for the whole group
    then: list[ast.stmt]               # the work-items' statements when it holds
    otherwise: list[ast.stmt]          # ... and when it does not


def plan_versions(stmts: list[ast.stmt], params: list[str], rank: int,
                  integral: Callable[[ast.expr], bool]) -> Versions | None:
    """The versions of the work-item statements ``stmts``, or None (one plain loop).
    ``integral(e)``: whether ``e`` is an integer; a range test's bounds must be (the split
    computes the first and last work-item where it holds: ``j < m / 2`` is not ``j < m // 2``,
    and a float bound gave wrong results)."""
    if any(isinstance(n, ast.Return) for st in stmts for n in ast.walk(st)):
        return None
    assigned: dict[str, int] = {}
    for st in stmts:
        for n in ast.walk(st):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                assigned[n.id] = assigned.get(n.id, 0) + 1
    fixed = set(params) - set(assigned)
    index_dims: dict[str, int] = {}
    prelude: list[ast.stmt] = []
    flags: dict[str, ast.expr] = {}    # _branch1 = tg.bool(test): how transforms spell an if
    for k, st in enumerate(stmts):
        if isinstance(st, ast.Assign):
            t, name = st.targets[0], tg_name(st.value)
            elts = t.elts if isinstance(t, ast.Tuple) else [t]
            names = [e.id for e in elts if isinstance(e, ast.Name)]
            once = len(names) == len(elts) and all(assigned.get(n) == 1 for n in names)
            if once and name == "global_index" and rank == 1 and len(names) == 1:
                index_dims[names[0]] = 0
            elif once and name == "global_indices" and isinstance(t, ast.Tuple):
                index_dims.update({n: d for d, n in enumerate(names)})
            elif once and is_uniform(st.value, fixed):
                fixed |= set(names)
                prelude.append(st)
            elif once and isinstance(t, ast.Name):
                flags[t.id] = st.value
            continue
        if not isinstance(st, ast.If) or not st.body:
            continue
        rest_before, rest_after = stmts[:k], stmts[k + 1:]
        if is_uniform(st.test, fixed):
            return Versions(prelude, st.test, [], rest_before + st.body + rest_after,
                            rest_before + st.orelse + rest_after)
        def uniform(e: ast.expr, fixed: set[str] = fixed) -> bool:
            return is_uniform(e, fixed) and integral(e)

        # (the test is all range tests, and the split runs the rest of each row exactly where
        # one of them fails: there the test is false, and the version is the else branch)
        ranges = range_tests(st.test, index_dims, uniform)
        if ranges is not None:
            return Versions(prelude, None, ranges, rest_before + st.body + rest_after,
                            rest_before + st.orelse + rest_after)
        if isinstance(st.test, ast.Name) and st.test.id in flags:
            ranges = range_tests(flags[st.test.id], index_dims, uniform)
            if ranges is not None:   # every top-level `if flag:` becomes one of its branches
                flag = st.test.id

                def branch(holds: bool, flag: str = flag) -> list[ast.stmt]:
                    return [x for y in stmts for x in (
                        (y.body if holds else y.orelse) if isinstance(y, ast.If)
                        and isinstance(y.test, ast.Name) and y.test.id == flag else [y])]
                return Versions(prelude, None, ranges, branch(True), branch(False))
        return None    # only the first if is considered (bounded code size)
    return None
