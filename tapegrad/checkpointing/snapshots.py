"""The snapshots a checkpointed loop keeps: how many when the user does not say (as many states
as a memory budget holds, a quarter of the free memory where the states live by default, at
least 2 and at most one per step, said on stderr with what it costs), and where (``Snapshots``:
in memory, or on disk)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import weakref
from typing import Any

import numpy as np

from tapegrad.backends import get_backend, to_numpy
from tapegrad.backends.registry import offers_cuda_interface
from tapegrad.checkpointing.revolve import forward_steps
from tapegrad.errors import TapegradError

FRACTION = 0.25


def free_memory(x: Any) -> int:
    """Bytes free where ``x`` lives: the GPU's for CuPy arrays, else the host's."""
    if offers_cuda_interface(x):
        import cupy
        return int(cupy.cuda.runtime.memGetInfo()[0])
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):       # (no sysconf: not Linux)
        return 1 << 30


def choose_snapshots(states: tuple, n: int, memory: int | None, plain: bool = True,
                     comms: list = ()) -> int:
    """The snapshots to keep for ``n`` steps of ``states`` within ``memory`` bytes; ``n`` if
    all ``n`` states fit (with ``plain``, the loop then records every step, as the plain tape
    does).  A loop whose step communicates over ``comms`` (MPI communicators) keeps the
    least number over their processes: every process must run the same schedule, whose
    recomputations exchange messages (the states' sizes and the free memory differ from one
    process to the next)."""
    size = sum(x.nbytes for x in states) or 1
    budget = int(FRACTION * free_memory(states[0])) if memory is None else int(memory)
    comms = [c for c in comms if c.Get_size() > 1]
    fit = agreed(budget // size, comms)
    s = max(2, min(n, fit))
    where = 'a quarter of the free memory' if memory is None else 'memory=' + _bytes(budget)
    if comms:
        where += " (the least over the processes)"
    say = not comms or comms[0].Get_rank() == 0      # (once for the processes)
    if fit >= n and plain:
        # (then the schedule would store every state and still record each step again in
        # the sweep: the plain tape's memory at more than its time)
        if say:
            print(f"tapegrad: checkpoint_loop records every step: {n} states of "
                  f"{_bytes(size)} fit in {where} (the plain tape; snapshots=... to "
                  "checkpoint)", file=sys.stderr, flush=True)
        return n
    t = forward_steps(n, s)
    if say:
        print(f"tapegrad: checkpoint_loop keeps {s} snapshot(s) of {_bytes(size)} "
              f"({_bytes(s * size)} of {where}): {t / n:.2f} forward steps per step in the "
              "reverse sweep (snapshots=... to choose)", file=sys.stderr, flush=True)
    return s


def agreed(count: int, comms: list) -> int:
    """The least ``count`` over the processes of ``comms``; ``count`` with none."""
    return least([count], comms)[0]


def least(values: list[int], comms: list) -> list[int]:
    """Each of ``values`` (ints), the least over the processes of ``comms`` (each of them, as
    many times as there are, so that the least travels across communicators that
    overlap)."""
    comms = [c for c in comms if c.Get_size() > 1]
    if not comms:
        return list(values)
    from tapegrad.mpi.buffers import mpi
    MIN = mpi().MIN
    mine = np.array(values, dtype=np.int64)
    out = np.empty_like(mine)
    for _ in comms:
        for comm in comms:
            comm.Allreduce(mine, out, op=MIN)
            mine[...] = out
    return [int(v) for v in mine]


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


class Snapshots:
    """The states a loop keeps: in memory, or with ``storage="disk"`` in a private folder
    (mode 0700, removed with the loop), the ``in_memory`` most recently stored ones in memory
    (the schedule restores its newest snapshots most often: a state stored deeper in the
    recursion serves the steps right after it, an old one the rest of the sweep).

    >>> import numpy as np
    >>> store = Snapshots("disk", in_memory=1)
    >>> store.put(0, (np.arange(3.0),)); store.put(5, (np.ones(2),))
    >>> sorted(store.on_disk), store.get(0)[0].tolist(), len(store)
    ([0], [0.0, 1.0, 2.0], 2)
    >>> store.close()
    """

    def __init__(self, storage: str = "memory", in_memory: int | None = None):
        if storage not in ("memory", "disk"):
            raise TapegradError(f"tg.checkpoint_loop: storage is 'memory' or 'disk', got "
                                f"{storage!r}")
        self.disk = storage == "disk"
        self.in_memory = (0 if in_memory is None else int(in_memory)) if self.disk else None
        self.memory: dict[int, tuple] = {}
        self.on_disk: dict[int, tuple] = {}     # position -> (files, kinds) to read back
        self.folder: str | None = None

    def __len__(self) -> int:
        return len(self.memory) + len(self.on_disk)

    def __iter__(self) -> Any:
        return iter(self.memory.values())

    def put(self, i: int, states: tuple, copy: bool = True) -> None:
        """Store ``states`` as position ``i``: copies, or (``copy=False``) the arrays
        themselves, which no one may change then (``get`` hands out copies)."""
        self.memory[i] = tuple(x.copy() for x in states) if copy else tuple(states)
        if self.disk:
            while len(self.memory) > self.in_memory:
                oldest = next(iter(self.memory))
                self.on_disk[oldest] = self._write(oldest, self.memory.pop(oldest))

    def get(self, i: int) -> tuple:
        """Copies of the states stored at ``i`` (the caller may update them in place)."""
        if i in self.memory:
            return tuple(x.copy() for x in self.memory[i])
        return self._read(*self.on_disk[i])

    def drop(self, i: int) -> None:
        if self.memory.pop(i, None) is None and i in self.on_disk:
            for path in self.on_disk.pop(i)[0]:
                os.unlink(path)

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    def _write(self, i: int, states: tuple) -> tuple:
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix="tapegrad-snapshots-")    # (mode 0700)
            weakref.finalize(self, shutil.rmtree, self.folder, True)
        paths, likes = [], []
        for k, x in enumerate(states):
            path = os.path.join(self.folder, f"{i}_{k}.npy")
            np.save(path, to_numpy(x), allow_pickle=False)
            paths.append(path)
            likes.append(None if isinstance(x, np.ndarray) else x)   # (to put it back there)
        return tuple(paths), tuple(likes)

    @staticmethod
    def _read(paths: tuple, likes: tuple) -> tuple:
        out = []
        for path, like in zip(paths, likes):
            host = np.load(path, allow_pickle=False)
            out.append(host if like is None else get_backend(like).asarray(host))
        return tuple(out)
