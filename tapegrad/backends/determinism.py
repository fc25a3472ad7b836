"""``tg.deterministic()``: the same gradient, bit for bit, on every run and every thread count.

What can differ between runs is the order in which floating-point additions meet: atomics
from threads running at once, and sums whose parts depend on how many threads a launch has.
Under ``tg.deterministic()`` (or ``TAPEGRAD_DETERMINISTIC=1`` in the environment) the CPU
splits every launch into ``CHUNKS`` tasks whatever its threads, each task adds into its own
copy (per-thread sums, merged in task order) or its own slot (an ``Active`` scalar's group
sums), and a launch that would still add with atomics into shared memory (an array it also
reads, copies too large to pay, or an atomic whose old value the kernel uses) runs its tasks
one after the other.  Captured replays are set aside, so that every launch goes this way
(chains of replayed adjoints run kernels without such sums, whose results do not depend on
the tasks).

Without it, a CPU launch is already reproducible run to run on the same number of threads
(each task's work and the merge order depend on the thread count only), except for kernels
that add with atomics into an array they also read.  On CUDA and OpenCL a kernel whose results
depend on its atomics' order (float additions: scatters, their adjoints, ``Active`` scalars)
runs under it as a variant that writes its additions down and adds them in work-item order
after the launch (``backends/ordered.py``, which states what it can order; the rest is
refused).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator
from typing import Any

from tapegrad.backends.structure import device_functions
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, TypedKernel

CHUNKS = 16     # tasks per CPU launch under tg.deterministic(), whatever the thread count


class _Switch:
    __slots__ = ("on", "depth", "always")

    def __init__(self) -> None:
        self.always = os.environ.get("TAPEGRAD_DETERMINISTIC", "").lower() in ("1", "on", "true",
                                                                                "yes")
        self.depth = 0
        self.on = self.always


DETERMINISTIC = _Switch()


class deterministic:
    """``with tg.deterministic():`` gradients (and every launch) give the same bits on every
    run and every thread count on the CPU, and on every run on CUDA and OpenCL (for the whole
    process while inside; ``TAPEGRAD_DETERMINISTIC=1``: always).  On the CPU it costs little
    where launches add into per-thread copies anyway, and serialises launches that add with
    atomics into arrays they also read; on GPUs float atomic additions are logged and added in
    work-item order after the launch (``backends/ordered.py``: what it cannot order is
    refused).

    >>> import numpy as np, tapegrad as tg
    >>> with tg.deterministic():
    ...     (g,) = tg.gradient(lambda x: tg.dot(x, x), np.array([1.0, 2.0]))
    >>> g.tolist()
    [2.0, 4.0]
    """

    def __enter__(self) -> deterministic:
        DETERMINISTIC.depth += 1
        DETERMINISTIC.on = True
        return self

    def __exit__(self, *exc: Any) -> None:
        DETERMINISTIC.depth -= 1
        DETERMINISTIC.on = DETERMINISTIC.always or DETERMINISTIC.depth > 0


def unordered_atomics(tk: TypedKernel, private: frozenset[str] = frozenset(),
                      spaces: tuple[str, ...] = ("global",)) -> bool:
    """Whether what ``tk`` (or a device function it calls) computes may depend on the order in
    which its work-items' atomics happen: a float ``atomic_add``/``atomic_sub`` or an Active
    scalar's group sum into an array of ``spaces`` other than the ``private`` (per-task copies),
    or any atomic whose old value the kernel uses (a counter handing out slots).  Float atomic
    min and max whose value is unused give the same result in any order (but for a +0.0
    and a -0.0, which compare equal: the first to arrive stays; docs/debugging.md)."""
    return any(unordered_atomic_calls(tk, private, spaces))


def unordered_atomic_calls(tk: TypedKernel, private: frozenset[str] = frozenset(),
                           spaces: tuple[str, ...] = ("global",)
                           ) -> Iterator[tuple[TypedKernel, ast.Call, bool]]:
    """The calls ``unordered_atomics`` looks for: the kernel (``tk`` or a device function)
    holding each, the call, and whether its old value is used."""
    for k in (tk, *device_functions(tk)):
        tree = ast.Module(body=list(k.ir.body), type_ignores=[])
        unused = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}
        for n in ast.walk(tree):
            name = tg_name(n) if isinstance(n, ast.Call) else None
            if not name or not (name.startswith("atomic_") or name == "group_reduce_add"):
                continue
            t = k.types.get(id(n.args[0]))
            if not isinstance(t, Array) or t.space not in (*spaces, "global"):
                continue
            if id(n) not in unused and name != "group_reduce_add":
                yield k, n, True
                continue
            mine = k is tk and isinstance(n.args[0], ast.Name) and n.args[0].id in private
            if name in ("atomic_add", "atomic_sub", "group_reduce_add") and \
                    t.dtype.startswith("float") and t.space in spaces and not mine:
                yield k, n, False
