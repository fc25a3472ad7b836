"""What a captured function reads from outside its arguments (its closure's cells, the
globals its code names, the attributes it names of modules among them, its object, and what
those hold), checked before each replay: an array by identity (and which argument, if any,
it is), a number or string by value.  A replay whose outside differs (``W = W * 3`` between
calls, ``config.dt = 0.2``, an array replaced in a dict, a global float rebound, the global
array passed as an argument) records again instead of replaying the first call's objects.
Changes in place are not rebindings: a replay reads an array's contents as they are then.
Checkpointed code (``tapegrad/checkpointing``), which the reverse sweep runs again, refuses
a rebound array or number by the same check (``changed``)."""

from __future__ import annotations

import dis
import functools
from types import CodeType, FunctionType, ModuleType
from typing import Any

import numpy as np

from tapegrad.tape.arrays import is_array
from tapegrad.tape.memory import owner
from tapegrad.tape.names import DEPTH, code_names

MOST_ENTRIES = 64   # a larger container is checked by identity alone
_VALUES = (int, float, complex, str, bytes, bool, type(None))
MISSING = object()


def outside(fn: Any, args: tuple) -> list[tuple]:
    """(path, kind, expected) for each thing ``fn`` reads from outside: ``kind`` is
    ``"is"`` (identity), ``"=="`` (a value) or ``"array"`` (identity, and the position of
    the argument sharing its memory, or None).  A module's attributes that the code names
    (``config.W``, ``config.dt``, ``package.config.dt``) count where they are arrays or
    values, read from the module's own attributes (its ``__getattr__`` is not run); so do
    a class's (``Config.dt``)."""
    found: list[tuple] = []
    seen: set[int] = set()

    def walk(v: Any, path: tuple, depth: int, names: Any = ()) -> None:
        if isinstance(v, ModuleType):
            found.append((path, "is", v))
            if depth >= DEPTH or id(v) in seen:
                return
            seen.add(id(v))
            attributes = vars(v)     # (not getattr: a module's __getattr__ may import)
            for m in names:      # (``names``: those of the code that named the module)
                x = attributes.get(m, MISSING)
                if isinstance(x, ModuleType) or is_array(x) or _value(x):  # (config.sub.dt)
                    walk(x, path + (("attr", m),), depth + 1, names)
            return
        if is_array(v):
            found.append((path, "array", (v, _alias(v, args))))
            return
        if _value(v):
            found.append((path, "==", v))
            return
        v = _standing_for(v)
        found.append((path, "is", v))
        if depth >= DEPTH or id(v) in seen:
            return
        seen.add(id(v))
        if isinstance(v, type):     # (a class's attributes the code names: Config.dt)
            home = getattr(v, "__module__", None)
            if isinstance(home, str) and not home.startswith(("tapegrad", "numpy", "builtins")):
                for m in names:
                    x = next((vars(k)[m] for k in v.__mro__ if m in vars(k)), MISSING)
                    if is_array(x) or _value(x):
                        walk(x, path + (("attr", m),), depth + 1)
            return
        if isinstance(v, dict) and len(v) <= MOST_ENTRIES:
            for key, x in list(v.items()):
                walk(x, path + (("item", key),), depth + 1)
        elif isinstance(v, (list, tuple)) and len(v) <= MOST_ENTRIES:
            for key, x in enumerate(v):
                walk(x, path + (("item", key),), depth + 1)
        elif isinstance(v, FunctionType) or hasattr(v, "__func__"):
            names = _code_names_of(v)
            for step, x in _names(v):
                walk(x, path + (step,), depth + 1, names)
        elif not type(v).__module__.startswith(("tapegrad", "numpy", "builtins")) \
                and hasattr(v, "__dict__") and len(vars(v)) <= MOST_ENTRIES:
            for key, x in list(vars(v).items()):
                walk(x, path + (("attr", key),), depth + 1)

    names = _code_names_of(fn)
    for step, x in _names(fn):
        walk(x, (step,), 1, names)
    return found


def stored(fn: Any) -> set[str]:
    """The global and attribute names that ``fn``'s code, or that of a function it reaches by
    name (four levels deep), assigns or deletes (``ELAPSED += dt``, ``Stats.seconds = t``):
    what it writes rather than computes with."""
    names: set[str] = set()
    seen: set[int] = set()

    def visit(f: Any, depth: int) -> None:
        f = getattr(f, "__func__", f)
        code = getattr(f, "__code__", None)
        if depth > DEPTH or id(f) in seen or code is None:
            return
        seen.add(id(f))
        names.update(_stores(code))
        for _, x in _names(f):
            if isinstance(x, FunctionType) or hasattr(x, "__func__"):
                visit(x, depth + 1)

    visit(fn, 1)
    return names


_STORES = frozenset({"STORE_GLOBAL", "STORE_ATTR", "DELETE_GLOBAL", "DELETE_ATTR",
                     "STORE_NAME", "DELETE_NAME"})


@functools.lru_cache(maxsize=4096)    # (a code object never changes; reading it is slow)
def _stores(code: Any) -> frozenset[str]:
    found = {i.argval for i in dis.get_instructions(code) if i.opname in _STORES}
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found |= _stores(const)
    return frozenset(found)


def _code_names_of(fn: Any) -> Any:
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code_names(code) if code is not None else ()


def same_outside(fn: Any, args: tuple, expected: list[tuple]) -> bool:
    """Whether what ``fn`` reads from outside is as ``outside`` found it."""
    return changed(fn, args, expected) is None


def changed(fn: Any, args: tuple, expected: list[tuple]) -> tuple | None:
    """The path of the first thing in ``expected`` (``outside``'s, or some of it) that ``fn``
    reaches otherwise now (``W = W.copy()`` since), or None where all are as they were.
    (Checkpointed code, which the reverse sweep runs again, refuses a rebound array by it.)"""
    for path, kind, want in expected:
        v = follow(fn, path)
        if kind == "array":
            if v is not want[0] or _alias(v, args) != want[1]:
                return path
        elif kind == "==":
            if not (v is want or type(v) is type(want) and v == want):
                return path
        elif _standing_for(v) is not want:
            return path
    return None


def _value(v: Any) -> bool:
    """Whether ``v`` is compared by value: a Python number, string, bytes or None, or a
    NumPy number (``config.dt = np.float64(0.5)``)."""
    return isinstance(v, _VALUES) and type(v).__module__ == "builtins" or \
        isinstance(v, (np.number, np.bool_))


def _standing_for(v: Any) -> Any:
    """``v``, or the function a wrapper that tapes put in its place stands for
    (``tape/hostmath.py``): a name that is the wrapper in one call and the function in
    the next is not rebound."""
    return getattr(v, "tapegrad_stands_for", v) if isinstance(v, FunctionType) else v


def describe(fn: Any, path: tuple) -> tuple[str, str]:
    """A path of ``outside``'s as the user writes it, and what holds it: ("W", "a global"),
    ("cfg['W']", "a global"), ("w", "a closure variable"), ("self.w", "an attribute of the
    method's object"); through a function the code reaches, ("W", "a global, read by helper")."""
    expr, where, through = "", "", []
    v = fn
    for step in path:
        kind = step[0]
        if kind in ("self", "cell", "global"):
            if expr:                              # (on into a function found there)
                through.append(expr)
            if kind == "global":
                expr, where = step[1], "a global"
            elif kind == "self":
                expr, where = "self", "the method's object"
            else:
                code = getattr(getattr(v, "__func__", v), "__code__", None)
                names = code.co_freevars if code is not None else ()
                expr = names[step[1]] if step[1] < len(names) else f"cell {step[1]}"
                where = "a closure variable"
        elif kind == "item":
            expr += f"[{step[1]!r}]"
        else:
            expr += f".{step[1]}"
            if where == "the method's object":
                where = "an attribute of the method's object"
        v = follow(v, (step,))
    if through:
        where += ", read by " + through[-1]
    return expr, where


def _alias(x: Any, args: tuple) -> int | None:
    base = owner(x)
    return next((pos for pos, a in enumerate(args) if is_array(a) and owner(a) is base), None)


def _names(fn: Any) -> list[tuple]:
    """(step, value) for what a function's code reaches by name."""
    found: list[tuple] = []
    bound = getattr(fn, "__self__", None)
    if bound is not None and not isinstance(bound, ModuleType):
        found.append((("self",), bound))
    target = getattr(fn, "__func__", fn)
    for n, cell in enumerate(getattr(target, "__closure__", None) or ()):
        try:
            found.append((("cell", n), cell.cell_contents))
        except ValueError:          # an empty cell
            pass
    code, globals_ = getattr(target, "__code__", None), getattr(target, "__globals__", {})
    for name in code_names(code) if code is not None else ():
        if name in globals_:
            found.append((("global", name), globals_[name]))
    return found


def outside_arrays(fn: Any) -> dict[int, Any]:
    """Arrays ``fn`` can reach without being given them: what its closure holds, the globals
    its code names (and their attributes it names), its object's attributes; and so on, four
    levels deep, through the functions, lists, tuples, dicts and objects among those."""
    arrays: dict[int, Any] = {}
    found, seen = [fn], set()
    for _ in range(4):
        inner: list[Any] = []
        for v in found:
            if id(v) in seen:
                continue
            seen.add(id(v))
            if is_array(v):
                arrays[id(v)] = v
            elif isinstance(v, dict):
                inner += v.values()
            elif isinstance(v, (list, tuple)):
                inner += v
            elif callable(v) and hasattr(v, "__code__") or hasattr(v, "__func__"):
                inner += _reached(v)
            elif not isinstance(v, (type, ModuleType)) and hasattr(v, "__dict__"):
                inner += vars(v).values()
        found = inner
    return arrays


def _reached(fn: Any) -> list[Any]:
    """What a function's code reaches by name (``_names``), a module's attributes it names
    in the module's place."""
    names = _code_names_of(fn)
    found: list[Any] = []
    for step, v in _names(fn):
        if isinstance(v, ModuleType):
            attributes = vars(v)   # (not getattr: a module's __getattr__ may import)
            found += [attributes[m] for m in names if m != step[-1] and m in attributes]
        else:
            found.append(v)
    return found


def follow(fn: Any, path: tuple) -> Any:
    v = fn
    try:
        for step in path:
            kind = step[0]
            if kind == "self":
                v = v.__self__
            elif kind == "cell":
                v = getattr(v, "__func__", v).__closure__[step[1]].cell_contents
            elif kind == "global":
                v = getattr(v, "__func__", v).__globals__.get(step[1], MISSING)
            elif kind == "item":
                v = v[step[1]]
            else:
                v = getattr(v, step[1])
    except (LookupError, AttributeError, TypeError, ValueError):
        return MISSING
    return v
