"""The CUDA backend's arrays: CuPy's, and any other ``__cuda_array_interface__`` array (a
PyTorch CUDA tensor, say), which tapegrad's own new arrays for it are CuPy arrays beside."""

from __future__ import annotations

from typing import Any

import numpy as np

from tapegrad.backends.registry import ArrayKind


class CudaArrays(ArrayKind):
    name = "cuda"

    def owns(self, x: Any) -> bool:
        return hasattr(x, "__cuda_array_interface__")

    def device(self, x: Any) -> int:
        """The index of the GPU ``x`` lives on (CuPy's ``device.id``, PyTorch's ``.index``)."""
        device = getattr(x, "device", None)
        return getattr(device, "id", getattr(device, "index", 0)) or 0

    def module(self) -> Any:
        import cupy
        return cupy

    def address(self, x: Any) -> int:
        return x.__cuda_array_interface__["data"][0]

    def to_numpy(self, x: Any) -> np.ndarray:
        if hasattr(x, "get"):
            return x.get()
        return self.module().asnumpy(self.module().asarray(x))   # (any CUDA array, no copy)

    def fingerprint(self, x: Any) -> Any:
        from tapegrad.backends.cuda.fingerprint import fingerprint
        return fingerprint(x)


CUDA_ARRAYS = CudaArrays()
