"""How many threads a CPU launch uses: all of Numba's on an idle machine, fewer when other
processes keep the cores busy.

A parallel launch ends at a barrier where every thread waits for the slowest.  When other
processes are runnable on the same cores, the operating system deschedules one of our
threads for a whole time slice now and then, and every launch whose barrier falls in that
slice waits for it: a simulation of many short launches ran 5-25x slower than idle instead of
the fair 2x.  So before a launch the count is taken down by the number of other runnable
tasks on the machine (Linux's ``/proc/loadavg`` counts every runnable task; our own are
subtracted, spinning OpenMP workers included), re-read at most every ``REFRESH_S`` seconds.
With one busy process per core the launches run on one thread, which the scheduler shares
fairly, and no launch waits at a barrier.  Elsewhere (no ``/proc``) the count stays Numba's.

``TAPEGRAD_ADAPTIVE_THREADS=0`` keeps Numba's count always (for timing threads yourself).
"""

from __future__ import annotations

import os
import threading
import time

import numba

REFRESH_S = 0.02


class ThreadCount:
    """The thread count for the next launch (``ThreadCount.get``), per process."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("TAPEGRAD_ADAPTIVE_THREADS", "1") != "0" and \
            os.path.exists("/proc/loadavg") and os.path.isdir("/proc/self/task")
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
            else os.cpu_count() or 1
        self.next_read = 0.0
        self.count = 0
        self.mine = threading.local()    # per thread: the count set here, and the one before

    def get(self, most: int) -> int:
        """The threads to use, at most ``most``."""
        if not self.enabled or most == 1:
            return most
        now = time.monotonic()
        if now >= self.next_read:
            self.next_read = now + REFRESH_S
            self.count = max(1, self.cores - other_runnable())
        return min(most, self.count)

    def for_launch(self, current: int) -> int:
        """The threads the next launch of this thread runs on, given Numba's ``current``
        count for it (set with ``numba.set_num_threads``): Numba's count is taken down, and
        back up to what it was, as other processes come and go."""
        mine = self.mine
        if current != getattr(mine, "set", None):
            mine.ceiling = current         # (Numba's, or the user's own setting)
        n = self.get(mine.ceiling)
        if n != current:
            numba.set_num_threads(n)
            mine.set = n
        return n


def other_runnable() -> int:
    """Runnable tasks on the machine that are not threads of this process."""
    try:
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - _own_running())


def _own_running() -> int:
    """This process's threads that are running or runnable now (state R)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:         # (a thread that ended meanwhile)
            continue
        end = stat.rfind(b")")  # the command name may hold spaces and parentheses
        if stat[end + 2:end + 3] == b"R":
            n += 1
    return n


thread_count = ThreadCount()
