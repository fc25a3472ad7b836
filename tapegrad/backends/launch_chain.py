"""A kernel launched ``steps`` times, two of its arguments swapped each step, from one Python
loop: how a tape's reverse sweep runs a chain of replays of one linear adjoint on a GPU
(``tapegrad/tape/chains.py`` finds the chains; a launcher offers this through
``chain_runner``; the CPU compiles the loop instead, ``backends/cpu/chain.py``).  The sweep's
bookkeeping per step is gone; each launch is its written-out launch alone.

>>> calls = []
>>> run = LaunchChain(lambda args, nd: calls.append(args), 3, 0, 2)
>>> run(3, "x", "y", ["a"], (4,))
True
>>> calls
[('x', 'a', 'y'), ('y', 'a', 'x'), ('x', 'a', 'y')]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class LaunchChain:
    """``runner(steps, x, y, rest, nd)``: ``launch`` called ``steps`` times over ``nd``, first
    with ``x`` and ``y`` in argument slots ``x_slot`` and ``y_slot``, then swapped, and so on
    (``rest``: the other arguments, in order).  A backend whose launch can do the whole run
    itself gives ``chain(steps, args, nd, x_slot, y_slot)`` (CUDA: packed once, two
    addresses rewritten per launch, ``cuda/plan.py``)."""

    def __init__(self, launch: Callable[[tuple, tuple], None], n_args: int, x_slot: int,
                 y_slot: int, chain: Callable[..., None] | None = None):
        self.launch, self.n_args, self.chain = launch, n_args, chain
        self.x_slot, self.y_slot = x_slot, y_slot

    def __call__(self, steps: int, x: Any, y: Any, rest: list, nd: tuple[int, ...]) -> bool:
        others = iter(rest)
        args = [None if s in (self.x_slot, self.y_slot) else next(others)
                for s in range(self.n_args)]
        args[self.x_slot], args[self.y_slot] = x, y
        forward = tuple(args)
        if self.chain is not None:
            self.chain(steps, forward, nd, self.x_slot, self.y_slot)
            return True
        args[self.x_slot], args[self.y_slot] = y, x
        swapped = tuple(args)
        launch = self.launch
        for s in range(steps):
            launch(swapped if s % 2 else forward, nd)
        return True
