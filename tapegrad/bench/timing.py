"""Timing helpers shared by the bench's tables: the median of repeated calls."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _median_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)
