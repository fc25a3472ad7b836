"""``check_tape``: every launch of a program checked on its own, so that "the gradient of my
500-launch simulation is off" becomes "the adjoint of this kernel at sim.py:42 is wrong".

The program runs once with every primal launch watched (``runtime.nans.collecting``): before
it runs, a float64 host copy of each of its arguments is kept, with the user's line.  Then
each launch is checked alone, on those copies, against central finite differences of that
launch: with random ``v`` (a direction for every float input) and ``w`` (a weight for every
float array after the launch), its adjoint (``tg.autodiff`` in reverse mode, every float array
``Duplicated`` with the seed ``w``, every float number ``Active``) gives ``<J^T w, v>``, its
tangent (forward mode, the shadows ``v``) gives ``<w, J v>``, and the launch run on the copies
moved by ``+h v`` and ``-h v`` gives ``<w, F(x + h v) - F(x - h v)> / 2h``.  Functions made
with ``tg.register_adjoint`` are checked the same way, their rules against ``fn``.  One random
direction tests every element at once: a wrong rule agrees with it only by chance.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tapegrad.api import autodiff
from tapegrad.backends.registry import kind_of
from tapegrad.callers import user_line
from tapegrad.errors import TapegradError
from tapegrad.runtime.nans import collecting
from tapegrad.tape.activity import Active, Const, Duplicated, Forward, Reverse


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
        self.seen.append(_Op(label, fn, reverse, forward, _host_copies(args), user_line()))


def _host_copies(args: Any) -> list:
    """Host copies of ``args``, float arrays as float64; one copy per array object."""
    copies: dict[int, Any] = {}
    out = []
    for a in args:
        kind = kind_of(a)
        if kind is None:
            out.append(float(a) if isinstance(a, float) else a)
            continue
        if id(a) not in copies:
            host = np.array(kind.to_numpy(a))
            copies[id(a)] = host.astype(np.float64) if host.dtype.kind == "f" else host
        out.append(copies[id(a)])
    return out


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
    for k, seen in enumerate(collector.seen):
        check = _check_launch if isinstance(seen, _Launch) else _check_op
        check(seen, rng, eps, rtol, atol, forward, f"{k + 1} of {len(collector.seen)}")
    return len(collector.seen)


def _is_float_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind == "f"


def _check_launch(seen: _Launch, rng: Any, eps: float, rtol: float, atol: float,
                  forward: bool, number: str) -> None:
    backend = seen.cfg.backend
    arrays = list(dict.fromkeys(id(a) for a in seen.args if _is_float_array(a)))
    if not arrays and not any(isinstance(a, float) for a in seen.args):
        return                                     # nothing differentiable
    by_id = {id(a): a for a in seen.args if isinstance(a, np.ndarray)}
    v = {i: rng.standard_normal(by_id[i].shape) for i in arrays}
    w = {i: rng.standard_normal(by_id[i].shape) for i in arrays}
    scalar_at = [k for k, a in enumerate(seen.args) if isinstance(a, float)]
    v_scalar = {k: float(rng.standard_normal()) for k in scalar_at}

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

    def weighted(h: float) -> float:
        moved = {i: by_id[i] + h * v[i] for i in arrays}
        args, made = on_device(moved)
        for k in scalar_at:
            args[k] = seen.args[k] + h * v_scalar[k]
        seen.cfg(*args, ndrange=seen.ndrange)
        return sum(float(np.vdot(w[i], backend.to_numpy(made[i]))) for i in arrays)

    fd = (weighted(eps) - weighted(-eps)) / (2 * eps)

    args, made = on_device({})
    shadows = {i: backend.asarray(np.array(w[i])) for i in arrays}
    annotated = [Duplicated(made[id(a)], shadows[id(a)]) if id(a) in shadows and
                 isinstance(a, np.ndarray) else Active(a) if k in v_scalar else x
                 for k, (a, x) in enumerate(zip(seen.args, args))]
    try:
        (derivs,) = autodiff(Reverse, seen.cfg, Const, *annotated, ndrange=seen.ndrange)
    except TapegradError as e:
        raise AssertionError(f"check_tape, launch {number}: {seen.name}: its adjoint cannot "
                             f"run: {e}") from e
    reverse = sum(float(np.vdot(backend.to_numpy(shadows[i]), v[i])) for i in arrays) + sum(
        derivs[k] * v_scalar[k] for k in scalar_at)
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
    tangent = sum(float(np.vdot(w[i], backend.to_numpy(tangents[i]))) for i in arrays)
    _compare(seen.name, number, "its tangent (forward mode) gives <w, J v> =", tangent, fd,
             rtol, atol)


def _check_op(seen: _Op, rng: Any, eps: float, rtol: float, atol: float, forward: bool,
              number: str) -> None:
    args = seen.args
    moving = [k for k, a in enumerate(args) if _is_float_array(a) or isinstance(a, float)]
    v = {k: rng.standard_normal(np.shape(args[k])) for k in moving}
    y = np.asarray(seen.fn(*args), dtype=np.float64)
    w = rng.standard_normal(y.shape)

    def weighted(h: float) -> float:
        moved = [a + h * (v[k] if np.ndim(a) else float(v[k])) if k in v else a
                 for k, a in enumerate(args)]
        return float(np.vdot(w, np.asarray(seen.fn(*moved), dtype=np.float64)))

    fd = (weighted(eps) - weighted(-eps)) / (2 * eps)
    cotangents = seen.reverse(w if y.ndim else float(w), *args)
    cotangents = cotangents if isinstance(cotangents, (tuple, list)) else (cotangents,)
    reverse = sum(float(np.vdot(np.asarray(c, dtype=np.float64), v[k]))
                  for k, c in enumerate(cotangents) if k in v and c is not None)
    _compare(seen.name, number, "its reverse rule gives <J^T w, v> =", reverse, fd, rtol, atol)
    if forward and seen.forward is not None:
        dots = [(v[k] if np.ndim(a) else float(v[k])) if k in v else None
                for k, a in enumerate(args)]
        tangent = float(np.vdot(w, np.asarray(seen.forward(*args, *dots), dtype=np.float64)))
        _compare(seen.name, number, "its forward rule gives <w, J v> =", tangent, fd, rtol,
                 atol)


def _compare(name: str, number: str, says: str, got: float, fd: float, rtol: float,
             atol: float) -> None:
    if not abs(got - fd) <= atol + rtol * max(abs(fd), abs(got)):
        raise AssertionError(
            f"check_tape, launch {number}: {name}: {says} {got!r}, central finite differences "
            f"of that launch alone {fd!r} (|difference| {abs(got - fd):.3g} > atol {atol} + "
            f"rtol {rtol} * max); v and w are random directions and weights, float64")
