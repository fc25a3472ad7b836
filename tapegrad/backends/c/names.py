"""The names the user's variables take in generated C, where their own would clash.

The printer derives names of its own from the user's: an array ``A``'s extents
``A_shape0``, ..., a tuple ``t``'s components ``t_0``, ...; and C's headers define macros
(``INFINITY``, ``NAN``, ``M_PI``, ``FLT_MAX``) that the preprocessor substitutes for any word
of that name.  A user's variable named like one of those (a local ``A_shape0`` next to an
array ``A``, a local ``M_PI``) is printed as ``A_shape0_`` (underscores appended until the
name is free), everywhere it appears; the derived names keep their own (``c_names``).

An array argument of the kernel itself keeps its name (the OpenCL printer names its offset
after it): one named like a derived name or a macro is refused with a message that says so.
"""

from __future__ import annotations

import ast
import re

from tapegrad.errors import located
from tapegrad.frontend.types import Array, TupleT, TypedKernel

# macros of OpenCL C's and CUDA's headers without an underscore (those with one, FLT_MAX,
# M_PI, CLK_..., are matched by _MACRO_LIKE)
_MACROS = frozenset({"INFINITY", "NAN", "MAXFLOAT", "NULL", "HUGE_VAL", "HUGE_VALF", "EOF"})
_MACRO_LIKE = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+")


def is_macro_like(name: str) -> bool:
    """Whether a header may define ``name`` as a macro (upper case with an underscore, as
    ``M_PI``, ``FLT_MAX``, ``CLK_LOCAL_MEM_FENCE``; or one of ``_MACROS``)."""
    return name in _MACROS or _MACRO_LIKE.fullmatch(name) is not None


def user_names(functions: list[TypedKernel]) -> set[str]:
    """Every parameter and local of ``functions`` (a kernel and its device functions)."""
    return {n for k in functions for n in [*k.ir.params, *k.locals]}


def derived_names(functions: list[TypedKernel]) -> set[str]:
    """The names the printer derives from the user's: arrays' extents, tuples' components."""
    out: set[str] = set()
    for k in functions:
        typed = {**dict(zip(k.ir.params, k.argtypes)), **k.locals}
        for name, t in typed.items():
            if isinstance(t, Array):
                out |= {f"{name}_shape{d}" for d in range(t.ndim)}
            elif isinstance(t, TupleT):
                out |= {f"{name}_{d}" for d in range(len(t.items))}
    return out


def c_names(kernel: TypedKernel, functions: list[TypedKernel]) -> dict[str, str]:
    """The C name of each user's variable (of ``functions``, ``kernel`` among them) whose own
    is a derived name or a macro's (see the module's docstring); others are absent."""
    names, derived = user_names(functions), derived_names(functions)
    taken = names | derived
    out = {}
    for name in sorted(names):
        if name not in derived and not is_macro_like(name):
            continue
        t = dict(zip(kernel.ir.params, kernel.argtypes)).get(name)
        if isinstance(t, Array):
            raise located(ast.Pass(lineno=kernel.ir.lineno, col_offset=0), kernel.ir.filename,
                          f"the array argument '{name}' is named like a name the generated "
                          "C uses itself (an extent of another array, a tuple's component or "
                          "a C macro): rename it to run the kernel on a GPU")
        new = name + "_"
        while new in taken:
            new += "_"
        taken.add(new)
        out[name] = new
    return out


def assigned_names(tk: TypedKernel) -> set[str]:
    """The names ``tk``'s body assigns (a device function's parameters among them lose their
    ``const``)."""
    body = ast.Module(body=tk.ir.body, type_ignores=[])
    return {n.id for n in ast.walk(body) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}
