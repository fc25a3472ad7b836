"""The sources a host-level derivative is taken with respect to, watched while ``f`` runs: a
source changed in place by code the tape does not record (``x *= 2.0`` inside ``f``) would
give the gradient with respect to the changed contents, so it is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tapegrad.api.launches import floats
from tapegrad.errors import TapegradError
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


def call_on_sources(who: str, tape: Tape, stamped: list[tuple], call: Callable[[], Any]
                     ) -> Any:
    """``call()`` (``f`` on the stamped sources, while ``tape`` records), its refusal of a
    source changed before its first recorded read said as such, and a source changed after
    its last recorded read refused where a derivative reads it."""
    try:
        result = call()
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
    for label, x, ident, stamp in stamped:
        now = tape.stamps.get(ident)          # (what the last recorded operation left)
        if tape.readers.get(ident) and type(now) is type(stamp) and \
                not same_bits(now, tape.sample(x)):
            raise TapegradError(
                f"{who}: {label}, an array of shape {tuple(x.shape)}, was changed in place by "
                "code the tape does not record (NumPy arithmetic such as x *= 2.0) after a "
                "recorded operation read it, and that operation's derivative reads its "
                "contents, so it would read the changed ones. Change a copy (y = x.copy(); "
                "y *= 2.0), or make a new array with recorded operations (tg.scale, a "
                "kernel), not the argument")
    return result
