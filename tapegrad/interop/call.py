"""A host function run on a tape of its own, with the vector-Jacobian product back to its
arguments: what the PyTorch and JAX wrappers (``tapegrad.torch``, ``tapegrad.jax``) call for
their forward and backward passes.

>>> import numpy as np, tapegrad as tg
>>> call = RecordedCall(lambda x, a: tg.scale(x, a), (np.array([1.0, 2.0]), 3.0), (True, True))
>>> call.outputs[0].tolist()
[3.0, 6.0]
>>> x_bar, a_bar = call.vjp([np.array([1.0, 1.0])])
>>> x_bar.tolist(), a_bar
([3.0, 3.0], 3.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.tape.arrays import is_array
from tapegrad.tape.identity import extent
from tapegrad.tape.scalars import TrackedScalar, plain
from tapegrad.tape.tape import Tape


class RecordedCall:
    """``f(*args)`` recorded; ``active[k]``: whether argument ``k`` wants a gradient (a number
    that does is watched as a tape scalar).  ``outputs``: the results as a list (one array or
    number, or each item of a returned tuple); ``single``: whether ``f`` returned one."""

    def __init__(self, f: Callable[..., Any], args: Sequence[Any], active: Sequence[bool]):
        # (no fingerprints: the wrappers guard the arguments and results themselves, PyTorch
        # by version counters, JAX by copies; docs/interop.md)
        self.tape = Tape(watch_changes=False)
        with self.tape:
            self.args = [self.tape.watch(float(a)) if on and _number(a) else a
                         for a, on in zip(args, active)]
            result = f(*self.args)
        self.single = not isinstance(result, (tuple, list))
        self.outputs = [result] if self.single else list(result)
        self.active = list(active)
        for y in self.outputs:
            if not (is_array(y) or isinstance(y, (float, int, np.floating, np.integer))):
                raise TapegradError(
                    f"{getattr(f, '__name__', 'the function')} returned a "
                    f"{type(y).__name__}; a wrapped tapegrad function returns arrays, numbers "
                    "(tg.sum/tg.dot/... results), or a tuple of them")

    def backward_reads(self) -> list[tuple[int, int]]:
        """The memory (byte ranges) that the vector-Jacobian product reads as it is then, not
        as a copy the tape kept: changing it before ``vjp`` would change the gradient."""
        return [ident.span for ident, refs in self.tape.readers.items() if refs]

    def written(self) -> list[tuple[int, int]]:
        """The memory (byte ranges) that recorded operations wrote."""
        return [ident.span for record in self.tape.records for ident in record.writes]

    def plain_outputs(self) -> list[Any]:
        """The outputs with tape scalars as floats."""
        return [float(plain(y)) if isinstance(y, TrackedScalar) else y for y in self.outputs]

    def vjp(self, cotangents: Sequence[Any], wanted: Sequence[bool] | None = None) -> list[Any]:
        """Per argument, ``sum_k cotangents[k] . d outputs[k] / d argument`` (an array, a
        float, or None where the argument is not active, not ``wanted``, or nothing connects
        it)."""
        outputs, seeds = [], []
        for y, w in zip(self.outputs, cotangents):
            if w is None or not (isinstance(y, TrackedScalar) or is_array(y)
                                 and self.tape.tracks(y)):
                continue                     # (a constant output: no derivative flows)
            outputs.append(y)
            seeds.append(w)
        wanted = self.active if wanted is None else [a and w for a, w in zip(self.active, wanted)]
        sources = [(k, a) for k, (a, on) in enumerate(zip(self.args, wanted))
                   if on and (isinstance(a, TrackedScalar) or is_array(a) and self.tape.tracks(a)
                              and np.dtype(a.dtype).kind == "f")]
        grads: list[Any] = [None] * len(self.args)
        if outputs and sources:
            for (k, _), g in zip(sources, self.tape.vjp(outputs, seeds,
                                                        [a for _, a in sources])):
                grads[k] = g
        return grads


def overlaps(x: Any, spans: list[tuple[int, int]]) -> bool:
    """Whether array ``x`` shares memory with one of the byte ranges ``spans``."""
    lo, hi = extent(x)
    return any(a < hi and lo < b for a, b in spans)


def _number(a: Any) -> bool:
    return isinstance(a, (float, int, np.floating, np.integer)) and not isinstance(a, bool)
