"""Forward mode at run time: compile a kernel's tangent for a launch (cached) and launch it."""

from __future__ import annotations

from typing import Any

from tapegrad.ad import Tangent, normalize, tangent_kernel
from tapegrad.backends.structure import check_barrier_rules
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import Type, specialize
from tapegrad.frontend.unassigned import zeroed_unassigned
from tapegrad.runtime.arguments import arg_key, check_args, groupsize_of, write_only
from tapegrad.runtime.nans import NANS, checked, forward_what
from tapegrad.runtime.show import show


def compile_tangent(kernel: Any, backend: Any, argtypes: tuple[Type, ...],
                    activity: tuple[str, ...], rank: int, groupsize: tuple[int, ...],
                    width: int) -> tuple[Any, Any]:
    """The forward-mode pipeline: kernel IR -> normalized, typed -> tangent IR -> compiled."""
    tangent = tangent_ir(kernel, argtypes, activity, rank, groupsize, width)
    ir = kernel_ir(kernel)
    extra = [argtypes[ir.params.index(p)] for p, _ in tangent.tangent_params]
    typed_tangent = specialize(tangent.ir, argtypes + tuple(extra), rank, groupsize, kernel_ir)
    return tangent, backend.compile(typed_tangent)


def tangent_ir(kernel: Any, argtypes: tuple[Type, ...], activity: tuple[str, ...], rank: int,
               groupsize: tuple[int, ...], width: int) -> Tangent:
    """The tangent kernel's IR (kernel IR -> normalized, typed -> tangent), not compiled."""
    ir = kernel_ir(kernel)
    check_barrier_rules(specialize(ir, argtypes, rank, groupsize, kernel_ir))
    flat = normalize(ir, kernel_ir, keep=lambda f: f.forward_rule is not None)
    typed = zeroed_unassigned(specialize(flat, argtypes, rank, groupsize, kernel_ir))
    return tangent_kernel(typed, activity, width)


def tangent_variant(cfg: Any, values: tuple, activity: tuple[str, ...], rank: int) -> Any:
    """The tangent of ``cfg``'s kernel for these arguments as a kernel of its own, configured
    like ``cfg``: launched on ``(*values, *tangents)`` (one tangent per ``dup``/``active``
    parameter, in order), a tape records it and differentiates it like any kernel, which is
    how ``tg.hvp`` differentiates a forward-mode run (reverse over forward).  Cached."""
    kernel, backend = cfg.kernel, cfg.backend
    wgs = groupsize_of(cfg, rank)
    key = ("tangent kernel", backend, arg_key(values), activity, rank, wgs)
    variant = kernel.cache.get(key)
    if variant is None:
        argtypes = check_args(kernel, backend, values)
        tangent = tangent_ir(kernel, argtypes, activity, rank, wgs, 1)
        variant = type(kernel)(kernel.pyfunc)
        variant.cache["ir"] = tangent.ir
        variant.tangent_of = kernel
        # (tg.debug_nans names its launches as forward mode's launches of ``kernel``, "the
        # tangent of B", not by its IR's names)
        variant.reported_as = forward_what(kernel.name, kernel_ir(kernel).params,
                                           tangent.tangent_params, 1)
        kernel.cache[key] = variant
    return variant(backend, cfg.workgroupsize)


def run_tangent(cfg: Any, values: tuple, tangents: dict[str, tuple], activity: tuple[str, ...],
                nd: tuple[int, ...]) -> tuple[Any, Any]:
    """One launch computing the kernel's outputs and their tangents in ``width`` directions;
    returns the compiled tangent it ran (``launch_tangent`` runs it again).

    ``tangents[p]`` holds one tangent per direction for every ``dup``/``active`` parameter:
    arrays (read for inputs, written for outputs) or floats (for scalars).
    """
    kernel, backend = cfg.kernel, cfg.backend
    params = kernel_ir(kernel).params
    width = max((len(t) for t in tangents.values()), default=1)
    wgs = groupsize_of(cfg, len(nd))
    plain = tuple(values) + tuple(t for p in params for t in tangents.get(p, ()))
    key = ("forward", backend, arg_key(plain), activity, len(nd), wgs, width)
    entry = kernel.cache.get(key)
    if entry is None:
        argtypes = check_args(kernel, backend, values)
        entry = compile_tangent(kernel, backend, argtypes, activity, len(nd), wgs, width)
        kernel.cache[key] = entry
    launch_tangent(cfg, entry, values, tangents, nd)
    return entry


def launch_tangent(cfg: Any, entry: tuple[Any, Any], values: tuple, tangents: dict[str, tuple],
                   nd: tuple[int, ...]) -> None:
    """Launch a compiled tangent (``run_tangent``'s) on ``values`` and ``tangents``."""
    kernel, backend = cfg.kernel, cfg.backend
    tangent, launcher = entry
    show(kernel, "forward", backend, launcher, lambda: tangent.ir)
    args = list(values) + [tangents[p][j] for p, j in tangent.tangent_params]
    if 0 not in nd:
        if NANS.on:
            params = kernel_ir(kernel).params
            width = max((len(t) for t in tangents.values()), default=1)
            what, names = forward_what(kernel.name, params, tangent.tangent_params, width)
            only = write_only(kernel)       # (its outputs, and their tangents)
            positions = only | frozenset(len(params) + j for j, (p, _)
                                         in enumerate(tangent.tangent_params)
                                         if params.index(p) in only)
            checked(lambda: launcher(tuple(args), nd), args, names, what,
                    write_only=positions)
            return
        launcher(tuple(args), nd)
