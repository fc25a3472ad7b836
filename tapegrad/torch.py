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

import contextlib
import functools
import inspect
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.backends.registry import offers_cuda_interface
from tapegrad.errors import InplaceModificationError, TapegradError, optional_module
from tapegrad.interop.call import RecordedCall, overlaps
from tapegrad.tape.arrays import is_array
from tapegrad.tape.fingerprint import fingerprint
from tapegrad.tape.identity import overlapping, sharing_pairs
from tapegrad.tape.stamps import same_bits
from tapegrad.tracebacks import api_boundary

__all__ = ["function"]

_handover = threading.local()      # forward -> setup_context: the call just recorded (weakly)


def _torch() -> Any:
    return optional_module("torch", "tapegrad.torch needs PyTorch: pip install 'tapegrad[torch]'")


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
    plain, transformable = _plain_function(torch, f), _transformable_function(torch, f)
    plain.__name__ = plain.__qualname__ = f"tapegrad_{name}"
    transformable.__name__ = transformable.__qualname__ = f"tapegrad_{name}_transformable"
    transforms_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)

    @functools.wraps(f)
    @api_boundary
    def apply(*inputs: Any) -> Any:
        # (the setup_context style that torch.func needs costs more per call in torch
        # itself, a signature bound on every apply: plain autograd takes the classic
        # Function; docs/performance.md, "Calls wrapped for PyTorch and JAX")
        return (transformable if transforms_active() else plain).apply(*inputs)
    apply.autograd_function = transformable
    # (torch.compile: Dynamo cannot trace tapegrad's host code and Numba; the call is a graph
    # break and runs eagerly, with autograd, between the compiled parts)
    return torch.compiler.disable(apply, recursive=True)


def _record(torch: Any, f: Callable[..., Any], inputs: tuple, active: list[bool],
            names: list[str]) -> tuple:
    """``f`` run on the inputs as tapegrad's arrays: the recorded call and its outputs as
    tensors (no copies for arrays).  The call's ``guards`` are the versions its backward
    pass checks (``_check_versions``)."""
    # (a tensor that requires grad is read-only to ``f``: PyTorch's graph cannot follow an
    # in-place change that tapegrad's kernels make, so the write is refused before it happens)
    arrays = [_to_tapegrad(torch, x, read_only=isinstance(x, torch.Tensor) and x.requires_grad)
              for x in inputs]
    _one_memory_per_active_argument(f, arrays, active, names)
    with _torch_stream(torch, inputs):
        call = RecordedCall(f, arrays, active)
    outputs = tuple(_to_torch(torch, _apart_from(y, arrays), inputs)
                    for y in call.plain_outputs())
    call.name = f"tapegrad.torch.function {getattr(f, '__name__', 'f')}"
    call.guards = _version_guards(torch, call, inputs, arrays, outputs, names)
    if any(active):
        call.array_guards = _array_guards(call, inputs, arrays, names)
    return call, outputs


def _apart_from(y: Any, arrays: list) -> Any:
    """A result, copied where it shares memory with an argument (``lambda x, m: (f(x), m)``):
    a tensor made on an argument's memory would change with it, unseen by autograd's version
    counters (and PyTorch warns of a read-only one)."""
    if is_array(y) and any(is_array(a) and overlapping(y, a) for a in arrays):
        return y.copy()
    return y


def _one_memory_per_active_argument(f: Callable[..., Any], arrays: list, active: list,
                                    names: list[str]) -> None:
    """Refuse two arguments that share memory where one wants a gradient (``f(x, x)``,
    ``f(x, x.detach())``): PyTorch asks for each argument's own derivative, and a tape, which
    follows memory, has one derivative for the memory (each argument got the total)."""
    for j, k in sharing_pairs([(k, a) for k, a in enumerate(arrays) if is_array(a) and a.size]):
        if active[j] or active[k]:
            first, second = (names[m] if m < len(names) else str(m) for m in (j, k))
            raise TapegradError(
                f"tapegrad.torch.function {getattr(f, '__name__', 'f')}: arguments {first} "
                f"and {second} share memory (one tensor, or views of one), and a gradient is "
                "wanted: tapegrad's tape has one derivative per memory, not one per argument; "
                "pass a copy for one of them (x.clone())")


def _parameter_names(f: Callable[..., Any]) -> list[str]:
    """``f``'s positional parameters by name (for messages), [] where it has no signature."""
    try:
        return [p.name for p in inspect.signature(f).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def _shares(torch: Any, t: Any, a: Any) -> bool:
    """Whether tensor ``t`` and tapegrad's array ``a`` made from it are one memory."""
    return isinstance(t, torch.Tensor) and t.ndim > 0 and t.is_contiguous() \
        and hasattr(a, "shape") and t.numel() > 0


def _version_guards(torch: Any, call: RecordedCall, inputs: tuple, arrays: list,
                    outputs: tuple, names: list[str]) -> list:
    """(what, tensor weakly, version) for each input and output tensor whose memory the
    backward pass reads as it is then: an in-place change to one of them before backward
    would change the gradient, which ``_check_versions`` refuses as PyTorch's ops do.  An
    input that ``f`` wrote has its version increased (a PyTorch operation that saved it
    refuses then) or, when it requires grad, is refused at once."""
    guards: list = []
    shared = [(k, x, a) for k, (x, a) in enumerate(zip(inputs, arrays)) if _shares(torch, x, a)]
    shared_out = [(k, y, a) for k, (y, a) in enumerate(zip(outputs, call.plain_outputs()))
                  if _shares(torch, y, a)]
    if not shared and not shared_out:
        return guards
    read, written = call.backward_reads(), call.written()
    for k, x, a in shared:
        what = f"its argument {names[k] if k < len(names) else k}"
        if written and overlaps(a, written):
            if x.requires_grad:      # (CUDA tensors: CPU ones are read-only to f)
                raise TapegradError(
                    f"{what}, a tensor that requires grad, was written in place by tapegrad's "
                    "kernels, which PyTorch's graph cannot follow (its gradient would be "
                    "wrong); write the result into a new array and return it, or pass a "
                    "clone (x.clone())")
            torch.autograd.graph.increment_version(x)
        if overlaps(a, read):
            guards.append((what, weakref.ref(x), x._version))
    for k, y, a in shared_out:
        if overlaps(a, read):
            guards.append((f"its output {k}", weakref.ref(y), y._version))
    return guards


def _array_guards(call: RecordedCall, inputs: tuple, arrays: list, names: list[str]) -> list:
    """(what, array, fingerprint) for each NumPy array argument (no version counter) whose
    memory the backward pass reads as it is then."""
    read = None
    guards = []
    for k, (x, a) in enumerate(zip(inputs, arrays)):
        if type(x) is np.ndarray and x is a and x.size:
            read = call.backward_reads() if read is None else read
            if overlaps(a, read):
                guards.append((f"its argument {names[k] if k < len(names) else k}", a,
                               fingerprint(a)))
    return guards


def _check_versions(call: RecordedCall) -> None:
    """Before the backward pass: the tensors it reads are as the forward pass left them, and
    so are the arrays from outside (globals, closures) that it reads."""
    for what, ref, version in getattr(call, "guards", ()):
        t = ref()
        if t is not None and t._version != version:
            raise InplaceModificationError(
                f"{call.name}: {what} (a tensor of shape {tuple(t.shape)}) was modified by an "
                f"inplace operation after the forward pass: it is at version {t._version}, "
                f"the backward pass expected version {version} and reads its contents, so the "
                "gradient would be wrong. Call backward() before changing it, or change a "
                "copy (y = t.clone(); y.mul_(3)) and leave the tensor the function saw as "
                "it was")
    for what, x, before in getattr(call, "array_guards", ()):
        if not same_bits(fingerprint(x), before):
            raise InplaceModificationError(
                f"{call.name}: {what} (a NumPy array of shape {tuple(x.shape)}) was changed in "
                "place after the forward pass, and the backward pass reads its contents, so "
                "the gradient would be wrong. Call backward() before changing it, or pass a "
                "copy (w.copy())")
    if getattr(call, "outside", None):
        call.check_outside(call.name, "call backward()")


def _torch_stream(torch: Any, tensors: tuple) -> Any:
    """For CUDA tensors: PyTorch's current stream made CuPy's (so tapegrad's launches are
    ordered after the torch work that made the inputs, and before the work that reads the
    results); for CPU tensors nothing."""
    device = next((t.device for t in tensors
                   if isinstance(t, torch.Tensor) and t.device.type == "cuda"), None)
    if device is None:
        return contextlib.nullcontext()
    import cupy
    handle = torch.cuda.current_stream(device).cuda_stream
    if hasattr(cupy.cuda.Stream, "from_external"):       # CuPy 14 deprecates ExternalStream
        return cupy.cuda.Stream.from_external(_StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle, device.index)


class _StreamHandle:
    """A raw ``cudaStream_t`` under the CUDA stream protocol (what CuPy's
    ``Stream.from_external`` takes)."""

    def __init__(self, handle: int):
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def _input_metas(torch: Any, inputs: tuple) -> list:
    """Per input, what its gradient must look like (None for a non-tensor)."""
    return [(x.dtype, x.device, tuple(x.shape)) if isinstance(x, torch.Tensor) else None
            for x in inputs]


def _gradients(torch: Any, call: RecordedCall, metas: list, wanted: Any, grads: tuple) -> list:
    """The recorded call's vector-Jacobian product as one tensor per tensor input (zeros where
    nothing connects it, None where it is not wanted)."""
    _check_versions(call)
    cotangents = [None if g is None else _to_tapegrad(torch, g) for g in grads]
    with _torch_stream(torch, grads):
        vjp = call.vjp(cotangents, wanted)
    out = []
    for g, meta, want in zip(vjp, metas, wanted):
        if meta is None:
            continue
        dtype, device, shape = meta
        if not want:
            out.append(None)
            continue
        if g is None:
            t = torch.zeros(shape, dtype=dtype)
        elif not shape:
            t = torch.as_tensor(g, dtype=dtype)
        else:
            t = _to_torch(torch, g, ())
        out.append(t if t.dtype == dtype and t.device == device
                   else t.to(device=device, dtype=dtype))
    return out


def _non_differentiable(ctx: Any, outputs: tuple) -> None:
    ints = [y for y in outputs if not y.is_floating_point()]
    if ints:
        ctx.mark_non_differentiable(*ints)


def _plain_function(torch: Any, f: Callable[..., Any]) -> Any:
    """``f`` as a classic ``torch.autograd.Function`` (forward takes ``ctx``): what plain
    ``backward()`` calls take; only the inputs that require grad are recorded as active."""
    names = _parameter_names(f)

    class Plain(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, *inputs: Any) -> Any:
            active = [need and x.is_floating_point()
                      for x, need in zip(inputs, ctx.needs_input_grad)]
            ctx.call, outputs = _record(torch, f, inputs, active, names)
            ctx.metas = _input_metas(torch, inputs)
            _non_differentiable(ctx, outputs)
            return outputs[0] if ctx.call.single else outputs

        @staticmethod
        @api_boundary
        def backward(ctx: Any, *grads: Any) -> tuple:
            if torch.is_grad_enabled() and any(ctx.needs_input_grad):
                # (create_graph=True: the gradient would have no graph of its own, and a loss
                # made of it would lose its second-order terms, silently)
                raise TapegradError(
                    f"{ctx.call.name}: a gradient with create_graph=True (a gradient "
                    "penalty, a Hessian) needs the second derivative of a tapegrad function, "
                    "which PyTorch cannot take through it; use tg.hvp for Hessian-vector "
                    "products, or take the gradient without create_graph")
            return gradients(ctx, *grads)

    def gradients(ctx: Any, *grads: Any) -> tuple:
        results = iter(_gradients(torch, ctx.call, ctx.metas, ctx.needs_input_grad, grads))
        return tuple(None if meta is None else next(results) for meta in ctx.metas)
    return Plain


def _transformable_function(torch: Any, f: Callable[..., Any]) -> Any:
    """``f`` as a ``torch.autograd.Function`` in the ``setup_context`` style, which
    ``torch.func``'s transforms (grad, vmap) take."""
    names = _parameter_names(f)

    class Transformable(torch.autograd.Function):
        @staticmethod
        def forward(*inputs: Any) -> Any:
            # (every float tensor: under torch.func.grad the inputs forward sees do not say
            # whether they require grad; backward picks by ctx.needs_input_grad)
            active = [isinstance(x, torch.Tensor) and x.is_floating_point() for x in inputs]
            call, outputs = _record(torch, f, inputs, active, names)
            # (functorch's transforms call setup_context more than once per forward: the
            # call is found by a weak reference, kept alive by the outputs until then)
            for t in outputs:
                t._tapegrad_call = call
            _handover.call = weakref.ref(call)
            return outputs[0] if call.single else outputs

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            ctx.call = _handover.call()
            ctx.metas = _input_metas(torch, inputs)
            _non_differentiable(ctx, output if isinstance(output, tuple) else (output,))

        @staticmethod
        @api_boundary
        def backward(ctx: Any, *grads: Any) -> tuple:
            # (through a Function of its own: torch.func.grad hands backward wrapped tensors,
            # which a Function's forward sees unwrapped)
            results = iter(_vjp_function(torch).apply(ctx.call, ctx.metas,
                                                      ctx.needs_input_grad, *grads))
            return tuple(None if meta is None else next(results) for meta in ctx.metas)

        @staticmethod
        def vmap(info: Any, in_dims: tuple, *inputs: Any) -> tuple:
            """``torch.func.vmap``: one call per example (tapegrad's kernels take the batch
            as a loop here, not as a dimension)."""
            results = [Transformable.apply(*[x if d is None else x.select(d, b)
                                             for x, d in zip(inputs, in_dims)])
                       for b in range(info.batch_size)]
            outputs = [r if isinstance(r, tuple) else (r,) for r in results]
            # (under vmap(grad(...)) the level above records one node for the whole batch:
            # its backward takes each example's vector-Jacobian product with its own call)
            examples = _Examples(example[0]._tapegrad_call for example in outputs)
            stacked = tuple(torch.stack(parts) for parts in zip(*outputs))
            for t in stacked:
                t._tapegrad_call = examples
            _handover.call = weakref.ref(examples)
            if not isinstance(results[0], tuple):
                return stacked[0], 0
            return stacked, (0,) * len(stacked)

    return Transformable


class _Examples(list):
    """The recorded calls of a batch that ``torch.func.vmap`` ran one example at a time."""


@functools.cache
def _vjp_function(torch: Any) -> Any:
    """The backward pass as a ``torch.autograd.Function`` (its forward runs the recorded
    call's vector-Jacobian product on plain tensors); differentiating it again is refused."""

    class TapeVJP(torch.autograd.Function):
        @staticmethod
        def forward(call: RecordedCall, metas: list, wanted: tuple, *grads: Any) -> tuple:
            # (a Function's forward returns tensors: zeros where no gradient is wanted)
            return tuple(torch.zeros(shape, dtype=dtype, device=device) if g is None else g
                         for g, (dtype, device, shape) in zip(
                             _gradients(torch, call, metas, wanted, grads),
                             [m for m in metas if m is not None]))

        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
            pass

        @staticmethod
        def vmap(info: Any, in_dims: tuple, call: RecordedCall, metas: list, wanted: tuple,
                 *grads: Any) -> tuple:
            """Several cotangents (``vmap(grad(...))``, ``jacrev``): one vector-Jacobian
            product each, with each example's own call where the forward pass was batched
            too (a tape can be asked again)."""
            calls = call if isinstance(call, _Examples) else [call] * info.batch_size
            results = [TapeVJP.apply(calls[b], metas, wanted,
                                     *[g if d is None else g.select(d, b)
                                       for g, d in zip(grads, in_dims[3:])])
                       for b in range(info.batch_size)]
            return tuple(torch.stack(parts) for parts in zip(*results)), (0,) * len(results[0])

        @staticmethod
        def backward(ctx: Any, *grads: Any) -> tuple:
            raise TapegradError("second derivatives through a tapegrad.torch.function are not "
                                "available: its backward pass is a tape's vector-Jacobian "
                                "product, which tapegrad does not differentiate again")

    return TapeVJP


def _to_tapegrad(torch: Any, x: Any, read_only: bool = False) -> Any:
    """A tensor as tapegrad's array (no copy where it is contiguous), a 0-d one as a number;
    ``read_only``: a CPU tensor's array is a view that kernels cannot write."""
    if not isinstance(x, torch.Tensor):
        return x
    x = x.detach()
    if x.ndim == 0:
        return x.item()
    if not x.is_contiguous():
        x = x.contiguous()                # (kernels take C-contiguous arrays: one copy)
    if x.device.type == "cpu":
        a = x.numpy()
        if read_only:
            a = a.view()
            a.flags.writeable = False
        return a
    if x.device.type == "cuda":
        import cupy
        return cupy.from_dlpack(x)
    raise TapegradError(f"tapegrad.torch takes CPU and CUDA tensors, got one on {x.device}")


def _to_torch(torch: Any, y: Any, inputs: tuple) -> Any:
    """A result as a tensor (no copy for arrays), on the inputs' device for numbers."""
    if isinstance(y, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(y))
    if offers_cuda_interface(y) or hasattr(y, "__dlpack__"):
        return torch.from_dlpack(y)
    t = torch.from_numpy(np.array(float(y)))     # (float64; cheaper than torch.tensor)
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), t.device)
    return t if device == t.device else t.to(device)
