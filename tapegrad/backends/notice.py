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
    compiler lets other threads run), and nothing for a quicker body."""

    def __init__(self, name: str, after_s: float = DELAY_S):
        self.name = name
        self.timer = threading.Timer(after_s, self.say)
        self.timer.daemon = True

    def say(self) -> None:
        if launched_rank() == 0:
            print(f"tapegrad: compiling {self.name} (first use; cached afterwards)",
                  file=sys.stderr, flush=True)

    def __enter__(self) -> compiling:
        self.timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timer.cancel()
        self.timer.join()    # (ended here, not later: a finished launch leaves no thread)
