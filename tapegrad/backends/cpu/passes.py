"""The CPU backend's optimisation passes, in the order they run, and the plan they make.

Each pass analyses the typed kernel and decides something the writer (``lower.py``) then
reads from one frozen ``Plan``; the rules that keep passes apart are stated once, in
``plan``.  Any pass can be switched off by name, for debugging or to compare with and
without it: ``tg.CPU(without=("bands",))`` (the backend is part of every compiled kernel's
key, so kernels compile again for it).  What the passes did for a kernel is printed by
``kern.passes(backend)`` after a launch, and at the top of its generated code.

>>> from tapegrad.backends.cpu import passes
>>> [p.name for p in passes.PASSES][:3]
['transposed', 'rows', 'phases']
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType

from tapegrad.backends.cpu.jam import JAM
from tapegrad.backends.cpu.phases import merged_phases
from tapegrad.backends.cpu.scaledsums import ScaledSum, scaled_sums
from tapegrad.backends.cpu.transposed import derived_params
from tapegrad.backends.cpu.versioning import plan_versions
from tapegrad.backends.structure import contains_barrier, memory_decl
from tapegrad.errors import BackendError
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, Scalar, TypedKernel


@dataclass(frozen=True)
class Pass:
    """A pass: its name, what it does, and the passes it builds on (off when they are)."""

    name: str
    does: str
    needs: tuple[str, ...] = ()


PASSES = (
    Pass("transposed", "an adjoint's tiles that would be read down the columns of an array "
                       "are read along the rows of a transposed copy (transposed.py)"),
    Pass("rows", "a kernel that cannot tell its workgroups apart runs large launches in "
                 "longer rows of the CPU's choosing (rows.py)"),
    Pass("phases", "barriers that order nothing when one thread runs the whole group are "
                   "dropped (phases.py)"),
    Pass("private_sums", "arrays only added to with atomics get per-thread copies, merged "
                         "after the launch, when they pay"),
    Pass("bands", "a tiled 2-D kernel that adds into per-thread copies walks its groups in "
                  "bands of rows, so tiles are reused while in cache", ("private_sums",)),
    Pass("scaled_sums", "a per-thread sum's terms scaled by the value at the element they "
                        "add to are added unscaled and scaled in the merge (scaledsums.py)",
         ("private_sums",)),
    Pass("versioning", "the work-item loop's first test is decided once per group, or its "
                       "rows are split where index-range tests all hold (versioning.py)"),
    Pass("edge_columns", "a 2-D stencil's few edge columns run column by column after the "
                         "groups, where their tests are uniform", ("versioning",)),
    Pass("jam", "a float32 2-D kernel's full groups run four rows of work-items at a time "
                "where their values go through loops of known length, and copy inputs into "
                "small local-memory tiles on the stack a vector per row (jam.py)"),
    Pass("outline", "each parallel task's body is a function of its own, so that Numba's "
                    "parallel lowering sees a small loop (outline.py)"),
)
NAMES = tuple(p.name for p in PASSES)


def switched_off(names: Iterable[str]) -> frozenset[str]:
    """The pass names given to ``tg.CPU(without=...)``, checked; with each pass that needs
    one of them."""
    off = set(names)
    unknown = sorted(off - set(NAMES))
    if unknown:
        raise BackendError(f"tg.CPU(without=...): no CPU pass named {', '.join(unknown)}; "
                           f"the passes are {', '.join(NAMES)}")
    for p in PASSES:                               # (in order: needs come first)
        if any(n in off for n in p.needs):
            off.add(p.name)
    return frozenset(off)


@dataclass(frozen=True)
class Plan:
    """What the passes decided for one typed kernel, read by the writer."""

    body: tuple[ast.stmt, ...]                 # the kernel body, after ``phases``
    private_sums: Mapping[str, int]            # array -> ndim, added into per-thread copies
    banded: bool
    scaled: Mapping[str, ScaledSum]
    versioning: bool
    edge_columns: bool
    jam: bool
    outline: bool
    notes: tuple[tuple[str, str], ...]         # (pass, what it did here, or why not)

    def describe(self) -> str:
        """One line per pass: what it did for this kernel."""
        width = max(len(n) for n in NAMES)
        return "\n".join(f"{name.ljust(width)}  {what}" for name, what in self.notes)


def bounds_checked() -> bool:
    """``TAPEGRAD_BOUNDSCHECK=1``: kernels check their indices and run on one thread."""
    return os.environ.get("TAPEGRAD_BOUNDSCHECK") == "1"


def plan(tk: TypedKernel, off: frozenset[str] = frozenset()) -> Plan:
    """Run the passes that decide how ``tk`` is written (transposed and rows ran before, on
    the kernel's IR and groupsize; their notes say what they did)."""
    ir = tk.ir
    notes: list[tuple[str, str]] = []

    def note(name: str, what: str) -> None:
        notes.append((name, "off (switched off)" if name in off else what))

    derived = derived_params(ir.params)
    note("transposed", f"reads {', '.join(derived)}" if derived else "nothing to do")
    note("rows", f"this variant runs in rows of {tk.groupsize} (launched with "
                 f"{tk.launch_groupsize})" if tk.launch_groupsize else
         "in the launch's workgroups")

    body = ir.body if "phases" in off else _without_needless_barriers(tk)
    had = _barriers(ir.body)
    note("phases", f"{had - _barriers(body)} of {had} barrier(s) dropped" if had else
         "no barriers")
    barriers = any(contains_barrier(s) for s in body)

    debug = bounds_checked()
    private = {} if debug or "private_sums" in off else _private_sums(tk, body)
    note("private_sums", "off: bounds checks run on one thread" if debug else
         f"{', '.join(private)}" if private else "no array only added to with atomics")

    local = any(memory_decl(s) == "localmem" for s in ir.body)
    # without per-thread copies, bands gain nothing and lose right after a gradient (a tiled
    # product's primal; CHANGELOG.md, 'the figures that moved')
    banded = "bands" not in off and tk.rank == 2 and bool(private) and local
    note("bands", "groups in bands of rows" if banded else
         "needs a 2-D kernel with local memory adding into per-thread copies")

    arrays = {p for p, t in zip(ir.params, tk.argtypes) if isinstance(t, Array)}
    scaled = {} if had or "scaled_sums" in off else scaled_sums(ir, private, arrays)
    note("scaled_sums", ", ".join(f"{a} scaled by {c.source}" for a, c in scaled.items())
         if scaled else "not with barriers" if had else "no sum scaled by its element")

    versioning = "versioning" not in off
    note("versioning", _versioning_note(tk, body) if not barriers else "not with barriers")
    group_sums = any(isinstance(n, ast.Expr) and tg_name(n.value) == "group_reduce_add"
                     for s in body for n in ast.walk(s))
    # (the scaled loop and the group sums' loops have no room for a pass after the groups)
    edge_columns = (versioning and "edge_columns" not in off and tk.rank == 2
                    and not barriers and not group_sums and not banded and not scaled)
    note("edge_columns", "2-D stencils split by index ranges" if edge_columns else
         "needs a 2-D kernel without barriers, group sums, bands or scaled sums")

    # (float64 rows, two vectors each, ran slower jammed: jam.py)
    jam = ("jam" not in off and tk.rank == 2 and tk.groupsize[0] % JAM == 0
           and tk.groupsize[1] >= 8 and _float32_only(tk))
    note("jam", f"full groups' rows in fours where a loop's values allow (if _lim0 == "
                f"{tk.groupsize[0]} ...), small local-memory tiles on the stack" if jam else
         "needs a float32 2-D kernel whose groups have rows in fours")

    outline = "outline" not in off and not debug
    note("outline", "the task's body is its own function" if outline else
         "off: bounds checks" if debug else "off")
    return Plan(body=tuple(body), private_sums=MappingProxyType(private), banded=banded,
                scaled=MappingProxyType(scaled), versioning=versioning,
                edge_columns=edge_columns, jam=jam, outline=outline, notes=tuple(notes))


def _float32_only(tk: TypedKernel) -> bool:
    """Whether ``tk`` computes in float32 and in no float64 (its literals aside)."""
    types = [*tk.argtypes, *tk.locals.values()]
    return any(getattr(t, "dtype", None) == "float32" for t in types) and not any(
        getattr(t, "dtype", None) == "float64" and not getattr(t, "weak", False)
        for t in types)


def _barriers(body: list[ast.stmt]) -> int:
    return sum(isinstance(n, ast.Expr) and tg_name(n.value) == "synchronize"
               for s in body for n in ast.walk(s))


def is_integral(tk: TypedKernel, e: ast.expr) -> bool:
    """Whether ``e`` is an integer (a range test's bounds must be: versioning.py)."""
    t = tk.types.get(id(e))
    return isinstance(t, Scalar) and not t.is_float and t.dtype != "bool"


def _versioning_note(tk: TypedKernel, body: list[ast.stmt]) -> str:
    """What versioning does to the work-item loop (the writer plans it again for each loop
    it writes: the scaled sums' loop is a copy with other nodes)."""
    stmts = [s for s in body if not memory_decl(s)]
    versions = plan_versions(stmts, tk.ir.params, tk.rank, partial(is_integral, tk))
    if versions is None:
        return "no leading test to decide per group"
    if versions.uniform is not None:
        return f"`if {ast.unparse(versions.uniform)}` decided once per group"
    return f"rows split where {len(versions.ranges)} index-range test(s) hold"


def _without_needless_barriers(tk: TypedKernel) -> list[ast.stmt]:
    """The body without barriers that order nothing when one thread runs the group."""
    ir, body = tk.ir, tk.ir.body
    if not any(contains_barrier(s) for s in body):
        return body
    shared = {s.targets[0].id for s in body if memory_decl(s) == "localmem"}
    declared = {s.targets[0].id for s in body if memory_decl(s)}   # (private: per item)
    params = {p for p, t in zip(ir.params, tk.argtypes) if isinstance(t, Array)}
    aliases = {n for n, t in tk.locals.items()      # (tuples of arrays are refused)
               if isinstance(t, Array) and n not in declared}
    return merged_phases(body, params | shared, aliases)


def _private_sums(tk: TypedKernel, body: list[ast.stmt]) -> dict[str, int]:
    """Argument arrays that the kernel updates only with atomic_add/atomic_sub statements
    (their old values unused) and never reads or writes otherwise: each thread can add into a
    private copy, merged after the launch, instead of contending on atomics.  Whether it pays
    is decided at run time (copies cost threads x size).  Any other use of the array's name
    rules it out, also one that does not index it (``f(Y)``)."""
    candidates: dict[str, int] = {}
    harmless: set[int] = set()     # name nodes that add to the array or read its shape
    tree = ast.Module(body=list(body), type_ignores=[])
    statements = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                  and tg_name(n.value) in ("atomic_add", "atomic_sub", "group_reduce_add")}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and id(n) in statements and isinstance(n.args[0], ast.Name):
            t = tk.types.get(id(n.args[0]))
            harmless.add(id(n.args[0]))
            if tg_name(n) != "group_reduce_add" and isinstance(t, Array) \
                    and t.space == "global" and t.dtype != "bool":
                candidates[n.args[0].id] = t.ndim
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            harmless.add(id(n.value))          # X.shape, X.size
    spoiled = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in harmless}
    return {a: nd for a, nd in candidates.items() if a not in spoiled}
