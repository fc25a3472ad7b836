"""Under ``verify``: arrays that host code made from recorded values while a tape recorded.

``u = 0.9 * u`` between two launches makes a new array from a launch's result by NumPy,
which no tape sees: the launch that wrote the old ``u`` is left with no use, and the new
array is a constant to the tape.  When the target still depends on a source another way (a
coefficient ``D`` every step reads), nothing else looks wrong, and the gradients with
respect to the sources before that line come out zero.  A verifying tape therefore traces
Python's allocations while it records (``tracemalloc``: the cost of a debugging mode) and
notes each array that a recorded operation reads before any wrote it and that was made
during the recording; the sweep refuses a target reached through such an array when a
recorded launch before its first read computed from the sources and reaches nothing the
target depends on (``check``).  A constant made inside the recording with nothing left
unused before it (``c = np.full(n, 0.5)``, ``np.zeros_like(u)`` that a kernel then adds
into) is not refused.
"""

from __future__ import annotations

import threading
import tracemalloc
from dataclasses import dataclass
from typing import Any

from tapegrad.callers import user_line
from tapegrad.errors import TapegradError
from tapegrad.tape.memory import owner

_lock = threading.Lock()
_tracing = [0]          # recordings that asked for tracing (tracemalloc stops at the last)


@dataclass
class Made:
    """An array made during the recording, first read by record ``position`` at ``where``."""

    ident: Any
    position: int
    where: str


class Provenance:
    """What a verifying tape notes while it records: each record's user line, and the
    arrays made during the recording that a record read before any record wrote them."""

    def __init__(self) -> None:
        self.lines: list[str] = []          # per record, the user's line that made it
        self.made: list[Made] = []
        self.seen: set = set()              # identities a record touched
        self.started = False

    def start(self) -> None:
        with _lock:
            if _tracing[0] == 0 and tracemalloc.is_tracing():
                return                      # the user's own tracing: arrays made before
                #                             the tape would look new; nothing is noted
            if _tracing[0] == 0:
                tracemalloc.start()
            _tracing[0] += 1
            self.started = True

    def stop(self) -> None:
        with _lock:
            if self.started:
                self.started = False
                _tracing[0] -= 1
                if _tracing[0] == 0:
                    tracemalloc.stop()

    def recorded(self, tape: Any, record: Any, arrays: Any) -> None:
        """After ``record`` was appended: its line, and which of ``arrays`` (those it read)
        no earlier record touched and were made during the recording."""
        where = user_line()
        position = len(tape.records) - 1
        self.lines.extend([where] * (position + 1 - len(self.lines)))
        if self.started:
            for x in arrays:
                ident = tape.ids.ident_of(x)
                if ident is not None and ident not in self.seen and ident not in \
                        record.writes and tracemalloc.get_object_traceback(owner(x)):
                    self.made.append(Made(ident, position, where))
        self.seen.update(record.reads)
        self.seen.update(record.writes)

    def check(self, records: list, useful: tuple[set, set], active: tuple[set, set]) -> None:
        """Refuse a sweep whose targets depend on an array made during the recording after a
        launch that computed from the sources and reaches none of the targets."""
        useful_ids, useful_nodes = useful
        active_ids, active_nodes = active
        for made in self.made:
            if made.ident not in useful_ids or made.ident in active_ids:   # (a source)
                continue
            for k, record in enumerate(records[:made.position]):
                if (active_ids.isdisjoint(record.reads) and active_nodes.isdisjoint(
                        record.scalars_in)) or not useful_ids.isdisjoint(record.writes) or (
                        record.scalar_out is not None and record.scalar_out in useful_nodes):
                    continue
                first = records[made.position]
                raise TapegradError(
                    f"the array of shape {made.ident.meta[1]} that {first.name} read at "
                    f"{made.where} (recorded operation {made.position + 1}) was made during "
                    "the recording by code the tape does not see (NumPy: u = 0.9 * u, "
                    f"u.copy(), np.exp(u)), and {record.name} at {self.lines[k]} (recorded "
                    f"operation {k + 1}) computed from the values you differentiate with "
                    "respect to but nothing the target depends on: if that array was made "
                    "from its result, the gradient would miss that path. Make it with "
                    "recorded operations (tg.scale(u, 0.9), tg.copy(u), a kernel); a true "
                    "constant, make it before the recording starts")
