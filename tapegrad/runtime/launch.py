"""Launching kernels: find or build a launch's compiled code and run it.

``compile_kernel`` is the primal pipeline in one place: frontend, types, backend.  ``launch``
is the hot path: one dictionary look-up when the kernel was already compiled for these
argument types, launch shape and workgroup size.
"""

from __future__ import annotations

import ast
import dataclasses
from contextvars import ContextVar
from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import Type, specialize
from tapegrad.runtime.arguments import (
    arg_key,
    check_args,
    check_writable,
    groupsize_of,
    ndrange_of,
    write_only,
)
from tapegrad.runtime.bounds import launch_check
from tapegrad.runtime.nans import NANS, checked, collector
from tapegrad.runtime.plans import make_plan
from tapegrad.runtime.show import show
from tapegrad.runtime.workitem import statement


def compile_kernel(kernel: Any, mode: str, backend: Any, argtypes: tuple[Type, ...],
                   rank: int, groupsize: tuple[int, ...]) -> Any:
    """The pipeline: source -> kernel IR -> typed kernel -> compiled launcher."""
    ir = kernel_ir(kernel)                                          # parse, check, resolve
    typed = specialize(ir, argtypes, rank, groupsize, kernel_ir)    # infer types
    return backend.compile(typed)                                   # lower, cache, compile


# While a tape records or forward mode runs, it sees every launch first: a function of
# ``(cfg, args, ndrange)`` set by tapegrad.tape, per thread (and per asyncio task), so that
# two threads each recording their own tape never see each other's launches.  It gets the
# arguments as passed, one object perhaps for several parameters: a tape's recording merges
# them after its launch plans' guards (which refuse repeats) miss; other interceptors are
# set wrapped in ``merging``.
interceptor: ContextVar[Any] = ContextVar("tapegrad_interceptor", default=None)


_intercepting = interceptor.get

# While a tape records in some thread, a function of ``(cfg, args)`` that sees the launches
# no tape records (another thread's, whose results that tape would take for constants:
# tapegrad/tape/threads.py); None while none records, the launches' usual case.
elsewhere: list[Any] = [None]


def launch(cfg: Any, args: tuple, ndrange: Any) -> None:
    """Run a configured kernel ``cfg`` on ``args`` over ``ndrange`` (recorded on a tape if one
    is recording)."""
    seen_by = _intercepting()
    if seen_by is None:
        noting = elsewhere[0]        # (read once: the last tape may stop meanwhile)
        if noting is not None:
            noting(cfg, args)
    if NANS.slow:          # (tg.debug_nans, check_tape: the general path, watched)
        watcher = collector()
        if watcher is not None:
            watcher.launch(cfg, args, ndrange)
    elif seen_by is None:
        for plan in cfg.kernel.cache.get(("plans", cfg), ()):     # (plans.py)
            if plan.fn(args, ndrange):
                return
    if seen_by is not None:
        seen_by(cfg, args, ndrange)
        return
    launch_now(*distinct(cfg, args), ndrange)


def distinct(cfg: Any, args: tuple) -> tuple[Any, tuple]:
    """``cfg`` and ``args``, with the parameters an array object is passed for more than
    once merged (``one_parameter_per_array``; rare)."""
    if len({id(a) for a in args}) < len(args):
        cfg, args, _ = one_parameter_per_array(cfg, args, args)
    return cfg, args


def merging(intercept: Any) -> Any:
    """The launch interceptor ``intercept`` given each array once (``distinct``)."""
    def merged(cfg: Any, args: tuple, ndrange: Any) -> None:
        intercept(*distinct(cfg, args), ndrange)
    return merged


def one_parameter_per_array(cfg: Any, args: tuple, arrays: tuple
                            ) -> tuple[Any, tuple, list[int]]:
    """A launch that passes one array object for several parameters (``arrays[k]`` is the
    array, if any, behind ``args[k]``) runs the kernel with those parameters merged into the
    first: ``kern(Z, a, X, Y)`` launched on ``(z, 0.5, z, y)`` runs ``Z[i] = a * Z[i] + Y[i]``.
    That is what one array means, and the only way to get it compiled: Numba takes distinct
    array arguments of a parallel loop to be distinct memory, so a store through one
    parameter would not be seen by a load through another (and an adjoint would lose
    updates).  Differentiating the merged kernel is differentiating an in-place kernel.
    Returns the configured kernel to launch, its arguments, and their positions in ``args``."""
    kernel = cfg.kernel
    params = kernel_ir(kernel).params
    if len(args) != len(params):
        return cfg, args, list(range(len(args)))   # the launch reports the wrong count
    first: dict[int, int] = {}
    merged: dict[str, str] = {}
    kept = []
    for pos, a in enumerate(arrays):
        if kind_of(a) is not None:
            at = first.setdefault(id(a), pos)
            if at != pos:
                merged[params[pos]] = params[at]
                continue
        kept.append(pos)
    if not merged:
        return cfg, args, kept
    key = ("merged", tuple(sorted(merged.items())))
    variant = kernel.cache.get(key)
    if variant is None:
        variant = kernel.cache[key] = _merged_kernel(kernel, merged)
    return variant(cfg.backend, cfg.workgroupsize), tuple(args[pos] for pos in kept), kept


def _merged_kernel(kernel: Any, merged: dict[str, str]) -> Any:
    """``kernel`` with each parameter in ``merged`` replaced by the one it maps to."""
    import copy

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.copy_location(ast.Name(id=merged[node.id], ctx=node.ctx), node) \
                if node.id in merged else node

    ir = kernel_ir(kernel)
    body = [Rename().visit(st) for st in copy.deepcopy(ir.body)]
    variant = type(kernel)(kernel.pyfunc)
    variant.cache["ir"] = dataclasses.replace(
        ir, params=[p for p in ir.params if p not in merged], body=body)
    variant.merged_from = kernel
    return variant


def launch_now(cfg: Any, args: tuple, ndrange: Any) -> None:
    """Run a configured kernel now, unrecorded; its next launches on arguments of the same
    types run by a plan (``plans.py``)."""
    launcher, nd, key = prepare(cfg, args, ndrange)
    if 0 not in nd:
        if NANS.on:
            checking_primal(cfg, launcher)(args, nd)
            return
        launcher(args, nd)
        make_plan(cfg, args, nd, key, launcher, cfg.kernel.cache[key][1])


def checking_primal(cfg: Any, launcher: Any) -> Any:
    """``launcher`` checked for new NaNs and infinities (tg.debug_nans, nans.py)."""
    kernel = cfg.kernel
    params = kernel_ir(kernel).params
    positions = write_only(kernel)

    def run(args: tuple, nd: tuple[int, ...]) -> None:
        def find(k: int, flat: int) -> str | None:
            if kernel.merged_from is not None or kernel.tangent_of is not None:
                return None     # (its Python function is not the code that ran)
            return statement(kernel.pyfunc, args, nd, groupsize_of(cfg, len(nd)), k, flat,
                             positions)
        what, names = kernel.reported_as or (f"the launch of kernel {kernel.name}", params)
        checked(lambda: launcher(args, nd), args, names, what, find, positions)
    return run


def prepare(cfg: Any, args: tuple, ndrange: Any) -> tuple[Any, tuple[int, ...], tuple]:
    """The compiled primal launcher for these arguments (checked and compiled on first use),
    the launch's ndrange as a tuple, and the key both are cached under.  A launch whose
    indices would leave an array, where that is known at launch (:mod:`.bounds`), is a
    ``KernelIndexError`` here, before anything runs."""
    kernel, backend = cfg.kernel, cfg.backend
    nd = ndrange_of(kernel, ndrange)
    wgs = groupsize_of(cfg, len(nd))
    key = ("primal", backend, arg_key(args), len(nd), wgs)
    found = kernel.cache.get(key)
    if found is None:
        argtypes = check_args(kernel, backend, args)
        launcher = compile_kernel(kernel, "primal", backend, argtypes, len(nd), wgs)
        check_writable(kernel, args)
        check = check_indices(cfg, args, nd)
        found = kernel.cache[key] = (launcher, check)
    else:
        launcher, check = found
        if check is not None and check.failing(args, nd):
            raise check.error(args, nd, wgs)
    show(kernel, "primal", backend, launcher)
    return launcher, nd, key


def check_indices(cfg: Any, args: tuple, nd: tuple[int, ...]) -> Any:
    """Raise ``KernelIndexError`` if this launch would index outside an array where that is
    known at launch (:mod:`.bounds`; the arguments already checked); returns the kernel's
    check (None where it has nothing to check)."""
    kernel = cfg.kernel
    wgs = groupsize_of(cfg, len(nd))
    key = ("bounds", cfg.backend, arg_key(args), len(nd), wgs)
    if key not in kernel.cache:
        # (NumPy integers the check takes as Python ints: their arithmetic would wrap)
        numpy_ints = frozenset(k for k, a in enumerate(args) if isinstance(a, np.integer))
        kernel.cache[key] = launch_check(kernel_ir(kernel), check_args(kernel, cfg.backend, args),
                                         len(nd), wgs, numpy_ints)
    check = kernel.cache[key]
    if check is not None and check.failing(args, nd):
        raise check.error(args, nd, wgs)
    return check
