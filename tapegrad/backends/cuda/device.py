"""CUDA GPUs through CuPy: finding CuPy, a GPU's limits, loading a compiled kernel."""

from __future__ import annotations

from typing import Any

from tapegrad.backends.cuda.limits import DeviceLimits
from tapegrad.backends.cuda.nvrtc import Binary
from tapegrad.errors import BackendError, optional_module

_INSTALL = ("install the CUDA extra matching your driver: pip install 'tapegrad[cuda13]' "
            "(or 'tapegrad[cuda12]')")


def cupy_module() -> Any:
    """CuPy, or a BackendError saying how to install it."""
    return optional_module(
        "cupy", f"tg.CUDA() needs CuPy for its arrays and launches: {_INSTALL}. Without an "
        "NVIDIA GPU, tg.OpenCL() runs the same generated C on other GPUs or on the CPU (PoCL), "
        "and tg.CPU() runs on the CPU", BackendError)


def device_limits(cupy: Any, device: int) -> DeviceLimits:
    """What a launch on GPU ``device`` may ask for; a BackendError where there is no GPU."""
    runtime = cupy.cuda.runtime
    try:
        count = runtime.getDeviceCount()
    except runtime.CUDARuntimeError as e:
        raise BackendError(
            f"tg.CUDA(): no CUDA GPU or driver was found ({e}). tapegrad's CUDA backend needs "
            "an NVIDIA GPU and its driver; without one, tg.OpenCL() runs the same generated C "
            "on other GPUs or on the CPU (PoCL), and tg.CPU() runs on the CPU") from None
    if not 0 <= device < count:
        raise BackendError(f"tg.CUDA({device}): this machine has {count} CUDA GPU(s), "
                           f"numbered 0 to {count - 1}")

    def attribute(number: int) -> int:      # (cudaDeviceAttr numbers)
        return int(runtime.deviceGetAttribute(number, device))
    return DeviceLimits(
        name=runtime.getDeviceProperties(device)["name"].decode(),
        arch=10 * attribute(75) + attribute(76),
        max_threads=attribute(1), max_block=(attribute(2), attribute(3), attribute(4)),
        max_grid=(attribute(5), attribute(6), attribute(7)),
        max_shared=attribute(97))

def load_function(cupy: Any, binary: Binary, name: str) -> Any:
    """The kernel ``name`` of ``binary``, loaded on the current GPU (a CuPy ``Function``,
    which keeps its module loaded)."""
    module = cupy.cuda.function.Module()
    try:
        module.load(binary.data)
    except cupy.cuda.driver.CUDADriverError as e:
        raise BackendError(
            f"{name}: the CUDA driver refused the kernel NVRTC compiled for sm_{binary.arch} "
            f"({e}). An NVRTC newer than the driver makes binaries the driver cannot load: "
            "install the extra that matches your driver, pip install 'tapegrad[cuda12]' for "
            "CUDA 12 drivers (nvidia-smi shows the driver's CUDA version)") from None
    return module.get_function(name)


def limits_of(device: int) -> DeviceLimits:
    """GPU ``device``'s limits, asked once (``tg.get_backend`` makes a ``CUDA`` per call)."""
    limits = _LIMITS.get(device)
    if limits is None:
        limits = _LIMITS[device] = device_limits(cupy_module(), device)
    return limits


_LIMITS: dict[int, DeviceLimits] = {}
