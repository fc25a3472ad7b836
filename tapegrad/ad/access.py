"""Which arrays a kernel reads and which it writes (after normalization)."""

from __future__ import annotations

import ast

from tapegrad.frontend.ir import KernelIR, tg_name


def array_access(ir: KernelIR, among: set[str] | None = None) -> tuple[set[str], set[str]]:
    """(parameters read, parameters written), from loads, stores and atomics in ``ir``; with
    ``among``, those of these names instead (local and private arrays too).  An atomic's
    target, an update in place (``A[i] += x``) and an array passed to a device function count
    as read and written: what they leave there depends on what was there."""
    reads: set[str] = set()
    writes: set[str] = set()
    params = set(ir.params) if among is None else among
    for n in ast.walk(ast.Module(body=ir.body, type_ignores=[])):
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Subscript) \
                and isinstance(n.target.value, ast.Name) and n.target.value.id in params:
            reads.add(n.target.value.id)       # (its target's Subscript, a store, adds the write)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) \
                and n.value.id in params:
            (reads if isinstance(n.ctx, ast.Load) else writes).add(n.value.id)
        elif isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_") \
                and isinstance(n.args[0], ast.Name) and n.args[0].id in params:
            reads.add(n.args[0].id)
            writes.add(n.args[0].id)
        elif isinstance(n, ast.Call) and tg_name(n) is None:   # a kept device function
            for a in n.args:
                if isinstance(a, ast.Name) and a.id in params:
                    reads.add(a.id)
                    writes.add(a.id)
    return reads, writes
