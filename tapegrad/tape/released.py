"""Arrays a tape's records hold weakly: a launch's arguments whose contents no adjoint reads
(a linear kernel's input, an output), so that a simulation of linear steps holds no state.
The adjoint gets the array itself while user code keeps it alive, else a stand-in of the same
type and shape."""

from __future__ import annotations

import weakref
from typing import Any

from tapegrad.tape.arrays import allocate
from tapegrad.tape.identity import Ident


def release(x: Any, ident: Ident) -> Any:
    """What a record holds of argument ``x`` whose contents no adjoint reads: ``x`` held
    weakly (one holder per identity, shared by the records that see it), or ``x`` itself
    where it cannot be."""
    known = ident.released
    if known is None or known.ref() is not x:
        known = Released.of(x, ident)
        if type(known) is Released:
            ident.released = known
    return known


class Released:
    """A launch argument whose contents no adjoint reads, held weakly: the adjoint gets the
    array itself while user code keeps it alive, else a stand-in of the same type and shape
    (whose contents it does not read)."""

    __slots__ = ("ref", "meta")

    def __init__(self, ref: Any, meta: tuple):
        self.ref = ref
        self.meta = meta

    @staticmethod
    def of(x: Any, ident: Any) -> Any:
        """``x`` held weakly, or ``x`` itself; ``ident``: its identity on the tape, whose weak
        reference and metadata serve when ``x`` owns its memory (a new array, each step of
        a simulation)."""
        try:
            flags = x.flags
            contiguous = flags.c_contiguous and getattr(flags, "writeable", True)
            if ident.weak and ident.owner() is x and ident.meta[0] is type(x):
                released = Released(ident.owner, ident.meta)
            else:
                released = Released(weakref.ref(x), (type(x), tuple(x.shape), x.dtype))
        except (AttributeError, TypeError):   # other flags, or no weak references
            return x
        # a stand-in of another layout would need another compiled kernel: keep the array
        return released if contiguous else x

    def get(self, stand_ins: dict) -> Any:
        x = self.ref()
        if x is None:
            x = stand_ins.get(self.meta)
            if x is None:
                x = stand_ins[self.meta] = allocate(self.meta, zeroed=False)
        return x
