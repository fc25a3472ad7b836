"""Launch plans: a configured kernel's launch on one argument signature, written out as a
small Python function once the general path (``launch.prepare``) has checked and compiled it.

A plan's guards are the launch key's (``arguments.arg_key``) for its signature, tested
argument by argument without building the key: each argument's type, and for arrays their
dtype, rank and what else their kind keys on (NumPy's: writeable; CuPy's: the GPU); no
object passed twice; an ndrange of the same rank.  Then the launch's index range check
(``bounds.py``), what ``kern.source()`` shows, and the compiled kernel's own launch.  A launch
that fails a guard returns False and takes the general path, which says what is wrong;
whatever passes the guards would have found the same compiled kernel there.

>>> import numpy as np, tapegrad as tg
>>> @tg.kernel
... def double(B, A):
...     i = tg.index()
...     B[i] = 2.0 * A[i]
>>> cfg = double(tg.CPU())
>>> A, B = np.arange(4.0), np.zeros(4)
>>> cfg(B, A, ndrange=4)
>>> print(plans_of(cfg)[0].source.splitlines()[0])
def plan(args, ndrange):
"""

from __future__ import annotations

import linecache
from typing import Any

import numpy as np

from tapegrad.backends.registry import ArrayKind, kind_of
from tapegrad.runtime.show import show

MAX_PLANS = 8          # signatures per configured kernel written out (others: general path)


class Plan:
    """``plan(args, ndrange)``: True where it launched, False where a guard failed;
    ``plan.prepared(args, ndrange)``: what ``launch.prepare`` returns (for a tape, which
    records before it launches), or None where a guard failed.  ``plain_scalars``: whether
    its scalars are Python's or NumPy's numbers (a tape takes only those plans: its own
    scalars need their nodes recorded); ``recording``: the tape's recording plan for it."""

    def __init__(self, key: tuple, source: str, fn: Any, prepared: Any, plain_scalars: bool):
        self.key, self.source, self.fn, self.prepared = key, source, fn, prepared
        self.plain_scalars = plain_scalars
        self.recording: Any = None

    def __call__(self, args: tuple, ndrange: Any) -> bool:
        return self.fn(args, ndrange)


def plans_of(cfg: Any) -> list[Plan]:
    """The plans of ``cfg`` (kept in its kernel's cache, which forgets them with the kernels
    compiled for it)."""
    cache = cfg.kernel.cache
    found = cache.get(("plans", cfg))
    if found is None:
        found = cache[("plans", cfg)] = []
    return found


def make_plan(cfg: Any, args: tuple, nd: tuple[int, ...], key: tuple, launcher: Any,
              check: Any) -> Plan | None:
    """The plan of a launch the general path has just prepared under ``key`` (the existing
    one where there is one); None where a guard cannot be written (an array kind keyed per
    object, such as PyTorch's tensors) or the kernel has ``MAX_PLANS``."""
    plans = plans_of(cfg)
    for plan in plans:
        if plan.key == key:
            return plan
    if len(plans) >= MAX_PLANS:
        return None
    scope: dict[str, Any] = {"CHECK": check, "RUN": getattr(launcher, "launch", launcher),
                             "KERNEL": cfg.kernel, "LAUNCHER": launcher, "SHOW": show,
                             "BACKEND": cfg.backend}
    n = len(args)
    head = [f"    if len(args) != {n}:",
            "        return @FAIL@",
            f"    {', '.join(f'a{k}' for k in range(n))}, = args"]
    tests, arrays = [], []
    for k, a in enumerate(args):
        test = argument_guard(k, a, scope)
        if test is None:
            return None
        tests.append(test)
        if kind_of(a) is not None:
            arrays.append(k)
    tests += [f"a{j} is not a{k}" for n_, j in enumerate(arrays) for k in arrays[n_ + 1:]]
    head += [f"    if not ({' and '.join(tests)}):",
             "        return @FAIL@"]
    head += ndrange_lines(len(nd))
    head += ["    if CHECK is not None and CHECK.failing(args, nd):",
             "        return @FAIL@",
             "    if KERNEL.shown.get('primal') is not LAUNCHER" + (
                 ":" if getattr(cfg.kernel, "merged_from", None) is None else
                 " or True:   # (a merged variant: show() also looks at its origin)"),
             "        SHOW(KERNEL, 'primal', BACKEND, LAUNCHER)"]
    body = "\n".join(head)
    source = (f"def plan(args, ndrange):\n{body.replace('@FAIL@', 'False')}\n    RUN(args, nd)\n"
              f"    return True\n\n\n"
              f"def prepared(args, ndrange):\n{body.replace('@FAIL@', 'None')}\n"
              f"    return LAUNCHER, nd, KEY\n")
    scope["KEY"] = key
    define(source, f"<tapegrad launch plan {len(plans)} of {cfg.kernel.name}>", scope)
    plain_scalars = all(type(a).__module__ in ("builtins", "numpy") for a in args
                        if kind_of(a) is None)
    plan = Plan(key, source, scope["plan"], scope["prepared"], plain_scalars)
    plans.append(plan)
    return plan


def define(source: str, filename: str, scope: dict) -> None:
    """Run a plan's ``source`` in ``scope``, its lines shown in tracebacks under ``filename``."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)


def argument_guard(k: int, a: Any, scope: dict) -> str | None:
    """A test that argument ``a{k}`` has the launch key's part ``a`` has."""
    t = type(a)
    scope[f"T{k}"] = t
    kind = kind_of(a)
    if kind is None:
        if t is int:       # (past 64 bits: the general path refuses it)
            return f"type(a{k}) is T{k} and -0x8000000000000000 <= a{k} <= 0x7fffffffffffffff"
        if t is np.uint64:     # (past 2**63 - 1, as an int64 negative: refused there too)
            scope[f"U{k}"] = np.uint64(2**63 - 1)
            return f"type(a{k}) is T{k} and a{k} <= U{k}"
        return f"type(a{k}) is T{k}"
    if kind.per_object(a):
        return None
    scope[f"D{k}"] = a.dtype
    test = f"type(a{k}) is T{k} and a{k}.dtype is D{k} and a{k}.ndim == {a.ndim}"
    if t is np.ndarray:
        return test + (" and a{k}.flags.writeable" if a.flags.writeable else
                       " and not a{k}.flags.writeable").format(k=k)
    if t.__module__.startswith("cupy"):
        return test + f" and a{k}.device.id == {a.device.id}"
    if t.__module__.startswith("pyopencl"):       # (its launch key's queue: the same object)
        scope[f"Q{k}"] = a.queue
        return test + f" and a{k}.queue is Q{k}"
    if type(kind).launch_key is ArrayKind.launch_key:
        return test
    scope[f"KEY{k}"], scope[f"KIND{k}"] = kind.launch_key(a), kind
    return f"type(a{k}) is T{k} and KIND{k}.launch_key(a{k}) == KEY{k}"


def ndrange_lines(rank: int) -> list[str]:
    """``nd``, the ndrange as a tuple of ``rank`` positive ints, or a return to the general
    path (which also handles empty launches)."""
    if rank == 1:
        return ["    if type(ndrange) is int and ndrange > 0:",
                "        nd = (ndrange,)",
                "    elif type(ndrange) is tuple and len(ndrange) == 1 and "
                "type(ndrange[0]) is int and ndrange[0] > 0:",
                "        nd = ndrange",
                "    else:",
                "        return @FAIL@"]
    extents = [f"ndrange[{d}]" for d in range(rank)]
    ints = " and ".join(f"type({e}) is int and {e} > 0" for e in extents)
    return [f"    if type(ndrange) is not tuple or len(ndrange) != {rank} or not ({ints}):",
            "        return @FAIL@",
            "    nd = ndrange"]
