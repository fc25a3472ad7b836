"""Autodiff plans: ``tg.autodiff`` of one configured kernel in one mode on one argument
signature, written out as a small Python function once the general path
(``launches.autodiff_kernel``) has checked such a call and found how it runs.

A plan's guards, per argument: its annotation's class (a bare value is a ``Const``), its
value's and its shadow's (forward mode: tangent's) type, dtype, rank and what else their kind
keys on (as a launch plan's, ``runtime/plans.py``), an array's shadow of its shape and on the
kernel's backend (a device's: C-contiguous); no object passed twice; an ndrange of the same
rank (in reverse mode, cutting a workgroup exactly when the plan's did: the adjoint differs).
Then, per call: the arrays and shadows in memory apart, the launch's index check.  A call that
fails any of them takes the general path, which says what is wrong; one that passes runs what
the general path found: in reverse mode (``ReverseRun``) the primal launch where its results
are wanted, then the adjoint; in forward mode the tangent's launch.  So a loop that calls
``tg.autodiff`` on the same kinds of arrays pays the checks' full cost once
(docs/autodiff.md).

>>> import numpy as np, tapegrad as tg
>>> @tg.kernel
... def square(B, A):
...     i = tg.index()
...     B[i] = A[i] * A[i]
>>> cfg = square(tg.CPU())
>>> A, dA, B, dB = np.arange(3.0), np.zeros(3), np.zeros(3), np.ones(3)
>>> for _ in range(2):
...     _ = tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, dB.copy()),
...                     tg.Duplicated(A, dA), ndrange=3)
>>> dA.tolist(), len(plans_of(cfg))
([0.0, 4.0, 8.0], 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.adjoint import adjoint_again, adjoint_of, run_adjoint
from tapegrad.runtime.arguments import groupsize_of
from tapegrad.runtime.plans import argument_guard, define, ndrange_lines
from tapegrad.runtime.tangent import launch_tangent
from tapegrad.tape.activity import Active, Annotation, BatchDuplicated, Const, Duplicated
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import disjoint

MAX_PLANS = 4          # signatures per configured kernel and mode written out


class ReverseRun(NamedTuple):
    """How a reverse-mode ``tg.autodiff`` of a launch runs, as its checks found it (a named
    tuple: the general path makes one per call)."""

    activity: tuple[str, ...]
    primal: bool                  # the primal launch runs first (its results are wanted)
    overwritten: tuple[str, ...]  # inputs it overwrites whose old contents the adjoint reads
    seeds: frozenset[str]         # accumulate=False: the shadows that are seeds
    found: tuple | None           # the adjoint (adjoint_of), where it runs on the given arrays


def run_reverse(cfg: Any, how: ReverseRun, given: tuple, values: tuple,
                shadows: dict[str, Any], nd: tuple[int, ...], accumulate: bool
                ) -> dict[str, float]:
    """The primal launch (if needed), then the adjoint; the Active scalars' derivatives.
    ``given``: the arguments as passed (a tape or forward mode around the call records the
    primal launch on them), ``values``: as plain values."""
    found, seeds = how.found, how.seeds
    seen = values
    if how.primal:
        # arrays the kernel reads and overwrites: the adjoint needs their contents from before
        params = kernel_ir(cfg.kernel).params
        old = {p: values[params.index(p)].copy() for p in how.overwritten}
        cfg(*given, ndrange=nd)                                     # the primal launch
        if old:
            seen = tuple(old.get(p, v) for p, v in zip(params, values))
    if accumulate:
        return run_adjoint(cfg, seen, shadows, how.activity, nd, found=found)   # the adjoint
    # the seeds' consumed elements need no zeros; if the adjoint still writes a seed (stores
    # twice, or reads the array), it gets a copy: the caller's stays as it was
    found = found or adjoint_of(cfg, seen, how.activity, nd, seeds)
    adjoint = found[0].adjoint
    for s, p in adjoint.shadow_of.items():
        if p in seeds and s in adjoint.shadows_written:
            shadows[p] = shadows[p].copy()
    return run_adjoint(cfg, seen, shadows, how.activity, nd, discard=seeds,
                       fresh=frozenset(shadows) - seeds, found=found)


def derivatives(active: tuple, params: list[str], scalars: dict[str, float]) -> tuple:
    """One entry per argument: an Active scalar's derivative (of its value's type, where that
    is a NumPy float; ``active[k]`` is the value), else None."""
    return tuple(None if v is None else type(v)(scalars[p]) if isinstance(v, np.floating)
                 else scalars[p] for v, p in zip(active, params))


@dataclasses.dataclass
class AutodiffPlan:
    """``fn(args, ndrange)``: ``(values, dvals, nd)`` where the guards pass, else None (the
    ``dvals``: the shadows, or in forward mode the tangents, of the Duplicated arguments)."""

    fn: Callable[[tuple, Any], tuple | None]
    source: str
    dval_params: tuple[str, ...]  # the Duplicated parameters, in order
    arrays: tuple[int, ...]       # positions of the values that are arrays
    floats: tuple[int, ...]       # positions of float subclasses (np.float64): passed plain
    dval_arrays: tuple[int, ...]  # positions in dvals of those that are arrays
    active: tuple[bool, ...]      # per argument: Active
    check: Any                    # the launch's index check (runtime/bounds.py), or None
    how: ReverseRun | None        # reverse mode: how it runs
    tangent: tuple | None         # forward mode: the compiled tangent (run_tangent's)


def plans_of(cfg: Any, reverse: bool = True, accumulate: bool = True) -> list[AutodiffPlan]:
    """The autodiff plans of ``cfg`` for one mode (kept in its kernel's cache, which forgets
    them with the kernels compiled for it)."""
    return cfg.kernel.cache.setdefault(("autodiff plans", cfg, reverse, accumulate), [])


def autodiff_by_plan(mode: Any, cfg: Any, ret: Any, args: tuple, ndrange: Any,
                     accumulate: bool) -> tuple | None:
    """``tg.autodiff(mode, cfg, ret, *args, ...)`` by a plan, or None where no plan's guards
    pass (then the general path runs)."""
    plans = cfg.kernel.cache.get(("autodiff plans", cfg, mode.reverse, accumulate))
    if not plans or not (ret is Const or type(ret) is Const):
        return None
    for plan in plans:
        got = plan.fn(args, ndrange)
        if got is not None:
            break
    else:
        return None
    given, dvals, nd = got
    values = given
    if plan.floats:          # (as the general path: tape.scalars.plain)
        values = tuple(float.__float__(v) if k in plan.floats else v
                       for k, v in enumerate(given))
    if not disjoint([values[k] for k in plan.arrays] + [dvals[k] for k in plan.dval_arrays]):
        return None
    if plan.check is not None and plan.check.failing(values, nd):
        return None
    if not mode.reverse:     # (a scalar's tangent as a float, as the general path passes it)
        launch_tangent(cfg, plan.tangent, values,
                       {p: (d if m in plan.dval_arrays else float(d),)
                        for m, (p, d) in enumerate(zip(plan.dval_params, dvals))}, nd)
        return (None,) if mode.with_primal else ()
    how = plan.how
    if how.found is not None:           # (the adjoint is compiled again for a deeper stack)
        found = adjoint_again(cfg.kernel, cfg.backend, how.found)
        if found is None or found[0] is not how.found[0]:
            how = how._replace(found=found)
            if found is not None:
                plan.how = how
    params = kernel_ir(cfg.kernel).params
    scalars = run_reverse(cfg, how, given, values, dict(zip(plan.dval_params, dvals)), nd,
                          accumulate)
    derivs = derivatives(tuple(v if a else None for v, a in zip(given, plan.active)), params,
                         scalars)
    return (derivs,) if not mode.with_primal else (derivs, None)


def _layout_guard(j: int, d: Any) -> str | None:
    """The test that device shadow (or tangent) ``a{j}`` is still C-contiguous, as the
    general path's ``launches.check_layout`` found it: a view that skips elements takes the
    general path, which refuses it before anything runs (CuPy's flag read without building
    its flags object).  None for host arrays, which may have any strides."""
    kind = kind_of(d)
    if kind is None or kind.host or getattr(d, "flags", None) is None:
        return None
    if type(d).__module__.startswith("cupy"):
        return f"a{j}._c_contiguous"
    return f"a{j}.flags.c_contiguous"


def remember(cfg: Any, args: tuple, check: Any, nd: tuple[int, ...], *,
             how: ReverseRun | None = None, accumulate: bool = True,
             tangent: tuple | None = None) -> None:
    """Write the plan of a call the general path has just run over ``nd``: in reverse mode
    (``how``, ``accumulate``) or forward mode (``tangent``); ``check``: the launch's index
    check.  Nothing where an argument cannot be guarded by type (a PyTorch tensor, several
    tangents), an object is passed twice, or ``MAX_PLANS`` are written."""
    plans = plans_of(cfg, how is not None, accumulate)
    if len(plans) >= MAX_PLANS or cfg.kernel.merged_from is not None:
        return       # (a merged variant's plans would never be looked up)
    for raw in args:   # (a tape's or forward mode's scalar: each call is recorded)
        value = raw.val if isinstance(raw, Annotation) else raw
        if not is_array(value) and type(value).__module__ not in ("builtins", "numpy"):
            return
    if any(plan.fn(args, nd) is not None for plan in plans):
        return       # (covered already: the call failed a per-call check)
    n = len(args)
    scope: dict[str, Any] = {"OWNS": cfg.backend.owns}
    lines = [f"    if len(args) != {n}:",
             "        return None",
             f"    {', '.join(f'r{k}' for k in range(n))}, = args"]
    arrays, dvals, dval_params, dval_arrays, active, held, floats = [], [], [], [], [], [], []
    params = kernel_ir(cfg.kernel).params
    for k, raw in enumerate(args):
        if isinstance(raw, BatchDuplicated):
            return
        value = raw.val if isinstance(raw, Annotation) else raw
        if isinstance(raw, Annotation):
            scope[f"A{k}"] = type(raw)
            lines += [f"    if type(r{k}) is not A{k}:",
                      "        return None",
                      f"    a{k} = r{k}.val"]
        else:
            lines.append(f"    a{k} = r{k}")
        tests = [argument_guard(k, value, scope)]
        if is_array(value):
            arrays.append(k)
            held.append(value)
        if isinstance(raw, Duplicated):
            j, dval = n + len(dvals), raw.dval
            lines.append(f"    a{j} = r{k}.dval")
            tests.append(argument_guard(j, dval, scope))
            if is_array(value):     # (a scalar's tangent may be a 0-d array: float() of it)
                tests.append(f"a{j}.shape == a{k}.shape")
                if not (type(dval) is np.ndarray or type(dval).__module__.startswith("cupy")):
                    tests.append(f"OWNS(a{j})")   # (NumPy's: the CPU's; CuPy's: device guarded)
                layout = _layout_guard(j, dval)
                if layout is not None:
                    tests.append(layout)
                dval_arrays.append(len(dvals))
                held.append(dval)
            dvals.append(f"a{j}")
            dval_params.append(params[k])
        if None in tests:
            return
        lines += [f"    if not ({' and '.join(tests)}):",
                  "        return None"]
        active.append(isinstance(raw, Active))
        if isinstance(value, float) and type(value) is not float:
            floats.append(k)
    if len({id(x) for x in held}) < len(held):
        return
    objects = [f"a{k}" for k in arrays] + [dvals[m] for m in dval_arrays]
    distinct = [f"{x} is not {y}" for m, x in enumerate(objects) for y in objects[m + 1:]]
    if distinct:
        lines += [f"    if not ({' and '.join(distinct)}):",
                  "        return None"]
    lines += [line.replace("@FAIL@", "None") for line in ndrange_lines(len(nd))]
    if how is not None:     # (an adjoint is compiled for whole workgroups or a cut one)
        wgs = groupsize_of(cfg, len(nd))
        whole = " and ".join(f"nd[{d}] % {w} == 0" for d, w in enumerate(wgs))
        lines += [f"    if {'not ' if all(n % w == 0 for n, w in zip(nd, wgs)) else ''}"
                  f"({whole}):",
                  "        return None"]
    lines.append(f"    return ({''.join(f'a{k}, ' for k in range(n))}), "
                 f"[{', '.join(dvals)}], nd")
    source = "def plan(args, ndrange):\n" + "\n".join(lines) + "\n"
    mode = "forward" if how is None else "reverse" if accumulate else \
        "reverse, accumulate=False"
    define(source, f"<tapegrad autodiff plan {len(plans)} of {cfg.kernel.name} ({mode})>", scope)
    plans.append(AutodiffPlan(scope["plan"], source, tuple(dval_params), tuple(arrays),
                              tuple(floats), tuple(dval_arrays), tuple(active), check, how,
                              tangent))
