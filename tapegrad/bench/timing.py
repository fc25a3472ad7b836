"""Timing helpers shared by the bench's tables: the median of repeated calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def in_turn_ms(first: Callable[[], Any], second: Callable[[], Any], repeats: int
               ) -> tuple[float, float]:
    """Median ms of each of two functions timed in turn, ``repeats`` times each: a slow
    minute of a busy machine slows both."""
    a, b = [], []
    for _ in range(repeats):
        a.append(_median_ms(first, 1))
        b.append(_median_ms(second, 1))
    return float(np.median(a)), float(np.median(b))


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)
