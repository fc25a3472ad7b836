"""What a tape holds in memory: the arrays its records keep (launch arguments whose contents
an adjoint reads, copies of overwritten inputs, host operations' operands) and the snapshots of
checkpointed loops, each array counted once with the whole buffer it keeps alive.

>>> import numpy as np, tapegrad as tg
>>> with tg.Tape() as tape:
...     loss = tg.dot(np.ones(1000), np.ones(1000))
>>> tape.memory()
{'arrays': 16000, 'snapshots': 0, 'total': 16000}
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from tapegrad.backends.registry import array_kind
from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array


def held_bytes(records: Iterable[Any], anchors: Iterable[Any] = ()) -> dict[str, int]:
    """Bytes the records keep alive, by kind (each buffer counted once, in its first kind);
    ``anchors``: memory the tape's identities hold (PyOpenCL buffers views share:
    tape/identity.py), counted with the arrays."""
    seen: set[int] = set()
    out = {"arrays": 0, "snapshots": 0}
    for record in records:
        for kind, x in kept_by(record):
            memory = None if type(x) is np.ndarray else array_kind(x).memory(x)
            buffer = owner(x) if memory is None else memory
            if id(buffer) not in seen:
                seen.add(id(buffer))
                out[kind] += int(buffer.nbytes if memory is None else memory.size)
    for memory in anchors:
        if id(memory) not in seen:
            seen.add(id(memory))
            out["arrays"] += int(memory.size)
    out["total"] = out["arrays"] + out["snapshots"]
    return out


def kept_by(record: Any) -> Iterable[tuple[str, Any]]:
    """(kind, array) for each array ``record`` holds: its own ``held()`` if it says, else the
    arrays among its arguments (``values``, ``views``)."""
    held = getattr(record, "held", None)
    if held is not None:
        yield from held()
        return
    for name in ("values", "views"):
        for x in getattr(record, name, None) or ():
            if is_array(x):
                yield "arrays", x


def owner(x: Any) -> Any:
    """The array that owns ``x``'s buffer (a view keeps its base alive): the end of its chain
    of ``base`` arrays of its own kind.  A NumPy array over another library's buffer ends at
    itself: such a buffer is no array to look into, and a JAX callback's may not even be
    touched (asking it for ``shape`` crashed the interpreter)."""
    while True:
        base = getattr(x, "base", None)
        if base is None or not isinstance(base, np.ndarray if isinstance(x, np.ndarray)
                                          else type(x)):
            return x
        x = base


class MemoryLimit:
    """``tg.Tape(max_memory=...)``: after each record, the bytes its records keep (counted
    over the new records only), and an error past the limit that names the way out."""

    def __init__(self, limit: int):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise TapegradError(f"tg.Tape(max_memory=...) is a number of bytes, got {limit!r}")
        self.limit = limit
        self.seen: set[int] = set()
        self.total = 0
        self.counted = 0                # records counted so far

    def check(self, records: list[Any]) -> None:
        for record in records[self.counted:]:
            for _, x in kept_by(record):
                buffer = owner(x)
                if id(buffer) not in self.seen:
                    self.seen.add(id(buffer))
                    self.total += int(buffer.nbytes)
        self.counted = len(records)
        if self.total > self.limit:
            raise TapegradError(
                f"this tape holds {self.total / 2**20:.1f} MiB, over its max_memory of "
                f"{self.limit / 2**20:.1f} MiB, after {len(records)} recorded operations: it "
                "keeps what each step's adjoint needs. For a long simulation, "
                "tg.checkpoint_loop(step, state, n_steps, snapshots=...) keeps a few states "
                "instead of one per step and recomputes the rest (docs/checkpointing.md); "
                "tg.checkpoint(fn) does so for one costly segment")
