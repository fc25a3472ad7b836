"""Two questions the adjoint transform asks of a kernel's body before it starts: which reads
use the work-item's own index (their adjoints need no atomics), and which locals are assigned
more than once or in a loop (their old values are saved on the work-item's stack)."""

from __future__ import annotations

import ast

from tapegrad.frontend.ir import tg_name


def reassigned_locals(body: list[ast.stmt]) -> set[str]:
    """Locals assigned more than once, or inside a loop: their old value must be saved when
    they are assigned again."""
    counts: dict[str, int] = {}
    in_loop: set[str] = set()

    def visit(stmts: list[ast.stmt], looped: bool) -> None:
        for s in stmts:
            targets: list[ast.expr] = []
            if isinstance(s, ast.Assign):
                t = s.targets[0]
                targets = t.elts if isinstance(t, ast.Tuple) else [t]
            elif isinstance(s, ast.For):
                targets = [s.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    counts[t.id] = counts.get(t.id, 0) + 1
                    if looped:
                        in_loop.add(t.id)
            if isinstance(s, (ast.For, ast.While)):
                visit(s.body, True)
            elif isinstance(s, ast.If):
                visit(s.body, looped)
                visit(s.orelse, looped)
    visit(body, False)
    return {n for n, c in counts.items() if c > 1 or n in in_loop}


def own_index_reads(body: list[ast.stmt], memory_kind: dict[str, str], rank: int
                    ) -> dict[str, str]:
    """For each array the kernel reads: 'plain' if every read uses this work-item's own index
    (its adjoint adds with a plain ``+=``), else 'atomic'."""
    counts: dict[str, int] = {}
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            counts[n.id] = counts.get(n.id, 0) + 1
    linear: set[str] = set()
    components: dict[str, int] = {}
    tuples: set[str] = set()
    local_linear: set[str] = set()
    local_components: dict[str, int] = {}
    for s in body:   # top-level, assigned once: fixed for the whole work-item
        if not isinstance(s, ast.Assign):
            continue
        t, name = s.targets[0], tg_name(s.value)
        if isinstance(t, ast.Name) and counts.get(t.id) == 1:
            if name == "global_index":
                linear.add(t.id)
            elif name == "global_indices":
                tuples.add(t.id)
            elif name == "local_index":
                local_linear.add(t.id)
        if isinstance(t, ast.Tuple) and name in ("global_indices", "local_indices") and all(
                isinstance(e, ast.Name) and counts.get(e.id) == 1 for e in t.elts):
            target = components if name == "global_indices" else local_components
            for k, e in enumerate(t.elts):
                target[e.id] = k

    def own(array: str, idx: ast.expr) -> bool:
        is_local = memory_kind.get(array) == "localmem"
        if memory_kind.get(array) == "private":
            return True
        lin = local_linear if is_local else linear
        comp = local_components if is_local else components
        call = "local_index" if is_local else "global_index"
        if isinstance(idx, ast.Name) and (idx.id in lin or (rank == 1 and comp.get(idx.id) == 0)):
            return True
        if tg_name(idx) == call:
            return True
        if not is_local and isinstance(idx, ast.Name) and idx.id in tuples:
            return True
        if isinstance(idx, ast.Tuple) and len(idx.elts) == rank and all(
                isinstance(e, ast.Name) and comp.get(e.id) == k for k, e in enumerate(idx.elts)):
            return True
        return False

    result: dict[str, str] = {}
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) \
                and isinstance(n.ctx, ast.Load):
            a = n.value.id
            ok = own(a, n.slice)
            result[a] = "plain" if ok and result.get(a, "plain") == "plain" else "atomic"
    return result
