"""Where a captured function names a ``math`` or ``cmath`` function: ``from math import
sqrt`` in its module, a closure's cell holding ``math.exp``, a helper it calls that does.

Every tape puts wrappers in place of those functions in their modules
(``tapegrad/tape/hostmath.py``, which says what a wrapper answers: ``math.sqrt(k)`` of a tape
scalar is ``tg.sqrt(k)``, its value a guard while a capture records).  A name bound to the
function itself elsewhere would not reach a wrapper, so while a captured function's first
call records, ``install`` puts the wrappers there too: each name of such a function that the
captured function's code uses, or that of a function it reaches by name (followed as
``outside.py`` follows them, four levels deep).  ``restore`` puts the functions back.

For example, ``f`` of ``from math import sqrt; def f(u, k): return scaled(u, sqrt(k))``
records ``sqrt(k)`` as ``tg.sqrt(k)`` would; without the wrapper in ``f``'s globals, its
value would be a constant to the tape.
"""

from __future__ import annotations

from types import FunctionType, MethodType
from typing import Any

from tapegrad.capturing.outside import DEPTH, code_names
from tapegrad.tape import hostmath
from tapegrad.tape.hostmath import IS_WRAPPER, WRAPPERS, get, restore

__all__ = ["install", "restore"]


def install(fn: Any) -> list[tuple]:
    """The wrappers in place in the math and cmath modules and wherever ``fn`` names one of
    their functions; what ``restore`` takes."""
    return hostmath.install(_places(fn))


def _places(fn: Any) -> list[tuple]:
    """(namespace, name) of each name bound to a math or cmath function that ``fn``'s code,
    or that of a function it names, uses (the functions followed as ``outside.py`` does)."""
    places: list[tuple] = []
    _walk(fn, 1, places, set())
    return places


def _walk(f: Any, depth: int, places: list[tuple], seen: set[int]) -> None:
    # (a function of the module, not a closure calling itself: that would be a reference
    # cycle per call, which tg.gradient makes on every call)
    f = getattr(f, "__func__", f)
    if depth > DEPTH or id(f) in seen:
        return
    seen.add(id(f))
    # (a tg.capture'd function's function, a functools.wraps decorator's)
    inner = vars(f).get("__wrapped__") if hasattr(f, "__dict__") else None
    if inner is not None:
        _walk(inner, depth + 1, places, seen)
    if not isinstance(f, FunctionType) or id(f) in IS_WRAPPER or \
            (f.__module__ or "").startswith("tapegrad"):
        return      # (tapegrad's own functions convert on purpose, and plainly)
    found = [(f.__globals__, name) for name in code_names(f.__code__) if name in f.__globals__]
    found += [(cell, None) for cell in f.__closure__ or ()]
    for namespace, name in found:
        v = get(namespace, name)
        if id(v) in WRAPPERS or id(v) in IS_WRAPPER:    # (the latter: installed)
            places.append((namespace, name))
        elif isinstance(v, (FunctionType, MethodType)) or \
                "__wrapped__" in getattr(v, "__dict__", ()):
            _walk(v, depth + 1, places, seen)
