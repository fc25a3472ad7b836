"""The CPU backend's arrays: NumPy's (subclasses too)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import ArrayKind


class NumpyArrays(ArrayKind):
    name = "numpy"
    host = True

    def owns(self, x: Any) -> bool:
        return isinstance(x, np.ndarray)

    def place(self, x: Any) -> Any:
        return ()

    def advice(self, x: Any) -> str | None:
        # a CPU tensor is refused, not converted: a copy would not see the kernel's stores
        if type(x).__module__.startswith("torch") and getattr(x, "is_cuda", True) is False:
            return ("a CPU torch.Tensor: pass t.numpy() to run on tg.CPU() (it shares the "
                    "tensor's memory; t.detach().numpy() if it requires grad), or t.cuda() "
                    "for tg.CUDA(); to differentiate through PyTorch, wrap the function with "
                    "tapegrad.torch.function")
        return None

    def module(self) -> Any:
        return np

    def address(self, x: Any) -> int:
        return x.__array_interface__["data"][0]

    def launch_key(self, x: Any) -> tuple:
        dtype = x.dtype
        return (type(x), dtype.num, x.ndim, x.flags.writeable, dtype.isnative)

    def to_numpy(self, x: Any) -> np.ndarray:
        return x


NUMPY = NumpyArrays()
