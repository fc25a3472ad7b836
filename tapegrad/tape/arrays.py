"""The tape's arrays: what counts as one, new ones for copies and shadows, and finished
shadows kept for the next sweep."""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from tapegrad.backends.registry import array_kind, is_array, kind_of_type

__all__ = ["is_array", "repeats", "only_tape_holds", "Spares", "spares", "allocate",
           "empty_like", "zeros_like"]


def repeats(items: list[Any]) -> bool:
    """Whether an object occurs twice among ``items``: a launch's few arrays, where pairwise
    identity tests beat building a set."""
    for k in range(1, len(items)):
        x = items[k]
        for j in range(k):
            if items[j] is x:
                return True
    return False


# free-threaded CPython defers some reference counts: there, count nothing and watch all
_EXACT_REFCOUNTS = getattr(sys, "_is_gil_enabled", lambda: True)()


def only_tape_holds(x: Any, held: int) -> bool:
    """True when every reference to ``x`` is one of the ``held`` the tape keeps and ``x`` owns
    its memory (no user view or base can reach it), so user code can no longer change it."""
    # besides the held ones getrefcount sees the caller's variable, this function's parameter
    # and its own argument (tests/tape/test_tape.py checks both outcomes)
    if not (_EXACT_REFCOUNTS and getattr(x, "base", None) is None
            and sys.getrefcount(x) - 3 <= held):
        return False
    if type(x) is np.ndarray:
        return True
    # memory that views share without a base (a PyOpenCL buffer): x must be alone on it (its
    # reference, this local and getrefcount's argument; a tape's anchor counts as another)
    memory = array_kind(x).memory(x)
    return memory is None or sys.getrefcount(memory) <= 3


class Spares:
    """Finished shadows of NumPy type kept from one sweep for the next (at most
    ``limit_bytes`` in all, the most recent first): a gradient asked for in a loop would
    otherwise take fresh pages from the system for its temporaries' shadows on every call
    and fault on each 4 KiB page (measured: CHANGELOG.md, 'the figures that
    moved').  CuPy has a memory pool of its own.  Set
    ``tapegrad.tape.arrays.spares.limit_bytes = 0`` to keep none."""

    def __init__(self, limit_bytes: int):
        self.limit_bytes = limit_bytes
        self.kept: list[tuple[tuple, np.ndarray]] = []    # oldest first
        self.lock = threading.Lock()

    def take(self, meta: tuple) -> np.ndarray | None:
        if not self.kept:
            return None
        with self.lock:
            for k in range(len(self.kept) - 1, -1, -1):
                if self.kept[k][0] == meta:
                    return self.kept.pop(k)[1]
        return None

    def keep(self, free: dict[tuple, list[Any]]) -> None:
        fresh = [(meta, a) for meta, arrays in free.items() if meta[0] is np.ndarray
                 for a in arrays if a.nbytes <= self.limit_bytes]
        if not fresh:
            return
        with self.lock:
            self.kept.extend(fresh)
            total = sum(a.nbytes for _, a in self.kept)
            while total > self.limit_bytes:
                total -= self.kept.pop(0)[1].nbytes


spares = Spares(64 << 20)


def allocate(meta: tuple, zeroed: bool) -> Any:
    """A new array of ``meta = (array type, shape, dtype)``."""
    kind, shape, dtype = meta
    if issubclass(kind, np.ndarray):
        return np.zeros(shape, dtype) if zeroed else np.empty(shape, dtype)
    return kind_of_type(kind).new(shape, dtype, zeroed)


def empty_like(x: Any) -> Any:
    """An array like ``x`` (its layout), a plain ``np.ndarray`` for NumPy's subclasses (a
    memmap's, an ``np.matrix``'s, whose ``ravel()`` stays 2-D)."""
    if isinstance(x, np.ndarray):
        return np.empty_like(x, subok=False)
    return array_kind(x).module().empty_like(x)


def zeros_like(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        if x.flags.c_contiguous and type(x) is np.ndarray:
            return np.zeros(x.shape, x.dtype)    # (calloc: no pass over memory the OS zeroed)
        return np.zeros_like(x, subok=False)       # (as empty_like)
    return array_kind(x).module().zeros_like(x)
