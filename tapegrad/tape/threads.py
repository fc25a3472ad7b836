"""Launches in another thread while a tape records: what they write is refused where the
tape meets it.

Tapes are per thread: a launch in a thread where no tape records (a ``ThreadPoolExecutor``'s
worker inside a ``with tg.Tape()`` block) is not recorded, so an array it writes is a
constant to the tape, and the derivative through it would be lost without a word.  While
any tape records, ``runtime.launch`` shows this module the launches no tape records
(``elsewhere``); each array such a launch writes is noted for the tapes recording in other
threads, by its bytes, and a tape that then meets an array over them as a new array (a
recorded launch or a ``tg`` operation reads or writes it; a view of them, or the array a
worker filled in parts) raises a TapegradError naming the kernel, the thread and the ways
out (``Identities.track``'s check).  Not seen: a ``tg.capture``'d function replayed by a
worker (its launches are called directly), and ``tg`` host operations in a worker.  A launch in the recording thread itself with the tape
paused (``tg.checkpoint``'s own runs) is that thread's business, not noted.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from tapegrad.frontend import kernel_ir
from tapegrad.runtime import launch
from tapegrad.runtime.arguments import access
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import extent
from tapegrad.tape.memory import owner

_LOCK = threading.Lock()
# (tape, the thread it records in) for each tape recording: a tuple replaced under the lock,
# read without it
_RECORDING: tuple[tuple[Any, int], ...] = ()


def started(tape: Any) -> None:
    """``tape`` records in this thread from now on."""
    global _RECORDING
    with _LOCK:
        _RECORDING += ((tape, threading.get_ident()),)
        launch.elsewhere[0] = _noted


def stopped(tape: Any) -> None:
    """``tape`` no longer records (what it noted goes: nothing new is recorded)."""
    global _RECORDING
    with _LOCK:
        _RECORDING = tuple(entry for entry in _RECORDING if entry[0] is not tape)
        if not _RECORDING:
            launch.elsewhere[0] = None
        tape.ids.foreign.clear()


def _noted(cfg: Any, args: tuple) -> None:
    """A launch no tape records in this thread: the arrays it writes, noted for the tapes
    recording in other threads (``foreign`` of their identities)."""
    me = threading.get_ident()
    tapes = [tape for tape, thread in _RECORDING if thread != me]
    if not tapes:
        return
    _, writes = access(cfg.kernel)
    what = (cfg.kernel.name, threading.current_thread().name)
    for name, a in zip(kernel_ir(cfg.kernel).params, args):
        if name in writes and is_array(a):
            # (by the bytes it wrote, which a view of them or the whole array meets too,
            # while the array owning them lives: freed memory may be another array's)
            try:
                ref: Any = weakref.ref(owner(a))
            except TypeError:         # (no weak references: known by its memory alone)
                ref = None
            span = extent(a)
            for tape in tapes:
                tape.ids.foreign[span] = (ref, *what)
