"""How many snapshots a checkpointed loop keeps when the user does not say: as many states as
a memory budget holds (a quarter of the free memory where the states live, by default), at
least 2 and at most one per step, said on stderr with what it costs."""

from __future__ import annotations

import os
import sys
from typing import Any

from tapegrad.checkpointing.revolve import forward_steps

FRACTION = 0.25


def free_memory(x: Any) -> int:
    """Bytes free where ``x`` lives: the GPU's for CuPy arrays, else the host's."""
    if hasattr(x, "__cuda_array_interface__"):
        import cupy
        return int(cupy.cuda.runtime.memGetInfo()[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):       # (no sysconf: not Linux)
        return 1 << 30


def choose_snapshots(states: tuple, n: int, memory: int | None) -> int:
    """The snapshots to keep for ``n`` steps of ``states`` within ``memory`` bytes."""
    size = sum(x.nbytes for x in states) or 1
    budget = int(FRACTION * free_memory(states[0])) if memory is None else int(memory)
    s = max(2, min(n, budget // size))
    t = forward_steps(n, s)
    print(f"tapegrad: checkpoint_loop keeps {s} snapshot(s) of {_bytes(size)} ({_bytes(s * size)}"
          f" of {'a quarter of the free memory' if memory is None else 'memory=' + _bytes(budget)}"
          f"): {t / n:.2f} forward steps per step in the reverse sweep (snapshots=... to choose)",
          file=sys.stderr, flush=True)
    return s


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
