"""Launching kernels: validate a launch, find or build its compiled code, run it.

``compile_kernel`` is the whole pipeline in one place: frontend, (differentiation), types,
backend.  ``launch`` is the hot path: one dictionary look-up when the kernel was already
compiled for these argument types, launch shape and workgroup size.
"""

from __future__ import annotations

import ast
import dataclasses
from contextvars import ContextVar
from typing import Any

import numpy as np

from tapegrad.ad import normalize, reverse_kernel, tangent_kernel
from tapegrad.ad.access import array_access
from tapegrad.ad.deadcode import has_effects, names_read
from tapegrad.ad.gather import split_gathers
from tapegrad.ad.localgather import gather_local_updates
from tapegrad.ad.reverse import tidy
from tapegrad.ad.storefresh import storable_shadows, storing
from tapegrad.errors import AdjointStackOverflow, LaunchError
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import (
    BOOL,
    FLOAT32,
    FLOAT64,
    INT64,
    WEAK_FLOAT,
    Array,
    Scalar,
    Type,
    specialize,
)

SUPPORTED_DTYPES = ("float32", "float64", "int32", "int64", "bool")


def compile_kernel(kernel: Any, mode: str, backend: Any, argtypes: tuple[Type, ...],
                   rank: int, groupsize: tuple[int, ...]) -> Any:
    """The pipeline: source -> kernel IR -> typed kernel -> compiled launcher."""
    ir = kernel_ir(kernel)                                          # parse, check, resolve
    typed = specialize(ir, argtypes, rank, groupsize, kernel_ir)    # infer types
    return backend.compile(typed)                                   # lower, cache, compile


def compile_adjoint(kernel: Any, backend: Any, argtypes: tuple[Type, ...],
                    activity: tuple[str, ...], rank: int, groupsize: tuple[int, ...],
                    stack_depth: int | None, discard: frozenset[str] = frozenset(),
                    full_groups: bool = True) -> tuple[Any, Any]:
    """The reverse-mode pipeline: kernel IR -> normalized, typed -> adjoint IR -> compiled."""
    adjoint = adjoint_ir(kernel, argtypes, activity, rank, groupsize, stack_depth, discard,
                         full_groups)
    adjoint.contents_read = _contents_read(kernel, adjoint, argtypes)
    adjoint.shadows_written = _shadows_written(adjoint)
    full = argtypes + tuple(_adjoint_extra_types(kernel, adjoint, argtypes))
    main = full               # the main kernel's argument types (the gathers' are ``full``)
    if full_groups:   # (after contents_read: what the backend derives reads its sources)
        adjoint.ir, main = backend.tune_adjoint(adjoint.ir, full, groupsize)
    typed_adjoint = specialize(adjoint.ir, main, rank, groupsize, kernel_ir)
    if adjoint.gathers and not has_effects(adjoint.ir.body):
        launcher = None                  # the gathers did everything (a tape's stencils)
    else:
        launcher = backend.compile(typed_adjoint)                   # lower, cache, compile
        storable = storable_shadows(adjoint.ir, list(adjoint.shadow_of), rank)
        if storable:
            adjoint.storing = _StoringVariants(adjoint.ir, storable, main, rank, groupsize,
                                               backend)
    if adjoint.gathers:
        gathers = []
        for g in adjoint.gathers:
            at = adjoint.ir.params.index(g.target)
            both = [specialize(v, full + (INT64,) * rank, rank, groupsize, kernel_ir)
                    for v in (g.ir, g.fresh_ir)]
            gathers.append(_Gather(at, backend.compile(both[0]), backend, both[1]))
        launcher = _GathersThenRest(gathers, launcher)
    return adjoint, launcher


def adjoint_ir(kernel: Any, argtypes: tuple[Type, ...], activity: tuple[str, ...], rank: int,
               groupsize: tuple[int, ...], stack_depth: int | None = None,
               discard: frozenset[str] = frozenset(), full_groups: bool = True) -> Any:
    """The adjoint of a kernel (``tapegrad.ad.Adjoint``, stencils split into gathers), not
    compiled: kernel IR -> normalized, typed -> adjoint IR.  ``full_groups``: the launch's
    ndrange is a multiple of the groupsize (local-memory updates may then gather)."""
    ir = kernel_ir(kernel)                                          # parse, check, resolve
    flat = normalize(ir, kernel_ir, keep=lambda f: f.reverse_rule is not None)  # inline...
    typed = specialize(flat, argtypes, rank, groupsize, kernel_ir)  # infer types
    adjoint = reverse_kernel(typed, activity, stack_depth, discard)  # generate the adjoint
    if full_groups:                                                 # tiles: no atomics
        gathered = gather_local_updates(adjoint.ir, groupsize)
        if gathered is not adjoint.ir:
            adjoint.ir = gathered
            tidy(adjoint)                           # what the gathered loops read is dead
    if not adjoint.uses_status:                                     # stencils: no atomics
        adjoint.ir, adjoint.gathers = split_gathers(adjoint.ir, list(adjoint.shadow_of), rank)
    return adjoint


def _adjoint_extra_types(kernel: Any, adjoint: Any, argtypes: tuple[Type, ...]) -> list[Type]:
    params = kernel_ir(kernel).params
    extra = [argtypes[params.index(p)] for p in adjoint.shadow_of.values()]
    extra += [Array("float64", 1)] * len(adjoint.active_scalars)
    return extra + ([Array("int64", 1)] if adjoint.uses_status else [])


def values_read(kernel: Any, backend: Any, args: tuple, activity: tuple[str, ...],
                nd: tuple[int, ...], wgs: tuple[int, ...]) -> frozenset[str]:
    """The array parameters whose contents the adjoint for ``activity`` reads (a linear
    kernel's adjoint reads none of its inputs: only their shapes); cached."""
    key = ("values read", backend, _arg_key(args), activity, len(nd), wgs)
    found = kernel.cache.get(key)
    if found is None:
        argtypes = check_args(kernel, backend, args)
        adjoint = adjoint_ir(kernel, argtypes, activity, len(nd), wgs)
        found = kernel.cache[key] = _contents_read(kernel, adjoint, argtypes)
    return found


def _contents_read(kernel: Any, adjoint: Any, argtypes: tuple[Type, ...]) -> frozenset[str]:
    """Array parameters whose contents the adjoint's kernels read (every array it stores
    into is one of its scratch copies)."""
    params = kernel_ir(kernel).params
    arrays = {p for p, t in zip(params, argtypes) if isinstance(t, Array)}
    read = set(adjoint.scratch)
    for ir in [adjoint.ir] + [g.ir for g in adjoint.gathers]:
        read |= names_read(ast.Module(body=ir.body, type_ignores=[])) & arrays
    return frozenset(read)


class _Gather:
    """One gather kernel of a split adjoint: adds into shadow argument ``position``, or, for
    a shadow with no values yet, stores (that variant compiled on first use)."""

    def __init__(self, position: int, adding: Any, backend: Any, storing_typed: Any):
        self.position = position
        self.adding = adding
        self.backend = backend
        self.storing_typed = storing_typed
        self.storing: Any = None

    def __call__(self, args: tuple, fresh: bool) -> None:
        if fresh and self.storing is None:
            self.storing = self.backend.compile(self.storing_typed)
        run = self.storing if fresh else self.adding
        run(args, tuple(args[self.position].shape))


def _shadows_written(adjoint: Any) -> frozenset[str]:
    """The shadow parameters the adjoint's kernels store into or add into."""
    written = {g.target for g in adjoint.gathers}
    if has_effects(adjoint.ir.body) or not adjoint.gathers:
        written |= array_access(adjoint.ir)[1]
    return frozenset(written & set(adjoint.shadow_of))


class _StoringVariants:
    """The adjoint's main kernel storing into some of its shadows instead of adding
    (``tapegrad.ad.storefresh``): for shadows that hold no values yet, each variant compiled on
    first use."""

    def __init__(self, ir: Any, storable: list[str], argtypes: tuple[Type, ...], rank: int,
                 groupsize: tuple[int, ...], backend: Any):
        self.ir, self.storable, self.argtypes = ir, frozenset(storable), argtypes
        self.rank, self.groupsize, self.backend = rank, groupsize, backend
        self.compiled: dict[frozenset[str], Any] = {}

    def __call__(self, shadows: frozenset[str]) -> Any:
        found = self.compiled.get(shadows)
        if found is None:
            ir = storing(self.ir, sorted(shadows), self.rank)
            typed = specialize(ir, self.argtypes, self.rank, self.groupsize, kernel_ir)
            found = self.compiled[shadows] = self.backend.compile(typed)
        return found


class _GathersThenRest:
    """Launches an adjoint split by ``tapegrad.ad.gather``: each gather kernel over its
    shadow's shape (the original ndrange as extra arguments), then the rest over the ndrange
    (unless it has nothing left to do)."""

    def __init__(self, gathers: list[_Gather], rest: Any):
        self.gathers = gathers
        self.rest = rest

    @property
    def source(self) -> str:
        parts = [g.adding.source for g in self.gathers]
        return "\n\n".join(parts + ([self.rest.source] if self.rest is not None else []))

    def __call__(self, args: tuple, ndrange: tuple[int, ...], fresh: set[int] = frozenset(),
                 rest: Any = None) -> None:
        for g in self.gathers:
            g(tuple(args) + tuple(ndrange), g.position in fresh)
        if rest is not None or self.rest is not None:
            (rest or self.rest)(args, ndrange)

    def gathered(self) -> set[int]:
        return {g.position for g in self.gathers}

    def steps(self, fresh: frozenset[int]) -> tuple[tuple[Any, int | None], ...]:
        """The launches of a call with these ``fresh`` positions, resolved in advance for a
        tape's sweep (two Python layers fewer per replayed launch): (launcher, the argument
        position whose shape is its ndrange, or None for the launch's ndrange)."""
        out = []
        for g in self.gathers:
            if g.position in fresh and g.storing is None:
                g.storing = g.backend.compile(g.storing_typed)
            out.append((g.storing if g.position in fresh else g.adding, g.position))
        if self.rest is not None:
            out.append((self.rest, None))
        return tuple(out)


# While a tape records or forward mode runs, it sees every launch first: a function of
# ``(cfg, args, ndrange)`` set by tapegrad.tape, per thread (and per asyncio task), so that
# two threads each recording their own tape never see each other's launches.
interceptor: ContextVar[Any] = ContextVar("tapegrad_interceptor", default=None)
_intercepting = interceptor.get


def launch(cfg: Any, args: tuple, ndrange: Any) -> None:
    """Run a configured kernel ``cfg`` on ``args`` over ``ndrange`` (recorded on a tape if one
    is recording)."""
    if len({id(a) for a in args}) < len(args):      # one object passed twice (rare)
        cfg, args, _ = one_parameter_per_array(cfg, args, args)
    seen_by = _intercepting()
    if seen_by is not None:
        seen_by(cfg, args, ndrange)
        return
    launch_now(cfg, args, ndrange)


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
        if isinstance(a, np.ndarray) or hasattr(a, "__cuda_array_interface__"):
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

    from tapegrad.lang.kernel import Kernel

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.Name:
            return ast.copy_location(ast.Name(id=merged[node.id], ctx=node.ctx), node) \
                if node.id in merged else node

    ir = kernel_ir(kernel)
    body = [Rename().visit(st) for st in copy.deepcopy(ir.body)]
    variant = Kernel(kernel.pyfunc)
    variant.cache["ir"] = dataclasses.replace(
        ir, params=[p for p in ir.params if p not in merged], body=body)
    variant.merged_from = kernel
    return variant


def launch_now(cfg: Any, args: tuple, ndrange: Any) -> None:
    """Run a configured kernel now, unrecorded."""
    launcher, nd, _ = prepare(cfg, args, ndrange)
    if 0 not in nd:
        launcher(args, nd)


def prepare(cfg: Any, args: tuple, ndrange: Any) -> tuple[Any, tuple[int, ...], tuple]:
    """The compiled primal launcher for these arguments (checked and compiled on first use),
    the launch's ndrange as a tuple, and the key both are cached under."""
    kernel, backend = cfg.kernel, cfg.backend
    nd = _ndrange(kernel, ndrange)
    wgs = _groupsize(cfg, len(nd))
    key = ("primal", backend, _arg_key(args), len(nd), wgs)
    launcher = kernel.cache.get(key)
    if launcher is None:
        argtypes = check_args(kernel, backend, args)
        launcher = compile_kernel(kernel, "primal", backend, argtypes, len(nd), wgs)
        check_writable(kernel, args)
        kernel.cache[key] = launcher
    _show(kernel, "primal", backend, launcher)
    return launcher, nd, key


def _show(kernel: Any, mode: str, backend: Any, launcher: Any, ir: Any = None) -> None:
    """What ``kern.source(mode, backend)`` shows: the code of the last launch (``ir()``: the
    kernel-language IR it came from, for ``kern.source(mode)``), also for the kernel a merged
    variant was made from (``one_parameter_per_array``), which a launch through another
    variant may have changed.  The hot path is an identity test per launch."""
    origin = getattr(kernel, "merged_from", None)
    if kernel.shown.get(mode) is launcher and (origin is None
                                               or origin.shown.get(mode) is launcher):
        return
    entries = {("last", mode, backend): launcher}
    if ir is not None:
        entries[_IR_SHOWN[mode]] = ir()
    for k in (kernel, origin):
        if k is not None:
            k.cache.update(entries)
            k.shown[mode] = launcher     # (a launcher belongs to one backend)


_IR_SHOWN = {"reverse": ("last adjoint",), "forward": ("last tangent",)}


def source_of(kernel: Any, mode: str, backend: Any) -> str:
    """``kern.source(mode, backend)``: see ``Kernel.source``."""
    if mode not in ("primal", "reverse", "forward"):
        raise LaunchError(f"source(mode={mode!r}): mode is 'primal', 'forward' or 'reverse'")
    if mode in ("reverse", "forward"):
        ir_key = ("last adjoint",) if mode == "reverse" else ("last tangent",)
        last = kernel.cache.get(("last", mode, backend) if backend else ir_key)
        if last is None:
            raise LaunchError(f"{kernel.name} has not been differentiated in {mode} mode yet "
                              f"(on {backend!r}); "
                              "the generated kernel depends on the argument types, so "
                              "differentiate it "
                              "once with tg.autodiff, then ask for its source")
        if backend is not None:
            return last.source
        return "\n\n".join(_unparse(ir) for ir in (last if isinstance(last, list) else [last]))
    if backend is None:
        return _unparse(kernel_ir(kernel))
    launcher = kernel.cache.get(("last", mode, backend))
    if launcher is None:
        raise LaunchError(f"{kernel.name} has not been launched on {backend!r} yet; launch it "
                          "once, then ask for its source")
    return launcher.source


def _unparse(ir: Any) -> str:
    """Kernel IR as kernel-language source (what the frontend or a transform produced)."""
    fn = ast.FunctionDef(name=ir.name, args=ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=p) for p in ir.params], kwonlyargs=[],
        kw_defaults=[], defaults=[]), body=ir.body, decorator_list=[], returns=None)
    return ast.unparse(ast.fix_missing_locations(fn)) + "\n"


def _arg_key(args: tuple) -> tuple:
    """What a compiled kernel depends on: each argument's type, and for arrays (NumPy, CuPy,
    any ``__cuda_array_interface__``) also dtype and rank."""
    key = []
    for a in args:
        t = type(a)
        if t is float or t is int:             # the common scalars, without the checks below
            key.append(t)
        elif isinstance(a, np.ndarray):
            dtype = a.dtype
            key.append((t, dtype.num, a.ndim, a.flags.writeable, dtype.isnative))
        elif hasattr(a, "__cuda_array_interface__"):
            key.append((t, np.dtype(a.dtype).num, a.ndim))
        else:
            key.append(t)
    return tuple(key)


def _ndrange(kernel: Any, ndrange: Any) -> tuple[int, ...]:
    if type(ndrange) is int and ndrange >= 0:
        return (ndrange,)                # the common cases, checked in one pass
    if type(ndrange) is tuple and 0 < len(ndrange) < 4:
        for n in ndrange:
            if type(n) is not int or n < 0:
                break
        else:
            return ndrange
    if ndrange is None:
        raise LaunchError(f"{kernel.name}(backend)(...) needs ndrange=: the number of "
                          "work-items, e.g. ndrange=B.size or ndrange=B.shape")
    if isinstance(ndrange, (int, np.integer)):
        nd = (ndrange,)
    elif isinstance(ndrange, (tuple, list)):
        nd = tuple(ndrange)
    else:
        nd = ()
    if not 1 <= len(nd) <= 3 or not all(isinstance(n, (int, np.integer)) and n >= 0 for n in nd):
        raise LaunchError(f"ndrange must be a non-negative int or a tuple of 1 to 3 of them, "
                          f"got {ndrange!r}")
    return tuple(int(n) for n in nd)


def _groupsize(cfg: Any, rank: int) -> tuple[int, ...]:
    known = cfg.__dict__.get("_groupsizes")
    if known is None:
        known = cfg._groupsizes = {}
    wgs = known.get(rank)
    if wgs is None:
        wgs = known[rank] = _checked_groupsize(cfg, rank)
    return wgs


_SMALLER = {1: 256, 2: (16, 16), 3: (8, 8, 8)}   # suggested where a workgroup is too large


def _checked_groupsize(cfg: Any, rank: int) -> tuple[int, ...]:
    wgs = cfg.workgroupsize
    if wgs is None:
        return cfg.backend.default_groupsize(rank)
    w = (wgs,) if isinstance(wgs, (int, np.integer)) else tuple(wgs)
    if len(w) != rank:
        raise LaunchError(f"{cfg.kernel.name}: workgroupsize {wgs!r} has {len(w)} dimension(s) "
                          f"but ndrange has {rank}; give them the same rank, e.g. "
                          f"workgroupsize={(16,) * rank}")
    if not all(isinstance(x, (int, np.integer)) and x > 0 for x in w):
        raise LaunchError(f"workgroupsize must hold positive ints, got {wgs!r}")
    limit, items = cfg.backend.max_group_items, int(np.prod(w))
    if limit is not None and items > limit:
        raise LaunchError(f"{cfg.kernel.name}: workgroupsize {wgs!r} has {items} work-items but "
                          f"{cfg.backend.name} allows at most {limit} per workgroup; use a "
                          f"smaller one, e.g. workgroupsize={_SMALLER.get(rank, 64)}")
    return tuple(int(x) for x in w)


def check_args(kernel: Any, backend: Any, args: tuple) -> tuple[Type, ...]:
    """Check a launch's arguments and return their kernel types (no array is touched);
    remembered per argument key, since a tape checks every launch it records."""
    key = ("argtypes", backend, _arg_key(args))
    types = kernel.cache.get(key)
    if types is None:
        params = kernel_ir(kernel).params
        if len(args) != len(params):
            raise LaunchError(f"{kernel.name} takes {len(params)} argument(s) "
                              f"({', '.join(params)}), got {len(args)}")
        types = tuple(argtype(kernel, backend, name, a) for name, a in zip(params, args))
        kernel.cache[key] = types
    return types


def check_writable(kernel: Any, args: tuple) -> None:
    """A read-only array passed where the kernel writes is the user's error, not Numba's."""
    _, writes = access(kernel)
    for name, a in zip(kernel_ir(kernel).params, args):
        if name in writes and isinstance(a, np.ndarray) and not a.flags.writeable:
            raise LaunchError(f"{kernel.name}: argument {name} is read-only "
                              f"({name}.flags.writeable is False) but the kernel writes it; "
                              f"pass a writable array, e.g. {name}.copy()")


def access(kernel: Any) -> tuple[set[str], set[str]]:
    """(parameters the kernel reads, parameters it writes); cached on the kernel."""
    summary = kernel.cache.get("access")
    if summary is None:
        summary = kernel.cache["access"] = array_access(normalize(kernel_ir(kernel), kernel_ir))
    return summary


def argtype(kernel: Any, backend: Any, name: str, a: Any) -> Type:
    """The kernel type of one launch argument."""
    if isinstance(a, (bool, np.bool_)):
        return BOOL
    if isinstance(a, (int, np.integer)) and not isinstance(a, np.ndarray):
        if isinstance(a, np.integer) and a.dtype.name in ("int32", "int64"):
            return Scalar(a.dtype.name)
        return INT64
    if isinstance(a, float) and not isinstance(a, np.floating):
        return WEAK_FLOAT   # a Python float takes the precision of the data it meets
    if isinstance(a, np.floating):
        if a.dtype == np.float32:
            return FLOAT32
        if a.dtype == np.float64:
            return FLOAT64
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        if not backend.owns(a):
            raise LaunchError(f"{kernel.name}: argument {name} is a {type(a).__name__}, which "
                              f"does not live on {backend!r}; move it with "
                              f"tg.asarray({backend!r}, {name}) or launch on "
                              f"tg.get_backend({name})")
        dt = np.dtype(a.dtype).name
        if not np.dtype(a.dtype).isnative:
            raise LaunchError(f"{kernel.name}: argument {name} has non-native byte order "
                              f"({a.dtype.str}); convert it with {name}.astype({dt!r})")
        if dt not in SUPPORTED_DTYPES:
            raise LaunchError(f"{kernel.name}: argument {name} has dtype {dt}; kernels take "
                              f"arrays of {', '.join(SUPPORTED_DTYPES)} (convert with "
                              f"{name}.astype(np.float64))")
        if not 1 <= a.ndim <= 3:
            raise LaunchError(f"{kernel.name}: argument {name} has {a.ndim} dimensions; kernels "
                              "take arrays of 1 to 3 dimensions (reshape a scalar to (1,))")
        return Array(dt, a.ndim)
    raise LaunchError(f"{kernel.name}: argument {name} is a {type(a).__name__}; kernels take "
                      "arrays and int, float or bool scalars")


# -- reverse mode ---------------------------------------------------------------------------

def adjoint_of(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...],
               discard: frozenset[str] = frozenset()) -> tuple[Any, Any, tuple]:
    """The compiled adjoint of a configured kernel for these arguments (cached)."""
    kernel, backend = cfg.kernel, cfg.backend
    wgs = _groupsize(cfg, len(nd))
    full = all(n % w == 0 for n, w in zip(nd, wgs))
    key = ("reverse", backend, _arg_key(values), activity, len(nd), wgs, discard, full)
    entry = kernel.cache.get(key)
    if entry is None:
        argtypes = check_args(kernel, backend, values)
        depth = kernel.cache.get(("stack depth", key))
        entry = compile_adjoint(kernel, backend, argtypes, activity, len(nd), wgs, depth,
                                discard, full)
        kernel.cache[key] = entry
    adjoint, launcher = entry
    _show(kernel, "reverse", backend, launcher,
          lambda: [g.ir for g in adjoint.gathers] + [adjoint.ir])
    return adjoint, launcher, key


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
    adjoint, launcher, key = found or adjoint_of(cfg, values, activity, nd, discard)
    _check_kept(kernel, adjoint, kept)
    fresh_at: frozenset[int] = frozenset()
    stored: frozenset[str] = frozenset()
    if fresh:
        covered = frozenset(p for p in fresh if tuple(shadows[p].shape) == nd)
        plan = adjoint.fresh_plans.get((fresh, covered))
        if plan is None:
            plan = adjoint.fresh_plans[fresh, covered] = _fresh_plan(
                adjoint, launcher, len(params), fresh, covered)
        launcher, fresh_at, stored, zeroed = plan
        for p in zeroed:
            shadows[p][...] = 0
    if not (adjoint.uses_status or adjoint.scratch or adjoint.active_scalars):
        # the common case (no stack, no copies, no scalar outputs): one launch
        args = tuple(values) + tuple(shadows[p] for p in adjoint.shadow_of.values())
        _launch_adjoint(launcher, args, nd, fresh_at)
        return {}
    backup: dict[str, Any] = {}
    if adjoint.uses_status:   # to undo a launch whose stack overflowed: what it changes
        written = {p for sh, p in adjoint.shadow_of.items() if sh in adjoint.shadows_written}
        backup = {p: d.copy() for p, d in shadows.items() if p in written and p not in fresh}
    for attempt in range(2):
        args = [v.copy() if p in adjoint.scratch else v for p, v in zip(params, values)]
        args += [shadows[p] for p in adjoint.shadow_of.values()]
        outs = [backend.zeros(np.float64, 1) for _ in adjoint.active_scalars]
        args += outs
        status = backend.zeros(np.int64, 1) if adjoint.uses_status else None
        if status is not None:
            args.append(status)
        _launch_adjoint(launcher, tuple(args), nd, fresh_at)
        needed = int(backend.to_numpy(status)[0]) if status is not None else 0
        if needed == 0:
            return {p: float(backend.to_numpy(o)[0]) for p, o in zip(adjoint.active_scalars, outs)}
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
        del kernel.cache[key]
        adjoint, launcher, key = adjoint_of(cfg, values, activity, nd, discard)
        if stored:
            launcher = _storing_into(adjoint, launcher, stored)
    raise AssertionError("unreachable")


@dataclasses.dataclass(slots=True)
class Replay:
    """One adjoint launch worked out in advance: a tape's sweep runs the same kernel with the
    same argument types and the same pattern of activities and shadow states once per
    recorded step, so it asks ``replay_for`` once per pattern and then only gathers the
    arrays and calls ``run_replay`` (what ``run_adjoint`` works out per call, done once)."""

    adjoint: Any
    launcher: Any
    fresh_at: frozenset[int]          # argument positions of gather kernels that store
    zeroed: tuple[str, ...]           # shadows to zero before the launch
    order: tuple[str, ...]            # the shadow parameters, in the adjoint's argument order
    shown: Any                        # what kern.source() shows for it (_Shown)
    steps: tuple[tuple[Any, int | None], ...]   # the launcher's launches (_GathersThenRest.steps)
    chain: Any = None    # how a sweep runs it along a chain of states (tape/chains.py), or False


def replay_for(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...],
               discard: frozenset[str], fresh: frozenset[str], covered: frozenset[str],
               kept: frozenset[str]) -> Replay | None:
    """The ``Replay`` of ``cfg``'s adjoint for this pattern (arguments as in ``run_adjoint``;
    ``covered``: the ``fresh`` shadows of the launch's shape), or None when the adjoint needs
    ``run_adjoint``'s general path (a stack, scratch copies, Active scalars).  Any record of
    the same kernel and argument types may use it: the values a record keeps (copies the tape
    made, stand-ins for freed arrays) can differ from the launch's arrays in being writeable
    and in layout, which pick compiled code but not what the adjoint is."""
    adjoint, launcher, _ = adjoint_of(cfg, values, activity, nd, discard)
    if adjoint.uses_status or adjoint.scratch or adjoint.active_scalars:
        return None
    _check_kept(cfg.kernel, adjoint, kept)
    fresh_at: frozenset[int] = frozenset()
    zeroed: tuple[str, ...] = ()
    if fresh:
        launcher, fresh_at, _, zeroed = _fresh_plan(
            adjoint, launcher, len(kernel_ir(cfg.kernel).params), fresh, covered)
    steps = launcher.steps(fresh_at) if isinstance(launcher, _GathersThenRest) \
        else ((launcher, None),)
    return Replay(adjoint, launcher, fresh_at, zeroed, tuple(adjoint.shadow_of.values()),
                  _Shown(steps), steps)


class _Shown:
    """What ``kern.source(mode="reverse", backend=...)`` shows after a replay: the code its
    launches ran (the storing variant of a gather, in the rows the CPU chose), not the
    adjoint's launcher as first compiled."""

    def __init__(self, steps: tuple):
        self.steps = steps

    @property
    def source(self) -> str:
        return "\n\n".join(run.source for run, _ in self.steps)


def run_replay(cfg: Any, replay: Replay, values: list, shadows: dict[str, Any],
               nd: tuple[int, ...]) -> None:
    """Launch a ``Replay`` on one record's arrays (no two shadows the same array)."""
    for p in replay.zeroed:
        shadows[p][...] = 0
    args = (*values, *[shadows[p] for p in replay.order])
    kernel = cfg.kernel
    if kernel.shown.get("reverse") is not replay.shown or kernel.merged_from is not None:
        _show(kernel, "reverse", cfg.backend, replay.shown,
              lambda: [g.ir for g in replay.adjoint.gathers] + [replay.adjoint.ir])
    if 0 in nd:
        _launch_adjoint(replay.launcher, args, nd, replay.fresh_at)
        return
    for run, shaped_by in replay.steps:
        if shaped_by is None:
            run(args, nd)
        else:                     # a gather kernel: over its shadow, the ndrange appended
            run(args + nd, args[shaped_by].shape)


def _launch_adjoint(launcher: Any, args: tuple, nd: tuple[int, ...], fresh_at: frozenset[int]
                    ) -> None:
    """One adjoint launch; ``fresh_at``: the argument positions of gather kernels that store
    (shadows holding no values yet), which get their zeros when nothing runs (an empty
    ndrange)."""
    if 0 in nd:
        for k in fresh_at:
            args[k][...] = 0
    elif fresh_at:
        launcher(args, nd, fresh_at)
    else:
        launcher(args, nd)


def _check_kept(kernel: Any, adjoint: Any, kept: frozenset[str] | None) -> None:
    if kept is not None and not adjoint.contents_read <= kept:
        raise LaunchError(
            f"tapegrad bug: the adjoint of {kernel.name} reads "
            f"{sorted(adjoint.contents_read - kept)}, whose contents the tape did not keep; "
            "please report it with the kernel")


def _fresh_plan(adjoint: Any, launcher: Any, base: int, fresh: frozenset[str],
                covered: frozenset[str]) -> tuple[Any, frozenset[int], frozenset[str], tuple]:
    """How an adjoint launch treats the shadows that hold no values yet (``fresh``; those in
    ``covered`` have the launch's shape): (the launcher, the argument positions of the gather
    kernels that store, the shadows the main kernel stores into, the shadows to zero first)."""
    gathered = launcher.gathered() if isinstance(launcher, _GathersThenRest) else set()
    storable = adjoint.storing.storable if adjoint.storing is not None else ()
    fresh_at, stored, zeroed = set(), set(), []
    for k, (s, p) in enumerate(adjoint.shadow_of.items()):
        if p in fresh:
            if base + k in gathered:
                fresh_at.add(base + k)
            elif s in storable and p in covered:
                stored.add(s)          # one work-item per element stores into it
            else:
                zeroed.append(p)
    stored = frozenset(stored)
    if stored:
        launcher = _storing_into(adjoint, launcher, stored)
    return launcher, frozenset(fresh_at), stored, tuple(zeroed)


def _storing_into(adjoint: Any, launcher: Any, stored: frozenset[str]) -> Any:
    """``launcher`` with its main kernel storing into the ``stored`` shadows."""
    rest = adjoint.storing(stored)
    return _GathersThenRest(launcher.gathers, rest) if isinstance(launcher, _GathersThenRest) \
        else rest


def overwritten_inputs(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...]
                       ) -> list[str]:
    """Parameters the kernel overwrites whose pre-launch contents the adjoint reads (the
    adjoint's scratch copies, and arrays it only reads once dead code is gone: a replayed
    load of an array whose final store the adjoint no longer redoes)."""
    adjoint = adjoint_of(cfg, values, activity, nd)[0]
    return sorted(adjoint.contents_read & access(cfg.kernel)[1])


# -- forward mode ---------------------------------------------------------------------------

def compile_tangent(kernel: Any, backend: Any, argtypes: tuple[Type, ...],
                    activity: tuple[str, ...], rank: int, groupsize: tuple[int, ...],
                    width: int) -> tuple[Any, Any]:
    """The forward-mode pipeline: kernel IR -> normalized, typed -> tangent IR -> compiled."""
    ir = kernel_ir(kernel)
    flat = normalize(ir, kernel_ir, keep=lambda f: f.forward_rule is not None)
    typed = specialize(flat, argtypes, rank, groupsize, kernel_ir)
    tangent = tangent_kernel(typed, activity, width)                # generate the tangent
    extra = [argtypes[ir.params.index(p)] for p, _ in tangent.tangent_params]
    typed_tangent = specialize(tangent.ir, argtypes + tuple(extra), rank, groupsize, kernel_ir)
    return tangent, backend.compile(typed_tangent)


def run_tangent(cfg: Any, values: tuple, tangents: dict[str, tuple], activity: tuple[str, ...],
                nd: tuple[int, ...]) -> None:
    """One launch computing the kernel's outputs and their tangents in ``width`` directions.

    ``tangents[p]`` holds one tangent per direction for every ``dup``/``active`` parameter:
    arrays (read for inputs, written for outputs) or floats (for scalars).
    """
    kernel, backend = cfg.kernel, cfg.backend
    params = kernel_ir(kernel).params
    width = max((len(t) for t in tangents.values()), default=1)
    wgs = _groupsize(cfg, len(nd))
    plain = tuple(values) + tuple(t for p in params for t in tangents.get(p, ()))
    key = ("forward", backend, _arg_key(plain), activity, len(nd), wgs, width)
    entry = kernel.cache.get(key)
    if entry is None:
        argtypes = check_args(kernel, backend, values)
        entry = compile_tangent(kernel, backend, argtypes, activity, len(nd), wgs, width)
        kernel.cache[key] = entry
    tangent, launcher = entry
    _show(kernel, "forward", backend, launcher, lambda: tangent.ir)
    args = list(values) + [tangents[p][j] for p, j in tangent.tangent_params]
    if 0 not in nd:
        launcher(tuple(args), nd)
