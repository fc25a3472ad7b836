"""The reverse sweep's adjoints of tape scalars, by node.

An adjoint launch adds an Active scalar's gradient into an array on its device (the work-items'
sum, ``ad/reverse.py``'s ``group_reduce_add``).  Reading that array after each launch would
make the host wait for the device once per launch; instead each scalar has one accumulator per
backend and parameter that every launch of the sweep adds into, read once, the first time the
scalar's adjoint is asked for (by the record that made the scalar, or at the end of the sweep).

>>> bars = ScalarBars()
>>> bars[3] = 1.5
>>> bars.get(3, 0.0), bars.get(4, 0.0)
(1.5, 0.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np


class ScalarBars(dict):
    """``node -> adjoint`` (a float), with sums still on a device settled when read."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: dict[int, dict[tuple, tuple[Any, Any]]] = {}

    def accumulator(self, node: int, backend: Any, param: str) -> Any:
        """The zeroed-once array on ``backend`` into which launches add ``node``'s gradient
        through parameter ``param`` (one per parameter: two parameters of one launch never
        share an array)."""
        mine = self.pending.get(node)
        if mine is None:
            mine = self.pending[node] = {}
        found = mine.get((backend, param))
        if found is None:
            found = mine[backend, param] = (backend, backend.zeros(
                np.float64, backend.scalar_sum_size))
        return found[1]

    def settle(self, node: int) -> None:
        """Add what ``node``'s accumulators hold to its adjoint (one read per accumulator)."""
        mine = self.pending.pop(node, None)
        if mine:
            total = sum(float(backend.to_numpy(a).sum()) for backend, a in mine.values())
            dict.__setitem__(self, node, dict.get(self, node, 0.0) + total)

    def get(self, node: Any, default: Any = None) -> Any:
        if node in self.pending:
            self.settle(node)
        return dict.get(self, node, default)

    def __getitem__(self, node: Any) -> Any:
        if node in self.pending:
            self.settle(node)
        return dict.__getitem__(self, node)

    def __contains__(self, node: object) -> bool:
        return node in self.pending or dict.__contains__(self, node)

    def __setitem__(self, node: Any, value: Any) -> None:
        if node in self.pending:
            self.settle(node)
        dict.__setitem__(self, node, value)
