"""The order of the AD passes: a kernel's IR to its adjoint's, and what the runtime asks of it.

Each pass is a module of ``tapegrad.ad`` (or the frontend's type inference); this module only
says in which order they run and what the result reads and writes.
"""

from __future__ import annotations

import ast
from typing import Any

from tapegrad.ad.access import array_access
from tapegrad.ad.adjoint import Adjoint
from tapegrad.ad.deadcode import has_effects, names_read
from tapegrad.ad.gather import split_gathers
from tapegrad.ad.localgather import gather_local_updates
from tapegrad.ad.normalize import normalize
from tapegrad.ad.reverse import reverse_kernel
from tapegrad.ad.sinkzeros import sink_zero_stores
from tapegrad.ad.tidy import tidy
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import Array, Type, specialize
from tapegrad.frontend.unassigned import zeroed_unassigned


def adjoint_ir(kernel: Any, argtypes: tuple[Type, ...], activity: tuple[str, ...], rank: int,
               groupsize: tuple[int, ...], stack_depth: int | None = None,
               discard: frozenset[str] = frozenset(), full_groups: bool = True,
               fuse: bool = True) -> Adjoint:
    """The adjoint of a kernel (``tapegrad.ad.Adjoint``, stencils split into gathers), not
    compiled: kernel IR -> normalized, typed -> adjoint IR.  ``full_groups``: the launch's
    ndrange is a multiple of the groupsize (local-memory updates may then gather); ``fuse``:
    the gathered sums add their products with ``tg.fma`` (the device has an FMA
    instruction)."""
    ir = kernel_ir(kernel)                                          # parse, check, resolve
    flat = normalize(ir, kernel_ir, keep=lambda f: f.reverse_rule is not None)  # inline...
    typed = specialize(flat, argtypes, rank, groupsize, kernel_ir)  # infer types
    typed = zeroed_unassigned(typed)                                # a read before x = ...: 0
    adjoint = reverse_kernel(typed, activity, stack_depth, discard)  # generate the adjoint
    if full_groups:                                                 # tiles: no atomics
        gathered = gather_local_updates(adjoint.ir, groupsize, fuse)
        if gathered is not adjoint.ir:
            adjoint.ir = gathered
            tidy(adjoint)                           # what the gathered loops read is dead
    if not adjoint.uses_status:                                     # stencils: no atomics
        adjoint.ir, adjoint.gathers = split_gathers(adjoint.ir, list(adjoint.shadow_of), rank)
    sink_zero_stores(adjoint.ir.body, set(adjoint.shadow_of))       # zeros after updates
    return adjoint


def adjoint_extra_types(kernel: Any, adjoint: Adjoint, argtypes: tuple[Type, ...]) -> list[Type]:
    params = kernel_ir(kernel).params
    extra = [argtypes[params.index(p)] for p in adjoint.shadow_of.values()]
    extra += [Array("float64", 1)] * len(adjoint.active_scalars)
    return extra + ([Array("int64", 1)] if adjoint.uses_status else [])


def contents_read(kernel: Any, adjoint: Adjoint, argtypes: tuple[Type, ...]) -> frozenset[str]:
    """Array parameters whose contents the adjoint's kernels read (every array it stores
    into is one of its scratch copies)."""
    params = kernel_ir(kernel).params
    arrays = {p for p, t in zip(params, argtypes) if isinstance(t, Array)}
    read = set(adjoint.scratch)
    for ir in [adjoint.ir] + [g.ir for g in adjoint.gathers]:
        read |= names_read(ast.Module(body=ir.body, type_ignores=[])) & arrays
    return frozenset(read)


def shadows_written(adjoint: Adjoint) -> frozenset[str]:
    """The shadow parameters the adjoint's kernels store into or add into."""
    written = {g.target for g in adjoint.gathers}
    if has_effects(adjoint.ir.body) or not adjoint.gathers:
        written |= array_access(adjoint.ir)[1]
    return frozenset(written & set(adjoint.shadow_of))
