"""PyTorch interop: a tapegrad host function (kernels, host reductions, a whole simulation) as
one differentiable operation on torch tensors.

``tapegrad.torch.function(f)`` is a ``torch.autograd.Function`` (``setup_context`` style): its
forward pass converts the tensors without copies (CPU tensors to NumPy arrays, CUDA tensors to
CuPy arrays through DLPack; a non-contiguous tensor is made contiguous, one copy), runs ``f``
on a tape of its own and hands the results back as tensors; its backward pass is that tape's
vector-Jacobian product.  Inputs that do not require grad are constants; a 0-d tensor is a
number to ``f`` (a tape scalar when it requires grad).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.interop.call import RecordedCall

_handover = threading.local()      # forward -> setup_context: the call just recorded (weakly)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise TapegradError("tapegrad.torch needs PyTorch: pip install 'tapegrad[torch]'") from None
    return torch


def function(f: Callable[..., Any]) -> Callable[..., Any]:
    """``f`` (arrays and numbers in; an array, a number or a tuple of them out) as a function
    of torch tensors that ``torch.autograd`` differentiates.

    >>> import numpy as np, torch, tapegrad as tg, tapegrad.torch
    >>> @tg.kernel
    ... def square(out, x):
    ...     i = tg.index()
    ...     out[i] = x[i] * x[i]
    >>> @tapegrad.torch.function
    ... def energy(x):
    ...     y = np.empty_like(x)
    ...     square(tg.CPU())(y, x, ndrange=x.size)
    ...     return tg.sum(y)
    >>> x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    >>> energy(x).backward()
    >>> x.grad.tolist()
    [2.0, 4.0, 6.0]
    """
    torch = _torch()
    name = getattr(f, "__name__", "f")

    class Wrapped(torch.autograd.Function):
        @staticmethod
        def forward(*inputs: Any) -> Any:
            args = [_to_tapegrad(torch, x) for x in inputs]
            # (every float tensor: under torch.func.grad the inputs forward sees do not say
            # whether they require grad; backward picks by ctx.needs_input_grad)
            active = [isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs]
            call = RecordedCall(f, args, active)
            outputs = tuple(_to_torch(torch, y, inputs) for y in call.plain_outputs())
            # (functorch's transforms call setup_context more than once per forward: the
            # call is found by a weak reference, kept alive by the outputs until then)
            for t in outputs:
                t._tapegrad_call = call
            _handover.call = weakref.ref(call)
            return outputs[0] if call.single else outputs

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            ctx.call = _handover.call()
            ctx.inputs = [(x.dtype, x.device, tuple(x.shape)) if isinstance(x, torch.Tensor)
                          else None for x in inputs]
            ints = [y for y in (output if isinstance(output, tuple) else (output,))
                    if not y.is_floating_point()]
            if ints:
                ctx.mark_non_differentiable(*ints)

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple:
            # (through a Function of its own: torch.func.grad hands backward wrapped tensors,
            # which a Function's forward sees unwrapped)
            results = iter(_vjp_function(torch).apply(ctx.call, ctx.inputs,
                                                      ctx.needs_input_grad, *grads))
            return tuple(None if meta is None else next(results) for meta in ctx.inputs)

        @staticmethod
        def vmap(info: Any, in_dims: tuple, *inputs: Any) -> tuple:
            """``torch.func.vmap``: one call per example (tapegrad's kernels take the batch
            as a loop here, not as a dimension)."""
            results = []
            for b in range(info.batch_size):
                results.append(Wrapped.apply(*[x if d is None else x.select(d, b)
                                               for x, d in zip(inputs, in_dims)]))
            if not isinstance(results[0], tuple):
                return torch.stack(results), 0
            return (tuple(torch.stack(parts) for parts in zip(*results)),
                    (0,) * len(results[0]))

    Wrapped.__name__ = Wrapped.__qualname__ = f"tapegrad_{name}"

    @functools.wraps(f)
    def apply(*inputs: Any) -> Any:
        return Wrapped.apply(*inputs)
    apply.autograd_function = Wrapped
    return apply


@functools.cache
def _vjp_function(torch: Any) -> Any:
    """The backward pass as a ``torch.autograd.Function`` (its forward runs the recorded
    call's vector-Jacobian product on plain tensors); differentiating it again is refused."""

    class TapeVJP(torch.autograd.Function):
        @staticmethod
        def forward(call: RecordedCall, inputs: list, wanted: tuple, *grads: Any) -> tuple:
            cotangents = [None if g is None else _to_tapegrad(torch, g) for g in grads]
            out = []
            for g, meta in zip(call.vjp(cotangents, wanted), inputs):
                if meta is None:
                    continue
                dtype, device, shape = meta
                if g is None:
                    t = torch.zeros(shape, dtype=dtype)
                elif not shape:
                    t = torch.as_tensor(g, dtype=dtype)
                else:
                    t = _to_torch(torch, g, ())
                out.append(t.to(device=device, dtype=dtype))
            return tuple(out)

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            pass

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple:
            raise TapegradError("second derivatives through a tapegrad.torch.function are not "
                                "available: its backward pass is a tape's vector-Jacobian "
                                "product, which tapegrad does not differentiate again")

    return TapeVJP


def _to_tapegrad(torch: Any, x: Any) -> Any:
    """A tensor as tapegrad's array (no copy where it is contiguous), a 0-d one as a number."""
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.ndim == 0:
        return x.item()
    if not x.is_contiguous():
        x = x.contiguous()                # (kernels take C-contiguous arrays: one copy)
    if x.device.type == "cpu":
        return x.numpy()
    if x.device.type == "cuda":
        import cupy
        return cupy.from_dlpack(x)
    raise TapegradError(f"tapegrad.torch takes CPU and CUDA tensors, got one on {x.device}")


def _to_torch(torch: Any, y: Any, inputs: tuple) -> Any:
    """A result as a tensor (no copy for arrays), on the inputs' device for numbers."""
    if isinstance(y, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(y))
    if hasattr(y, "__cuda_array_interface__") or hasattr(y, "__dlpack__"):
        return torch.from_dlpack(y)
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), "cpu")
    return torch.tensor(float(y), dtype=torch.float64, device=device)
