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

from tapegrad.tape.arrays import is_array


def held_bytes(records: Iterable[Any]) -> dict[str, int]:
    """Bytes the records keep alive, by kind (each buffer counted once, in its first kind)."""
    seen: set[int] = set()
    out = {"arrays": 0, "snapshots": 0}
    for record in records:
        for kind, x in kept_by(record):
            owner = _owner(x)
            if id(owner) not in seen:
                seen.add(id(owner))
                out[kind] += int(owner.nbytes)
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


def _owner(x: Any) -> Any:
    """The array that owns ``x``'s buffer (a view keeps its base alive)."""
    while getattr(x, "base", None) is not None and is_array(x.base):
        x = x.base
    return x
