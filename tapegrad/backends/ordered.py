"""``tg.deterministic()`` on GPUs: a kernel's float atomic additions written down, then added
in a fixed order.

A float ``tg.atomic_add`` (``atomic_sub``, an ``Active`` scalar's ``tg.group_reduce_add``) into
global memory gives bits that depend on the order in which work-items reach it.  Under
``tg.deterministic()`` a CUDA or OpenCL launch of such a kernel runs a variant of it, printable
like any kernel, where each such call instead writes its flat index and its value into a log
with one row per work-item; the runtime then adds the logged values into their arrays in
work-item order (``apply``, on the host), after checking every index is inside its array (a
``LaunchError`` otherwise, with no array written).  The rows of work-items that never reached
a call keep ``NOT_REACHED``.

The guard model: a call is ordered when it runs at most once per work-item (outside any
loop), in the kernel itself (not in a ``@tg.func``), into an array argument that the kernel
does not otherwise touch and that shares no memory with another argument (the adds land
after the launch, so a read of that array could tell).  A kernel with any other float atomic
addition (in local memory, in a loop, in a device function), or with an atomic whose old value
it uses, is refused under ``tg.deterministic()`` with the reason (a ``BackendError``).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tapegrad.backends.c.items import disjoint
from tapegrad.backends.determinism import unordered_atomic_calls, unordered_atomics
from tapegrad.backends.structure import device_functions
from tapegrad.errors import BackendError, LaunchError
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.ir import tg_call, tg_name
from tapegrad.frontend.types import Array, TupleT, TypedKernel, specialize

_ADDS = ("atomic_add", "atomic_sub", "group_reduce_add")


class Site(NamedTuple):
    """One ordered call: the array it adds into and its logs' parameter names."""
    array: str
    at: str | None    # the flat index (NOT_REACHED: the work-item did not reach the call);
    value: str        # None where the index is a constant, ``flat`` (an Active scalar's sum)
    flat: int = 0


NOT_REACHED = -(2 ** 62)   # (a negative flat index is an error: it must not be taken for this)


def ordered_kernel(tk: TypedKernel) -> tuple[TypedKernel, list[Site]]:
    """``tk`` with its float atomic additions into global memory written to logs, typed, and
    the logs' calls in parameter order; a BackendError says why a kernel cannot be."""
    why = _refusal(tk)
    if why:
        raise BackendError(f"{tk.name} computes with atomics whose result depends on the "
                           f"order work-items reach them, and tg.deterministic() cannot order "
                           f"it on a GPU: "
                           f"{why}.  Run this part on tg.CPU() under tg.deterministic(), or "
                           f"leave tg.deterministic() (docs/debugging.md says what is "
                           f"reproducible without it)")
    taken = set(tk.ir.params) | set(tk.locals) | _device_function_names(tk)
    item = _fresh("ordered_item", taken)
    sites: list[Site] = []
    cleared: list[ast.stmt] = []       # every work-item's rows, before anything can return

    def replace(s: ast.stmt) -> list[ast.stmt] | None:
        call = s.value if isinstance(s, ast.Expr) else None
        if not _is_site(tk, call):
            return None
        k, (target, index, value) = len(sites), call.args
        value = copy.deepcopy(value)
        if tg_name(call) == "atomic_sub":
            value = ast.UnaryOp(op=ast.USub(), operand=value)
        constant = isinstance(index, ast.Constant) and type(index.value) is int
        site = Site(target.id, None if constant else _fresh(f"ordered{k}_at", taken),
                    _fresh(f"ordered{k}_value", taken), index.value if constant else 0)
        sites.append(site)
        if constant:                   # (a sum: the work-items that do not reach it add 0)
            cleared.append(_store(site.value, item, ast.Constant(0.0)))
            return [ast.copy_location(_store(site.value, item, value), s)]
        cleared.append(_store(site.at, item, ast.Constant(NOT_REACHED)))
        return [ast.copy_location(x, s)
                for x in (_store(site.at, item, _flat_index(tk, target.id, index)),
                          _store(site.value, item, value))]

    body = _rewritten(tk.ir.body, replace)
    start = [ast.Assign(targets=[ast.Name(id=item, ctx=ast.Store())],
                        value=tg_call("global_index", []), lineno=0)] + cleared
    for s in start:
        ast.copy_location(s, tk.ir.body[0])
        ast.fix_missing_locations(s)
    params = [*tk.ir.params, *(p for s in sites for p in (s.at, s.value) if p)]
    ir = dataclasses.replace(tk.ir, name=f"{tk.ir.name}_ordered", params=params,
                             body=start + body, locals=set(tk.ir.locals) | {item},
                             generated=True)
    logs = tuple(t for s in sites
                 for t in ((Array("int64", 1),) if s.at else ()) +
                 (Array(_array(tk, s.array).dtype, 1),))
    typed = specialize(ir, tk.argtypes + logs, tk.rank, tk.groupsize, kernel_ir)
    typed.launch_groupsize = tk.launch_groupsize
    if unordered_atomics(typed, spaces=("global", "local")):
        raise BackendError(f"{tk.name}: its variant for tg.deterministic() still adds with "
                           f"atomics in an order that varies (a tapegrad bug: please report it "
                           f"with the kernel)")
    return typed, sites


class OrderedLaunch:
    """A launch of ``tk`` under ``tg.deterministic()``: its ordered variant (compiled on first
    use by ``compile``), then the logged additions applied in work-item order: a sum into a
    constant index reduced where the array lives (CuPy's ``sum`` on a GPU), the rest added on
    the host."""

    def __init__(self, tk: TypedKernel, compile: Callable[[TypedKernel], Any], kind: Any):
        typed, self.sites = ordered_kernel(tk)
        self.params, self.name, self.kind = tk.ir.params, tk.name, kind
        self.argtypes = tk.argtypes
        self.launch = compile(typed)

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        n = math.prod(ndrange)
        arrays = {p: a for p, a, t in zip(self.params, args, self.argtypes)
                  if isinstance(t, Array)}
        self._check_disjoint(arrays)
        logs: list[tuple[Any, Any]] = []
        for site in self.sites:
            at = self.kind.new((n,), np.int64, False) if site.at else None
            logs.append((at, self.kind.new((n,), self.kind.dtype(arrays[site.array]), False)))
        self.launch((*args, *(a for log in logs for a in log if a is not None)), ndrange)
        to_host, xp = self.kind.to_numpy, self.kind.module()
        results = []                   # (every target checked before any is written)
        for array in dict.fromkeys(s.array for s in self.sites):
            mine = [(s, logs[k]) for k, s in enumerate(self.sites) if s.array == array]
            totals = [(s.flat, xp.sum(value)) for s, (at, value) in mine if at is None]
            dest = arrays[array]
            host = np.ascontiguousarray(to_host(dest))
            flat = host.reshape(-1)
            rows = [(to_host(at), to_host(value)) for _, (at, value) in mine if at is not None]
            if rows:
                apply(flat, *map(list, zip(*rows)), f"{self.name}: {array}")
            for k, total in totals:
                _check_index(k, flat.size, f"{self.name}: {array}")
                flat[k] += float(total)
            results.append((dest, host))
        for dest, host in results:
            self.kind.upload(dest, host)

    def _check_disjoint(self, arrays: dict[str, Any]) -> None:
        spans = {p: (0, self.kind.address(a), self.kind.address(a) + a.nbytes)
                 for p, a in arrays.items()}
        for site in self.sites:
            mine = spans[site.array]
            for p, other in spans.items():
                if p != site.array and not disjoint([mine, other]):
                    raise BackendError(
                        f"{self.name}: under tg.deterministic() its atomic additions into "
                        f"{site.array} are applied after the launch, and {site.array} shares "
                        f"memory with argument {p}, which the kernel may read meanwhile: pass "
                        f"separate arrays")


def apply(dest: np.ndarray, ats: list[np.ndarray], values: list[np.ndarray], what: str) -> None:
    """Add the logged ``values`` into ``dest`` (flat) at ``ats`` (flat index, NOT_REACHED for
    none; one column per call), in work-item order: the same bits whatever order the device
    ran the work-items in.  Each element's terms are summed in float64 (``np.bincount``, one
    pass in order), then added to it: one rounding for float32 arrays."""
    at = np.stack(ats, axis=1).reshape(-1)
    value = np.stack(values, axis=1).reshape(-1)
    reached = at != NOT_REACHED
    at, value = at[reached], value[reached]
    if not at.size:
        return
    if at.min() < 0 or at.max() >= dest.size:
        _check_index(int(at[(at < 0) | (at >= dest.size)][0]), dest.size, what)
    sums = np.bincount(at, weights=value, minlength=dest.size)
    touched = np.bincount(at, minlength=dest.size) > 0     # (-0.0 + 0.0 would be 0.0)
    dest[touched] += sums[touched]


def _check_index(flat: int, size: int, what: str) -> None:
    if not 0 <= flat < size:
        raise LaunchError(f"{what}: an atomic addition at flat index {flat}, outside its "
                          f"{size} elements")


def _refusal(tk: TypedKernel) -> str | None:
    """Why ``tk``'s float atomic additions cannot be ordered (None: they can)."""
    for k, n, old_value_used in unordered_atomic_calls(tk, spaces=("global", "local")):
        where = f"tg.{tg_name(n)} at {os.path.basename(k.ir.filename)}:{n.lineno}"
        if old_value_used:
            return f"{where} uses the atomic's old value"
        if k is not tk:
            return f"device function {k.name} adds with {where}"
        space = tk.types[id(n.args[0])].space
        if space != "global":
            return f"{where} adds into {space} memory"
        if not _is_site(tk, n):
            return (f"{where} adds into {ast.unparse(n.args[0])}, not into one of the "
                    f"kernel's arguments by its name")
    tree = ast.Module(body=list(tk.ir.body), type_ignores=[])
    sites = [n for n in ast.walk(tree) if _is_site(tk, n)]
    file = os.path.basename(tk.ir.filename)
    for loop in ast.walk(tree):
        if isinstance(loop, (ast.For, ast.While)):
            for n in ast.walk(loop):
                if n in sites:
                    return (f"tg.{tg_name(n)} at {file}:{n.lineno} is inside a loop (it is "
                            f"ordered where it runs at most once per work-item)")
    targets = {n.args[0].id for n in sites}
    site_arrays = {id(n.args[0]) for n in sites}
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and n.id in targets and id(n) not in site_arrays:
            if not _shape_of(tree, n):
                return (f"{file}:{n.lineno} uses {n.id} other than by the atomic additions "
                        f"into it, which land after the launch")
    return None


def _is_site(tk: TypedKernel, n: Any) -> bool:
    """Whether ``n`` is a float atomic addition into a global array argument, its result
    unused (as a statement of its own)."""
    if tg_name(n) not in _ADDS or not isinstance(n.args[0], ast.Name):
        return False
    t = tk.types.get(id(n.args[0]))
    return (isinstance(t, Array) and t.space == "global" and t.dtype.startswith("float")
            and n.args[0].id in tk.ir.params)


def _shape_of(tree: ast.AST, name: ast.Name) -> bool:
    """Whether ``name`` is read only for its shape there (``x.shape``, ``x.size``, ``len(x)``)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.value is name and n.attr in ("shape", "size",
                                                                             "ndim"):
            return True
        if tg_name(n) == "len" and n.args and n.args[0] is name:
            return True
    return False


def _rewritten(body: list[ast.stmt], replace: Callable) -> list[ast.stmt]:
    """A copy of ``body`` where ``replace(s)`` gives statements for ``s`` (None: kept)."""
    out: list[ast.stmt] = []
    for s in body:
        new = replace(s)
        if new is not None:
            out += new
            continue
        s = copy.copy(s)
        for field_ in ("body", "orelse"):
            inner = getattr(s, field_, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                setattr(s, field_, _rewritten(inner, replace))
        out.append(s)
    return out


def _flat_index(tk: TypedKernel, array: str, idx: ast.expr) -> ast.expr:
    """The row-major flat index of ``array[idx]`` as an expression (the C printer's)."""
    if isinstance(idx, ast.Tuple):
        parts = [copy.deepcopy(e) for e in idx.elts]
    elif isinstance(tk.types.get(id(idx)), TupleT):
        parts = [ast.Subscript(value=copy.deepcopy(idx), slice=ast.Constant(k), ctx=ast.Load())
                 for k in range(len(tk.types[id(idx)].items))]
    else:
        return copy.deepcopy(idx)
    flat = parts[0]
    for k, e in enumerate(parts[1:], start=1):
        extent = ast.Subscript(value=ast.Attribute(value=ast.Name(id=array, ctx=ast.Load()),
                                                   attr="shape", ctx=ast.Load()),
                               slice=ast.Constant(k), ctx=ast.Load())
        flat = ast.BinOp(left=ast.BinOp(left=flat, op=ast.Mult(), right=extent), op=ast.Add(),
                         right=e)
    return flat


def _store(log: str, item: str, value: ast.expr) -> ast.Assign:
    target = ast.Subscript(value=ast.Name(id=log, ctx=ast.Load()),
                           slice=ast.Name(id=item, ctx=ast.Load()), ctx=ast.Store())
    return ast.Assign(targets=[target], value=value, lineno=0)


def _array(tk: TypedKernel, name: str) -> Array:
    return tk.argtypes[tk.ir.params.index(name)]


def _device_function_names(tk: TypedKernel) -> set[str]:
    return {n for k in device_functions(tk) for n in (k.name, k.symbol)}


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, with ``_`` appended until neither it nor a name printed from it (its
    ``_shape<k>`` extents) is taken."""
    while any(t == name or t.startswith(name + "_") for t in taken):
        name += "_"
    taken.add(name)
    return name
