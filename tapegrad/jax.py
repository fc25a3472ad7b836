"""JAX interop: a tapegrad host function as a ``jax.custom_vjp`` function, usable under
``jax.jit``, ``jax.grad`` and ``jax.vmap``.

On JAX's CPU backend it runs through ``jax.experimental.buffer_callback``: ``f`` reads JAX's
buffers in place and the results are written straight into JAX's (where JAX's default backend
is a GPU, through ``jax.pure_callback``, which copies every argument into a new JAX array
first, and to the host and back: host-side for now; the costs of both are in
docs/performance.md, "Calls wrapped for PyTorch and JAX"). The forward callback runs ``f`` on
a tape of its own (on copies of the arrays: JAX reuses its buffers once the callback returns)
and keeps it under a number that travels through JAX as the residual, with the arguments; the
backward callback takes that tape's vector-Jacobian product. A backward may run several times
(``jax.jacrev``, a ``vjp_fn`` called again): the last few tapes answered are kept, and a tape
no longer kept is recorded again from the arguments (the same forward pass). The results'
shapes come from running ``f`` once on zeros of the arguments' shapes (cached per shapes and
dtypes). ``jax.vmap`` maps the callbacks one example at a time.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.errors import InplaceModificationError, TapegradError, optional_module
from tapegrad.interop.call import RecordedCall
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tracebacks import api_boundary

__all__ = ["function"]

_calls: dict[int, RecordedCall] = {}          # forward passes waiting for their backward
_answered: dict[int, RecordedCall] = {}       # forward passes whose backward ran, newest last
_numbers = itertools.count(1)
_lock = threading.Lock()
KEPT = 4096      # forward passes kept at most (JAX may drop a backward it never needs)
# Forward passes kept after their backward ran: a backward may run again (jax.jacrev runs
# one per row of the Jacobian in a row, a vjp_fn may be called twice) and finds its tape
# here; one that is gone is recomputed from the arguments, which travel in the residual.
ANSWERED_KEPT = 2


def _jax() -> Any:
    return optional_module("jax", "tapegrad.jax needs JAX: pip install 'tapegrad[jax]'")


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
    name = f"tapegrad.jax.function {getattr(f, '__name__', 'f')}"

    @functools.cache
    def shapes(signature: tuple) -> tuple:
        """The results' shapes and dtypes for arguments of these (shape, dtype)s."""
        arguments, _ = signature
        call = RecordedCall(f, _host([np.zeros(s, d) for s, d in arguments]),
                            [False] * len(arguments))
        # (in JAX's dtypes: float32 and int32 while jax_enable_x64 is off, as JAX's own)
        return tuple(jax.ShapeDtypeStruct(np.shape(y), _canonical(jax, np.asarray(y).dtype))
                     for y in call.plain_outputs()), call.single

    def signature(args: tuple) -> tuple:
        # (with the x64 setting: it decides the results' dtypes)
        return (tuple((tuple(a.shape), np.dtype(a.dtype)) for a in args),
                bool(jax.config.jax_enable_x64))

    def record(args: tuple) -> RecordedCall:
        call = RecordedCall(f, _host(args, copy=True), [True] * len(args))
        call.meta = [(np.shape(a), np.asarray(a).dtype) for a in args]
        return call

    def run_forward(*args: Any) -> tuple:
        call = record(args)
        with _lock:
            number = next(_numbers)
            _calls[number] = call
            while len(_calls) > KEPT:
                _calls.pop(next(iter(_calls)))
        outputs = call.plain_outputs()
        return (*outputs, np.array([number, _digest(outputs), call.outside_digest()],
                                   dtype=np.int64))

    def run_backward(n_args: int, ticket: Any, *rest: Any) -> tuple:
        args, cotangents = rest[:n_args], rest[n_args:]
        number, digest, outside_digest = (int(v) for v in np.asarray(ticket))
        with _lock:
            call = _calls.pop(number, None) or _answered.pop(number, None)
        if call is not None:
            if call.outside:
                call.check_outside(name, "take the gradient (each vector-Jacobian product)")
        else:                   # (its tape was dropped: the same forward pass again)
            call = record(args)
            if call.outside_digest() != outside_digest:
                raise InplaceModificationError(
                    f"{name}: its backward pass ran again after its tape was dropped, and "
                    f"what the function reads without taking it as an argument "
                    f"({call.outside_names() or 'an array'}) changed since the forward pass, "
                    "so the gradient would be wrong. Pass it to the function as an argument, "
                    "or take each vector-Jacobian product before changing it")
            if _digest(call.plain_outputs()) != digest:
                raise TapegradError(
                    f"{name}: its backward pass ran again after its tape was dropped, and "
                    "recording the forward pass again from the same arguments gave different "
                    "results: the function depends on something besides its arguments (a "
                    "global array changed since, a random number), so the gradient would be "
                    "wrong. Pass what it "
                    "reads as an argument, or take each vector-Jacobian product soon after "
                    "its forward pass")
        with _lock:
            _answered[number] = call
            while len(_answered) > ANSWERED_KEPT:
                _answered.pop(next(iter(_answered)))
        grads = call.vjp([np.asarray(c) for c in cotangents])
        return tuple(np.zeros(shape, dtype) if g is None else
                     np.asarray(g, dtype=dtype).reshape(shape)
                     for g, (shape, dtype) in zip(grads, call.meta))

    def plain(*args: Any) -> Any:
        outs, single = shapes(signature(args))
        results = _host_call(
            jax, lambda *a: tuple(RecordedCall(f, _host(a), [False] * len(a)).plain_outputs()),
            outs, args)
        return results[0] if single else tuple(results)

    wrapped = jax.custom_vjp(plain)

    def fwd(*args: Any) -> tuple:
        outs, single = shapes(signature(args))
        # (the ticket: the tape's number, a digest of the results and one of the arrays read
        # from outside (outside_reads), which a forward pass recorded again for a repeated
        # backward must reproduce)
        *results, ticket = _host_call(
            jax, run_forward, (*outs, jax.ShapeDtypeStruct((3,), np.int64)), args)
        primal = results[0] if single else tuple(results)
        return primal, (ticket, args)

    def bwd(residual: tuple, cotangent: Any) -> tuple:
        ticket, args = residual
        # (under jax.grad(jax.jit(f)) a float argument comes back from the residual as a
        # literal, not an array)
        args = tuple(jnp.asarray(a) for a in args)
        cotangents = (cotangent,) if not isinstance(cotangent, tuple) else cotangent
        arg_shapes = tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in args)
        return tuple(_host_call(jax, functools.partial(run_backward, len(args)), arg_shapes,
                                (ticket, *args, *[jnp.asarray(c) for c in cotangents])))

    wrapped.defvjp(fwd, bwd)

    @functools.wraps(f)
    @api_boundary
    def apply(*args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise TapegradError(
                f"{name} takes its arguments by position, as jax.custom_vjp does: "
                f"call it as f({', '.join(kwargs)}) rather than with "
                f"{', '.join(f'{k}=...' for k in kwargs)}")
        try:
            return wrapped(*[jnp.asarray(a) for a in args])
        except (TypeError, ValueError) as exc:
            if "forward-mode" not in str(exc) and "support JVP" not in str(exc):
                raise
            raise TapegradError(
                f"{name} has reverse mode only (jax.grad, jax.vjp, jax.jacrev): forward mode "
                "and derivatives of derivatives (jax.jvp, jax.jacfwd, jax.hessian, jax.grad "
                "of jax.grad) do not reach through it. Take those with tapegrad itself: "
                "tg.jvp, tg.hvp (docs/interop.md)") from None
    return apply


def _digest(outputs: list) -> int:
    """A 63-bit hash of a forward pass's results, bit for bit."""
    return hash(tuple(fingerprint(np.asarray(y, dtype=np.float64) if np.ndim(y) == 0
                                  else np.asarray(y)) for y in outputs)) & (2**63 - 1)


def _host_call(jax: Any, fn: Callable[..., tuple], results: tuple, args: tuple) -> list:
    """``fn`` (NumPy arrays in, a tuple of arrays or numbers out) as a JAX operation returning
    arrays of the ``results`` shapes; under ``jax.vmap``, one call per example."""
    def in_place(ctx: Any, outs: tuple, *buffers: Any) -> None:
        for out, y in zip(outs, checked(*[np.asarray(b) for b in buffers])):
            np.copyto(np.asarray(out), y, casting="same_kind")

    def checked(*arrays: Any) -> tuple:
        """``fn``'s results, each of the shape and kind JAX was told when it traced."""
        ys = fn(*arrays)
        for k, (y, want) in enumerate(zip(ys, results)):
            dtype = _canonical(jax, np.asarray(y).dtype)
            if np.shape(y) != tuple(want.shape) or dtype.kind != np.dtype(want.dtype).kind:
                raise TapegradError(
                    f"result {k} of the wrapped function has shape {np.shape(y)} and dtype "
                    f"{dtype} now, where it had shape {tuple(want.shape)} and dtype "
                    f"{want.dtype} for arguments of these shapes before: JAX fixes each "
                    "result's shape and dtype when it traces, so they may depend on the "
                    "arguments' shapes and dtypes only (not on a global, or on values)")
        return ys

    if jax.default_backend() != "cpu" or _buffer_callback() is None:
        return jax.pure_callback(
            lambda *a: tuple(np.asarray(y, dtype=want.dtype)
                             for y, want in zip(checked(*a), results)),
            results, *args, vmap_method="sequential")
    return _buffer_callback()(in_place, results, vmap_method="sequential")(*args)


def _canonical(jax: Any, dtype: np.dtype) -> np.dtype:
    """``dtype`` as JAX holds it (float64 as float32 while ``jax_enable_x64`` is off)."""
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


@functools.cache
def _buffer_callback() -> Any:
    """``jax.experimental.buffer_callback`` where this JAX has it (0.7 on)."""
    try:
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        return None
    return buffer_callback


def _read_only(array: np.ndarray) -> np.ndarray:
    """A view that ``f`` cannot write (JAX's arrays are immutable: a kernel writing an input
    is tapegrad's LaunchError, under ``jax.grad`` or not)."""
    view = array.view()
    view.flags.writeable = False
    return view


def _host(args: Any, copy: bool = False) -> list:
    """JAX's arguments as ``f`` takes them: read-only NumPy arrays (views of JAX's buffers,
    or copies that outlive the call), 0-d ones as numbers."""
    return [np.asarray(a).item() if np.ndim(a) == 0
            else _read_only(np.asarray(a).copy() if copy else np.asarray(a)) for a in args]
