"""How many threads a CPU launch uses: Numba's count, never more than the cores this process
may run on.

Numba starts one thread per core of the machine, but a container's CPU quota (cgroups'
``cpu.max``) or an affinity mask (``taskset``, a batch scheduler's allocation) may grant
fewer.  A parallel launch ends at a barrier where every thread waits for the slowest; with
more threads than granted cores, some thread is always descheduled, every launch waits for a
time slice, and under a quota the spinning threads use up the period's allowance and the
whole process stops until the next one.  So each launch runs on at most the granted cores.

Other busy processes need nothing more: with one per core alongside, a gradient takes about
twice its idle time, the fair share (``python -m tapegrad bench`` measures it).  Taking
threads down by the machine's load would leave one thread a smaller share of the cores than
two get, and inside a container the load average counts the whole host.  Measurements:
docs/performance.md, "Busy machines and granted cores".

``TAPEGRAD_CAP_THREADS=0`` keeps Numba's count (for timing threads yourself).
"""

from __future__ import annotations

import os
import threading

import numba


class ThreadCount:
    """The thread count for the next launch (``ThreadCount.for_launch``), per process."""

    def __init__(self) -> None:
        self.enabled = os.environ.get("TAPEGRAD_CAP_THREADS", "1") != "0"
        self.cores = usable_cores()
        self.mine = threading.local()    # per thread: the count set here, and the one before

    def get(self, most: int) -> int:
        """The threads to use, at most ``most``."""
        return min(most, self.cores) if self.enabled else most

    def for_launch(self, current: int) -> int:
        """The threads the next launch of this thread runs on, given Numba's ``current``
        count for it (set with ``numba.set_num_threads``, per Python thread): Numba's count,
        or the user's own setting, capped at the usable cores."""
        mine = self.mine
        if (current, self.cores) == getattr(mine, "last", None):
            return current                 # (as the last launch left it: 1 us spared)
        if current != getattr(mine, "set", None):
            mine.ceiling = current         # (Numba's, or the user's own setting)
        n = self.get(mine.ceiling)
        if n != current:
            numba.set_num_threads(n)       # (threads past the tasks would spin at the barrier)
            mine.set = n
        mine.last = (n, self.cores)        # (Numba's count now)
        return n


def usable_cores() -> int:
    """The cores this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    quota = cgroup_quota()
    return max(1, min(cores, quota)) if quota else cores


def cgroup_quota(root: str = "/sys/fs/cgroup") -> int | None:
    """Whole cores granted by a cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``),
    rounded up; None without a quota."""
    try:
        with open(os.path.join(root, _own_cgroup().lstrip("/"), "cpu.max")) as f:
            quota, period = f.read().split()[:2]
    except (OSError, ValueError):
        try:
            with open(os.path.join(root, "cpu", "cpu.cfs_quota_us")) as f:
                quota = f.read().strip()
            with open(os.path.join(root, "cpu", "cpu.cfs_period_us")) as f:
                period = f.read().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:          # "max": no quota
        return None
    return -(-q // p) if q > 0 and p > 0 else None


def _own_cgroup() -> str:
    """This process's cgroup v2 path ("" when unknown: the root, as inside a container)."""
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return ""


thread_count = ThreadCount()
