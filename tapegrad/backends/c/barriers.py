"""A kernel with barriers in C: ``structure.BarrierPlan``'s segments and group-level statements.

Every work-item stays alive to reach each barrier (work-items past the ndrange too); the
statements between two barriers run under ``if (_valid)``.  Loops and branches that hold
barriers run in every work-item alike.  Where their bounds or conditions were computed per
work-item (an adjoint restores its loops' trip counts per work-item), work-item 0's values are
taken by all: the plan's ``evaluates`` segments compute them into ``_group_valueN`` (typed as
``BarrierPlan.runtime_values`` says), and work-item 0 publishes them through local memory::

    if (_valid) {
        // kernel.py:12
        _group_value0 = (stride > 0);
    }
    if (_l0 == 0) {
        _group_values[_group_bank][0] = _group_value0;
    }
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    _group_value0 = _group_values[_group_bank][0];
    _group_bank ^= 1;
    while (_group_value0) {
        ...

Why this is free of races: every work-item copies the published values into its own
``_group_valueN`` right after the barrier that publishes them, and the loop or branch reads only
that copy.  Publications alternate between two banks of slots (``_group_bank``, the same in
every work-item, since every work-item passes the same publications).  So a bank written at
publication ``k`` is written again at ``k + 2`` at the earliest, by work-item 0 after it has
passed the barrier of publication ``k + 1``; every work-item reaches that barrier only after
its copy from publication ``k``.  One bank would not do: a loop of zero trips (or a branch not
taken) between two publications leaves no barrier between a slow work-item's copy and work-item
0's next write of the same slot, which would give the work-items different trip counts (and a
deadlock at the next barrier).
"""

from __future__ import annotations

import ast

from tapegrad.backends.c.expressions import bare
from tapegrad.backends.c.helpers import Helpers
from tapegrad.backends.c.statements import Body
from tapegrad.backends.returns import eliminate_returns
from tapegrad.backends.structure import Barrier, BarrierPlan, GroupStmt, Segment, segments_of
from tapegrad.frontend.types import Scalar, TypedKernel

BANKS = 2


class BarrierBody(Body):
    """The body of kernel ``tk`` as ``plan`` splits it at its barriers."""

    def __init__(self, helpers: Helpers, tk: TypedKernel, plan: BarrierPlan):
        super().__init__(helpers, tk)
        self.plan = plan
        self.slots = list(plan.runtime_values)
        # the assignments the plan adds (``_group_valueN = <bound>``) take the shared values'
        # types; their right-hand sides are the kernel's own, typed, expressions
        for seg in segments_of(plan.blocks):
            for s in seg.stmts if seg.evaluates else []:
                self.added_types[id(s.targets[0])] = Scalar(plan.runtime_values[s.targets[0].id])
        lid = "_l0"
        for k in range(1, tk.rank):
            lid = f"({lid} * {tk.groupsize[k]} + _l{k})"
        self.local_id = lid

    @property
    def shared_bytes(self) -> int:
        """The bytes of local memory the shared values take."""
        return BANKS * 8 * len(self.slots)

    def declarations(self, depth: int) -> list[str]:
        """The shared slots and each work-item's copies of the values (nothing without)."""
        if not self.slots:
            return []
        pad = "    " * depth
        out = [pad + "// work-item 0's loop bounds and conditions, for the group (two banks: "
                     "c/barriers.py)",
               pad + f"{self.d.local_memory}{self.d.int64} _group_values[{BANKS}]"
                     f"[{len(self.slots)}];",
               pad + "int _group_bank = 0;"]
        out += [pad + f"{self.d.ctype(dtype)} {name} = 0;"
                for name, dtype in self.plan.runtime_values.items()]
        return out

    def blocks(self, blocks: list, depth: int) -> None:
        for b in blocks:
            if isinstance(b, Barrier):
                self.emit(self.d.barrier, depth)
            elif isinstance(b, Segment):
                self.segment(b, depth)
            else:
                self.group(b, depth)

    def segment(self, b: Segment, depth: int) -> None:
        if not b.stmts:
            return
        stmts, _ = eliminate_returns(b.stmts)
        if stmts != b.stmts or any(isinstance(n, ast.Return) for st in b.stmts
                                   for n in ast.walk(st)):
            # (continue leaves the do-while: the rest of the segment is skipped)
            self.emit("if (_valid) do {", depth)
            self.statements(stmts, depth + 1)
            self.emit("} while (0);", depth)
        else:
            self.emit("if (_valid) {", depth)
            self.statements(b.stmts, depth + 1)
            self.emit("}", depth)
        if b.evaluates:
            self.publish(b.evaluates, depth)

    def publish(self, names: list[str], depth: int) -> None:
        """Work-item 0's ``names`` into every work-item's own (see the module's docstring)."""
        self.emit(f"if ({self.local_id} == 0) {{", depth)
        for v in names:
            self.emit(f"_group_values[_group_bank][{self.slots.index(v)}] = {v};", depth + 1)
        self.emit("}", depth)
        self.emit(self.d.barrier, depth)
        for v in names:
            self.emit(f"{v} = _group_values[_group_bank][{self.slots.index(v)}];", depth)
        self.emit("_group_bank ^= 1;", depth)

    def group(self, b: GroupStmt, depth: int) -> None:
        s = b.stmt
        if isinstance(s, (ast.Assign, ast.AugAssign)):
            self.statement(s, depth)
            return
        values = list(b.values)       # this work-item's copies of work-item 0's values
        if isinstance(s, ast.For):
            if values:
                bounds = (["0"] + values + ["1"])[:3] if len(values) == 1 else \
                    (values + ["1"])[:3]
            else:
                bounds = self.range_bounds(s.iter.args)
            self.range_loop(s, tuple(bounds), depth)
            self.blocks(b.blocks[0], depth + 2)
            self.emit("}", depth + 1)
            self.emit("}", depth)
            return
        test = values[0] if values else bare(self.truth(s.test))
        self.emit(f"{'while' if isinstance(s, ast.While) else 'if'} ({test}) {{", depth)
        self.blocks(b.blocks[0], depth + 1)
        if len(b.blocks) > 1 and b.blocks[1]:
            self.emit("} else {", depth)
            self.blocks(b.blocks[1], depth + 1)
        self.emit("}", depth)
