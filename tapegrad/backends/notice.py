"""One line on stderr for a compile that takes long: a first gradient that compiles its
adjoint kernels for half a minute in silence looks hung.  Under an MPI launcher (``mpiexec``,
``srun``), only rank 0 says it: every rank compiles the same kernels at the same time.

>>> import time
>>> with compiling("demo_kernel", after_s=10.0):   # quick: says nothing
...     time.sleep(0.01)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

DELAY_S = 1.0
# what MPI launchers tell each process of its rank: MPICH/Hydra, Open MPI, MVAPICH, PMIx, Slurm
_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PMIX_RANK",
                   "SLURM_PROCID")


_SAID: set = set()       # what this process announced a compile of (``compiling``'s keys)


def launched_rank() -> int:
    """This process's rank as its MPI launcher set it (0 without one)."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


class compiling:
    """``with compiling(name):`` prints ``tapegrad: compiling NAME (first use; cached
    afterwards)`` to stderr once the body has run ``after_s`` seconds (a timer thread: Numba's
    compiler lets other threads run), and nothing for a quicker body; ``key`` (default: the
    name) says which compiles are variants of one thing, announced as such the second time."""

    def __init__(self, name: str, after_s: float = DELAY_S, key: Any = None):
        self.name, self.key = name, (name if key is None else key)
        self.timer = threading.Timer(after_s, self.say)
        self.timer.daemon = True

    def say(self) -> None:
        if launched_rank() != 0:
            return
        if self.key in _SAID:     # (one kernel, compiled again for other types or activities)
            text = (f"tapegrad: compiling another variant of {self.name} (other argument "
                    "types, activities or launch shapes; cached afterwards)")
        else:
            text = f"tapegrad: compiling {self.name} (first use; cached afterwards)"
        _SAID.add(self.key)
        print(text, file=sys.stderr, flush=True)

    def __enter__(self) -> compiling:
        self.timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timer.cancel()
        self.timer.join()    # (ended here, not later: a finished launch leaves no thread)
