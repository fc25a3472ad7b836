"""A kernel launched ``steps`` times, two of its arguments swapped each step, from one Python
loop: how a tape's reverse sweep runs a chain of replays of one adjoint on a GPU
(``tapegrad/tape/chains.py`` finds the chains; a launcher offers this through
``chain_runner``; the CPU compiles the loop instead, ``backends/cpu/chain.py``), and, on
every backend, a nonlinear step's, whose adjoint reads each step's own states.  The sweep's
bookkeeping per step is gone; each launch is its written-out launch alone.

>>> calls = []
>>> run = LaunchChain(lambda args, nd: calls.append(args), 3, 0, 2)
>>> run(3, "x", "y", ["a"], (4,))
True
>>> calls
[('x', 'a', 'y'), ('y', 'a', 'x'), ('x', 'a', 'y')]
>>> calls.clear()
>>> run = LaunchChain(lambda args, nd: calls.append(args), 3, 0, 2, states=(1,))
>>> run(2, "x", "y", ["a"], (4,), [["s1"], ["s0"]])
True
>>> calls
[('x', 's1', 'y'), ('y', 's0', 'x')]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LaunchChain:
    """``runner(steps, x, y, rest, nd)``: ``launch`` called ``steps`` times over ``nd``, first
    with ``x`` and ``y`` in argument slots ``x_slot`` and ``y_slot``, then swapped, and so on
    (``rest``: the other arguments, in order).  A backend whose launch can do the whole run
    itself gives ``chain(steps, args, nd, x_slot, y_slot, states, per_launch)`` (CUDA:
    packed once, the swapped and the states' addresses rewritten per launch,
    ``cuda/plan.py``).  ``states``: slots whose arguments change each launch, given per
    launch as ``runner(..., per_launch)`` (each a list, in the order of ``states``)."""

    def __init__(self, launch: Callable[[tuple, tuple], None], n_args: int, x_slot: int,
                 y_slot: int, chain: Callable[..., None] | None = None,
                 states: tuple[int, ...] = ()):
        self.launch, self.n_args, self.chain = launch, n_args, chain
        self.x_slot, self.y_slot, self.states = x_slot, y_slot, states

    def __call__(self, steps: int, x: Any, y: Any, rest: list, nd: tuple[int, ...],
                 per_launch: list | None = None) -> bool:
        others = iter(rest)
        args = [None if s in (self.x_slot, self.y_slot) else next(others)
                for s in range(self.n_args)]
        args[self.x_slot], args[self.y_slot] = x, y
        forward = tuple(args)
        if self.chain is not None:
            self.chain(steps, forward, nd, self.x_slot, self.y_slot, self.states, per_launch)
            return True
        if per_launch is not None:
            self.each_with_states(steps, args, x, y, nd, per_launch)
            return True
        args[self.x_slot], args[self.y_slot] = y, x
        swapped = tuple(args)
        launch = self.launch
        for s in range(steps):
            launch(swapped if s % 2 else forward, nd)
        return True

    def each_with_states(self, steps: int, args: list, x: Any, y: Any, nd: tuple[int, ...],
                         per_launch: list) -> None:
        launch, states, xs, ys = self.launch, self.states, self.x_slot, self.y_slot
        for s in range(steps):
            args[xs], args[ys] = (y, x) if s % 2 else (x, y)
            for slot, value in zip(states, per_launch[s]):
                args[slot] = value
            launch(tuple(args), nd)
