"""Reverse mode at run time: compile a kernel's adjoint for a launch's arguments (cached) and
launch it once, growing its stack when a launch needed more."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from tapegrad.ad.deadcode import has_effects
from tapegrad.ad.pipeline import adjoint_extra_types, adjoint_ir, contents_read, shadows_written
from tapegrad.ad.storefresh import storable_shadows
from tapegrad.backends.structure import check_barrier_rules
from tapegrad.errors import AdjointStackOverflow, LaunchError
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import INT64, Type, specialize
from tapegrad.runtime.adjoint_parts import (
    Gather,
    GathersThenRest,
    StoringVariants,
    adjoint_names,
    check_kept,
    fresh_plan,
    launch_adjoint,
    stored_at,
    storing_into,
)
from tapegrad.runtime.arguments import access, arg_key, check_args, groupsize_of
from tapegrad.runtime.nans import NANS, adjoint_what, checked
from tapegrad.runtime.show import show


@dataclasses.dataclass(slots=True)
class CompiledAdjoint:
    """A kernel's adjoint (``tapegrad.ad.Adjoint``) compiled for a launch's argument types,
    with what the runtime builds for it: its launcher, its variants that store into shadows
    holding no values yet (``tapegrad.ad.storefresh``), and how each set of such shadows is
    treated (``fresh_plan``, cached)."""

    adjoint: Any
    launcher: Any
    storing: StoringVariants | None = None
    fresh_plans: dict = dataclasses.field(default_factory=dict)
    retired: bool = False         # compiled again with a deeper stack (see run_adjoint)


def compile_adjoint(kernel: Any, backend: Any, argtypes: tuple[Type, ...],
                    activity: tuple[str, ...], rank: int, groupsize: tuple[int, ...],
                    stack_depth: int | None, discard: frozenset[str] = frozenset(),
                    full_groups: bool = True) -> CompiledAdjoint:
    """The reverse-mode pipeline: kernel IR -> normalized, typed -> adjoint IR -> compiled."""
    check_barrier_rules(specialize(kernel_ir(kernel), argtypes, rank, groupsize, kernel_ir))
    adjoint = adjoint_ir(kernel, argtypes, activity, rank, groupsize, stack_depth, discard,
                         full_groups, backend.fast_fma)
    adjoint.contents_read = contents_read(kernel, adjoint, argtypes)
    adjoint.shadows_written = shadows_written(adjoint)
    full = argtypes + tuple(adjoint_extra_types(kernel, adjoint, argtypes))
    main = full               # the main kernel's argument types (the gathers' are ``full``)
    if full_groups:   # (after contents_read: what the backend derives reads its sources)
        adjoint.ir, main = backend.tune_adjoint(adjoint.ir, full, groupsize)
    typed_adjoint = specialize(adjoint.ir, main, rank, groupsize, kernel_ir)
    storing = None
    if adjoint.gathers and not has_effects(adjoint.ir.body):
        launcher = None                  # the gathers did everything (a tape's stencils)
    else:
        launcher = backend.compile(typed_adjoint)                   # lower, cache, compile
        storable = storable_shadows(adjoint.ir, list(adjoint.shadow_of), rank)
        if storable:
            storing = StoringVariants(adjoint.ir, storable, main, rank, groupsize, backend)
    if adjoint.gathers:
        gathers = []
        for g in adjoint.gathers:
            at = adjoint.ir.params.index(g.target)
            both = [specialize(v, full + (INT64,) * rank, rank, groupsize, kernel_ir)
                    for v in (g.ir, g.fresh_ir)]
            gathers.append(Gather(at, backend.compile(both[0]), backend, both[1]))
        launcher = GathersThenRest(gathers, launcher)
    return CompiledAdjoint(adjoint, launcher, storing)


def adjoint_of(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...],
               discard: frozenset[str] = frozenset()) -> tuple[CompiledAdjoint, tuple]:
    """The compiled adjoint of a configured kernel for these arguments (cached), and the key
    it is cached under."""
    kernel, backend = cfg.kernel, cfg.backend
    wgs = groupsize_of(cfg, len(nd))
    full = all(n % w == 0 for n, w in zip(nd, wgs))
    key = ("reverse", backend, arg_key(values), activity, len(nd), wgs, discard, full)
    entry = kernel.cache.get(key)
    if entry is None:
        argtypes = check_args(kernel, backend, values)
        depth = kernel.cache.get(("stack depth", key))
        entry = compile_adjoint(kernel, backend, argtypes, activity, len(nd), wgs, depth,
                                discard, full)
        kernel.cache[key] = entry
    return _shown(kernel, backend, entry, key)


def adjoint_again(kernel: Any, backend: Any, found: tuple) -> tuple | None:
    """What ``adjoint_of`` returned as ``found`` earlier, as it would return it now: the
    adjoint compiled again with a deeper stack where that happened since (None where that
    one is not compiled yet)."""
    entry, key = found
    if entry.retired:
        entry = kernel.cache.get(key)
        if entry is None:
            return None
    return _shown(kernel, backend, entry, key)


def _shown(kernel: Any, backend: Any, entry: CompiledAdjoint, key: tuple
           ) -> tuple[CompiledAdjoint, tuple]:
    adjoint = entry.adjoint
    show(kernel, "reverse", backend, entry.launcher,
         lambda: [g.ir for g in adjoint.gathers] + [adjoint.ir])
    return entry, key


def values_read(kernel: Any, backend: Any, args: tuple, activity: tuple[str, ...],
                nd: tuple[int, ...], wgs: tuple[int, ...]) -> frozenset[str]:
    """The array parameters whose contents the adjoint for ``activity`` reads (a linear
    kernel's adjoint reads none of its inputs: only their shapes); cached."""
    key = ("values read", backend, arg_key(args), activity, len(nd), wgs)
    found = kernel.cache.get(key)
    if found is None:
        argtypes = check_args(kernel, backend, args)
        adjoint = adjoint_ir(kernel, argtypes, activity, len(nd), wgs)
        found = kernel.cache[key] = contents_read(kernel, adjoint, argtypes)
    return found


def run_adjoint(cfg: Any, values: tuple, shadows: dict[str, Any], activity: tuple[str, ...],
                nd: tuple[int, ...], discard: frozenset[str] = frozenset(),
                fresh: frozenset[str] = frozenset(), kept: frozenset[str] | None = None,
                found: tuple | None = None) -> dict[str, float]:
    """Launch the adjoint of ``cfg`` once; return the derivatives of its Active scalars.

    ``values`` are the arguments as the primal launch saw them (arrays it overwrote as copies
    of their old contents); ``shadows`` maps each Duplicated parameter to its shadow, which
    the adjoint adds into (and consumes where the kernel overwrote).  When a kernel's loops
    need a deeper per-work-item stack than it was compiled with, the partial result is
    undone, the adjoint is recompiled with the depth the launch reported, and run again.

    For a tape's sweep: the shadows of the ``discard`` parameters are not read afterwards
    (consumed elements need not be zeroed), those of the ``fresh`` parameters hold no values
    yet (the kernel that updates them stores instead of adding where it can, see
    ``tapegrad.ad.storefresh`` and ``tapegrad.ad.gather``; any other is zeroed first), and only the
    parameters in ``kept`` hold their real contents (a check: the tape kept what the
    adjoint reads).  ``found``: what ``adjoint_of`` returned for these arguments, if the
    caller asked already.
    """
    kernel, backend = cfg.kernel, cfg.backend
    merges: list[tuple[Any, Any]] = []
    if len({id(d) for d in shadows.values()}) < len(shadows):
        assert found is None, "shadows that alias are separated before the adjoint is chosen"
        shadows, discard, fresh, merges = _separate_aliased(kernel, backend, shadows, discard,
                                                            fresh)
    scalars = _run_adjoint(cfg, values, shadows, activity, nd, discard, fresh, kept, found)
    for array, part in merges:
        array += part
    return scalars


def _separate_aliased(kernel: Any, backend: Any, shadows: dict[str, Any],
                      discard: frozenset[str], fresh: frozenset[str]
                      ) -> tuple[dict[str, Any], frozenset[str], frozenset[str], list]:
    """One shadow array given for several different arrays the kernel only reads (their
    gradients summed into it; one array passed for several parameters is merged into one
    parameter before this, see ``one_parameter_per_array``).  Compiled kernels must not see
    it twice: Numba takes distinct array arguments of a parallel loop to be distinct memory,
    and one parameter's update would be lost.  The first keeps the array, each other gets
    zeros of its own, added in after the launch.  Returns the shadows, ``discard`` and
    ``fresh`` without the shared arrays (zeroed first if they held no values), and the
    (array, part) pairs to add."""
    written = access(kernel)[1]
    sharing: dict[int, list[str]] = {}
    for p, d in shadows.items():
        sharing.setdefault(id(d), []).append(p)
    shadows, merges = dict(shadows), []
    for group in sharing.values():
        if len(group) == 1:
            continue
        if any(p in written for p in group):
            raise LaunchError(f"{kernel.name}: one shadow array is given for {', '.join(group)}, "
                              "and the kernel writes one of them: its shadow is a seed the "
                              "adjoint consumes, not a gradient to add to; give each array its "
                              "own shadow")
        array = shadows[group[0]]
        if any(p in fresh for p in group):
            array[...] = 0
        for p in group[1:]:
            shadows[p] = backend.zeros(array.dtype, array.shape)
            merges.append((array, shadows[p]))
        discard, fresh = discard - set(group), fresh - set(group)
    return shadows, discard, fresh, merges


def _run_adjoint(cfg: Any, values: tuple, shadows: dict[str, Any], activity: tuple[str, ...],
                 nd: tuple[int, ...], discard: frozenset[str], fresh: frozenset[str],
                 kept: frozenset[str] | None, found: tuple | None) -> dict[str, float]:
    """``run_adjoint`` once no two shadows are the same array."""
    kernel, backend = cfg.kernel, cfg.backend
    params = kernel_ir(kernel).params
    compiled, key = found or adjoint_of(cfg, values, activity, nd, discard)
    adjoint, launcher = compiled.adjoint, compiled.launcher
    check_kept(kernel, adjoint, kept)
    fresh_at: frozenset[int] = frozenset()
    stored: frozenset[str] = frozenset()
    if fresh:
        covered = frozenset(p for p in fresh if tuple(shadows[p].shape) == nd)
        plan = compiled.fresh_plans.get((fresh, covered))
        if plan is None:
            plan = compiled.fresh_plans[fresh, covered] = fresh_plan(
                compiled, len(params), fresh, covered)
        launcher, fresh_at, stored, zeroed = plan
        for p in zeroed:
            shadows[p][...] = 0
    if not (adjoint.uses_status or adjoint.scratch or adjoint.active_scalars):
        # the common case (no stack, no copies, no scalar outputs): one launch
        args = tuple(values) + tuple(shadows[p] for p in adjoint.shadow_of.values())
        _launch(kernel, adjoint, launcher, args, nd, fresh_at, stored)
        return {}
    backup: dict[str, Any] = {}
    if adjoint.uses_status:   # to undo a launch whose stack overflowed: what it changes
        written = {p for sh, p in adjoint.shadow_of.items() if sh in adjoint.shadows_written}
        backup = {p: d.copy() for p, d in shadows.items() if p in written and p not in fresh}
    for attempt in range(2):
        args = [v.copy() if p in adjoint.scratch else v for p, v in zip(params, values)]
        args += [shadows[p] for p in adjoint.shadow_of.values()]
        outs = [backend.zeros(np.float64, backend.scalar_sum_size)
                for _ in adjoint.active_scalars]
        args += outs
        status = backend.zeros(np.int64, 1) if adjoint.uses_status else None
        if status is not None:
            args.append(status)
        _launch(kernel, adjoint, launcher, tuple(args), nd, fresh_at, stored)
        needed = int(backend.to_numpy(status)[0]) if status is not None else 0
        if needed == 0:
            return {p: float(backend.to_numpy(o).sum())
                    for p, o in zip(adjoint.active_scalars, outs)}
        if attempt == 1:
            raise AdjointStackOverflow(
                f"the adjoint of {kernel.name} needed a stack of {needed} entries per work-item "
                f"even after growing to {adjoint.stack_depth}; this is a tapegrad bug, please "
                "report it with the kernel")
        for p, d in shadows.items():   # undo the partial accumulation, grow the stack, redo
            if p in backup:
                d[...] = backup[p]
            elif p in fresh:           # held no values: zeros again (or stored into again)
                d[...] = 0
        depth = 1 << max(needed - 1, 1).bit_length()
        kernel.cache[("stack depth", key)] = depth
        compiled.retired = True
        del kernel.cache[key]
        compiled, key = adjoint_of(cfg, values, activity, nd, discard)
        adjoint, launcher = compiled.adjoint, compiled.launcher
        if stored:
            launcher = storing_into(compiled, stored)
    raise AssertionError("unreachable")


def _launch(kernel: Any, adjoint: Any, launcher: Any, args: tuple, nd: tuple[int, ...],
            fresh_at: frozenset[int], stored: frozenset[str]) -> None:
    """``launch_adjoint``, checked under ``tg.debug_nans`` (runtime/nans.py); ``stored``: the
    adjoint's shadows it stores into (holding no values yet, as those at ``fresh_at``)."""
    if NANS.on and 0 not in nd:
        names = adjoint_names(kernel, tuple(adjoint.shadow_of.values()),
                              tuple(adjoint.active_scalars))
        checked(lambda: launch_adjoint(launcher, args, nd, fresh_at), args, names,
                adjoint_what(kernel.name),
                write_only=fresh_at | stored_at(adjoint, stored, len(kernel_ir(kernel).params)))
    else:
        launch_adjoint(launcher, args, nd, fresh_at)


def overwritten_inputs(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...],
                       found: tuple | None = None) -> list[str]:
    """Parameters the kernel overwrites whose pre-launch contents the adjoint reads (the
    adjoint's scratch copies, and arrays it only reads once dead code is gone: a replayed
    load of an array whose final store the adjoint no longer redoes); ``found``: what
    ``adjoint_of`` returned for these arguments, if the caller asked already."""
    adjoint = (found or adjoint_of(cfg, values, activity, nd))[0].adjoint
    return sorted(adjoint.contents_read & access(cfg.kernel)[1])
