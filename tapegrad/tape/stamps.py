"""What a tape keeps of an array's contents to see host code change it between two
recorded uses (``Tape.stamps``): a cheap sample, or a fingerprint under ``verify``, and the
error that says what to write instead (docs/tape.md, "What the tape sees")."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.errors import TapegradError


def sample(x: Any) -> tuple | None:
    """Two elements of a NumPy array (its first and last), a cheap stand-in for its contents
    that host code scaling or refilling the array changes; None for arrays elsewhere (reading
    device memory is a synchronisation): those are checked with ``verify``."""
    if type(x) is np.ndarray and x.size:
        return x.item(0), x.item(-1)
    return None


def same_bits(a: Any, b: Any) -> bool:
    """Whether two samples are equal bit for bit (NaNs included): tuples of numbers, host
    fingerprints (ints), or fingerprints left where their array lives (a one-element CuPy
    array), which are compared through their backend's copy to the host."""
    if type(a) is not type(b):
        return False
    kind = kind_of(a)
    if kind is None:
        if a == b:
            return True
    elif not kind.host:
        a, b = kind.to_numpy(a), kind.to_numpy(b)
    return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))


def host_change(x: Any, reader: str) -> TapegradError:
    """The error for ``x``, changed by host code before ``reader`` read it."""
    if np.dtype(x.dtype).kind != "f":
        return TapegradError(
            f"an array of {np.dtype(x.dtype)} of shape {tuple(x.shape)} that a recorded "
            f"operation had read was changed in place by code the tape does not record "
            f"before {reader} read it; the derivatives of the operations before read its "
            f"contents when the gradient is computed, so they would read the new ones. Make "
            f"a new array for the new values (idx = new_idx.copy()) instead of changing it "
            f"in place")
    return TapegradError(
        f"an array of shape {tuple(x.shape)} that the tape had seen (a recorded kernel "
        f"launch or tapegrad host operation read or wrote it) was changed by code the tape "
        f"does not record before {reader} read it (NumPy arithmetic in place, such as "
        "B *= 3.0 or B[0] = 1, is invisible to tapes), so the gradient would not include "
        "that change. Do it in a kernel, or with tapegrad's recorded host operations "
        "(B2 = tg.scale(B, 3.0), tg.copy, tg.reshape); to change a result only for "
        "display, change a copy (B.copy())")


class Derivatives:
    """The stamp of an array that holds derivatives a computation the tape does not record
    wrote (a kernel-level ``tg.autodiff`` inside the recording: its primal launch is
    recorded, its derivative launches are not).  It matches no sample, so the next recorded
    operation that reads the array before one writes it is refused (``error``): a gradient
    through those values would lose their own derivatives (a simulation's forces computed
    that way would lose their second-order terms)."""

    __slots__ = ("what",)

    def __init__(self, what: str):
        self.what = what

    def __eq__(self, other: Any) -> bool:
        return False

    def __ne__(self, other: Any) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]

    def error(self, x: Any, reader: str) -> TapegradError:
        return TapegradError(
            f"{reader} reads an array of shape {tuple(x.shape)} that holds derivatives "
            f"{self.what} computed inside the recording; the tape records that call's primal "
            "launch, not its derivative launches, so the derivative through these values "
            "would be lost (forces computed as such derivatives inside a recorded simulation "
            "would lose their second-order terms). Compute them with launches the tape "
            "records (a kernel of their own, or tg.register_adjoint with its rule), or "
            "compute them outside the recording; to use them as constants on purpose, read a "
            "copy (d.copy())")
