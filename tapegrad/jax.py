"""JAX interop: a tapegrad host function as a ``jax.custom_vjp`` function, usable under
``jax.jit``, ``jax.grad`` and ``jax.vmap``.

It runs on the host through ``jax.pure_callback`` (on a GPU, JAX copies to the host and back:
host-side for now).  The forward callback runs ``f`` on a tape of its own and keeps it under a
number that travels through JAX as the residual; the backward callback takes that tape's
vector-Jacobian product and frees it.  The results' shapes come from running ``f`` once on
zeros of the arguments' shapes (cached per shapes and dtypes).  ``jax.vmap`` maps the
callbacks one example at a time.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.interop.call import RecordedCall

_calls: dict[int, RecordedCall] = {}          # forward passes waiting for their backward
_numbers = itertools.count(1)
_lock = threading.Lock()
KEPT = 4096      # forward passes kept at most (JAX may drop a backward it never needs)


def _jax() -> Any:
    try:
        import jax
    except ImportError:
        raise TapegradError("tapegrad.jax needs JAX: pip install 'tapegrad[jax]'") from None
    return jax


def function(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` (arrays in; an array, a number or a tuple of them out) as a function of JAX
    arrays that ``jax.grad``, ``jax.jit`` and ``jax.vmap`` take.

    >>> import jax, jax.numpy as jnp, numpy as np, tapegrad as tg, tapegrad.jax
    >>> jax.config.update("jax_enable_x64", True)
    >>> @tg.kernel
    ... def square(out, x):
    ...     i = tg.index()
    ...     out[i] = x[i] * x[i]
    >>> @tapegrad.jax.function
    ... def energy(x):
    ...     y = np.empty_like(x)
    ...     square(tg.CPU())(y, x, ndrange=x.size)
    ...     return tg.sum(y)
    >>> jax.grad(energy)(jnp.array([1.0, 2.0, 3.0])).tolist()
    [2.0, 4.0, 6.0]
    """
    jax = _jax()
    import jax.numpy as jnp

    @functools.cache
    def shapes(signature: tuple) -> tuple:
        """The results' shapes and dtypes for arguments of these (shape, dtype)s."""
        call = RecordedCall(f, _host([np.zeros(s, d) for s, d in signature]),
                            [False] * len(signature))
        return tuple(jax.ShapeDtypeStruct(np.shape(y), np.asarray(y).dtype)
                     for y in call.plain_outputs()), call.single

    def signature(args: tuple) -> tuple:
        return tuple((tuple(a.shape), np.dtype(a.dtype)) for a in args)

    def run_forward(*args: Any) -> tuple:
        call = RecordedCall(f, _host(args), [True] * len(args))
        call.meta = [(np.shape(a), np.asarray(a).dtype) for a in args]
        with _lock:
            number = next(_numbers)
            _calls[number] = call
            while len(_calls) > KEPT:
                _calls.pop(next(iter(_calls)))
        outs = tuple(np.asarray(y) for y in call.plain_outputs())
        return (*outs, np.int64(number))

    def run_backward(number: Any, *cotangents: Any) -> tuple:
        with _lock:
            call = _calls.pop(int(number), None)
        if call is None:
            raise TapegradError("tapegrad.jax: the forward pass of this backward pass was freed "
                                "(more than KEPT forward passes waited for theirs)")
        grads = call.vjp([np.asarray(c) for c in cotangents])
        return tuple(np.zeros(shape, dtype) if g is None else
                     np.asarray(g, dtype=dtype).reshape(shape)
                     for g, (shape, dtype) in zip(grads, call.meta))

    def plain(*args: Any) -> Any:
        outs, single = shapes(signature(args))
        results = jax.pure_callback(
            lambda *a: tuple(np.asarray(y) for y in RecordedCall(
                f, _host(a), [False] * len(a)).plain_outputs()),
            outs, *args, vmap_method="sequential")
        return results[0] if single else tuple(results)

    wrapped = jax.custom_vjp(plain)

    def fwd(*args: Any) -> tuple:
        outs, single = shapes(signature(args))
        *results, number = jax.pure_callback(
            run_forward, (*outs, jax.ShapeDtypeStruct((), np.int64)), *args,
            vmap_method="sequential")
        primal = results[0] if single else tuple(results)
        return primal, (number, args)

    def bwd(residual: tuple, cotangent: Any) -> tuple:
        number, args = residual
        cotangents = (cotangent,) if not isinstance(cotangent, tuple) else cotangent
        arg_shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
        return tuple(jax.pure_callback(run_backward, arg_shapes, number,
                                       *[jnp.asarray(c) for c in cotangents],
                                       vmap_method="sequential"))

    wrapped.defvjp(fwd, bwd)

    @functools.wraps(f)
    def apply(*args: Any) -> Any:
        return wrapped(*[jnp.asarray(a) for a in args])
    return apply


def _host(args: Any) -> list:
    """JAX's arguments as ``f`` takes them: NumPy views of JAX's buffers (no copy; read-only,
    as JAX's arrays are), 0-d ones as numbers."""
    return [np.asarray(a).item() if np.ndim(a) == 0 else np.asarray(a) for a in args]
