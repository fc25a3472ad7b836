"""Activity annotations and differentiation modes, with Enzyme's names and meaning.

>>> import numpy as np, tapegrad as tg
>>> A = np.ones(3); dA = tg.make_zero(A)
>>> tg.Duplicated(A, dA).dval is dA
True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import array_kind, is_array
from tapegrad.errors import TapegradError
from tapegrad.tracebacks import api_boundary


class Mode:
    """A differentiation mode: ``tg.Forward``, ``tg.ForwardWithPrimal``, ``tg.Reverse``,
    ``tg.ReverseWithPrimal``."""

    def __init__(self, name: str, reverse: bool, with_primal: bool):
        self.name = name
        self.reverse = reverse
        self.with_primal = with_primal

    def __repr__(self) -> str:
        return f"tg.{self.name}"


Forward = Mode("Forward", reverse=False, with_primal=False)
ForwardWithPrimal = Mode("ForwardWithPrimal", reverse=False, with_primal=True)
Reverse = Mode("Reverse", reverse=True, with_primal=False)
ReverseWithPrimal = Mode("ReverseWithPrimal", reverse=True, with_primal=True)


class Annotation:
    """Base class of activities; ``.val`` is the primal value."""

    kind = "const"

    def __init__(self, val: Any):
        self.val = val

    def __repr__(self) -> str:
        return f"tg.{type(self).__name__}({_short(self.val)})"


class Const(Annotation):
    """Not differentiated.  Used bare (``tg.Const``) as a return activity: nothing is seeded."""


class Active(Annotation):
    """A float scalar whose derivative is returned.  Used bare (``tg.Active``) as a return
    activity: the function returns a scalar and its adjoint is seeded with 1."""

    kind = "active"


class Duplicated(Annotation):
    """An array ``val`` with its shadow ``dval`` (same shape, dtype and device).  Reverse mode
    *adds* derivatives into ``dval``: zero it first (``tg.make_zero_``)."""

    kind = "dup"

    def __init__(self, val: Any, dval: Any):
        super().__init__(val)
        self.dval = dval

    def __repr__(self) -> str:
        return f"tg.{type(self).__name__}({_short(self.val)}, {_short(self.dval)})"


class DuplicatedNoNeed(Duplicated):
    """Like ``Duplicated``, but the caller does not need the primal result."""


class BatchDuplicated(Annotation):
    """An array with several shadows (forward mode computes all tangents in one launch)."""

    kind = "batch"

    def __init__(self, val: Any, dvals: tuple):
        super().__init__(val)
        self.dval = tuple(dvals)


def _short(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"array(shape={x.shape}, dtype={x.dtype})"
    return type(x).__name__ if hasattr(x, "shape") else repr(x)


def annotate(arg: Any) -> Annotation:
    """A plain argument is ``Const``."""
    if isinstance(arg, Annotation):
        return arg
    if isinstance(arg, type) and issubclass(arg, Annotation):
        raise TapegradError(f"tg.{arg.__name__} needs a value here, e.g. "
                            f"tg.{arg.__name__}(x){'' if arg is not Duplicated else ', dx'}; the bare "
                            "class is only a return activity")
    return Const(arg)


@api_boundary
def make_zero(x: Any) -> Any:
    """A new zero-filled array like ``x``, on the same device (Enzyme's ``make_zero``)."""
    if isinstance(x, np.floating):
        return type(x)(0)
    if isinstance(x, float):       # (a tape's or forward mode's scalar too: a plain zero)
        return 0.0
    if isinstance(x, np.ndarray):
        return np.zeros_like(x)
    return array_kind(x, "tg.make_zero").module().zeros_like(x)


@api_boundary
def make_zero_(dx: Any) -> Any:
    """Zero ``dx`` in place (shadows accumulate, so reset them between gradients); returns it."""
    if type(dx) is not np.ndarray and is_array(dx):
        array_kind(dx).check_operable(dx, "tg.make_zero_")
    dx[...] = 0
    return dx
