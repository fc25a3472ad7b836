"""Per-thread copies instead of atomics: the part of the CPU kernel writer that starts, adds
into and merges the copies of the arrays ``passes.py`` chose (its ``private_sums``)."""

from __future__ import annotations

import ast

from tapegrad.backends.cpu.expressions import CPULowering
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Scalar

_MERGE_BLOCK = 4096     # at most this many elements per parallel task merging 1-D copies


class PrivateSums:
    """Mixed into the kernel writer (lower.py), which has ``out``, ``tk``, ``plan`` and
    ``known_private``."""

    # -- per-thread copies instead of atomics (passes.py decides which) -----------------
    def privatize_start(self) -> None:
        out = self.out
        if not self.plan.private_sums:
            return
        for a in self.plan.private_sums:
            # the launcher passes one zeroed copy per task when they pay (see _Launcher.pools),
            # else a single element: new memory on every launch would cost a page fault per 4 KiB
            out.emit(f"_private_{a} = {a}__pool.shape[0] == _nchunks and "
                     f"{a}__pool.size == _nchunks * {a}.size", 1)
            out.emit(f"{a}__priv = {a}__pool", 1)
        if self.plan.scaled:
            out.emit("_scaled = " + " and ".join(
                f"_private_{a} and {c.source}.shape == {a}.shape"
                for a, c in self.plan.scaled.items()), 1)

    def with_unit_scales(self, stmts: list[ast.stmt], ones: list[ast.Constant]
                         ) -> list[ast.stmt]:
        """``stmts`` with each scale of a per-thread sum (scaledsums.py) set to one (the new
        constants, typed for the time they are lowered, go into ``ones``)."""
        out = []
        for s in stmts:
            if any(s is c.assign for c in self.plan.scaled.values()):
                one = ast.Constant(value=1.0)
                self.tk.types[id(one)] = Scalar("float64")   # a literal: cast to the local's
                ones.append(one)
                s = ast.copy_location(ast.Assign(targets=s.targets, value=one), s)
            out.append(s)
        return out

    def privatize_merge(self) -> None:
        """Add the per-task copies into the arrays (and zero them for the next launch), the
        tasks' loop outside the last dimension's, so that the innermost loop runs along
        contiguous rows and LLVM vectorises it (with the tasks innermost it did not: 0.25-0.5
        ms of a 512^2 float32 matmul adjoint's 6)."""
        out = self.out
        for a, nd in self.plan.private_sums.items():
            out.emit(f"if _private_{a}:", 1)
            idx = ", ".join(f"_m{d}" for d in range(nd))
            last = f"_m{nd - 1}"
            if nd == 1:       # blocks of the one dimension are the parallel tasks
                out.emit(f"_mb = min({_MERGE_BLOCK}, max(1024, -(-{a}.shape[0] // _nchunks)))",
                         2)        # (at least one block per thread when there is work for it)
                out.emit(f"for _b in numba.prange(({a}.shape[0] + _mb - 1) // _mb):", 2)
                rows = f"range(_b * _mb, min({a}.shape[0], (_b + 1) * _mb))"
            else:
                out.emit(f"for _m0 in numba.prange({a}.shape[0]):", 2)
                for d in range(1, nd - 1):
                    out.emit(f"for _m{d} in range({a}.shape[{d}]):", 2 + d)
                rows = f"range({a}.shape[{nd - 1}])"
            inner = 2 + max(nd - 1, 1)     # inside the prange and the middle dimensions
            out.emit("for _t in range(_nchunks):", inner)
            out.emit(f"for {last} in {rows}:", inner + 1)
            term = f"{a}__priv[_t, {idx}]"
            if a in self.plan.scaled:
                # (an element no term went to stays as it was, also where its scale is inf
                # or nan: 0 * inf would be nan)
                out.emit(f"_p = {term}", inner + 2)
                term = f"({self.plan.scaled[a].source}[{idx}] * _p if _scaled and _p != 0 else _p)"
            out.emit(f"{a}[{idx}] += {term}", inner + 2)
            out.emit(f"{a}__priv[_t, {idx}] = 0", inner + 2)   # zero again for the next launch

    def special(self, s: ast.stmt, depth: int, low: CPULowering) -> bool:
        if isinstance(s, ast.Expr) and tg_name(s.value) in ("atomic_add", "atomic_sub") \
                and getattr(s.value.args[0], "id", None) in self.plan.private_sums:
            arr, idx, value = s.value.args
            a = arr.id
            index = low.index(idx)
            parts = index.elts if isinstance(index, ast.Tuple) else [index]
            target = f"{a}__priv[_c, {', '.join(ast.unparse(p) for p in parts)}]"
            op = "+=" if tg_name(s.value) == "atomic_add" else "-="
            element = Scalar(self.tk.types[id(arr)].dtype)
            add = f"{target} {op} {ast.unparse(low.coerce(value, element))}"
            known = self.known_private.get(a)      # (decided outside this loop: write_blocks)
            if known is not None:
                self.out.emit(add if known else ast.unparse(low.expr(s.value)), depth)
                return True
            self.out.emit(f"if _private_{a}:", depth)
            self.out.emit(add, depth + 1)
            self.out.emit("else:", depth)
            self.out.emit(ast.unparse(low.expr(s.value)), depth + 1)
            return True
        return self.special_group_sum(s, depth, low)
