"""Which recorded arrays are the same array: identities by memory, without keeping arrays alive.

A tape tracks arrays by their memory (address, shape, strides, dtype), so that two view
objects of the same elements are the same array.  It does not keep them alive: an array whose
contents no adjoint reads (a linear kernel's input, an output) is freed when user code drops
it, so a 1000-step simulation of linear steps holds no state.  Memory can then be reused by a
new array at the same address; while the object owning the old memory (the root of the view's
``base`` chain) is alive that cannot happen, so an identity stays valid exactly as long as its
owner lives, and a new array at a dead owner's address gets a new identity (a new generation).
"""

from __future__ import annotations

import bisect
import sys
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError


def array_key(x: Any) -> tuple:
    """An array's memory: (address, shape, strides, dtype)."""
    return (_address(x), tuple(x.shape), tuple(x.strides), x.dtype.str)


def _address(x: Any) -> int:
    if issubclass(type(x), np.ndarray):      # (a proxy claiming the class has no such struct)
        return _numpy_address(x)
    if isinstance(x, np.ndarray):
        return _address_by_interface(x)
    return x.__cuda_array_interface__["data"][0]


def _address_by_interface(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def _address_by_struct() -> Any:
    """A NumPy array's data pointer read from its C struct, where it is the first field after
    the object header (NumPy's ``PyArrayObject_fields``): 0.09 us, against 0.73 us through
    ``__array_interface__``, which builds a dict per call (a recorded launch asks once per new
    array).  Checked here against ``__array_interface__`` on an array and a view; None where
    the layout differs."""
    if sys.implementation.name != "cpython":     # elsewhere id() is no address
        return None
    import ctypes
    read = ctypes.c_void_p.from_address
    offset = object.__basicsize__

    def address(x: np.ndarray) -> int:
        return read(id(x) + offset).value or 0

    try:
        base = np.arange(12.0).reshape(3, 4)
        if all(address(a) == _address_by_interface(a) for a in (base, base[1:, 2:], base.T)):
            return address
    except Exception:       # any surprise: the slow, documented way
        pass
    return None


_numpy_address = _address_by_struct() or _address_by_interface


class Ident:
    """One tracked array on one tape: an opaque key that hashes and compares by object
    identity, as fast as a dict lookup gets (the reverse sweep looks identities up in a few
    sets and dicts per recorded launch; hashing the memory tuple each time cost ~0.1 us a
    lookup).  Identities of one tape are ordered by when they were registered, so that the
    sorted list of memory ranges can break ties."""

    __slots__ = ("serial", "key")

    def __init__(self, serial: int, key: tuple):
        self.serial = serial
        self.key = key          # (address, shape, strides, dtype) when registered

    def __lt__(self, other: Ident) -> bool:
        return self.serial < other.serial

    def __repr__(self) -> str:
        return f"Ident({self.serial}, shape={self.key[1]})"


@dataclass(slots=True)
class _Entry:
    ident: Ident
    owner: Any          # a weak reference to the memory's owner, or the owner itself
    weak: bool
    meta: tuple         # (array type, shape, dtype string): enough to make its shadow
    span: tuple         # (lo, hi): the bytes its elements occupy (see extent)

    def alive(self) -> bool:
        return not self.weak or self.owner() is not None


class Identities:
    """Identities of the arrays one tape has seen."""

    def __init__(self) -> None:
        self.by_memory: dict[tuple, _Entry] = {}        # array_key -> current generation
        self.entries: dict[Ident, _Entry] = {}          # identity -> entry (all generations)
        self.extents: list[tuple[int, int, Ident]] = []   # sorted memory ranges
        self.known: dict[int, tuple] = {}   # id(view) -> (ref to view, shape, strides, ident)
        self.serial = 0

    def track(self, x: Any) -> Ident:
        """The identity of ``x``, registering it the first time."""
        known = self.known.get(id(x))
        if known is not None and known[0]() is x and known[1] == x.shape \
                and known[2] == x.strides:
            return known[3]
        key = (_address(x), x.shape, x.strides, x.dtype.str) if isinstance(x, np.ndarray) \
            else array_key(x)        # other array types may give shape and strides as lists
        entry = self.by_memory.get(key)
        if entry is None or not entry.alive():
            entry = self._register(x, key, entry)
        try:
            self.known[id(x)] = (weakref.ref(x), x.shape, x.strides, entry.ident)
        except TypeError:      # no weak references to this array type: remember nothing
            pass
        return entry.ident

    def ident_of(self, x: Any) -> Ident | None:
        """The identity of ``x`` if it is tracked (and not a new array at old memory)."""
        entry = self.by_memory.get(array_key(x))
        return entry.ident if entry is not None and entry.alive() else None

    def meta(self, ident: Ident) -> tuple:
        return self.entries[ident].meta

    def strong_references(self) -> list[Any]:
        """Owners held strongly (types without weak references): they stay alive."""
        return [e.owner for e in self.by_memory.values() if not e.weak]

    def _register(self, x: Any, key: tuple, old: _Entry | None) -> _Entry:
        self.serial += 1
        ident = Ident(self.serial, key)      # (a new generation of old memory: a new one)
        slot = self._slot_of(old)
        if slot is not None:
            # a freed array's exact memory (a simulation's new state, as the allocator hands
            # out the memory of an old one): its range is in the list, overlapping nothing
            lo, hi = old.span
            self.extents[slot] = (lo, hi, ident)
        else:
            lo, hi = extent(x, key[0])
            self._check_overlap(x, lo, hi, old)
            if hi > lo:           # an empty range overlaps nothing (and would hide neighbours)
                bisect.insort(self.extents, (lo, hi, ident))
        owner = x
        while getattr(owner, "base", None) is not None:
            owner = owner.base
        meta = (type(x), tuple(x.shape), x.dtype.str)
        try:
            entry = _Entry(ident, weakref.ref(owner), True, meta, (lo, hi))
        except TypeError:
            entry = _Entry(ident, owner, False, meta, (lo, hi))
        self.by_memory[key] = entry
        self.entries[ident] = entry
        return entry

    def _slot_of(self, old: _Entry | None) -> int | None:
        """Where the dead entry ``old`` (same memory key as a new array) still has its range in
        the sorted list, if it does.  The list's ranges never overlap (each new one is checked
        against its neighbours; a clash with a live array is an error, a dead one is dropped),
        so a range still listed overlaps no other."""
        if old is None:
            return None
        k = bisect.bisect_left(self.extents, (*old.span, old.ident))
        if k < len(self.extents) and self.extents[k][2] is old.ident:
            return k
        return None

    def _check_overlap(self, x: Any, lo: int, hi: int, old: _Entry | None) -> None:
        """Tracked live arrays never overlap, so only the neighbours can touch a new one;
        ranges of freed arrays are dropped as they are met."""
        while hi > lo:
            k = bisect.bisect_right(self.extents, (lo, hi))
            clash = None
            for j in (k - 1, k):
                if 0 <= j < len(self.extents):
                    other_lo, other_hi, other = self.extents[j]
                    if other_lo < hi and lo < other_hi:
                        clash = j
                        break
            if clash is None:
                return
            other = self.extents[clash][2]
            entry = self.entries[other]
            if entry.alive() and entry is not old:
                raise TapegradError(
                    f"recorded code used two different views of the same memory (shapes "
                    f"{entry.meta[1]} and {tuple(x.shape)}); tapegrad tracks whole arrays or "
                    "identical views, so pass the same view every time (or copy)")
            del self.extents[clash]          # freed memory, now reused


def extent(x: Any, ptr: int | None = None) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` an array's elements occupy (host and device addresses
    never meet: device arrays are shifted into their own range); ``ptr``: its address, if
    known."""
    if ptr is None:
        ptr = _address(x)
    lo = hi = ptr
    for n, st in zip(x.shape, x.strides):
        if n == 0:
            return ptr, ptr
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    hi += x.dtype.itemsize
    if not isinstance(x, np.ndarray):
        lo, hi = lo + (1 << 64), hi + (1 << 64)
    return lo, hi
