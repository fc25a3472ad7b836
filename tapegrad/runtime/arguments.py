"""A launch's arguments, ndrange and workgroup size: checked once, then keyed for the caches.

Every error here is the user's, said at the user's line: a wrong count, a read-only array the
kernel writes, an array on another device, an unsupported dtype or rank, a bad ndrange or
workgroup size.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tapegrad.ad import normalize
from tapegrad.ad.access import array_access
from tapegrad.backends.registry import array_kind, is_array, kind_of
from tapegrad.errors import LaunchError
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
)

SUPPORTED_DTYPES = ("float32", "float64", "int32", "int64", "bool")


def check_args(kernel: Any, backend: Any, args: tuple) -> tuple[Type, ...]:
    """Check a launch's arguments and return their kernel types (no array is touched);
    remembered per argument key, since a tape checks every launch it records."""
    key = ("argtypes", backend, arg_key(args))
    types = kernel.cache.get(key)
    if types is None:
        params = kernel_ir(kernel).params
        if len(args) != len(params):
            raise LaunchError(f"{kernel.name} takes {len(params)} argument(s) "
                              f"({', '.join(params)}), got {len(args)}")
        types = tuple(argtype(kernel, backend, name, a) for name, a in zip(params, args))
        kernel.cache[key] = types
    return types


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
        raise LaunchError(f"{kernel.name}: argument {name} is a NumPy {a.dtype} number; kernels "
                          f"take float32 and float64 numbers (np.float64({name}), or a Python "
                          "float, which takes the precision of the data it meets)")
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        if isinstance(a, np.ma.MaskedArray):
            raise LaunchError(f"{kernel.name}: argument {name} is a {masked_array(name)}")
        if not backend.owns(a):
            raise LaunchError(f"{kernel.name}: " + (backend.not_here(name, a) or (
                f"argument {name} is a {type(a).__name__}, which does not live on "
                f"{backend!r}; move it with tg.asarray({backend!r}, {name}) or launch on "
                f"tg.get_backend({name})")))
        dtype = array_kind(a, "a kernel launch").dtype(a)     # (a torch dtype is not NumPy's)
        dt = dtype.name
        if not dtype.isnative:
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


def masked_array(name: str) -> str:
    """What to say of a ``numpy.ma.MaskedArray`` passed as ``name`` (after "... is a")."""
    return (f"numpy.ma.MaskedArray; kernels take plain arrays and would ignore its mask. Pass "
            f"its data, np.ma.getdata({name}) (a view: the kernel's stores reach it; the mask "
            f"is left as it is), or {name}.filled(value) (a copy, value where it is masked)")


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


def write_only(kernel: Any) -> frozenset[int]:
    """The positions of the parameters the kernel writes with plain stores and never reads
    (``access`` counts atomics' targets and updates in place, ``A[i] += x``, as read: what is
    there matters); cached on the kernel."""
    found = kernel.cache.get("write only")
    if found is None:
        reads, writes = access(kernel)
        found = kernel.cache["write only"] = frozenset(
            k for k, p in enumerate(kernel_ir(kernel).params)
            if p in writes and p not in reads)
    return found


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_LIMIT = np.uint64(_INT64_MAX)     # (np.uint64 compared with its own type: exact)


def arg_key(args: tuple) -> tuple:
    """What a compiled kernel depends on: each argument's type, and for arrays also what
    their kind says (``ArrayKind.launch_key``: dtype and rank, and for NumPy's whether it is
    writeable and in native byte order).  An array no backend owns is refused; an int past
    64 bits (a Python int, or an ``np.uint64`` past ``2**63 - 1``, which kernels would take
    as a negative int64) raises OverflowError (the launch's caller names the argument:
    kernels.py)."""
    key = []
    for a in args:
        t = type(a)
        if t is float or t is int:             # the common scalars, without the checks below
            if t is int and not _INT64_MIN <= a <= _INT64_MAX:
                raise OverflowError(f"int argument {a} does not fit in 64 bits")
            key.append(t)
        elif t is np.ndarray:                  # the common arrays, as NumPy's kind keys them
            dtype = a.dtype
            key.append((t, dtype.num, a.ndim, a.flags.writeable, dtype.isnative))
        else:
            kind = kind_of(a)
            if kind is not None:
                key.append(kind.launch_key(a))
            elif is_array(a):
                array_kind(a, "a kernel launch")     # (raises: no backend owns it)
            else:
                if t is np.uint64 and a > _UINT64_LIMIT:     # (it would wrap negative)
                    raise OverflowError(f"int argument {a} does not fit in 64 bits")
                key.append(t)
    return tuple(key)


def ndrange_of(kernel: Any, ndrange: Any) -> tuple[int, ...]:
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


def groupsize_of(cfg: Any, rank: int) -> tuple[int, ...]:
    known = cfg.__dict__.get("_groupsizes")
    if known is None:
        known = cfg._groupsizes = {}
    wgs = known.get(rank)
    if wgs is None:
        # (a configured kernel is often made per launch: kern(tg.CPU(), (8, 16)) in a loop;
        # the check, once per groupsize, rank and backend)
        given = cfg.workgroupsize
        key = (given if isinstance(given, (int, tuple)) else None, rank, cfg.backend)
        wgs = _CHECKED.get(key) if key[0] is not None else None
        if wgs is None:
            wgs = _checked_groupsize(cfg, rank)
            if key[0] is not None and len(_CHECKED) < 1024:
                _CHECKED[key] = wgs
        known[rank] = wgs
    return wgs


_CHECKED: dict[tuple, tuple[int, ...]] = {}


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
    limit, items = cfg.backend.max_group_items, math.prod(int(x) for x in w)
    if limit is not None and items > limit:
        raise LaunchError(f"{cfg.kernel.name}: workgroupsize {wgs!r} has {items} work-items but "
                          f"{cfg.backend.name} allows at most {limit} per workgroup; use a "
                          f"smaller one, e.g. workgroupsize={_SMALLER.get(rank, 64)}")
    return tuple(int(x) for x in w)
