"""Testing helpers: ``check_grad`` (reverse mode against finite differences), ``check_tape``
(each launch of a program checked alone: ``testing/tape.py``) and Hypothesis
strategies for arrays and their shadows, so users write property-based gradient tests of their
own kernels (see docs/testing.md).  Hypothesis is needed only for the strategies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.api import gradient
from tapegrad.errors import TapegradError
from tapegrad.tape.activity import Duplicated, make_zero
from tapegrad.tape.arrays import is_array
from tapegrad.testing.tape import agrees, check_tape, disagreement
from tapegrad.tracebacks import api_boundary

__all__ = ["check_grad", "check_tape", "arrays", "duplicated", "shadow_of"]

@api_boundary
def check_grad(f: Callable[..., Any], *arrays: Any, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-7, max_elements: int = 64, seed: int = 0) -> bool:
    """True when the reverse-mode gradients of the scalar ``f(*arrays)`` agree with central
    finite differences in float64; otherwise an ``AssertionError`` naming the worst element.
    Arguments are float arrays or floats (a float's gradient is a float).  A NaN on either
    side fails, and so does an infinity unless both are the same infinity.

    Float32 arrays are checked on float64 copies (kernels are precision-generic); where ``f``
    computes in float32 all the same (a float32 intermediate), or is not smooth at the point,
    the finite differences are noise, and the failure says so.  At most ``max_elements``
    elements per array are probed (a fixed random sample beyond that).

    >>> import numpy as np, tapegrad as tg
    >>> tg.testing.check_grad(lambda x: tg.dot(x, x) * 0.5, np.array([1.0, -2.0, 3.0]))
    True
    """
    xs = [_float64(a, k) for k, a in enumerate(arrays)]
    grads = gradient(f, *[_copy(x) for x in xs])
    rng = np.random.default_rng(seed)
    worst = None
    for k, (x, g) in enumerate(zip(xs, grads)):
        indices = list(np.ndindex(np.shape(x)))
        if len(indices) > max_elements:
            picks = rng.choice(len(indices), size=max_elements, replace=False)
            indices = [indices[p] for p in sorted(picks)]
        for idx in indices:
            fd = _central(f, xs, k, idx, eps)
            rev = float(np.asarray(g)[idx])
            if agrees(rev, fd, atol, rtol, abs(fd)):
                continue
            # (a NaN or an infinity: the worst)
            excess = abs(rev - fd) - (atol + rtol * abs(fd)) if math.isfinite(rev) and \
                math.isfinite(fd) else math.inf
            if worst is None or excess > worst[0]:
                worst = (excess, k, idx, rev, fd)
    if worst is not None:
        _, k, idx, rev, fd = worst
        raise AssertionError(f"gradient of argument {k} at index {idx}: reverse mode gives "
                             f"{rev!r}, central finite differences {fd!r} "
                             f"({disagreement(rev, fd, atol, rtol, '|fd|')})"
                             + _noise(f, xs, k, idx, eps, fd, atol, rtol))
    return True


def _float64(a: Any, k: int) -> Any:
    """Argument ``k`` as check_grad probes it: a float, or a float64 copy of a float array."""
    if isinstance(a, (float, np.floating)):
        return float(a)
    if np.asarray(a).dtype.kind != "f":
        number = np.ndim(a) == 0 and not is_array(a)
        what = f"is {a!r}" if number else f"has dtype {np.asarray(a).dtype}"
        instead = f"{float(a)!r}" if number else "x.astype(np.float64)"
        raise TapegradError(
            f"tg.testing.check_grad differentiates with respect to float arrays and floats, "
            f"but argument {k} {what} (integers and booleans have no derivative); pass "
            f"{instead} instead")
    return np.array(a, dtype=np.float64)


def _moved(xs: list, k: int, idx: tuple, step: float) -> list:
    """Copies of ``xs``, element ``idx`` of argument ``k`` moved by ``step``."""
    moved = [_copy(y) for y in xs]
    if isinstance(moved[k], float):           # (a number's one "element")
        moved[k] += step
    else:
        moved[k][idx] += step
    return moved


def _central(f: Callable[..., Any], xs: list, k: int, idx: tuple, eps: float) -> float:
    return (float(f(*_moved(xs, k, idx, eps))) - float(f(*_moved(xs, k, idx, -eps)))) / (2 * eps)


def _noise(f: Callable[..., Any], xs: list, k: int, idx: tuple, eps: float, fd: float,
           atol: float, rtol: float) -> str:
    """Why the finite differences ``fd`` may be the wrong side: ``f``'s values are all
    float32 numbers (it computes in float32, whose rounding at ``x + eps`` is about as large
    as the change), or the differences change with the step ('' where neither)."""
    values = [float(f(*_moved(xs, k, idx, step))) for step in (0.0, eps, -eps)]
    if all(math.isfinite(v) and float(np.float32(v)) == v for v in values) and \
            not all(v == round(v) for v in values):
        return (f". f appears to compute in float32: f(x) and f(x ± eps) are all float32 "
                f"numbers, whose rounding is as large as the change a step of eps={eps:g} "
                "makes, so these finite differences are noise (check_grad probes float64 "
                "copies of the arguments; a float32 intermediate, such as np.empty(n, "
                "np.float32), rounds them). Make the intermediates in the arguments' dtype "
                "(np.empty_like(x)) to check in float64")
    fd2 = _central(f, xs, k, idx, 2 * eps)
    if agrees(fd2, fd, atol, rtol, abs(fd)):
        return ""
    return (f". With a step of 2 * eps central finite differences give {fd2!r}: they change "
            "with the step, so f is not smooth at this point, or computes in lower precision "
            "than float64; check it with float64 intermediates, at another point, or with "
            "another eps")


def _copy(x: Any) -> Any:
    return x if isinstance(x, float) else x.copy()


# -- Hypothesis strategies ---------------------------------------------------------------------

def arrays(shape: Any = None, dtype: Any = np.float64, min_value: float = -1.0,
           max_value: float = 1.0, max_side: int = 16) -> Any:
    """A Hypothesis strategy of finite float arrays (1-D of length 1..``max_side`` by
    default; ``shape`` may be a tuple or a strategy of tuples)."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
    if shape is None:
        shape = st.integers(1, max_side).map(lambda n: (n,))
    elements = st.floats(min_value, max_value, allow_nan=False, allow_infinity=False,
                         width=np.dtype(dtype).itemsize * 8)
    return hnp.arrays(dtype=dtype, shape=shape, elements=elements)


def duplicated(array_strategy: Any = None) -> Any:
    """A strategy of ``tg.Duplicated(x, dx)`` with ``dx`` a zero shadow matching ``x``."""
    strategy = arrays() if array_strategy is None else array_strategy
    return strategy.map(lambda x: Duplicated(x, make_zero(x)))


def shadow_of(x: Any) -> Any:
    """A strategy of random seeds ``w`` shaped like ``x`` (for vector-Jacobian products)."""
    return arrays(shape=np.shape(x), dtype=np.asarray(x).dtype)
