"""Forward mode on host functions: while a ``ForwardContext`` is active, every kernel launch
runs its tangent kernel (values and tangents in one launch), host reductions return dual
scalars, and arithmetic on those carries the tangents along.  Nothing is recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.frontend import kernel_ir
from tapegrad.runtime.arguments import access, check_args, ndrange_of
from tapegrad.runtime.launch import interceptor, launch_now
from tapegrad.runtime.tangent import run_tangent
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.identity import array_key, extent
from tapegrad.tape.modes import forward_var, refuse_nested
from tapegrad.tape.scalars import DualScalar, plain_value


class ForwardContext:
    """Runs host code in forward mode with ``width`` tangent directions."""

    def __init__(self, width: int = 1):
        self.width = width
        self.tangents: dict[tuple, list[Any]] = {}
        self.arrays: dict[tuple, Any] = {}
        self.extents: dict[tuple, tuple[int, int]] = {}   # the bytes each one's elements span

    def __enter__(self) -> ForwardContext:
        refuse_nested()      # (the outer run's recorder would read as a tape's below)
        if interceptor.get() is not None:
            raise TapegradError("forward mode cannot run inside a recording tg.Tape")
        self.tokens = (forward_var.set((self,)), interceptor.set(self.launch))
        return self

    def __exit__(self, *exc: Any) -> None:
        forward_var.reset(self.tokens[0])
        interceptor.reset(self.tokens[1])

    def seed(self, x: Any, tangents: list[Any]) -> None:
        key = array_key(x)
        self.arrays[key] = x
        self.tangents[key] = list(tangents)
        self.extents[key] = extent(x, key[0])

    def tangent_of(self, x: Any) -> list[Any] | None:
        key = array_key(x)
        found = self.tangents.get(key)
        if found is None and self.tangents:
            self.check_not_a_view(x, key)
        return found

    def check_not_a_view(self, x: Any, key: tuple) -> None:
        """Tangents belong to whole arrays: another view of an array that carries one would
        have none (a kernel given ``x[1:]`` got a zero tangent, silently)."""
        lo, hi = extent(x, key[0])
        for other, (o_lo, o_hi) in self.extents.items():
            if o_lo < hi and lo < o_hi:
                raise TapegradError(
                    f"an array of shape {tuple(x.shape)} shares memory with an array of shape "
                    f"{other[1]} that carries a tangent; forward mode follows whole arrays, so "
                    "this view would carry none: pass the array itself (and offset the indices "
                    "in the kernel), or make the view before differentiating")

    def tangents_or_zero(self, x: Any) -> list[Any]:
        t = self.tangent_of(x)
        if t is None:
            t = [zeros_like(x) for _ in range(self.width)]
            self.seed(x, t)
        return t

    def launch(self, cfg: Any, args: tuple, ndrange: Any) -> None:
        kernel = cfg.kernel
        nd = ndrange_of(kernel, ndrange)
        plain = tuple(plain_value(a) if isinstance(a, DualScalar) else a for a in args)
        check_args(kernel, cfg.backend, plain)
        reads, writes = access(kernel)
        params = kernel_ir(kernel).params
        varied = any((is_array(a) and p in reads and self.tangent_of(a) is not None)
                     or isinstance(a, DualScalar) for p, a in zip(params, args))
        activity, tangents = [], {}
        for p, a in zip(params, args):
            if isinstance(a, DualScalar):
                activity.append("active")
                tangents[p] = a.tangents
            elif is_array(a) and np.dtype(a.dtype).kind == "f" and (
                    self.tangent_of(a) is not None or (varied and p in writes)):
                activity.append("dup")
                tangents[p] = tuple(self.tangents_or_zero(a))
            else:
                activity.append("const")
        if "dup" not in activity and "active" not in activity:
            launch_now(cfg, plain, ndrange)      # nothing carries a tangent here
            return
        run_tangent(cfg, plain, tangents, tuple(activity), nd)
