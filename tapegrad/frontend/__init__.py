"""Frontend: parse a kernel, check it is inside the supported subset, resolve its names, and
make each call that writes memory run once, in Python's order (``once.py``).

``kernel_ir(fn_or_kernel)`` is the one entry point; results are cached on the kernel object.
"""

from __future__ import annotations

from typing import Any

from tapegrad.frontend.checks import check_syntax
from tapegrad.frontend.ir import KernelIR
from tapegrad.frontend.once import evaluate_once
from tapegrad.frontend.params import local_copies_of_assigned_params
from tapegrad.frontend.parse import parse_function
from tapegrad.frontend.resolve import resolve
from tapegrad.lang.kernel import KernelFunction

__all__ = ["kernel_ir", "KernelIR"]


def kernel_ir(obj: Any) -> KernelIR:
    """The canonical IR of a ``tg.Kernel`` or ``tg.Func`` (built once, then cached)."""
    ir = obj.cache.get("ir")
    if ir is None:
        ir = obj.cache["ir"] = evaluate_once(_resolved(obj), _resolved)
    return ir


def _resolved(obj: Any) -> KernelIR:
    """The IR before ``evaluate_once``, which reads the device functions' own through this
    (a function that calls itself finds its IR here, not half-built)."""
    ir = obj.cache.get("resolved ir")
    if ir is None:
        is_kernel = isinstance(obj, KernelFunction)
        check_syntax(obj.pyfunc, is_kernel=is_kernel)
        ir = resolve(parse_function(obj.pyfunc), is_kernel=is_kernel)
        if is_kernel:
            ir = local_copies_of_assigned_params(ir)
        obj.cache["resolved ir"] = ir
    return ir
