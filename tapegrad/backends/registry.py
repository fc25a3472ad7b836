"""Which backend owns an array, and the operations tapegrad needs on that kind of array.

Each backend declares the array types it owns in one :class:`ArrayKind` (its own folder's
``arrays.py``) and registers it here with one line in ``tapegrad/backends/__init__.py``.
Everything that handles arrays outside kernels (``tg.get_backend``, the launch cache's key,
the tape's identities, copies and shadows, the host reductions) asks :func:`kind_of`, so an
array type that no backend owns is refused with a clear error instead of being taken for a
constant (its gradient silently zero).

The answer is remembered per Python type, except for types whose objects live on either side
(``ArrayKind.per_object``: a ``torch.Tensor`` is on the CPU or on a GPU), which are asked
object by object.

>>> import numpy as np
>>> kind_of(np.zeros(3)).name
'numpy'
>>> kind_of([1.0, 2.0]) is None
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.errors import BackendError


class ArrayKind:
    """One kind of array and what tapegrad does with it; a backend subclasses it."""

    name = "array"
    host = False          # its memory is the host's (addresses of host and device never meet)
    # whether a view leads to the object owning its memory through ``.base`` (NumPy's and
    # CuPy's do; a PyOpenCL view shares a buffer object that takes no weak references)
    views_know_their_base = True

    def owns(self, x: Any) -> bool:
        raise NotImplementedError

    def check_operable(self, x: Any, what: str) -> None:
        """Refuse ``x`` where this kind's array module cannot ``what`` it (a copy, a scale,
        a reshape, zeroing in place) with a tapegrad error saying what to pass instead."""

    def memory(self, x: Any) -> Any:
        """The object owning ``x``'s memory where ``views_know_their_base`` is False (then
        the tape holds it while other arrays share it: tape/identity.py), else None."""
        return None

    def per_object(self, x: Any) -> bool:
        """Whether other objects of ``type(x)`` may get another answer from :meth:`owns`
        than ``x`` does (then :func:`kind_of` asks every object, not once per type)."""
        return False

    def place(self, x: Any) -> Any:
        """Which of this kind's backends ``x`` lives on, as a hashable value (``()`` where
        the kind has one backend, a GPU's index), so that ``tg.get_backend`` hands out one
        backend object per place; None where that is not known cheaply (a backend is made
        per call)."""
        return None

    def advice(self, x: Any) -> str | None:
        """How to bring ``x``, an array no kind owns, to this kind's backend (None: no
        advice), for the error that refuses it."""
        return None

    def address(self, x: Any) -> int:
        """The address of ``x``'s first element (its identity, with shape and strides)."""
        raise NotImplementedError

    def dtype(self, x: Any) -> np.dtype:
        """``x``'s element type, as NumPy's."""
        return np.dtype(x.dtype)

    def launch_key(self, x: Any) -> tuple:
        """What compiled code for a launch taking ``x`` depends on."""
        return (type(x), np.dtype(x.dtype).num, x.ndim)

    def new(self, shape: tuple[int, ...], dtype: Any, zeroed: bool) -> Any:
        """A new array of this kind (tapegrad's copies and shadows)."""
        xp = self.module()
        return xp.zeros(shape, dtype) if zeroed else xp.empty(shape, dtype)

    def module(self) -> Any:
        """The array module for host-side operations on this kind (``numpy``, ``cupy``)."""
        raise NotImplementedError

    def to_numpy(self, x: Any) -> np.ndarray:
        raise NotImplementedError

    def upload(self, x: Any, host: np.ndarray) -> None:
        """Write ``host`` (a NumPy array of ``x``'s shape and type) into ``x``."""
        xp = self.module()
        xp.asarray(x)[...] = xp.asarray(host)

    def fingerprint(self, x: Any) -> Any:
        """The tape's hash of ``x``'s contents computed where ``x`` lives (a value that two
        fingerprints of the same array compare equal by), or None to hash a host copy."""
        return None

    # tg.debug_nans (runtime/nans.py): a copy taken where the array lives, the first element
    # that became a NaN or an infinity, computed there (one number comes back), and the copy
    # put back.  These defaults take the NumPy API of ``module()``, which CuPy shares.
    def snapshot(self, x: Any) -> Any:
        """A copy of ``x``'s contents, where ``x`` lives."""
        xp = self.module()
        return xp.array(xp.asarray(x), copy=True)

    def mark_nonfinite(self, x: Any) -> None:
        """Give the NaNs and infinities of ``x``, an array a launch only writes, tapegrad's
        own NaN (``MARK``): old non-finite contents (memory from ``np.empty``) then hide no
        new NaN, and no arithmetic makes that NaN from the launch's inputs."""
        xp = self.module()
        a = xp.asarray(x)
        a.view(_BITS[a.dtype.itemsize])[~xp.isfinite(a)] = MARK[a.dtype.itemsize]

    def first_new_nonfinite(self, before: Any, after: Any, marked: bool = False) -> int | None:
        """The flat (row-major) index of the first element ``after`` holds as a NaN or an
        infinity where ``before`` (its snapshot) held another value (``marked``: that is not
        ``MARK``); None if none did."""
        xp = self.module()
        a = xp.asarray(after).reshape(-1)
        if marked:
            new = ~xp.isfinite(a) & (a.view(_BITS[a.dtype.itemsize]) != MARK[a.dtype.itemsize])
        else:
            b = before.reshape(-1)
            new = ~xp.isfinite(a) & ~((a == b) | (xp.isnan(a) & xp.isnan(b)))
        return int(xp.argmax(new)) if bool(new.any()) else None

    def unmark(self, x: Any, before: Any) -> None:
        """The elements of ``x`` still holding ``MARK`` (not written) get ``before``'s back."""
        xp = self.module()
        a = xp.asarray(x)
        kept = a.view(_BITS[a.dtype.itemsize]) == MARK[a.dtype.itemsize]
        a[kept] = before[kept]

    def element(self, x: Any, flat: int) -> float:
        """The element at flat index ``flat`` of ``x`` (row-major), as a Python number."""
        return self.module().asarray(x).reshape(-1)[flat].item()

    def restore(self, x: Any, before: Any) -> None:
        """Put ``before`` (a snapshot of ``x``) back into ``x`` (a read-only array was not
        written)."""
        if getattr(getattr(x, "flags", None), "writeable", True):
            self.module().asarray(x)[...] = before


# tapegrad's NaN (a quiet NaN with a payload of its own), by item size: see mark_nonfinite
MARK = {8: 0x7FF8_7A6E_616E_7321, 4: 0x7FC7_A6E1, 2: 0x7E3D}
_BITS = {8: np.uint64, 4: np.uint32, 2: np.uint16}


_KINDS: list[ArrayKind] = []
_PER_OBJECT: Any = object()   # in _BY_TYPE: a type whose objects are asked one by one
_BY_TYPE: dict[type, Any] = {}         # answers so far, per Python type (or _PER_OBJECT)
_OF_TYPE: dict[type, ArrayKind] = {}   # the kind that owned an object of a type, per type
_BACKEND_OF: dict[int, Callable[[Any], Any]] = {}  # id(kind) -> the backend an array is on
_BACKENDS: dict[tuple, Any] = {}       # (id(kind), place) -> that place's backend


def register(kind: ArrayKind, backend_of: Callable[[Any], Any]) -> ArrayKind:
    """Register a backend's kind of array, with ``backend_of(x)``: the backend an array of
    that kind lives on (given here, so that the kind needs no import of its backend)."""
    _KINDS.append(kind)
    _BACKEND_OF[id(kind)] = backend_of
    _BY_TYPE.clear()
    _OF_TYPE.clear()
    _BACKENDS.clear()
    return kind


def backend_of(x: Any, who: str = "tapegrad") -> Any:
    """The backend the array ``x`` lives on (a :class:`BackendError` if none owns it): one
    object per place where the kind names places (``ArrayKind.place``), so that caches keyed
    by the backend see the same object launch after launch."""
    kind = array_kind(x, who)
    place = kind.place(x)
    if place is None:
        return _BACKEND_OF[id(kind)](x)
    key = (id(kind), place)
    backend = _BACKENDS.get(key)
    if backend is None:
        backend = _BACKENDS[key] = _BACKEND_OF[id(kind)](x)
    return backend


def kind_of(x: Any) -> ArrayKind | None:
    """The registered kind of array ``x`` is, or None if it is not an array of any (asked
    once per Python type where that decides it: the launch path asks per argument)."""
    try:
        found = _BY_TYPE[type(x)]
    except KeyError:
        return _first_of_type(x)
    if found is _PER_OBJECT:
        return _ask(x)
    return found


def _ask(x: Any) -> ArrayKind | None:
    found = next((k for k in _KINDS if k.owns(x)), None)
    if found is not None:
        _OF_TYPE.setdefault(type(x), found)
    return found


def _first_of_type(x: Any) -> ArrayKind | None:
    found = _ask(x)
    _BY_TYPE[type(x)] = _PER_OBJECT if any(k.per_object(x) for k in _KINDS) else found
    return found


def kind_of_type(t: type) -> ArrayKind | None:
    """The kind of arrays of type ``t``, for a type :func:`kind_of` has met (a tape's
    records keep types, not arrays; for a type asked per object, the kind that owned one)."""
    return _OF_TYPE.get(t)


def array_kind(x: Any, who: str = "tapegrad") -> ArrayKind:
    """``kind_of(x)``, or a :class:`~tapegrad.errors.BackendError` that says what to do
    (``who``: what wanted an array)."""
    kind = kind_of(x)
    if kind is None:
        if not is_array(x):
            raise BackendError(f"{who} expects an array (numpy.ndarray, or a GPU array), got "
                               f"{type(x).__name__}" + ("; make it an array first, e.g. "
                               "numpy.asarray(x)" if isinstance(x, (list, tuple)) else ""))
        advice = next((a for a in (k.advice(x) for k in _KINDS) if a), None)
        raise BackendError(
            f"{who} got a {type(x).__module__}.{type(x).__name__}, which no tapegrad backend "
            f"owns (kinds registered: {', '.join(k.name for k in _KINDS)}); " + (advice or
            "convert it, e.g. numpy.asarray(x) for the CPU or cupy.asarray(x) for CUDA"))
    return kind


def offers_cuda_interface(x: Any) -> bool:
    """Whether ``x`` is a CUDA array by the CUDA Array Interface: ``hasattr`` would raise
    where the library refuses the interface to an object that has one (PyTorch, for a CUDA
    tensor that requires grad)."""
    try:
        getattr(x, "__cuda_array_interface__")
    except AttributeError:
        return False
    except Exception:
        return True
    return True


def is_array(x: Any) -> bool:
    """Whether ``x`` has an array's shape and dtype (whether or not a backend owns it): a
    NumPy scalar or a tape's scalar is not one."""
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(
        x, (np.generic, float, int))
