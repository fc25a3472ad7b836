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
from typing import Any

import numpy as np

from tapegrad.backends.registry import array_kind, kind_of
from tapegrad.errors import TapegradError


def array_key(x: Any) -> tuple:
    """An array's memory: (address, shape, strides, dtype).  The dtype object itself, not
    its name: equal dtypes compare equal, and ``dtype.str`` builds a string per call (a
    third of a new array's key)."""
    return (_address(x), tuple(x.shape), byte_strides(x), x.dtype)


class _CupyTypes(dict):
    """Whether an array type is CuPy's (its address ``x.data.ptr``, shape and strides
    tuples, as ``array_key`` takes them): ``_CUPY_TYPES[t]``, asked once per type."""

    def __missing__(self, t: type) -> bool:
        self[t] = found = t.__module__.startswith("cupy")
        return found


_CUPY_TYPES = _CupyTypes()


def byte_strides(x: Any) -> tuple[int, ...]:
    """``x.strides`` in bytes; a torch tensor has none but ``stride()``, in elements."""
    strides = getattr(x, "strides", None)
    if strides is None and hasattr(x, "stride"):
        return tuple(s * x.element_size() for s in x.stride())
    return tuple(strides)


def _address(x: Any) -> int:
    if issubclass(type(x), np.ndarray):      # (a proxy claiming the class has no such struct)
        return _numpy_address(x)
    if isinstance(x, np.ndarray):
        return _address_by_interface(x)
    return array_kind(x).address(x)


def _address_by_interface(x: np.ndarray) -> int:
    return x.__array_interface__["data"][0]


def _address_by_struct() -> Any:
    """A NumPy array's data pointer read from its C struct, where it is the first field after
    the object header (NumPy's ``PyArrayObject_fields``): a single memory read, where
    ``__array_interface__`` builds a dict per call (a recorded launch asks once per new
    array; measured: CHANGELOG.md, 'the figures that moved').  Checked here
    against ``__array_interface__`` on an array and a view; None where the layout differs."""
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
    """One tracked array (one generation of its memory) on one tape.  Records and sweeps use
    it as an opaque key: it hashes and compares by object identity, as fast as a dict lookup
    gets (a sweep looks identities up in a few sets and dicts per recorded launch, where
    hashing a memory tuple on every lookup would add up).  Identities are ordered by when
    they were registered, which breaks ties in the sorted list of memory ranges."""

    __slots__ = ("serial", "owner", "weak", "meta", "span", "released", "anchor")

    def __init__(self, serial: int, owner: Any, weak: bool, meta: tuple, span: tuple):
        self.serial = serial
        self.owner = owner      # a weak reference to the memory's owner, or the owner itself
        self.weak = weak
        self.meta = meta        # (array type, shape, dtype): enough to make its shadow
        self.span = span        # (lo, hi): the bytes its elements occupy (see extent)
        self.released = None    # the tape's weak slot for records that do not keep it
        # the memory itself, held, where other array objects share it and no view leads to
        # it (ArrayKind.memory: a PyOpenCL buffer): the identity then lives as long as the tape
        self.anchor = None

    def alive(self) -> bool:
        return not self.weak or self.anchor is not None or self.owner() is not None

    def __lt__(self, other: Ident) -> bool:
        return self.serial < other.serial

    def __repr__(self) -> str:
        return f"Ident({self.serial}, shape={self.meta[1]})"


class Identities:
    """Identities of the arrays one tape has seen."""

    def __init__(self) -> None:
        self.by_memory: dict[tuple, Ident] = {}         # array_key -> current generation
        self.extents: list[list] = []     # sorted memory ranges: [lo, hi, ident]
        self.starts: list[int] = []       # their los, searched (ints compare fastest)
        # ident -> its entry in ``extents`` (kept here, not on the identity: an identity and
        # its entry pointing at each other would leave cycles for the garbage collector)
        self.entry_of: dict[Ident, list] = {}
        self.known: dict[int, tuple] = {}   # id(view) -> (ref to view, shape, strides, ident)
        self.serial = 0
        # (lo, hi) -> (weak reference to the owner, kernel, thread) of what launches in
        # other threads wrote while the tape recorded (tape/threads.py): refused when met new
        self.foreign: dict[tuple, tuple] = {}

    def track(self, x: Any) -> Ident:
        """The identity of ``x``, registering it the first time."""
        known = self.known.get(id(x))
        shape, strides = x.shape, getattr(x, "strides", None)
        if known is not None and known[0]() is x and known[1] == shape \
                and known[2] == strides:
            return known[3]
        # (a new state of a simulation each step: the plain NumPy case without the helpers)
        t = type(x)
        key = (_numpy_address(x), shape, strides, x.dtype) if t is np.ndarray else \
            (x.data.ptr, shape, strides, x.dtype) if _CUPY_TYPES[t] else \
            (_address(x), shape, strides, x.dtype) if isinstance(x, np.ndarray) else None
        if key is None:         # other array types may give shape and strides as lists
            key = array_key(x)
            ident = self.by_memory.get(key)
            if ident is not None and ident.anchor is None and ident.alive():
                _anchor(ident, x)
        else:
            ident = self.by_memory.get(key)
        if ident is None or ident.weak and ident.anchor is None and ident.owner() is None:
            if self.foreign:
                _refuse_foreign(x, self.foreign)
            ident = self._register(x, key, ident)       # (new, or not alive)
        try:
            self.known[id(x)] = (weakref.ref(x), shape, strides, ident)
        except TypeError:      # no weak references to this array type: remember nothing
            pass
        return ident

    def find(self, x: Any) -> Ident | None:
        """``ident_of(x)``, first by the view object itself (as ``track`` does)."""
        known = self.known.get(id(x))
        if known is not None and known[0]() is x and known[1] == x.shape \
                and known[2] == getattr(x, "strides", None):
            return known[3] if known[3].alive() else None
        return self.ident_of(x)

    def ident_of(self, x: Any) -> Ident | None:
        """The identity of ``x`` if it is tracked (and not a new array at old memory)."""
        ident = self.by_memory.get(array_key(x))
        return ident if ident is not None and ident.alive() else None

    def meta(self, ident: Ident) -> tuple:
        return ident.meta

    def overlapping(self, x: Any) -> Ident | None:
        """A live identity whose memory overlaps that of ``x``, if any (``x`` a view of it)."""
        lo, hi = extent(x)
        k = bisect.bisect_right(self.starts, lo)
        for j in range(max(k - 1, 0), len(self.extents)):
            other_lo, other_hi, other = self.extents[j]
            if other_lo >= hi:
                break
            if lo < other_hi and other.alive():
                return other
        return None

    def anchors(self) -> list[Any]:
        """The memory objects identities hold (``Ident.anchor``)."""
        return [e.anchor for e in self.by_memory.values() if e.anchor is not None]

    def strong_references(self) -> list[Any]:
        """Owners held strongly (types without weak references): they stay alive."""
        return [e.owner for e in self.by_memory.values() if not e.weak]

    def _register(self, x: Any, key: tuple, old: Ident | None) -> Ident:
        """A new identity for ``x`` at memory ``key`` (``old``: the dead one there, if any)."""
        entry = self.entry_of.pop(old, None) if old is not None else None
        if entry is not None and entry[2] is old:
            # a freed array's exact memory (a simulation's new state, as the allocator hands
            # out the memory of an old one): its range is still listed, and the list's ranges
            # never overlap (each new one is checked against its neighbours; a clash with a
            # live array is an error, a dead one is dropped), so it overlaps no other
            span = old.span
            meta = old.meta if old.meta[0] is type(x) else (type(x), old.meta[1], x.dtype)
        else:
            entry = None
            span = lo, hi = extent(x, key[0])
            at = self._check_overlap(x, lo, hi, old)
            meta = (type(x), tuple(x.shape), x.dtype)
        owner = x
        while getattr(owner, "base", None) is not None:
            owner = owner.base
        self.serial += 1
        try:
            ident = Ident(self.serial, weakref.ref(owner), True, meta, span)
        except TypeError:
            ident = Ident(self.serial, owner, False, meta, span)
        if ident.weak and type(x) is not np.ndarray and not _CUPY_TYPES[type(x)]:
            _anchor(ident, x)
        if entry is not None:
            entry[2] = ident
        elif at is not None:      # (None: an empty range overlaps nothing, is not listed)
            entry = [*span, ident]
            self.starts.insert(at, span[0])
            self.extents.insert(at, entry)
        if entry is not None:
            self.entry_of[ident] = entry
        self.by_memory[key] = ident
        return ident

    def _check_overlap(self, x: Any, lo: int, hi: int, old: Ident | None) -> int | None:
        """Tracked live arrays never overlap, so only the neighbours can touch a new one;
        ranges of freed arrays are dropped as they are met.  Returns where ``[lo, hi)``
        goes in the sorted list (None for an empty range, which is not listed)."""
        starts, extents = self.starts, self.extents
        while hi > lo:
            k = bisect.bisect_right(starts, lo)
            if k and extents[k - 1][1] > lo:
                clash = k - 1
            elif k < len(starts) and starts[k] < hi:
                clash = k
            else:
                return k
            other = self.extents[clash][2]
            if other.alive() and other is not old:
                raise TapegradError(
                    f"recorded code used two different views of the same memory (shapes "
                    f"{other.meta[1]} and {tuple(x.shape)}); tapegrad tracks whole arrays or "
                    "identical views, so pass the same view every time (or copy)")
            self.entry_of.pop(other, None)
            del starts[clash]
            extents.pop(clash)[2] = None     # freed memory, now reused: not listed
        return None


def _refuse_foreign(x: Any, noted: dict[tuple, tuple]) -> None:
    """Refuse array ``x`` where it shares bytes with what a launch in another thread wrote
    while the tape recorded (``noted``: (lo, hi) -> (a weak reference to the array owning
    them, the kernel's name, the thread's): ``tape/threads.py``), unless that array is gone
    (``x`` is a new one at its memory)."""
    lo, hi = extent(x)
    for (other_lo, other_hi), (ref, kernel, thread) in list(noted.items()):
        if lo < other_hi and other_lo < hi and (ref is None or ref() is not None):
            raise TapegradError(
                f"an array of shape {tuple(x.shape)} that kernel {kernel} wrote (or wrote part "
                f"of) in thread {thread!r} while this tape recorded in another thread: tapes "
                "record the launches of their own thread only, so the tape would take it for "
                "a constant and lose the derivative through it. Launch the kernel in the "
                "recording thread (after the workers, or instead of them), or record each "
                "worker's part on a tape of its own and combine their gradients; data that "
                "depends on nothing you differentiate can be made before the `with` block")


def _anchor(ident: Ident, x: Any) -> None:
    """Hold the memory of ``x`` in ``ident`` where another object may reach it too and no
    view leads to it (a PyOpenCL view shares a buffer that takes no weak references): the
    identity then outlives ``x``, as the memory does, so that a new view of the same elements
    is the same array (a temporary view's identity died with it, and the tape took the next
    view for a new, unwritten array).  An array object alone on its memory (a simulation's
    new state) is not held: the tape frees it as it frees NumPy's."""
    memory = array_kind(x).memory(x)
    # (references: x's own, this local, getrefcount's argument; more: another object's)
    if memory is not None and (sys.getrefcount(memory) > 3 or ident.owner() is not x):
        ident.anchor = memory


def disjoint(arrays: list) -> bool:
    """Whether distinct array objects have no element in common: NumPy arrays that own their
    memory cannot share it, others' byte ranges must lie apart (an interleaved pair of views
    counts as overlapping here)."""
    for x in arrays:
        if type(x) is not np.ndarray or x.base is not None:
            break
    else:
        return True
    spans = sorted(map(extent, arrays))
    end = spans[0][1]
    for lo, hi in spans[1:]:
        if lo < end:
            return False
        end = hi
    return True


def sharing_pairs(items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """The pairs ``(key, other key)`` of ``items`` (``(key, array)``, in order) whose arrays
    have elements in common; none at the cost of one ``disjoint`` in the usual case."""
    arrays = [x for _, x in items]
    if len({id(x) for x in arrays}) == len(arrays) and disjoint(arrays):
        return []
    return [(p, q) for k, (p, a) in enumerate(items) for q, b in items[k + 1:]
            if overlapping(a, b)]


def overlapping(a: Any, b: Any) -> bool:
    """Whether two arrays have elements in common (byte ranges first; NumPy decides
    interleaved views)."""
    if a is b:
        return True
    (lo, hi), (lo2, hi2) = extent(a), extent(b)
    if not (lo < hi2 and lo2 < hi):
        return False
    return not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or bool(
        np.shares_memory(a, b))


def extent(x: Any, ptr: int | None = None) -> tuple[int, int]:
    """The byte range ``[lo, hi)`` an array's elements occupy (host and device addresses
    never meet: device arrays are shifted into their own range); ``ptr``: its address, if
    known."""
    t = type(x)
    if _CUPY_TYPES[t]:                      # (the common cases without the kinds' helpers)
        ptr = x.data.ptr if ptr is None else ptr
        if x._c_contiguous and x.size:      # (a new state: its bytes in a row)
            return ptr + (1 << 64), ptr + (1 << 64) + x.nbytes
        strides, itemsize, device = x.strides, x.dtype.itemsize, True
    elif isinstance(x, np.ndarray):
        ptr, strides, itemsize, device = _address(x) if ptr is None else ptr, x.strides, \
            x.dtype.itemsize, False
    else:
        ptr = _address(x) if ptr is None else ptr
        strides, itemsize = byte_strides(x), array_kind(x).dtype(x).itemsize
        device = not kind_of(x).host
    lo = hi = ptr
    for n, st in zip(x.shape, strides):
        if n == 0:
            return ptr, ptr
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    hi += itemsize
    if device:                              # device memory: apart from the host's
        lo, hi = lo + (1 << 64), hi + (1 << 64)
    return lo, hi
