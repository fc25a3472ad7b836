"""A tape's sweep replays the same adjoint once per recorded step: worked out once per pattern
of activities and shadow states (``replay_for``), then only launched (``run_replay``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from tapegrad.frontend import kernel_ir
from tapegrad.runtime.adjoint import adjoint_of
from tapegrad.runtime.adjoint_parts import (
    GathersThenRest,
    adjoint_names,
    check_kept,
    fresh_plan,
    launch_adjoint,
    stored_at,
)
from tapegrad.runtime.nans import NANS, adjoint_what, checked
from tapegrad.runtime.show import Shown, show


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
    shown: Any                        # what kern.source() shows for it (Shown)
    steps: tuple[tuple[Any, int | None], ...]   # the launcher's launches (GathersThenRest.steps)
    scalars: tuple[str, ...] = ()     # Active scalar parameters: their gradients it sums
    # argument positions the adjoint writes (it recomputes in place): it gets copies of them
    scratch: tuple[int, ...] = ()
    # a per-work-item stack whose overflow its status array reports: run by the general
    # path (``run_adjoint``), which grows the stack and runs it again; a trace writes it down
    status: bool = False
    chain: Any = None    # how a sweep runs it along a chain of states (tape/chains.py), or False
    # argument positions of the shadows it stores into (they hold no values yet): what
    # tg.debug_nans takes as written only (runtime/nans.py)
    stored_at: frozenset[int] = frozenset()

    @property
    def general(self) -> bool:
        """Whether a sweep runs it by ``run_adjoint`` (scratch copies, a stack) rather
        than by ``run_replay``."""
        return self.status or bool(self.scratch)


def replay_for(cfg: Any, values: tuple, activity: tuple[str, ...], nd: tuple[int, ...],
               discard: frozenset[str], fresh: frozenset[str], covered: frozenset[str],
               kept: frozenset[str]) -> Replay:
    """The ``Replay`` of ``cfg``'s adjoint for this pattern (arguments as in ``run_adjoint``;
    ``covered``: the ``fresh`` shadows of the launch's shape; ``Replay.general``: one that
    runs by ``run_adjoint``'s general path, scratch copies and a stack).  Any record of
    the same kernel and argument types may use it: the values a record keeps (copies the tape
    made, stand-ins for freed arrays) can differ from the launch's arrays in being writeable
    and in layout, which pick compiled code but not what the adjoint is."""
    compiled, _ = adjoint_of(cfg, values, activity, nd, discard)
    adjoint, launcher = compiled.adjoint, compiled.launcher
    check_kept(cfg.kernel, adjoint, kept)
    params = kernel_ir(cfg.kernel).params
    fresh_at: frozenset[int] = frozenset()
    zeroed: tuple[str, ...] = ()
    stored: frozenset[str] = frozenset()
    if fresh:
        launcher, fresh_at, stored, zeroed = fresh_plan(compiled, len(params), fresh, covered)
    steps = launcher.steps(fresh_at) if isinstance(launcher, GathersThenRest) \
        else ((launcher, None),)
    return Replay(adjoint, launcher, fresh_at, zeroed, tuple(adjoint.shadow_of.values()),
                  Shown(steps), steps, tuple(adjoint.active_scalars),
                  tuple(k for k, p in enumerate(params) if p in adjoint.scratch),
                  adjoint.uses_status, None,
                  fresh_at | stored_at(adjoint, stored, len(params)))


def scalar_sums(backend: Any, n: int) -> list[Any]:
    """``n`` zeroed arrays into which adjoint launches add Active scalars' gradients (one
    per scalar, a slot per part of the sum: ``backend.scalar_sum_size``)."""
    return [backend.zeros(np.float64, backend.scalar_sum_size) for _ in range(n)]


def run_replay(cfg: Any, replay: Replay, values: list, shadows: dict[str, Any],
               nd: tuple[int, ...], sums: list | None = None) -> Mapping[str, float]:
    """Launch a ``Replay`` on one record's arrays (no two shadows the same array); the
    gradients of its Active scalars, by parameter name.  ``sums``: arrays the launch adds
    those gradients into instead (one per Active scalar, read by the caller when it needs
    them: ``tape/bars.py``)."""
    for p in replay.zeroed:
        shadows[p][...] = 0
    given = sums is not None
    if not given:
        sums = scalar_sums(cfg.backend, len(replay.scalars)) if replay.scalars else []
    args = (*values, *[shadows[p] for p in replay.order], *sums)
    kernel = cfg.kernel
    if kernel.shown.get("reverse") is not replay.shown or kernel.merged_from is not None:
        show(kernel, "reverse", cfg.backend, replay.shown,
              lambda: [g.ir for g in replay.adjoint.gathers] + [replay.adjoint.ir])
    if 0 in nd:
        launch_adjoint(replay.launcher, args, nd, replay.fresh_at)
    elif NANS.on:
        names = adjoint_names(kernel, replay.order, replay.scalars)
        checked(lambda: _launch_steps(replay, args, nd), args, names, adjoint_what(kernel.name),
                write_only=replay.stored_at)
    else:
        _launch_steps(replay, args, nd)
    if not sums or given:     # (the common case, once per replayed launch: no new dict)
        return _NO_SCALARS
    backend = cfg.backend
    return {p: float(backend.to_numpy(s).sum()) for p, s in zip(replay.scalars, sums)}


def _launch_steps(replay: Replay, args: tuple, nd: tuple[int, ...]) -> None:
    for run, shaped_by in replay.steps:
        if shaped_by is None:
            run(args, nd)
        else:                 # a gather kernel: over its shadow, the ndrange appended
            run(args + nd, args[shaped_by].shape)


_NO_SCALARS: Mapping[str, float] = MappingProxyType({})
