"""Cutting a captured program's ops into stretches that a backend runs as one unit (a CUDA
graph, a run of OpenCL launches packed in advance), the rest one by one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def stretches(ops: list[Any], fits: Callable[[Any], bool],
              make: Callable[[int, int], Any]) -> list[tuple[bool, Any]] | None:
    """``ops`` as (True, ``make(start, stop)``) for each longest run of ops that ``fits``
    holding two launches or more, else (False, the op's index); None where there is none."""
    out: list[tuple[bool, Any]] = []
    k = 0
    while k < len(ops):
        end = k
        while end < len(ops) and fits(ops[end]):
            end += 1
        if sum(ops[j].kind == "launch" for j in range(k, end)) >= 2:
            out.append((True, make(k, end)))
            k = end
        else:
            out += [(False, j) for j in range(k, max(end, k + 1))]
            k = max(end, k + 1)
    return out if any(whole for whole, _ in out) else None
