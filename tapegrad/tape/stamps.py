"""What a tape keeps of an array's contents to see host code change it between two
recorded uses (``Tape.stamps``): a cheap sample, or a fingerprint under ``verify``, and the
error that says what to write instead (docs/tape.md, "What the tape sees")."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tapegrad.backends.registry import kind_of
from tapegrad.errors import TapegradError
from tapegrad.tape.fingerprint import fingerprint


def verify_by_default() -> bool:
    """``TAPEGRAD_VERIFY=1``: every element of every array checked, wherever it lives."""
    return os.environ.get("TAPEGRAD_VERIFY", "") not in ("", "0")


def watched(x: Any, verify: bool) -> bool:
    """Whether stamps follow array ``x``: a float one on the host, or anywhere under
    ``verify`` (reading device memory is a synchronisation)."""
    if type(x) is np.ndarray:
        return x.dtype.kind == "f"
    return verify and np.dtype(x.dtype).kind == "f"


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


def changed_after_last_use(tape: Any) -> dict[int, list[tuple[int, Any]]]:
    """At the end of ``tape``'s recording: the arrays whose contents a derivative may read
    (``tape.readers``) that code the tape does not record changed after the last recorded
    operation used them (``b[:] = 0`` on a scratch buffer, ``x *= 0.5`` on an input, after
    its last launch), by the records that read them (``id(record)``: [(position, array)]).
    No later recorded read compares their stamps; the sweep refuses them where a record's
    derivative reads them (``Record.reads_contents``): it would read the new contents."""
    stale: dict[int, list[tuple[int, Any]]] = {}
    for ident, refs in tape.readers.items():
        if not refs:
            continue
        x = refs[-1][2]
        if _differs(tape, tape.stamps.get(ident), x):
            for record, pos, _ in refs:
                stale.setdefault(id(record), []).append((pos, x))
    return stale


def changed_after_use(x: Any, reader: str) -> TapegradError:
    """The error for ``x``, whose contents ``reader``'s derivative reads, changed by host code
    after ``reader`` and before the recording ended."""
    return TapegradError(
        f"an array of shape {tuple(x.shape)} that {reader or 'a recorded operation'} read, and "
        "whose contents its derivative reads, was changed by code the tape does not record "
        "after that read and before the recording ended (NumPy in place, such as b[:] = 0 or "
        "x *= 0.5), so the gradient would read the new contents. Change a copy (y = "
        "x.copy()), or make the change with recorded operations on a new array (tg.scale, a "
        "kernel)")


def check_output(tape: Any, y: Any, ident: Any) -> None:
    """Before a sweep seeds ``y``, an array the recording wrote or read: refuse one that
    code the tape does not record changed since (``b *= 2.0`` before ``return b``): the
    derivative would be of what the recorded operations computed, not of ``y``."""
    if _differs(tape, tape.stamps.get(ident), y):
        raise result_changed(y)


def _differs(tape: Any, stamp: Any, x: Any) -> bool:
    """Whether ``x`` no longer holds what a recorded operation left (``stamp``, taken by
    ``tape.sample``; NaNs compared by their bits), where the tape stamps such arrays: float
    ones, on the host (elsewhere under ``verify``: the launches' rule)."""
    if stamp is None or type(stamp) is Derivatives or not watched(x, tape.verify):
        return False
    now = tape.sample(x)
    return stamp != now and not same_bits(stamp, now)


def result_changed(y: Any) -> TapegradError:
    """The error for a result ``y`` that host code changed after the last recorded (or
    forward-mode) operation that used it."""
    return TapegradError(
        f"the array of shape {tuple(y.shape)} you differentiate was changed by code tapegrad "
        "does not see after the last operation it recorded or ran on it (NumPy in place, such "
        "as b *= 2.0 before return b), so its derivative would be that of what those "
        "operations computed, not of its contents. Make the change with tapegrad's operations "
        "(b = tg.scale(b, 2.0), a kernel), or change a copy")


class HostChanges:
    """The tape's side of its stamps (``Tape`` is one): what a recorded host operation that
    reads or writes an array in place checks and leaves, and the checks before a sweep."""

    def before_host_write(self, x: Any, who: str) -> tuple:
        """Before a recorded host operation (``who``) writes part of ``x`` in place: ``x`` is
        as the last recorded operation left it, and records that still need its contents
        get a copy.  Returns ``x``'s identity, for ``after_host_write``."""
        ident = self.track(x)
        self.unchanged_since_use(x, who, ident)
        self.will_overwrite(x, False, ident)
        return ident

    def after_host_write(self, x: Any, ident: tuple) -> None:
        """After it wrote: what it left is what later recorded operations must find."""
        if np.dtype(x.dtype).kind == "f":
            self.stamps[ident] = self.sample(x)

    def unchanged_since_use(self, x: Any, who: str, ident: Any = None) -> None:
        """Before a recorded host operation (``who``) uses ``x``: as the last recorded
        operation left it (``changed_by_host``); stamped here if none has used it yet."""
        if not watched(x, self.verify):
            return                # (the launches' rule: device arrays only under verify)
        ident = self.track(x) if ident is None else ident
        stamp = self.stamps.get(ident)
        if stamp is None:
            self.stamps[ident] = self.sample(x)
        elif stamp != self.sample(x):
            self.changed_by_host(x, stamp, who)

    def changed_by_host(self, x: Any, stamp: Any, reader: str) -> None:
        """A recorded operation is about to read ``x``, which an earlier recorded operation
        read or wrote, and its contents differ from what it found or left (``stamp``): host
        code changed it."""
        if type(stamp) is Derivatives:
            raise stamp.error(x, reader)
        if same_bits(stamp, self.sample(x)):
            return                # (NaN samples compare unequal to themselves)
        raise host_change(x, reader)

    def derivatives_written(self, x: Any, what: str) -> None:
        """``x`` now holds derivatives a computation the tape does not record wrote (``what``:
        which): a recorded operation reading it before one writes it is refused
        (``stamps.Derivatives``; arrays on the host, and elsewhere under ``verify``)."""
        self.stamps[self.track(x)] = Derivatives(what)

    def check_unchanged(self) -> None:
        for ident, fp in self.fingerprints.items():
            refs = self.readers.get(ident)
            if refs and fingerprint(refs[-1][2]) != fp:
                x = refs[-1][2]
                raise TapegradError(
                    f"an array of shape {x.shape} that the recorded code read was changed after "
                    "recording and before gradient(), so the recorded derivatives no longer "
                    "match its contents; compute the gradient before changing it, or pass a "
                    "copy into the recorded code")
