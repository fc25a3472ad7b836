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
from tapegrad.tape.activity import Duplicated, make_zero
from tapegrad.testing.tape import agrees, check_tape, disagreement

__all__ = ["check_grad", "check_tape", "arrays", "duplicated", "shadow_of"]

def check_grad(f: Callable[..., Any], *arrays: Any, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-7, max_elements: int = 64, seed: int = 0) -> bool:
    """True when the reverse-mode gradients of the scalar ``f(*arrays)`` agree with central
    finite differences in float64; otherwise an ``AssertionError`` naming the worst element.
    Arguments are arrays or floats (a float's gradient is a float).  A NaN on either side
    fails, and so does an infinity unless both are the same infinity.

    Float32 arrays are checked on float64 copies (kernels are precision-generic). At most
    ``max_elements`` elements per array are probed (a fixed random sample beyond that).

    >>> import numpy as np, tapegrad as tg
    >>> tg.testing.check_grad(lambda x: tg.dot(x, x) * 0.5, np.array([1.0, -2.0, 3.0]))
    True
    """
    xs = [float(a) if isinstance(a, (float, np.floating)) else
          np.array(a, dtype=np.float64) if np.asarray(a).dtype.kind == "f" else np.array(a)
          for a in arrays]
    grads = gradient(f, *[_copy(x) for x in xs])
    rng = np.random.default_rng(seed)
    worst = None
    for k, (x, g) in enumerate(zip(xs, grads)):
        indices = list(np.ndindex(np.shape(x)))
        if len(indices) > max_elements:
            picks = rng.choice(len(indices), size=max_elements, replace=False)
            indices = [indices[p] for p in sorted(picks)]
        for idx in indices:
            plus = [_copy(y) for y in xs]
            minus = [_copy(y) for y in xs]
            if isinstance(x, float):          # (a number's one "element")
                plus[k], minus[k] = x + eps, x - eps
            else:
                plus[k][idx] += eps
                minus[k][idx] -= eps
            fd = (float(f(*plus)) - float(f(*minus))) / (2 * eps)
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
                             f"({disagreement(rev, fd, atol, rtol, '|fd|')})")
    return True


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
