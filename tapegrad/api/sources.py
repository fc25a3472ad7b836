"""The sources a host-level derivative is taken with respect to, watched while ``f`` runs: a
source changed in place by code the tape does not record (``x *= 2.0`` inside ``f``) would
give the gradient with respect to the changed contents, so it is refused.  Also the one check
of a direction given with a source (``tg.jvp``'s and ``tg.hvp``'s ``v``, ``tg.vjp``'s ``w``
against ``f``'s output), before anything runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.api.launches import floats
from tapegrad.backends.registry import kind_of
from tapegrad.errors import LaunchError, TapegradError
from tapegrad.tape import hostmath
from tapegrad.tape.arrays import is_array
from tapegrad.tape.stamps import same_bits
from tapegrad.tape.tape import Tape


def stamp_sources(tape: Tape, sources: list[tuple[str, Any]]) -> list[tuple]:
    """Before ``f`` runs: each float array source (``(label, array)``) stamped on ``tape``
    with what it holds now (the tape's ``sample``; under ``verify`` a fingerprint, one per
    source per call), as a recorded operation that had just used it would be.  The first
    recorded operation that reads it then refuses contents that code the tape does not see
    changed in between (``x *= 2.0`` at the top of ``f``): the gradient would be with respect
    to the changed contents, not the ones given.  Returns ``(label, array, identity,
    stamp)`` per stamped source, for ``call_on_sources``."""
    stamped = []
    for label, x in sources:
        if is_array(x) and floats(x):
            stamp = tape.sample(x)
            if stamp is not None:         # (a device array: only under verify, as launches)
                ident = tape.track(x)
                stamped.append((label, x, ident, tape.stamps.setdefault(ident, stamp)))
    return stamped


def call_on_sources(who: str, tape: Tape | None, stamped: list[tuple],
                    call: Callable[[], Any], fn: Any = None) -> Any:
    """``call()`` (``f`` on the stamped sources, while ``tape`` records), its refusal of a
    source changed before its first recorded read said as such.  (One changed after its last
    recorded read is refused by the sweep where a derivative reads it: stamps.py.)  ``fn``:
    the function ``call`` runs, whose names bound to ``math`` functions (``from math import
    sqrt``) get the tapes' wrappers while it runs, as the modules' do (tape/hostmath.py)."""
    places = hostmath.install(hostmath.places(fn)) if fn is not None else None
    try:
        return call()
    except TapegradError as e:
        # the tape's refusal (tape/stamps.py host_change, a plain TapegradError) leaves the
        # stamp as it was: a source still holding its stamp with other contents is the cause
        if type(e) is TapegradError:
            for label, x, ident, stamp in stamped:
                if tape.stamps.get(ident) is stamp and not same_bits(stamp, tape.sample(x)):
                    raise TapegradError(
                        f"{who}: {label}, an array of shape {tuple(x.shape)}, was changed in "
                        "place by code the tape does not record (NumPy arithmetic such as x "
                        "*= 2.0, x /= np.linalg.norm(x), x[0] = 1) before a recorded "
                        "operation read it, so the gradient would be with respect to the "
                        f"changed contents, not the ones {who} was given. To differentiate "
                        "through the change, make it with recorded operations on a new array "
                        "(x = tg.scale(x, 2.0), x = tg.scale(x, 1.0 / tg.norm(x)), or a "
                        f"kernel); to leave it out, change the array before calling {who}"
                    ).with_traceback(e.__traceback__) from None
        raise
    finally:
        if places is not None:
            hostmath.restore(places)


def is_number(a: Any) -> bool:
    """A number a derivative can be taken in or along (not a bool, not an array)."""
    return not isinstance(a, bool) and isinstance(a, (float, int, np.floating, np.integer))


def check_direction(who: str, x: Any, v: Any, names: tuple[str, str] = ("x", "v"),
                    every_element: bool = False) -> None:
    """Refuse a direction ``v`` that does not fit ``x``, before anything runs (``who``: the
    call as the user wrote it, ``tg.jvp(f, x, v)``; ``names``: what the message calls ``x``
    and ``v``).  For an array ``x``: a float array, and ``v`` an array like it (shape,
    dtype, array type, which is its device); for a number ``x``: ``v`` a number.  With
    ``every_element`` (a cotangent: ``tape.vjp``'s convention) ``v`` may also be a number
    for every element of an array ``x``, and an array of one element for a number ``x``."""
    xn, vn = names
    if is_array(x):
        if every_element and is_number(v):
            pass
        elif not is_array(v) or v.shape != x.shape or v.dtype != x.dtype or \
                kind_of(v) is not kind_of(x):
            if is_array(v):
                got = f"an array of shape {tuple(v.shape)}, dtype {v.dtype}" + (
                    "" if kind_of(v) is kind_of(x) else f", on another device (a {_kind(v)})")
            else:
                got = "None" if v is None else f"a {type(v).__name__}"
            hint = (f"; for the same number along every element, np.full_like({xn}, "
                    f"{float(v)!r})" if is_number(v) and isinstance(x, np.ndarray) else "")
            raise LaunchError(
                f"{who}: got {got} for {vn}, but {vn} must be an array like {xn} (shape "
                f"{tuple(x.shape)}, dtype {x.dtype}, same device: a {_kind(x)}"
                + (", or a number for every element" if every_element else "") + f"){hint}")
        if np.dtype(x.dtype).kind != "f":
            raise TapegradError(f"{who}: {xn} must be a float array, got dtype {x.dtype}")
        return
    if not is_number(x):
        raise TapegradError(f"{who}: {xn} is an array or a number, got "
                            f"{'None' if x is None else type(x).__name__}")
    if is_number(v) or every_element and is_array(v) and getattr(v, "size", 0) == 1:
        return
    got = (f"an array of shape {tuple(v.shape)}" if is_array(v) else
           "None" if v is None else f"a {type(v).__name__}")
    raise TapegradError(f"{who}: got {got} for {vn}, but {vn} must be a number, as {xn} is")


def _kind(x: Any) -> str:
    """An array's type as a reader knows it: ``numpy ndarray``, ``pyopencl Array``."""
    return f"{type(x).__module__.split('.')[0]} {type(x).__name__}"
