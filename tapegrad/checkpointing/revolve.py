"""Binomial checkpointing (Griewank and Walther's Revolve): the order in which a reverse sweep
over ``n`` steps of ``x[i + 1] = step(x[i])`` stores, restores and recomputes states when at
most ``s`` states may be held at once, with the fewest forward steps possible.

With ``s`` snapshots (the initial state counts as one) and ``r`` the smallest number with
``C(s + r, s) >= n``, the sweep needs ``t = r n - C(s + r, s + 1)`` forward steps besides the
``n`` steps it differentiates (each of which runs forward once more while it is recorded).
The schedule splits a segment ``[lo, hi)`` held at ``lo`` at the ``m`` that minimises
``(m - lo) + t(hi - m, s - 1) + t(m - lo, s)``: advance to ``m`` and store it, reverse
``[m, hi)`` with one snapshot fewer, free it, reverse ``[lo, m)``.  The cost is convex in
``m``, so the split is found by bisection on its slope.

A schedule is a list of actions (as Firedrake's ``checkpoint_schedules`` models them):

- ``("advance", i, j)``: run steps ``i .. j - 1`` unrecorded, from the state at ``i`` in hand;
- ``("store", i)`` / ``("free", i)``: keep a copy of the state at ``i`` / drop it;
- ``("restore", i)``: take (a copy of) the stored state at ``i`` in hand;
- ``("reverse", i)``: record step ``i`` from the state at ``i`` in hand and run its adjoint.

>>> forward_steps(1000, 10), forward_steps(100_000, 40) / 100_000
(3636, 3.86756)
>>> actions = reverse_actions(3, 2)
>>> actions
[('store', 0), ('advance', 0, 1), ('store', 1), ('advance', 1, 2), ('reverse', 2), \
('restore', 1), ('reverse', 1), ('free', 1), ('restore', 0), ('reverse', 0), ('free', 0)]
"""

from __future__ import annotations

import functools
from math import comb


def repetitions(n: int, s: int) -> int:
    """The smallest ``r`` with ``C(s + r, s) >= n``: how often, at most, a step runs forward."""
    if s < 1:
        raise ValueError("binomial checkpointing needs at least one snapshot (the initial state)")
    r = 0
    while comb(s + r, s) < n:
        r += 1
    return r


def forward_steps(n: int, s: int) -> int:
    """Revolve's ``t``: the forward steps a reverse sweep over ``n`` steps with ``s`` snapshots
    needs besides recording each step once (0 for ``n <= 1``)."""
    if n <= 1:
        return 0
    r = repetitions(n, s)
    return r * n - comb(s + r, s + 1)


@functools.lru_cache(maxsize=1 << 16)
def split(n: int, s: int) -> int:
    """Where to store the next snapshot in a segment of ``n`` steps held at its start, with
    ``s`` snapshots in all (``1 <= split < n``; ``n >= 2``, ``s >= 2``)."""
    def slope(m: int) -> int:          # cost(m + 1) - cost(m), nondecreasing in m
        return 1 + (forward_steps(n - m - 1, s - 1) - forward_steps(n - m, s - 1)) + \
            (forward_steps(m + 1, s) - forward_steps(m, s))
    lo, hi = 1, n - 1                  # the smallest m in [1, n - 1] with slope(m) >= 0
    while lo < hi:
        mid = (lo + hi) // 2
        if slope(mid) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo


def reverse_actions(n: int, s: int) -> list[tuple]:
    """The whole schedule for ``n`` steps and ``s`` snapshots, from the initial state in hand:
    the forward run to the last step's state (storing snapshots), then the reverse sweep."""
    if n < 1:
        return []
    actions: list[tuple] = [("store", 0)]
    _reverse(0, n, s, actions, held=True)
    actions.append(("free", 0))
    return actions


def _reverse(lo: int, hi: int, s: int, out: list[tuple], held: bool) -> None:
    """Reverse steps ``[lo, hi)``, the state at ``lo`` stored (and in hand if ``held``),
    with ``s`` snapshots counting that one.  (A loop with a stack of what is left to do after
    each stored snapshot's segment: as recursion it would nest once per snapshot.)"""
    later: list[tuple] = []        # (lo, hi, s, snapshot to free first)
    while True:
        while hi - lo > 1 and s > 1:
            m = lo + split(hi - lo, s)
            if not held:
                out.append(("restore", lo))
            out.append(("advance", lo, m))
            out.append(("store", m))
            later.append((lo, m, s, m))          # [lo, m) after [m, hi), m freed first
            lo, s, held = m, s - 1, True
        for i in range(hi - 1, lo - 1, -1):   # one snapshot left (or one step): from lo each time
            if not held:
                out.append(("restore", lo))
            if i > lo:
                out.append(("advance", lo, i))
            out.append(("reverse", i))
            held = False
        if not later:
            return
        lo, hi, s, stored = later.pop()
        out.append(("free", stored))
        held = False
