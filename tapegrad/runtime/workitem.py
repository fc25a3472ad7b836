"""One work-item of a kernel run in Python on the host, line by line: which statement of the
kernel (or of a device function it calls) first made a NaN or an infinity.

``tg.debug_nans`` (nans.py) asks it after a primal launch wrote a new non-finite element,
for kernels without barriers or local memory whose written array has the launch's shape (the
work-item that wrote element ``k`` is then work-item ``k``).  The kernel's own Python
function runs on host copies of the arguments, with ``tg.index()`` and the other
kernel-language functions answering for that work-item (``lang.intrinsics.emulated``), under
a line tracer: the first line after which a local variable or the bad element holds a new
NaN or infinity, or which raises (Python's ``math.sqrt(-1.0)``, ``1 / 0`` on ints), is the
statement.  Python's arithmetic is not the device's in every corner (integer division by
zero, rounding of float32), so this names a statement, not a value; None where it cannot
(barriers, local memory, atomics' ordering, another work-item wrote the element).
"""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.lang.intrinsics import Global, Group, Linear, Local, NTuple, emulated


class _CannotRun(Exception):
    """What this work-item does cannot be run alone (a barrier, local memory)."""


class _Found(Exception):
    def __init__(self, filename: str, line: int):
        self.filename, self.line = filename, line


class WorkItem:
    """The answers of the kernel-language functions for one work-item."""

    def __init__(self, index: tuple[int, ...], nd: tuple[int, ...], groupsize: tuple[int, ...]):
        self.g, self.nd, self.wgs = index, nd, groupsize

    def index(self, space: Any = Global, kind: Any = Linear) -> Any:
        if space is Local:
            idx, shape = tuple(g % w for g, w in zip(self.g, self.wgs)), self.wgs
        elif space is Group:
            idx = tuple(g // w for g, w in zip(self.g, self.wgs))
            shape = tuple(-(-n // w) for n, w in zip(self.nd, self.wgs))
        else:
            idx, shape = self.g, self.nd
        if kind is NTuple:
            return idx
        return int(np.ravel_multi_index(idx, shape))

    def groupsize(self) -> tuple[int, ...]:
        return self.wgs

    def ndrange(self) -> tuple[int, ...]:
        return self.nd

    def localmem(self, *args: Any) -> Any:
        raise _CannotRun("local memory")

    def synchronize(self) -> None:
        raise _CannotRun("a barrier")

    def private(self, dtype: Any, shape: Any) -> Any:
        return np.zeros(shape, dtype)

    def _atomic(self, arr: Any, idx: Any, v: Any, op: Any) -> Any:
        old = arr[idx]
        arr[idx] = op(old, v)
        return old

    def atomic_add(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, lambda a, b: a + b)

    def atomic_sub(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, lambda a, b: a - b)

    def atomic_min(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, min)

    def atomic_max(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, max)


def statement(pyfunc: Any, args: tuple, nd: tuple[int, ...], groupsize: tuple[int, ...],
              written: int, flat: int, write_only: frozenset[int] = frozenset()) -> str | None:
    """``file:line: source`` of the statement with which the work-item that wrote element
    ``flat`` of argument ``written`` made it non-finite (``args`` as before the launch;
    ``write_only``: the positions of arrays the kernel only writes, whose old contents do not
    matter), or None where that cannot be told.  A local variable counts when it becomes NaN
    (an infinity may be meant: ``m = -math.inf`` before a maximum), the element when it
    becomes NaN or infinite, a device function when it returns NaN."""
    array = args[written]
    if tuple(array.shape) != tuple(nd):
        return None
    copies = [np.array(kind_of(a).to_numpy(a)) if kind_of(a) is not None else a for a in args]
    for k in write_only:
        if copies[k].dtype.kind == "f":
            copies[k][~np.isfinite(copies[k])] = 0.0
    target = copies[written].reshape(-1)
    index = tuple(int(i) for i in np.unravel_index(flat, nd))
    user_files = {pyfunc.__code__.co_filename}
    frames_seen: dict[Any, int] = {}
    already = {"element": not np.isfinite(target[flat])}   # (non-finite before: not new)

    def nan(value: Any) -> bool:
        return isinstance(value, (float, np.floating)) and bool(np.isnan(value))

    def bad_now(frame: Any) -> bool:
        for name, value in frame.f_locals.items():
            if nan(value) and (frame, name) not in already:
                return True
        return not already["element"] and not np.isfinite(target[flat])

    def note_bad(frame: Any) -> None:
        for name, value in frame.f_locals.items():
            if nan(value):
                already[(frame, name)] = True

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename not in user_files and not _is_device_function(frame):
            return None
        user_files.add(code.co_filename)
        if event == "call":
            note_bad(frame)        # (its arguments: what came in is not this function's)
        elif event == "line" or event == "return":
            last = frames_seen.get(frame)
            if last is not None and (bad_now(frame) or event == "return" and nan(arg)):
                raise _Found(code.co_filename, last)
            frames_seen[frame] = frame.f_lineno
        elif event == "exception" and not isinstance(arg[1], (_Found, _CannotRun)):
            raise _Found(code.co_filename, frame.f_lineno)
        return tracer

    token = emulated.set(WorkItem(index, tuple(nd), tuple(groupsize)))
    old = sys.gettrace()
    try:
        with np.errstate(all="ignore"):
            sys.settrace(tracer)
            try:
                pyfunc(*copies)
            finally:
                sys.settrace(old)
    except _Found as found:
        text = re.sub(r"\s+#.*$", "", linecache.getline(found.filename, found.line).strip())
        return f"{os.path.basename(found.filename)}:{found.line}: {text}"
    except Exception:     # (_CannotRun, or Python refusing what the device computes)
        return None
    finally:
        emulated.reset(token)
    return None


def _is_device_function(frame: Any) -> bool:
    """Whether ``frame`` runs a ``@tg.func``'s Python (called from the kernel's): the module
    of the kernel's callees is the user's, not tapegrad's or the standard library's."""
    filename = frame.f_code.co_filename
    return not (filename.startswith("<") or "site-packages" in filename
                or filename.startswith(os.path.dirname(os.__file__))
                or filename.startswith(os.path.dirname(os.path.dirname(__file__))))
