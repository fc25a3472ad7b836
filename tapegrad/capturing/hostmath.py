"""``math.sqrt(k)`` of a float argument while a captured function records: a guard.

A tape scalar is a ``float``, so ``math``'s and ``cmath``'s functions read its value without
calling any of its methods: the answer would be frozen into the recording.  While a trace tape
records, ``install`` puts a wrapper in place of each such function, in the ``math`` and
``cmath`` modules and wherever the captured function (or a function it reaches by name, four
levels deep) names one (``from math import sqrt``; a closure's cell): called with a tape
scalar, the wrapper answers through ``scalars.concrete``, so the answer is a guard that each
replay checks (a call answering otherwise records again), as ``math.floor`` is through
``__floor__``.  ``restore`` puts the functions back.  Installs are counted, under a lock, so
that recordings in several threads overlap; outside a recording (``scalars.concretized``
unset, as in every other thread) a wrapper calls the function as it is; so does one that
code run during a recording bound for good (a module first imported then, ``from math import
sqrt``).

For example, ``sc(out, u, math.sqrt(k))`` recorded with ``k = 0.25`` replays for ``k = 0.25``
and records again for ``k = 4.0``: the guard ``sqrt(k) == 0.5`` fails.
"""

from __future__ import annotations

import cmath
import functools
import math
import threading
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Any

from tapegrad.capturing.outside import DEPTH, code_names
from tapegrad.tape.scalars import TrackedScalar, concrete, concretized


class _Packed:
    """``fn`` of flat arguments: list or tuple arguments (``math.fsum([a, b])``) and keyword
    arguments put back as the call gave them (``layout``: per argument, None or its
    length), so that each tape scalar is an argument of the guard."""

    def __init__(self, fn: Any, layout: tuple, kwargs: dict):
        self.fn, self.layout, self.kwargs = fn, layout, kwargs
        self.__name__ = fn.__name__

    def __call__(self, *flat: Any) -> Any:
        args, k = [], 0
        for n in self.layout:
            if n is None:
                args.append(flat[k])
                k += 1
            else:
                args.append(flat[k:k + n])
                k += n
        return self.fn(*args, **self.kwargs)


def _wrapper(real: Any) -> Any:
    @functools.wraps(real)
    def host_math(*args: Any, **kwargs: Any) -> Any:
        if concretized.get() is None:           # (no capture records in this context)
            return real(*args, **kwargs)
        given, flat, layout, tracked = [], [], [], False
        for a in args:
            if hasattr(a, "__next__"):          # (fsum of a generator: read once, here)
                a = tuple(a)
            given.append(a)
            if type(a) in (list, tuple):
                layout.append(len(a))
                flat += a
                tracked = tracked or any(isinstance(x, TrackedScalar) for x in a)
            else:
                layout.append(None)
                flat.append(a)
                tracked = tracked or isinstance(a, TrackedScalar)
        if not tracked:
            return real(*given, **kwargs)
        if kwargs or any(n is not None for n in layout):
            return concrete(_Packed(real, tuple(layout), kwargs), *flat)
        return concrete(real, *flat)
    host_math.tapegrad_stands_for = real      # (a kernel naming it compiles the function)
    return host_math


# id of each math and cmath function -> its wrapper (which keeps the function alive)
WRAPPERS: dict[int, Any] = {
    id(fn): _wrapper(fn) for module in (math, cmath) for fn in vars(module).values()
    if isinstance(fn, BuiltinFunctionType)}

_IS_WRAPPER = {id(wrapper) for wrapper in WRAPPERS.values()}
_MODULES = [(vars(module), name) for module in (math, cmath)
            for name, fn in vars(module).items() if id(fn) in WRAPPERS]



_LOCK = threading.Lock()
# (id(namespace), name) -> [namespace, name, function, wrapper, installs]; a namespace is a
# module's or a function's globals (a dict, name a str) or a closure's cell (name None)
_INSTALLED: dict[tuple, list] = {}


def _get(namespace: Any, name: str | None) -> Any:
    if name is None:
        try:
            return namespace.cell_contents
        except ValueError:                  # (an empty cell)
            return None
    return namespace.get(name)


def _set(namespace: Any, name: str | None, value: Any) -> None:
    if name is None:
        namespace.cell_contents = value
    else:
        namespace[name] = value


def install(fn: Any) -> list[tuple]:
    """Put the wrappers in place (see the module's docstring); what ``restore`` takes."""
    places = _MODULES + _places(fn)
    done = []
    with _LOCK:
        for namespace, name in places:
            key = (id(namespace), name)
            entry = _INSTALLED.get(key)
            if entry is None:
                real = _get(namespace, name)
                wrapper = WRAPPERS.get(id(real))
                if wrapper is None:   # (a wrapper bound anew by code run while installed:
                    continue          # it stays, calling the function as it is outside)
                _set(namespace, name, wrapper)
                entry = _INSTALLED[key] = [namespace, name, real, wrapper, 0]
            entry[4] += 1
            done.append(key)
    return done


def restore(done: list[tuple]) -> None:
    """Undo an ``install``: the last one out puts each function back (unless the name was
    bound anew meanwhile)."""
    with _LOCK:
        for key in done:
            entry = _INSTALLED[key]
            entry[4] -= 1
            if entry[4] == 0:
                del _INSTALLED[key]
                namespace, name, real, wrapper, _ = entry
                if _get(namespace, name) is wrapper:
                    _set(namespace, name, real)


def _places(fn: Any) -> list[tuple]:
    """(namespace, name) of each name bound to a math or cmath function that ``fn``'s code,
    or that of a function it names, uses (the functions followed as ``outside.py`` does)."""
    places: list[tuple] = []
    seen: set[int] = set()

    def walk(f: Any, depth: int) -> None:
        f = getattr(f, "__func__", f)
        if depth > DEPTH or id(f) in seen:
            return
        seen.add(id(f))
        # (a tg.capture'd function's function, a functools.wraps decorator's)
        inner = vars(f).get("__wrapped__") if hasattr(f, "__dict__") else None
        if inner is not None:
            walk(inner, depth + 1)
        if not isinstance(f, FunctionType) or id(f) in _IS_WRAPPER or \
                (f.__module__ or "").startswith("tapegrad"):
            return      # (tapegrad's own functions convert on purpose, and plainly)
        found = [(f.__globals__, name) for name in code_names(f.__code__)
                 if name in f.__globals__]
        found += [(cell, None) for cell in f.__closure__ or ()]
        for namespace, name in found:
            v = _get(namespace, name)
            if id(v) in WRAPPERS or id(v) in _IS_WRAPPER:    # (the latter: installed)
                places.append((namespace, name))
            elif isinstance(v, (FunctionType, MethodType)) or \
                    "__wrapped__" in getattr(v, "__dict__", ()):
                walk(v, depth + 1)

    walk(fn, 1)
    return places

