"""``math.sqrt(s)`` of a scalar that carries a derivative: recorded as ``tg.sqrt(s)``, or refused.

A tape scalar is a ``float`` (so are forward mode's and tg.hvp's scalars), so ``math``'s and
``cmath``'s functions read its value without calling any of its methods: the derivative
would be lost without a word.  While a tape records or forward mode runs in some thread,
``install`` puts a wrapper in place of each such function, in the ``math`` and ``cmath``
modules, and at ``places``: names bound to the function itself (``from math import sqrt``)
that a function given to tg.gradient, tg.capture... reaches (``places``: its code and that
of the functions it calls by name, four levels deep).  Given a scalar that carries a
derivative in this thread, a wrapper answers as ``ANSWERS`` says:

- a function with a row in the table (``lang/primitives.py``: sqrt, exp, log, sin, atan2,
  hypot, pow, fmod, ...) is ``tg.<f>``: recorded, or its tangents carried, with the partials
  of its row and math's own value (and errors: ``math.sqrt(-1.0)`` raises ValueError);
  ``log(x, base)``, ``hypot(x)``, ``degrees``, ``radians``, ``fsum`` and ``prod`` are built
  from rows and the scalars' own ``+ *``;
- a function whose answer carries no derivative (``PLAIN``: ``isnan``, ``isclose``, ...)
  answers with its value, as ``s < 1.0`` does (``floor``, ``ceil`` and ``trunc`` need no
  wrapper: they call the scalar's ``__floor__``...);
- any other (``math.gamma``, ``math.frexp``, ``cmath.sqrt``) is refused with a TapegradError
  that names it and the ways out.

While tg.capture records, each answer is also a guard (``scalars.concrete``): a replay whose
``math.sqrt(k)`` answers otherwise records again.

``restore`` puts the functions back.  Installs are counted, under a lock, so that recordings
in several threads overlap; a wrapper given plain numbers, or called where no tape records
and no forward mode runs (every other thread), calls the function as it is (a type test per
argument, two context-variable reads); so does one that code run meanwhile bound for good (a
module first imported then that says ``from math import sqrt``).

For example, under ``tg.gradient``, ``s = tg.sum(B); return s * math.sqrt(s)`` records
``sqrt`` on the tape: the gradient is ``1.5 * sqrt(s) * dB/dA``, where the plain value would
have given ``sqrt(s) * dB/dA``; ``math.gamma(s)`` raises "math.gamma(s) of a scalar that
carries a derivative ... cannot be differentiated".
"""

from __future__ import annotations

import cmath
import functools
import math
import operator
import os
import sys
import sysconfig
import threading
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType
from typing import Any

from tapegrad.callers import user_line
from tapegrad.errors import TapegradError
from tapegrad.lang.primitives import MATH
from tapegrad.tape.duals import TapedDual, part
from tapegrad.tape.modes import current_forward, forward_var, tapes_var
from tapegrad.tape.names import DEPTH, code_names
from tapegrad.tape.scalars import (
    DualScalar,
    TrackedScalar,
    concrete,
    concretized,
    record_scalar_op,
    scalar_math,
)

# -- what math.<f>(s) answers --------------------------------------------------------------


def _row(name: str) -> Any:
    """``math.<name>(*args)`` as ``tg.<name>``, the value from ``real`` (math's function)."""
    arity = MATH[name].arity

    def answer(real: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs or len(args) != arity:
            return real(*args, **kwargs)          # (math's own TypeError)
        return scalar_math(name, args, real)
    return answer


def _log(real: Any, x: Any, *base: Any) -> Any:
    if not base:
        return scalar_math("log", (x,), real)
    if len(base) > 1:
        return real(x, *base)               # (math's own TypeError)
    # (math.log(x, b) is log(x) / log(b), rounded as here)
    return scalar_math("log", (x,), real) / scalar_math("log", base, real)


def _hypot(real: Any, *args: Any) -> Any:
    if len(args) == 1:
        return scalar_math("fabs", args, real)          # (hypot(x) is |x|)
    if len(args) == 2:
        return scalar_math("hypot", args, real)
    raise _refused(real, "tapegrad's rule for math.hypot takes two arguments",
                   "Nest it: math.hypot(math.hypot(x, y), z)")


def _fsum(real: Any, items: Any) -> Any:
    """``fsum``'s correctly rounded value; its partials are all 1 (it is linear, so tg.hvp's
    tangent is the fsum of the tangents)."""
    items = tuple(items)
    if any(isinstance(x, TapedDual) for x in items):
        return TapedDual(_fsum(real, [part(x) for x in items]), _fsum(real, [
            x.tangent if isinstance(x, TapedDual) else 0.0 for x in items]))
    rule = _fsum_rule(real)
    value, partials = rule(*(float.__float__(x) if isinstance(x, float) else x
                             for x in items))
    if any(isinstance(x, DualScalar) for x in items):
        return DualScalar.combine(items, value, partials)
    return record_scalar_op("fsum", items, value, partials, rule)


@functools.cache
def _fsum_rule(real: Any) -> Any:
    def fsum(*values: Any) -> tuple[float, tuple[float, ...]]:
        return real(values), (1.0,) * len(values)
    return fsum


def _prod(real: Any, items: Any, *, start: Any = 1) -> Any:
    return functools.reduce(operator.mul, items, start)   # (math.prod's order and rounding)


_DEGREES = 180.0 / math.pi        # (math.degrees(x) is x * this, math.radians(x) x / ...)
_RADIANS = math.pi / 180.0

# (module, name) -> how math.<name> of a scalar that carries a derivative answers:
# ``PLAIN`` (its value: no derivative to lose) or a function of (math's function, *args)
PLAIN = "plain"
ANSWERS: dict[tuple[str, str], Any] = {
    **{("math", name): _row(name) for name, row in MATH.items()
       if row.differentiable and isinstance(getattr(math, name, None), BuiltinFunctionType)},
    ("math", "log"): _log,
    ("math", "hypot"): _hypot,
    ("math", "fsum"): _fsum,
    ("math", "prod"): _prod,
    ("math", "degrees"): lambda real, x: x * _DEGREES,
    ("math", "radians"): lambda real, x: x * _RADIANS,
    **{("math", name): PLAIN for name in ("isnan", "isinf", "isfinite", "isclose", "ulp")},
    **{("cmath", name): PLAIN for name in ("isnan", "isinf", "isfinite", "isclose", "phase")},
}

_ROUTED = sorted(name for (module, name), how in ANSWERS.items() if how is not PLAIN)


def _refused(real: Any, why: str = "", instead: str = "") -> TapegradError:
    """The refusal of ``real`` of a scalar that carries a derivative: what is wrong, where
    (the user's line), and what to write instead."""
    where = user_line()
    call = f"{real.__module__}.{real.__name__}"
    if real.__module__ == "cmath":
        why = why or f"{call}'s answer is complex (tapegrad's scalars are real)"
        instead = instead or "Write it with real functions (math.sqrt(abs(s)), math.atan2)"
    return TapegradError(
        f"{where + ': ' if where else ''}{call}(s) of a scalar that carries a derivative (a "
        "tape scalar from tg.sum/dot/mean/norm or arithmetic on them, a differentiated float "
        "argument, or forward mode's) cannot be differentiated: "
        f"{why or f'tapegrad has no derivative rule for {call}'}, and its plain value would "
        f"drop the derivative without a word. {instead + '; or b' if instead else 'B'}uild it "
        "from + - * / ** and the math functions recorded for such a scalar, as tg.<name> is: "
        f"{', '.join(_ROUTED)}. If the value is meant as a constant, compute it outside the "
        "function being differentiated (or after the recording) and pass it in")


def _live(x: Any) -> bool:
    """Whether ``x`` carries a derivative here (as its ``float()`` would refuse)."""
    if isinstance(x, TrackedScalar):
        return x.recorded()
    return isinstance(x, (DualScalar, TapedDual)) and current_forward() is not None


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


def _answer(real: Any, how: Any, args: tuple, kwargs: dict) -> Any:
    """``real(*args, **kwargs)`` while a tape records or forward mode runs here."""
    given, flat, layout = [], [], []
    for a in args:
        if hasattr(a, "__next__"):          # (fsum of a generator: read once, here)
            a = tuple(a)
        given.append(a)
        if type(a) in (list, tuple):
            layout.append(len(a))
            flat += a
        else:
            layout.append(None)
            flat.append(a)
    if not any(_live(a) for a in flat):
        return real(*given, **kwargs)
    if how is None:
        raise _refused(real)
    if how is PLAIN or concretized.get() is not None:
        # the value, a guard while tg.capture records (replays check it)
        packed = kwargs or any(n is not None for n in layout)
        answer = concrete(_Packed(real, tuple(layout), kwargs) if packed else real, *flat)
        if how is PLAIN:
            return answer
    return how(real, *given, **kwargs)


def _wrapper(real: Any) -> Any:
    how = ANSWERS.get((real.__module__, real.__name__))

    @functools.wraps(real)
    def host_math(*args: Any, **kwargs: Any) -> Any:
        for a in args:
            if type(a) is not float and type(a) is not int:
                break
        else:                                   # (plain numbers: nothing to differentiate)
            return real(*args, **kwargs)
        if not tapes_var.get() and not forward_var.get():   # (nothing differentiates here)
            return real(*args, **kwargs)
        return _answer(real, how, args, kwargs)
    host_math.tapegrad_stands_for = real      # (a kernel naming it compiles the function)
    return host_math


# -- putting the wrappers in place ---------------------------------------------------------

# Functions that need no wrapper: a tape scalar's own ``__floor__``, ``__ceil__`` and
# ``__trunc__`` answer math.floor/ceil/trunc (guards while tg.capture records), and the integer
# functions refuse a float
_UNWRAPPED = {"floor", "ceil", "trunc", "comb", "perm", "factorial", "gcd", "lcm", "isqrt"}

# id of each math and cmath function -> its wrapper (which keeps the function alive)
WRAPPERS: dict[int, Any] = {
    id(fn): _wrapper(fn) for module in (math, cmath) for name, fn in vars(module).items()
    if isinstance(fn, BuiltinFunctionType) and name not in _UNWRAPPED}

IS_WRAPPER = {id(wrapper) for wrapper in WRAPPERS.values()}

_LOCK = threading.Lock()
# key -> [groups, installs]: a group is (namespace, {name: function}, {name: wrapper}),
# swapped together; a namespace is a module's or a function's globals (a dict) or a
# closure's cell (its one name: None).  The key ``_MODULES_KEY``: the math and cmath modules'
# functions; (id(namespace), name): a name elsewhere.
_INSTALLED: dict[tuple, list] = {}
_MODULES_KEY = ("math", "cmath")
_MODULE_GROUPS = [
    (vars(module), {name: fn for name, fn in vars(module).items() if id(fn) in WRAPPERS},
     {name: WRAPPERS[id(fn)] for name, fn in vars(module).items() if id(fn) in WRAPPERS})
    for module in (math, cmath)]


def get(namespace: Any, name: str | None) -> Any:
    """What ``name`` in ``namespace`` holds (a closure's cell: name None; empty: None)."""
    if name is None:
        try:
            return namespace.cell_contents
        except ValueError:                  # (an empty cell)
            return None
    return namespace.get(name)


def _swap(group: tuple, old: int, new: int) -> None:
    """Bind each name of ``group`` to its ``group[new]`` where it holds its ``group[old]``
    (1: the function, 2: its wrapper); a name bound to anything else is left as it is."""
    namespace, was, now = group[0], group[old], group[new]
    if None in was:
        if get(namespace, None) is was[None]:
            namespace.cell_contents = now[None]
    elif was.items() <= namespace.items():
        namespace.update(now)               # (all at once: the usual case)
    else:
        for name, fn in was.items():
            if namespace.get(name) is fn:
                namespace[name] = now[name]


def _known_to_numba() -> None:
    """Make Numba take each wrapper for the function it stands for (once per process): it
    finds math's functions by the function objects, so code compiled while the wrappers are
    in place (a user's ``numba.njit`` helper, tapegrad's own kernels compiled here) would
    meet an unknown ``math.sqrt``; and its tables of them, read on its first compile, would
    hold the wrappers for the rest of the process."""
    global _NUMBA_KNOWS
    _NUMBA_KNOWS = True
    try:
        from numba.core.registry import cpu_target
    except ImportError:          # (no Numba: nothing to tell)
        return
    typing = cpu_target.typing_context
    typing.refresh()             # (its tables, read now: the functions themselves)
    for wrapper in WRAPPERS.values():
        try:
            typing.insert_global(wrapper, typing.resolve_value_type(wrapper.tapegrad_stands_for))
        except Exception:        # (a function Numba does not compile: nothing to alias)
            continue


_NUMBA_KNOWS = False


def install(places: list[tuple] = ()) -> list[tuple]:
    """Put the wrappers in place (see the module's docstring): in the math and cmath modules
    and at ``places``, (namespace, name) pairs; what ``restore`` takes."""
    done = []
    if not _NUMBA_KNOWS:
        _known_to_numba()
    with _LOCK:
        for key, namespace, name in [(_MODULES_KEY, None, None), *(
                ((id(namespace), name), namespace, name) for namespace, name in places)]:
            entry = _INSTALLED.get(key)
            if entry is None:
                if key is _MODULES_KEY:
                    groups = _MODULE_GROUPS
                else:
                    real = get(namespace, name)
                    if id(real) not in WRAPPERS:   # (a wrapper bound anew by code run while
                        continue                   # installed: it stays, harmless)
                    groups = [(namespace, {name: real}, {name: WRAPPERS[id(real)]})]
                for group in groups:
                    _swap(group, 1, 2)
                entry = _INSTALLED[key] = [groups, 0]
            entry[1] += 1
            done.append(key)
    return done


def restore(done: list[tuple]) -> None:
    """Undo an ``install``: the last one out puts each function back (unless the name was
    bound anew meanwhile)."""
    with _LOCK:
        for key in done:
            entry = _INSTALLED[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _INSTALLED[key]
                for group in entry[0]:
                    _swap(group, 2, 1)


def places(fn: Any) -> list[tuple]:
    """(namespace, name) of each name bound to a math or cmath function that ``fn``'s code,
    or that of a function it names (a function of a module of yours it names through the
    module: ``helpers.rms(s)``), uses, four levels deep: what ``install`` takes.  For ``from
    math import sqrt; def f(u, k): return scaled(u, sqrt(k))``, ``f``'s global ``sqrt``;
    without the wrapper there, its value would be a constant to the tape.  The standard
    library's and installed packages' functions are not followed (they convert on purpose,
    and binding wrappers there would slow them for every thread)."""
    found: list[tuple] = []
    _walk(fn, 1, found, {})
    return found


def _walk(f: Any, depth: int, found: list[tuple], seen: dict) -> None:
    # (a function of the module, not a closure calling itself: that would be a reference
    # cycle per call, which tg.gradient makes on every call)
    try:
        f = getattr(f, "__func__", f)
    except Exception:       # noqa: BLE001 - (an object whose attributes raise: not followed)
        return
    # (reached again by a shorter path: its callees are nearer than they were)
    if depth > DEPTH or seen.get(id(f), DEPTH + 1) <= depth:
        return
    seen[id(f)] = depth
    inner = _own_attributes(f).get("__wrapped__")   # (tg.capture's, functools.wraps')
    if inner is not None:
        _walk(inner, depth + 1, found, seen)
    if type(f) is not FunctionType or id(f) in IS_WRAPPER \
            or _library_file(f.__code__.co_filename):
        return      # (tapegrad's own functions convert on purpose, and plainly)
    _walk_code(f.__code__, f.__globals__, f.__closure__ or (), depth, found, seen)


def _walk_code(code: Any, globals_: dict, cells: tuple, depth: int, found: list[tuple],
               seen: dict) -> None:
    names = code_names(code)
    named = [(globals_, name) for name in names if name in globals_]
    named += [(cell, None) for cell in cells]
    while named:
        namespace, name = named.pop()
        v = get(namespace, name)
        kind = type(v)      # (not isinstance: a lazy proxy would build what it stands for)
        if id(v) in WRAPPERS or id(v) in IS_WRAPPER:    # (the latter: installed)
            found.append((namespace, name))
        elif kind is FunctionType or kind is MethodType \
                or "__wrapped__" in _own_attributes(v):
            _walk(v, depth + 1, found, seen)
        elif kind is ModuleType and name is not None and _users(v) \
                and seen.setdefault((id(v), id(code)), depth) == depth:
            # (a module of the user's: ``helpers.rms(s)`` reaches helpers' sqrt)
            attributes = _own_attributes(v)
            named += [(attributes, m) for m in names if m != name and m in attributes]


def _own_attributes(v: Any) -> dict:
    """``v``'s own ``__dict__`` (empty where it has none), read without its class's
    ``__getattr__``/``__getattribute__``."""
    try:
        found = object.__getattribute__(v, "__dict__")
    except Exception:       # noqa: BLE001 - (no __dict__, or one that raises)
        return {}
    return found if type(found) is dict else {}


def _users(module: ModuleType) -> bool:
    """Whether a module may be the user's: not the standard library's, nor an installed
    package's (``_library_file``)."""
    top = (module.__name__ or "").partition(".")[0]
    where = _own_attributes(module).get("__file__")
    return top not in sys.stdlib_module_names and top != "tapegrad" and not (
        isinstance(where, str) and _library_file(where))


@functools.cache
def _library_file(filename: str) -> bool:
    """Whether code in ``filename`` is the standard library's or an installed package's
    (tapegrad's own included), not a user's."""
    if filename.startswith("<frozen") or filename.startswith(_TAPEGRADS):
        return True
    parts = os.path.normpath(filename).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts \
        or filename.startswith(_STDLIB)


_TAPEGRADS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep
                 for k in ("stdlib", "platstdlib")})
