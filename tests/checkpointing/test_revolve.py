"""The binomial schedule: valid (every step reversed once, in order, from its own state, never
more than ``s`` snapshots held), as short as Revolve's formula says, and that formula the
optimum (a dynamic programme over every split, for small sizes)."""

from __future__ import annotations

import functools
from math import comb

from hypothesis import given, settings
from hypothesis import strategies as st

from tapegrad.checkpointing.revolve import forward_steps, repetitions, reverse_actions


def run(actions: list[tuple], n: int, s: int) -> int:
    """Execute a schedule on positions only; the forward steps it takes (asserting as it
    goes that it is valid)."""
    hand, stored, reversed_, steps = 0, set(), [], 0
    for action in actions:
        kind = action[0]
        if kind == "store":
            assert action[1] == hand and len(stored) < s
            stored.add(hand)
        elif kind == "free":
            stored.remove(action[1])
        elif kind == "restore":
            assert action[1] in stored
            hand = action[1]
        elif kind == "advance":
            assert action[1] == hand and action[2] > hand
            steps += action[2] - hand
            hand = action[2]
        else:
            assert kind == "reverse" and action[1] == hand
            reversed_.append(hand)
            hand = None                       # (recording it moved the state on)
    assert reversed_ == list(range(n - 1, -1, -1)) and not stored
    return steps


@functools.cache
def optimum(n: int, s: int) -> int:
    """The fewest forward steps over every schedule of the recursive kind."""
    if n <= 1:
        return 0
    if s == 1:
        return n * (n - 1) // 2
    return min(m + optimum(n - m, s - 1) + optimum(m, s) for m in range(1, n))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), s=st.integers(1, 25))
def test_the_schedule_is_valid_and_takes_revolves_number_of_forward_steps(n, s):
    assert run(reverse_actions(n, s), n, s) == forward_steps(n, s)


def test_revolves_number_is_the_optimum_for_small_sizes():
    for n in range(1, 60):
        for s in range(1, 8):
            assert forward_steps(n, s) == optimum(n, s), (n, s)


def test_the_issues_figures():
    """t / N for N = 1,000 and s = 5, 10, 20, 40; N = 100,000 and s = 10, 40."""
    assert [round(forward_steps(1000, s) / 1000, 2) for s in (5, 10, 20, 40)] == \
        [6.28, 3.64, 2.75, 2.1]
    assert [round(forward_steps(100_000, s) / 100_000, 2) for s in (10, 40)] == [8.32, 3.87]
    assert repetitions(1000, 5) == 8 and comb(13, 5) >= 1000 > comb(12, 5)


def test_enough_snapshots_for_every_state_take_no_recomputation():
    assert forward_steps(10, 10) == 9 and run(reverse_actions(10, 10), 10, 10) == 9
    assert forward_steps(1, 1) == 0 and reverse_actions(1, 1) == [
        ("store", 0), ("reverse", 0), ("free", 0)]
