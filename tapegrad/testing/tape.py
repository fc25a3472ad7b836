"""``check_tape``: every launch of a program checked on its own, so that "the gradient of my
500-launch simulation is off" becomes "the adjoint of this kernel at sim.py:42 is wrong".

The program runs once with every primal launch watched (``runtime.nans.collecting``): before
it runs, a float64 host copy of each of its arguments is kept, with the user's line.  Then
each launch is checked alone, on those copies, against central finite differences of that
launch: with random ``v`` (a direction for every float input) and ``w`` (a weight for every
float array after the launch), its adjoint (``tg.autodiff`` in reverse mode, every float array
``Duplicated`` with the seed ``w``, every float number ``Active``) gives ``<J^T w, v>``, its
tangent (forward mode, the shadows ``v``) gives ``<w, J v>``, and the launch run on the copies
moved by ``+h v`` and ``-h v`` gives ``<w, F(x + h v) - F(x - h v)> / 2h``, with ``h = eps``
and each input's part of ``v`` scaled by its own size (``max(1, its largest magnitude)``), so
that each input moves by ``eps`` times its own size (a frequency of 1000 beside an x in
[0, 1) moves x by ``eps``, not ``1000 eps``).  Functions made with ``tg.register_adjoint``
are checked the same way, their rules against ``fn``, and held to what the tape accepts of
them (``tape/registry.py``: one cotangent per argument, each of its argument's shape).  One
random direction tests every element at once: a wrong rule agrees with it only by chance.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from tapegrad.api import autodiff
from tapegrad.backends.registry import kind_of
from tapegrad.callers import user_line
from tapegrad.errors import KernelError, TapegradError
from tapegrad.runtime.arguments import write_only
from tapegrad.runtime.nans import collecting, uncollected
from tapegrad.tape.activity import Active, Const, Duplicated, Forward, Reverse
from tapegrad.tape.arrays import is_array
from tapegrad.tape.registry import check_count, check_like, check_result
from tapegrad.tracebacks import api_boundary


@dataclass
class _Launch:
    cfg: Any
    args: list            # host copies (float arrays in float64); aliases share one copy
    ndrange: Any
    where: str

    @property
    def name(self) -> str:
        return f"the launch of kernel {self.cfg.kernel.name} at {self.where}"


@dataclass
class _Op:
    label: str
    fn: Callable[..., Any]
    reverse: Callable[..., Any]
    forward: Callable[..., Any] | None
    args: list
    where: str
    widened: list         # per argument: its host copy has another dtype (float32 -> float64)

    @property
    def name(self) -> str:
        return f"the registered adjoint {self.label} called at {self.where}"


class _Collector:
    def __init__(self) -> None:
        self.seen: list[Any] = []

    def launch(self, cfg: Any, args: tuple, ndrange: Any) -> None:
        self.seen.append(_Launch(cfg, _host_copies(args), ndrange, user_line()))

    def op(self, label: str, fn: Callable[..., Any], reverse: Callable[..., Any],
           forward: Callable[..., Any] | None, args: list) -> None:
        copies = _host_copies(args)
        widened = [getattr(a, "dtype", None) != getattr(c, "dtype", None)
                   for a, c in zip(args, copies)]
        self.seen.append(_Op(label, fn, reverse, forward, copies, user_line(), widened))


def _host_copies(args: Any) -> list:
    """Host copies of ``args``, float arrays as float64; one copy per array object."""
    copies: dict[int, Any] = {}
    out = []
    for a in args:
        kind = kind_of(a)
        if kind is None:     # (a tape's or forward mode's scalar: its value)
            out.append(float.__float__(a) if isinstance(a, float) else a)
            continue
        if id(a) not in copies:
            host = np.array(kind.to_numpy(a))
            copies[id(a)] = host.astype(np.float64) if host.dtype.kind == "f" else host
        out.append(copies[id(a)])
    return out


@api_boundary
def check_tape(f: Callable[..., Any], *args: Any, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-9, seed: int = 0, forward: bool = True) -> int:
    """Run ``f(*args)`` once and check the adjoint (and, with ``forward``, the tangent) of
    each kernel launch it makes, and the rules of each ``tg.register_adjoint`` function it
    calls, against central finite differences of that launch alone, in float64, along a
    random direction.  Returns how many were checked; the first that disagrees is an
    ``AssertionError`` naming it, its line and both numbers.  Captured functions run as plain
    ones; launches inside ``tg.checkpoint_loop`` steps are checked too.  Every launch's
    arguments are copied to the host: use a small problem.

    >>> import numpy as np, tapegrad as tg
    >>> @tg.kernel
    ... def cube(out, x):
    ...     i = tg.index()
    ...     out[i] = x[i] * x[i] * x[i]
    >>> def simulate(x):
    ...     y = np.empty_like(x)
    ...     cube(tg.CPU())(y, x, ndrange=x.size)
    ...     return tg.sum(y)
    >>> tg.testing.check_tape(simulate, np.array([0.5, 1.5]))
    1
    """
    with collecting(_Collector()) as collector:
        f(*args)
    rng = np.random.default_rng(seed)
    checked = 0
    for k, seen in enumerate(collector.seen):
        check = _check_launch if isinstance(seen, _Launch) else _check_op
        checked += check(seen, rng, eps, rtol, atol, forward,
                         f"{k + 1} of {len(collector.seen)}") is not False
    return checked


def _is_float_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _check_launch(seen: _Launch, rng: Any, eps: float, rtol: float, atol: float,
                  forward: bool, number: str) -> bool | None:
    """Check one launch; False where it could not be (``check_tape`` warns), else None."""
    backend = seen.cfg.backend
    arrays = list(dict.fromkeys(id(a) for a in seen.args if _is_float_array(a)))
    scalar_at = [k for k, a in enumerate(seen.args) if isinstance(a, float) and np.isfinite(a)]
    if not arrays and not scalar_at:
        return                                     # nothing differentiable
    by_id = {id(a): a for a in seen.args if isinstance(a, np.ndarray)}

    def on_device(moved: dict[int, Any]) -> tuple[list, dict]:
        """The arguments on the launch's backend (one object per array), from ``moved``."""
        made: dict[int, Any] = {}
        out = []
        for a in seen.args:
            if isinstance(a, np.ndarray):
                if id(a) not in made:
                    made[id(a)] = backend.asarray(np.array(moved.get(id(a), a)))
                out.append(made[id(a)])
            else:
                out.append(a)
        return out, made

    def after(moved: dict[int, Any], scalars: dict[int, float]) -> dict[int, np.ndarray]:
        args, made = on_device(moved)
        for k, value in scalars.items():
            args[k] = value
        seen.cfg(*args, ndrange=seen.ndrange)
        return {i: np.asarray(backend.to_numpy(made[i]), dtype=np.float64) for i in arrays}

    # directions only where the inputs are finite and read (an array the kernel only writes
    # holds whatever memory held), weights only where the outputs are finite (an infinity
    # would make every difference NaN); each input's part of the direction scaled by its own
    # size, so that the step eps moves each by eps times its own size (one scale for all would
    # move an x in [0, 1) by 1e-3 beside a frequency of 1000: sin(1000 x) by a radian)
    unread = {id(a) for k, a in enumerate(seen.args) if k in write_only(seen.cfg.kernel)}
    base = after({}, {})
    v = {i: np.where(np.isfinite(by_id[i]) & (i not in unread),
                     rng.standard_normal(by_id[i].shape), 0.0) for i in arrays}
    w = {i: np.where(np.isfinite(base[i]), rng.standard_normal(by_id[i].shape), 0.0)
         for i in arrays}
    v_scalar = {k: float(rng.standard_normal()) * max(1.0, abs(seen.args[k]))
                for k in scalar_at}
    for i in arrays:
        v[i] *= max(1.0, float(np.max(np.abs(by_id[i][v[i] != 0]), initial=0.0)))
    h = eps

    def weighted(step: float) -> float:
        moved = {i: by_id[i] + step * v[i] for i in arrays}
        outs = after(moved, {k: seen.args[k] + step * v_scalar[k] for k in scalar_at})
        return sum(float(np.vdot(w[i], np.where(w[i] != 0, outs[i], 0.0))) for i in arrays)

    fd = (weighted(h) - weighted(-h)) / (2 * h)

    args, made = on_device({})
    shadows = {i: backend.asarray(np.array(w[i])) for i in arrays}
    annotated = [Duplicated(made[id(a)], shadows[id(a)]) if id(a) in shadows and
                 isinstance(a, np.ndarray) else Active(a) if k in v_scalar else x
                 for k, (a, x) in enumerate(zip(seen.args, args))]
    try:
        (derivs,) = autodiff(Reverse, seen.cfg, Const, *annotated, ndrange=seen.ndrange)
    except KernelError as e:
        if not getattr(e, "varying_only", False):
            raise AssertionError(f"check_tape, launch {number}: {seen.name}: its adjoint "
                                 f"cannot run: {e}") from e
        # (with every float argument varying, as here, tg.atomic_max of data the program
        # keeps constant has no derivative: where the program's gradient needs one,
        # tg.gradient refuses it at its line)
        warnings.warn(f"check_tape, launch {number}: {seen.name}: not checked: tapegrad cannot "
                      f"differentiate it with every float argument varying ({e})", stacklevel=4)
        return False
    except TapegradError as e:
        raise AssertionError(f"check_tape, launch {number}: {seen.name}: its adjoint cannot "
                             f"run: {e}") from e
    reverse = sum(float(np.vdot(np.asarray(backend.to_numpy(shadows[i]), np.float64), v[i]))
                  for i in arrays) + sum(derivs[k] * v_scalar[k] for k in scalar_at)
    _compare(seen.name, number, "its adjoint (reverse mode) gives <J^T w, v> =", reverse, fd,
             rtol, atol)
    if not forward:
        return
    args, made = on_device({})
    tangents = {i: backend.asarray(np.array(v[i])) for i in arrays}
    annotated = [Duplicated(made[id(a)], tangents[id(a)]) if id(a) in tangents and
                 isinstance(a, np.ndarray) else Duplicated(a, v_scalar[k]) if k in v_scalar
                 else x for k, (a, x) in enumerate(zip(seen.args, args))]
    try:
        autodiff(Forward, seen.cfg, Const, *annotated, ndrange=seen.ndrange)
    except TapegradError:
        return                    # (no forward mode for this kernel: its adjoint was checked)
    tangent = sum(float(np.vdot(w[i], np.asarray(backend.to_numpy(tangents[i]), np.float64)))
                  for i in arrays)
    _compare(seen.name, number, "its tangent (forward mode) gives <w, J v> =", tangent, fd,
             rtol, atol)


def _check_op(seen: _Op, rng: Any, eps: float, rtol: float, atol: float, forward: bool,
              number: str) -> None:
    args = seen.args
    # what the tape refuses (tape/registry.py) is refused here too: fn returning its argument
    # or a tuple (an argument widened to float64 here is not the caller's array:
    # np.asarray(x, np.float64) may return it), too few cotangents, a cotangent or tangent of
    # another shape than what it stands for (NumPy would broadcast it below)
    with uncollected():          # (the kernels fn launches: its rules stand for them)
        result = seen.fn(*args)
    with _refused(seen, number):
        check_result(seen.label, result,
                     [None if widened else a for a, widened in zip(args, seen.widened)])
    y = np.asarray(result, dtype=np.float64)
    w = np.where(np.isfinite(y), rng.standard_normal(y.shape), 0.0)
    with uncollected():
        returned = seen.reverse(w if y.ndim else float(w), *args)
    with _refused(seen, number):
        cotangents = check_count(seen.label, returned, len(args))
        # the arguments with a cotangent vary (None: a constant, which the rule may say)
        moving = [k for k, a in enumerate(args) if (_is_float_array(a) or isinstance(a, float))
                  and cotangents[k] is not None]
        for k in moving:
            check_like(seen.label, "reverse rule's cotangent", k, cotangents[k],
                       args[k] if np.ndim(args[k]) else None)
    # each argument's part of the direction scaled by its own size (as for a launch)
    v = {k: np.where(np.isfinite(args[k]), rng.standard_normal(np.shape(args[k])), 0.0) *
         max(1.0, float(np.max(np.abs(np.asarray(args[k])[np.isfinite(args[k])]),
                               initial=0.0)))
         for k in moving}
    h = eps

    def along(step: float) -> list:
        return [a + step * (v[k] if np.ndim(a) else float(v[k])) if k in v else a
                for k, a in enumerate(args)]

    def weighted(step: float) -> float:
        with uncollected():
            out = np.asarray(seen.fn(*along(step)), dtype=np.float64)
        return float(np.vdot(w, np.where(w != 0, out, 0.0)))

    fd = (weighted(h) - weighted(-h)) / (2 * h)
    reverse = sum(float(np.vdot(np.asarray(cotangents[k], np.float64), v[k])) for k in moving)
    _compare(seen.name, number, "its reverse rule gives <J^T w, v> =", reverse, fd, rtol, atol)
    if forward and seen.forward is not None:
        dots = [(v[k] if np.ndim(a) else float(v[k])) if k in v else None
                for k, a in enumerate(args)]
        with uncollected():
            rule_says = seen.forward(*args, *dots)
        with _refused(seen, number):
            check_like(seen.label, "forward rule's tangent", None, rule_says,
                       result if is_array(result) else None)
        tangent = float(np.vdot(w, np.asarray(rule_says, np.float64)))
        _compare(seen.name, number, "its forward rule gives <w, J v> =", tangent, fd, rtol,
                 atol)


@contextmanager
def _refused(seen: _Op, number: str) -> Iterator[None]:
    """The tape's refusal of a registered function's rule as check_tape's failure."""
    try:
        yield
    except TapegradError as e:
        raise AssertionError(f"check_tape, launch {number}: {seen.name}: {e}") from e


def agrees(got: float, reference: float, atol: float, rtol: float, scale: float) -> bool:
    """Whether the derivative ``got`` agrees with its ``reference``: both finite and within
    ``atol + rtol * scale``, or the same infinity.  A NaN never agrees, nor does an infinity
    with a finite number (``abs(got - ref) > bound`` is False for a NaN, and an infinite
    ``got`` in ``scale`` would make the bound infinite)."""
    if math.isfinite(got) and math.isfinite(reference):
        return abs(got - reference) <= atol + rtol * scale
    return got == reference


def disagreement(got: float, reference: float, atol: float, rtol: float, scale: str) -> str:
    """Why ``agrees`` said no, for the message."""
    if math.isfinite(got) and math.isfinite(reference):
        return f"|difference| {abs(got - reference):.3g} > atol {atol} + rtol {rtol} * {scale}"
    return "not both finite: a NaN agrees with nothing, an infinity only with the same one"


def _compare(name: str, number: str, says: str, got: float, fd: float, rtol: float,
             atol: float) -> None:
    if not agrees(got, fd, atol, rtol, max(abs(fd), abs(got))):
        raise AssertionError(
            f"check_tape, launch {number}: {name}: {says} {got!r}, central finite differences "
            f"of that launch alone {fd!r} ({disagreement(got, fd, atol, rtol, 'max')}); v and "
            "w are random directions and weights, float64")
