"""The CUDA backend's arrays: CuPy's, and any other ``__cuda_array_interface__`` array (a
PyTorch CUDA tensor, say), which tapegrad's own new arrays for it are CuPy arrays beside.

Which GPU an array is on is asked per array (CuPy's ``x.device.id``, PyTorch's
``t.get_device()``, else its pointer's device from the CUDA runtime) and is part of its launch
key, so a launch's arguments are checked against the launch's GPU once per set of devices
(``CUDA.owns``).  A ``torch.Tensor`` is on the CPU or on a GPU, so it is asked object by
object (``per_object``), never once for its type.

>>> import numpy as np
>>> CUDA_ARRAYS.owns(np.zeros(3))
False
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any

import numpy as np

from tapegrad.backends.registry import ArrayKind
from tapegrad.errors import LaunchError

CAI = "__cuda_array_interface__"
# cudaMemoryType: what the CUDA runtime says a pointer's memory is
_DEVICE_MEMORY, _MANAGED_MEMORY = 2, 3


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a ``torch.Tensor`` (without importing PyTorch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def interface(x: Any) -> dict:
    """``x.__cuda_array_interface__``, or a tapegrad error saying what to do where the array's
    library refuses it (PyTorch raises a RuntimeError for a tensor that requires grad)."""
    try:
        return getattr(x, CAI)
    except AttributeError:
        raise LaunchError(f"a {_name(x)} without a {CAI} is not a CUDA array; copy it to the "
                          "GPU first, e.g. tg.asarray(tg.CUDA(), x)") from None
    except Exception as e:          # (the library's own error: its message, with our advice)
        if is_torch(x) and x.requires_grad:
            raise LaunchError(_requires_grad(x)) from None
        raise LaunchError(f"a {_name(x)} refused its {CAI} ({type(e).__name__}: {e}); pass "
                          "a CuPy array, e.g. cupy.from_dlpack(x)") from None


def _requires_grad(x: Any) -> str:
    return (f"a torch.Tensor that requires grad (shape {tuple(x.shape)}) was passed to a "
            "tapegrad kernel, and PyTorch gives no CUDA array of it: pass t.detach() (the "
            "kernel then reads and writes the same memory, outside PyTorch's autograd), or "
            "wrap the function with tapegrad.torch.function to get its PyTorch gradient")


def _name(x: Any) -> str:
    return f"{type(x).__module__}.{type(x).__name__}"


_TORCH_DTYPES = {"torch.float64": "float64", "torch.float32": "float32",
                 "torch.int64": "int64", "torch.int32": "int32", "torch.bool": "bool",
                 "torch.float16": "float16", "torch.int16": "int16", "torch.int8": "int8",
                 "torch.uint8": "uint8"}


class CudaArrays(ArrayKind):
    name = "cuda"

    def owns(self, x: Any) -> bool:
        if is_torch(x):
            return x.is_cuda        # (its interface raises where it requires grad)
        try:
            return hasattr(x, CAI)
        except Exception:           # it has one but refuses it now: interface() says why
            return True

    def per_object(self, x: Any) -> bool:
        t = type(x)
        if t.__module__.startswith("cupy"):
            return False            # (CuPy's arrays are always on a GPU)
        declared = inspect.getattr_static(t, CAI, None)
        if declared is None:        # an instance's own attribute: another may lack it
            return CAI in getattr(x, "__dict__", ())
        return hasattr(declared, "__get__")    # computed per object: some may refuse it

    def place(self, x: Any) -> Any:
        return self.device(x)

    def device(self, x: Any) -> int:
        """The index of the GPU ``x`` lives on (0 for an array without memory)."""
        found = self.device_of(x)
        return 0 if found is None else found

    def device_of(self, x: Any) -> int | None:
        """The index of the GPU ``x``'s memory is on: CuPy's ``device.id``, PyTorch's
        ``get_device()``, else the CUDA runtime's answer for its pointer (an array that
        says neither: its ``device``'s ``id`` or ``index``); None where any GPU may use it
        (no memory, or managed memory)."""
        if type(x).__module__.startswith("cupy"):
            return x.device.id
        if is_torch(x):
            return x.get_device()
        pointer = interface(x)["data"][0]
        if pointer:
            cupy = sys.modules.get("cupy") or _import_cupy()
            if cupy is not None:
                return _pointer_device(cupy, x, pointer)
        # (no memory, or no CUDA runtime to ask: the array's own word)
        device = getattr(x, "device", None)
        index = getattr(device, "id", getattr(device, "index", None))
        return index if isinstance(index, int) else None

    def launch_key(self, x: Any) -> tuple:
        if is_torch(x) and x.requires_grad:
            raise LaunchError(_requires_grad(x))
        return (type(x), self.dtype(x).num, x.ndim, self.device_of(x))

    def dtype(self, x: Any) -> np.dtype:
        """``x``'s element type as NumPy's (PyTorch's dtypes are not NumPy's)."""
        if is_torch(x):
            return np.dtype(_TORCH_DTYPES.get(str(x.dtype), "V"))
        return np.dtype(x.dtype)

    def module(self) -> Any:
        import cupy
        return cupy

    def address(self, x: Any) -> int:
        if type(x).__module__.startswith("cupy"):
            return x.data.ptr
        return interface(x)["data"][0]

    def to_numpy(self, x: Any) -> np.ndarray:
        if hasattr(x, "get"):
            return x.get()
        if is_torch(x):             # (on PyTorch's stream, which made it)
            return x.detach().cpu().numpy()
        interface(x)                # (the advice, where its library refuses the interface)
        return self.module().asnumpy(self.module().asarray(x))   # (any CUDA array, no copy)

    def fingerprint(self, x: Any) -> Any:
        from tapegrad.backends.cuda.fingerprint import fingerprint
        return fingerprint(x)


@functools.cache
def _import_cupy() -> Any:
    try:
        import cupy
    except ImportError:
        return None
    return cupy


def _pointer_device(cupy: Any, x: Any, pointer: int) -> int | None:
    """The GPU whose memory ``pointer`` (of array ``x``) is, asked of the CUDA runtime."""
    runtime = cupy.cuda.runtime
    try:
        attributes = runtime.pointerGetAttributes(pointer)
    except runtime.CUDARuntimeError as e:
        raise LaunchError(f"a {_name(x)}'s memory (address {pointer:#x}) is unknown to the "
                          f"CUDA runtime ({e}); pass a CuPy array, e.g. cupy.asarray(x)"
                          ) from None
    memory = getattr(attributes, "type", getattr(attributes, "memoryType", _DEVICE_MEMORY))
    if memory == _MANAGED_MEMORY:
        return None
    if memory != _DEVICE_MEMORY:
        raise LaunchError(f"a {_name(x)}'s {CAI} points to host memory (address "
                          f"{pointer:#x}), which a CUDA kernel cannot use; copy it to the GPU "
                          "first, e.g. tg.asarray(tg.CUDA(), x)")
    return int(attributes.device)


CUDA_ARRAYS = CudaArrays()
