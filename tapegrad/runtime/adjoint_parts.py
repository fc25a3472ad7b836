"""The launchers an adjoint is made of: gather kernels before the rest, variants that store
into shadows holding no values yet, and how one launch uses them."""

from __future__ import annotations

from typing import Any

from tapegrad.ad.storefresh import storing
from tapegrad.errors import LaunchError
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import Type, specialize


class Gather:
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


class StoringVariants:
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


class GathersThenRest:
    """Launches an adjoint split by ``tapegrad.ad.gather``: each gather kernel over its
    shadow's shape (the original ndrange as extra arguments), then the rest over the ndrange
    (unless it has nothing left to do)."""

    def __init__(self, gathers: list[Gather], rest: Any):
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


def fresh_plan(compiled: Any, base: int, fresh: frozenset[str], covered: frozenset[str]
               ) -> tuple[Any, frozenset[int], frozenset[str], tuple]:
    """How an adjoint launch treats the shadows that hold no values yet (``fresh``; those in
    ``covered`` have the launch's shape): (the launcher, the argument positions of the gather
    kernels that store, the shadows the main kernel stores into, the shadows to zero first)."""
    adjoint, launcher = compiled.adjoint, compiled.launcher
    gathered = launcher.gathered() if isinstance(launcher, GathersThenRest) else set()
    storable = compiled.storing.storable if compiled.storing is not None else ()
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
        launcher = storing_into(compiled, stored)
    return launcher, frozenset(fresh_at), stored, tuple(zeroed)


def storing_into(compiled: Any, stored: frozenset[str]) -> Any:
    """The compiled adjoint's launcher with its main kernel storing into the ``stored``
    shadows."""
    launcher = compiled.launcher
    rest = compiled.storing(stored)
    return GathersThenRest(launcher.gathers, rest) if isinstance(launcher, GathersThenRest) \
        else rest


def adjoint_names(kernel: Any, shadowed: tuple[str, ...], scalars: tuple[str, ...]
                  ) -> list[str]:
    """What an adjoint launch's arguments are, by position, for ``tg.debug_nans``'s report:
    the primal's parameters, the gradients of the ``shadowed`` ones and of the Active
    ``scalars`` (their sums)."""
    return [*kernel_ir(kernel).params, *(f"the gradient of {p}" for p in shadowed),
            *(f"the gradient of {p} (its partial sums)" for p in scalars)]


def stored_at(adjoint: Any, stored: frozenset[str], base: int) -> frozenset[int]:
    """The argument positions of the shadows an adjoint launch stores into (``stored``: their
    names in the adjoint; ``base``: the primal's parameter count)."""
    return frozenset(base + k for k, s in enumerate(adjoint.shadow_of) if s in stored)


def launch_adjoint(launcher: Any, args: tuple, nd: tuple[int, ...], fresh_at: frozenset[int]
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


def check_kept(kernel: Any, adjoint: Any, kept: frozenset[str] | None) -> None:
    if kept is not None and not adjoint.contents_read <= kept:
        raise LaunchError(
            f"tapegrad bug: the adjoint of {kernel.name} reads "
            f"{sorted(adjoint.contents_read - kept)}, whose contents the tape did not keep; "
            "please report it with the kernel")
