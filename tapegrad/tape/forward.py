"""Forward mode on host functions: while a ``ForwardContext`` is active, every kernel launch
runs its tangent kernel (values and tangents in one launch), host reductions return dual
scalars, and arithmetic on those carries the tangents along.  Nothing is recorded, except by
``tg.hvp``: there a tape records the run (``on_tape``), each launch as its tangent kernel
launched as a kernel of its own, so that the tape can differentiate the tangents.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.errors import LaunchError, TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.arguments import access, check_args, ndrange_of
from tapegrad.runtime.launch import interceptor, launch, launch_now, merging
from tapegrad.runtime.tangent import run_tangent, tangent_variant
from tapegrad.tape import hostmath
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.duals import TapedDual
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.identity import Ident, Identities, array_key, sharing_pairs
from tapegrad.tape.modes import forward_var, refuse_nested, tapes_var
from tapegrad.tape.scalars import DualScalar, plain_value
from tapegrad.tape.stamps import (
    host_change,
    result_changed,
    same_bits,
    sample,
    verify_by_default,
    watched,
)


class ForwardContext:
    """Runs host code in forward mode with ``width`` tangent directions; ``on_tape``: inside
    the tape recording it (tg.hvp), one direction, everything it computes recorded."""

    def __init__(self, width: int = 1, on_tape: bool = False, parent: Any = None):
        self.width = width
        self.parent = parent    # (a run inside a run's loop: what it does not know, it asks)
        self.taped = on_tape
        self.dual = TapedDual if on_tape else DualScalar     # (what its host scalars are)
        # tangents by the identity of their array's memory (``tape/identity.py``), which does
        # not keep the array alive: a simulation's old states and their tangents are freed as
        # they are dropped (pruned from here now and then), and a new array at a freed one's
        # memory is a new identity, with no tangent
        self.ids = Identities()
        self.tangents: dict[Ident, list[Any]] = {}
        # what the last operation that gave an array its tangent left in it (NumPy arrays:
        # ``stamps.sample``): an array changed by host code since (b *= 3.0 between two
        # launches) is refused where it is read, as the tape refuses it
        self.stamps: dict[Ident, Any] = {}
        # (TAPEGRAD_VERIFY=1: every element, device arrays too, as the tape's)
        self.verify = verify_by_default()
        self.sample = fingerprint if self.verify else sample
        self.prune_at = 8

    def __enter__(self) -> ForwardContext:
        refuse_nested()      # (the outer run's recorder would read as a tape's below)
        if self.taped != bool(tapes_var.get()):
            raise TapegradError("forward mode cannot run inside a recording tg.Tape")
        self.tape_records = (tapes_var.get(), interceptor.get())
        self.tokens = (forward_var.set((self,)), interceptor.set(merging(self.launch)))
        self.math_wrappers = hostmath.install()     # (math.sqrt(s) of a dual: tape/hostmath.py)
        return self

    def __exit__(self, *exc: Any) -> None:
        hostmath.restore(self.math_wrappers)     # (first: a reset below can raise)
        forward_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])

    def on_tape(self) -> _OnTape:
        """``with ctx.on_tape():`` runs its body as the tape alone sees it (tg.hvp): what it
        computes from values and tangents is recorded, as plain operations."""
        return _OnTape(self.tape_records)

    def taped_or_plain(self, recorded: Any, plain: Any, *args: Any) -> Any:
        """``recorded(*args)`` on the tape (tg.hvp), else ``plain(*args)``."""
        if not self.taped:
            return plain(*args)
        with self.on_tape():
            return recorded(*args)

    def seed(self, x: Any, tangents: list[Any]) -> None:
        # (a view of another array that carries a tangent is refused by ``track``)
        ident = self.ids.track(x)
        self.tangents[ident] = list(tangents)
        self.stamp(x, ident)
        if len(self.tangents) > self.prune_at:
            for ident in [i for i in self.tangents if not i.alive()]:
                del self.tangents[ident]
                self.stamps.pop(ident, None)
            self.prune_at = max(8, 2 * len(self.tangents))

    def stamp(self, x: Any, ident: Any) -> None:
        if watched(x, self.verify):
            self.stamps[ident] = self.sample(x)

    def wrote(self, x: Any) -> None:
        """A tapegrad operation other than a launch (``halo.exchange``) wrote ``x`` in place,
        its tangents with it: what it left is what later reads must find."""
        self.stamp(x, self.ids.track(x))

    def unchanged(self, x: Any, reader: str | None) -> None:
        """Before ``reader`` reads ``x``'s values (None: ``x`` is the result whose tangent is
        asked for): as the operation that gave it its tangent left them (else its tangent
        would belong to other values)."""
        if not watched(x, self.verify):
            return                # (device arrays: not sampled, as the tape's launches)
        ident = self.ids.find(x)
        stamp = self.stamps.get(ident) if ident is not None else None
        now = self.sample(x) if stamp is not None else None
        if stamp is not None and stamp != now and not same_bits(stamp, now):
            raise host_change(x, reader) if reader is not None else result_changed(x)

    def unknown(self, arrays: list[Any], how: str) -> None:
        """``arrays`` now hold values whose tangents are unknown (``how``: what made them):
        their next use by a launch or a reduction is refused."""
        for x in arrays:
            self.tangents[self.ids.track(x)] = how

    def tangent_of(self, x: Any) -> list[Any] | None:
        ident = self.ids.find(x)
        found = self.tangents.get(ident) if ident is not None else None
        if isinstance(found, str):
            raise TapegradError(
                f"an array of shape {tuple(x.shape)} holds derivatives {found}: they carry no "
                "tangents, so what is computed from them would be silently wrong. Compute "
                "them outside the function; for second derivatives of f, tg.hvp(f, x, v)")
        if found is None and self.tangents:
            self.check_not_a_view(x)
        if found is None and self.parent is not None:
            return self.parent.tangent_of(x)
        return found

    def check_not_a_view(self, x: Any) -> None:
        """Tangents belong to whole arrays: another view of an array that carries one would
        have none (a kernel given ``x[1:]`` got a zero tangent, silently)."""
        other = self.ids.overlapping(x)
        if other is not None and other in self.tangents:
            raise TapegradError(
                f"an array of shape {tuple(x.shape)} shares memory with an array of shape "
                f"{other.meta[1]} that carries a tangent; forward mode follows whole arrays, so "
                "this view would carry none: pass the array itself (and offset the indices "
                "in the kernel), or make the view before differentiating")

    def tangents_or_zero(self, x: Any) -> list[Any]:
        t = self.tangent_of(x)
        return t if t is not None else self.zero_tangents(x)

    def zero_tangents(self, x: Any) -> list[Any]:
        """New zero tangents for ``x``, which has none."""
        t = [zeros_like(x) for _ in range(self.width)]
        self.seed(x, t)
        return t

    def launch(self, cfg: Any, args: tuple, ndrange: Any) -> None:
        kernel = cfg.kernel
        nd = ndrange_of(kernel, ndrange)
        dual = self.dual
        plain = tuple(plain_value(a) if isinstance(a, dual) else a for a in args)
        check_args(kernel, cfg.backend, plain)
        reads, writes = access(kernel)
        params = kernel_ir(kernel).params
        found = [self.tangent_of(a) if is_array(a) else None for a in args]
        for p, a, t in zip(params, args, found):
            if t is not None and p in reads:
                self.unchanged(a, f"kernel {kernel.name}")
        varied = any((t is not None and p in reads) or isinstance(a, dual)
                     for p, a, t in zip(params, args, found))
        activity, tangents = [], {}
        for p, a, t in zip(params, args, found):
            if isinstance(a, dual):
                activity.append("active")
                tangents[p] = a.tangents
            elif is_array(a) and np.dtype(a.dtype).kind == "f" and (
                    t is not None or (varied and p in writes)):
                activity.append("dup")
                tangents[p] = tuple(t if t is not None else self.zero_tangents(a))
            else:
                activity.append("const")
        if self.taped:
            self.launch_on_tape(cfg, args, ndrange, nd, activity, tangents)
        elif "dup" not in activity and "active" not in activity:
            launch_now(cfg, plain, ndrange)      # nothing carries a tangent here
        else:
            check_written_tangents_apart(kernel, params, plain, tangents)
            run_tangent(cfg, plain, tangents, tuple(activity), nd)
        for p, a, kind in zip(params, args, activity):
            if kind == "dup" and p in writes:
                self.stamp(a, self.ids.track(a))

    def launch_on_tape(self, cfg: Any, args: tuple, ndrange: Any, nd: tuple[int, ...],
                       activity: list[str], tangents: dict[str, tuple]) -> None:
        """The launch recorded (tg.hvp): its tangent kernel as a kernel, on the values (tape
        scalars for dual scalars) and the tangents, or the kernel itself if nothing varies."""
        values = tuple(a.value if isinstance(a, TapedDual) else a for a in args)
        if "dup" not in activity and "active" not in activity:
            with self.on_tape():
                launch(cfg, values, ndrange)
            return
        plain = tuple(plain_value(a) if isinstance(a, TapedDual) else a for a in args)
        variant = tangent_variant(cfg, plain, tuple(activity), len(nd))
        params = kernel_ir(cfg.kernel).params
        extra = tuple(tangents[p][0] for p, kind in zip(params, activity)
                      if kind in ("dup", "active"))
        with self.on_tape():
            launch(variant, values + extra, ndrange)


class _OnTape:
    def __init__(self, records: tuple) -> None:
        self.records = records

    def __enter__(self) -> None:
        self.tokens = (forward_var.set(()), tapes_var.set(self.records[0]),
                       interceptor.set(self.records[1]))

    def __exit__(self, *exc: Any) -> None:
        forward_var.reset(self.tokens[0])
        tapes_var.reset(self.tokens[1])
        interceptor.reset(self.tokens[2])


def check_written_tangents_apart(kernel: Any, params: list[str], values: tuple,
                                 tangents: dict[str, tuple]) -> None:
    """A tangent the kernel writes shares no element with another tangent: it would be
    written while the other is read (one array passed for two parameters has one tangent).
    Tangents of arrays the kernel only reads may share memory (one direction for two
    inputs).  Checked before anything runs."""
    pairs = sharing_pairs([((p, d), d) for p, dirs in tangents.items() for d in dirs
                           if is_array(d)])
    if not pairs:
        return
    _, written = access(kernel)
    value = dict(zip(params, values))
    for (p, d), (q, e) in pairs:
        if p not in written:
            p, q = q, p
        if p not in written or p != q and d is e and array_key(value[p]) == array_key(value[q]):
            continue        # (both only read; or one array passed twice: one tangent)
        raise LaunchError(
            f"{kernel.name}: the tangent of {p} shares elements with "
            + ("another of its tangents" if p == q else f"the tangent of {q}")
            + f", and the kernel writes {p}, so its tangent would be written while "
            "the other is read; give each array a tangent of its own (tg.make_zero(x))")
