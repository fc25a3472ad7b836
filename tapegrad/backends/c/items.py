"""Which kernels may run several work-items per thread, or take ``restrict`` pointers, and
whether a launch's arrays let them.

Independent work-items (``independent_items``).  A kernel qualifies when neither it nor a
device function it calls has a barrier (``tg.synchronize()``) or local memory
(``tg.localmem``).  Everything else is allowed: private arrays, loops, ``return`` (the
printer runs each work-item's body as a function of its own, so ``return`` ends that
work-item only), group and local indices, ``tg.groupsize()``, atomics and an Active scalar's
sums.  Why that is enough: without a barrier or memory shared by a workgroup, nothing in the
kernel language orders two work-items or lets one see what another does except atomics,
whose order is unspecified anyway; running work-items one after another in one thread is one
of the orders a launch may already take.  The printer keeps every work-item's coordinates
(the thread's ``K`` work-items are workgroups ``K * b + 0 .. K - 1`` of dimension 0, at the
thread's local index), so every index the body reads is the one-item launch's, and each
work-item runs under the one-item launch's range check: the results are bit for bit those of
one work-item per thread.

``K`` work-items ``groupsize[0]`` apart (``blockDim`` along dimension 0), not
``blockDim * gridDim`` apart: a thread block then covers ``K`` neighbouring workgroups, one
contiguous stretch of each array a 1-D kernel indexes by ``tg.index()``, and ``_g0`` stays
``K * blockIdx + m``, so the grid shrinks by ``K`` along dimension 0 and nothing else changes.
Dimension 0 is the 1-D ndrange itself; for 2-D and 3-D ndranges it is the outermost (usually
the longest), along CUDA's y or z, whose 65,535-block limit it relieves.  Where the block's
last work-item is inside the ndrange, all ``K`` are (the index grows with ``m``): those
blocks run the ``K`` work-items without guards, straight-line code a compiler can schedule.

``restrict`` pointers (``disjoint``).  A kernel of independent work-items has a second
variant whose array parameters are ``restrict`` (``__restrict__`` in CUDA): the compiler may
then move a load of one work-item above another's store (the loads of ``K`` work-items in
flight together, and a saxpy adjoint's loads not held behind its store).  C allows that
exactly when no byte reached through one parameter is written through another; a launch
takes that variant only when its arrays' byte ranges are pairwise disjoint (a kernel indexes
only within its arrays), else the plain one.

Switches, read when a kernel is compiled: ``TAPEGRAD_ITEMS_PER_THREAD`` (default 4; ``1``
prints one work-item per thread, as before) and ``TAPEGRAD_RESTRICT=0`` (never the
``restrict`` variant).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

from tapegrad.backends.structure import contains_barrier, device_functions, memory_decl
from tapegrad.frontend.types import TypedKernel

DEFAULT_ITEMS = 4


def independent_items(tk: TypedKernel) -> bool:
    """Whether ``tk``'s work-items are independent (see the module's docstring): no barrier
    and no local memory in it or in a device function it reaches."""
    for k in [tk, *device_functions(tk)]:
        body = ast.Module(body=k.ir.body, type_ignores=[])
        for st in ast.walk(body):
            if isinstance(st, ast.stmt) and (contains_barrier(st)
                                             or memory_decl(st) == "localmem"):
                return False
    return True


def items_per_thread() -> int:
    """``TAPEGRAD_ITEMS_PER_THREAD``: work-items per thread for kernels of independent
    work-items (1 to 16; default 4)."""
    text = os.environ.get("TAPEGRAD_ITEMS_PER_THREAD", str(DEFAULT_ITEMS))
    try:
        k = int(text)
    except ValueError:
        k = 0
    if not 1 <= k <= 16:
        raise ValueError(f"TAPEGRAD_ITEMS_PER_THREAD={text!r}: give a whole number from 1 "
                         f"(one work-item per thread) to 16; the default is {DEFAULT_ITEMS}")
    return k


def restrict_allowed() -> bool:
    """Whether kernels of independent work-items get a ``restrict`` variant
    (``TAPEGRAD_RESTRICT=0`` turns it off)."""
    return os.environ.get("TAPEGRAD_RESTRICT", "1") != "0"


def disjoint(spans: Iterable[tuple[int, int, int]]) -> bool:
    """Whether no byte lies in two of ``spans``, each (memory, first byte, byte after the
    last) where spans in different memories never share a byte; empty spans share none.

    >>> disjoint([(0, 0, 8), (0, 8, 16), (1, 0, 8)]), disjoint([(0, 0, 9), (0, 8, 16)])
    (True, False)
    """
    ordered = sorted(s for s in spans if s[2] > s[1])
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(ordered, ordered[1:]))
