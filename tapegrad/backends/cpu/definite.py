"""Locals a work-item may read before assigning them get a value when its parallel task starts.

After this plan is written out, no local of the kernel is live on entry to the body of the
``numba.prange`` loop: every path from the start of a task to a read of a local passes an
assignment to it.

Why: Numba's parallel-loop pass takes a variable that may reach a read in the ``prange`` body
without an assignment there as a value flowing in from outside the loop (a parfor
*parameter*), and looks for a reduction in it.  Its search (``get_reduce_nodes`` and
``cyclic_lookup`` in ``numba/parfors/parfor.py``) follows the chain of copies that its SSA
form makes around the work-item loops, and detects a cycle only when the chain comes back to
the first copy it followed; a chain that ends in a cycle elsewhere recurses until Python
stops it (``RecursionError``).

Adjoint kernels make such reads whenever a branch inside a loop holds another branch: the
inner branch's flag is assigned only when the outer branch is taken, and the reverse sweep
pops it under the stack's overflow guard, so Numba cannot see that it is always assigned
before it is tested::

    for k in range(_start3, n, _step4):          # forward sweep
        _branch5 = np.int64(bool(k < 16))
        if _branch5:
            _branch6 = np.int64(bool(k < 8))     # assigned only here
            ...
    for _rev10 in range(_trips2):                # reverse sweep
        ...
        if _branch5:
            _isp = _isp - 1
            if _isp < _stack_depth:
                _branch6 = _istack[np.uint64(_isp)]
            if _branch6:                         # reached unassigned, as far as Numba sees

The kernel then starts each task with ``_branch6 = 0``.  The value is never read where the
kernel is right (a correct kernel assigns these locals before it reads them; Numba cannot
tell).  Arrays and tuples get nothing (there is no zero to give them).

A user's kernel may read a local that no path of its work-item assigned (``x`` after
``for x in range(0)``, or assigned in one branch only), where Python would raise
UnboundLocalError: such a local reads 0 at the start of every work-item, as the GPUs' C
declares it (``zeroed_per_item``), not an earlier work-item's value or Numba's garbage.
"""

from __future__ import annotations

import ast

from tapegrad.frontend.types import TypedKernel
from tapegrad.frontend.unassigned import unassigned_scalars, zeroed_unassigned

_ZERO = {"float64": "0.0", "float32": "np.float32(0.0)", "int64": "0", "int32": "np.int32(0)",
         "bool": "False"}


def unassigned_locals(tk: TypedKernel, body: list[ast.stmt] | None = None) -> dict[str, str]:
    """The scalar locals that ``body`` (the kernel's, by default) may read before assigning
    them, each with the generated source of its type's zero, in name order."""
    return {name: _ZERO[tk.locals[name].dtype] for name in unassigned_scalars(tk, body)}


def zeroed_per_item(tk: TypedKernel) -> TypedKernel:
    """``tk`` with ``x = 0`` (its type's zero) at the top of the work-item body for each scalar
    local it may read before assigning it (``frontend/unassigned.py``); a kernel the
    transforms made is left as it is (its reads before assignment are never used: see
    above, and the transforms wrote the user's zeros into it)."""
    if tk.ir.generated:
        return tk
    return zeroed_unassigned(tk)
