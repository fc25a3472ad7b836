"""OpenCL devices and their queues: one context and in-order queue per device, made on first
use and kept (a queue per launch would cost more than the launch)."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tapegrad.backends.opencl.buffers import to_host
from tapegrad.errors import BackendError, optional_module

_INSTALL = ("install PyOpenCL and an OpenCL driver: pip install 'tapegrad[opencl]' "
            "(PyOpenCL with PoCL, which runs OpenCL on the CPU), or your GPU vendor's driver")


def _cl() -> Any:
    return optional_module("pyopencl", f"tg.OpenCL() needs PyOpenCL: {_INSTALL}", BackendError)


def devices() -> list[Any]:
    """Every OpenCL device of every platform, GPUs first."""
    cl = _cl()
    try:
        found = [d for p in cl.get_platforms() for d in p.get_devices()]
    except cl.Error as e:
        raise BackendError(f"no OpenCL platform answers ({e}): {_INSTALL}") from None
    if not found:
        raise BackendError(f"no OpenCL device found: {_INSTALL}")
    return sorted(found, key=lambda d: not d.type & cl.device_type.GPU)


@functools.cache
def queue(index: int) -> Any:
    """The in-order queue of device ``index`` (in ``devices()``'s order)."""
    cl = _cl()
    found = devices()
    if not 0 <= index < len(found):
        raise BackendError(f"tg.OpenCL({index}): there are {len(found)} OpenCL device(s): "
                           + ", ".join(f"{k}: {d.name}" for k, d in enumerate(found)))
    device = found[index]
    if "cl_khr_fp64" not in device.extensions:
        raise BackendError(f"tg.OpenCL({index}): {device.name} has no float64 "
                           "(cl_khr_fp64), which tapegrad's kernels need")
    return cl.CommandQueue(cl.Context([device]))


def index_of(device: Any) -> int:
    """The index ``tg.OpenCL(k)`` takes for an OpenCL device."""
    return next(k for k, d in enumerate(devices()) if d == device)


class _Arrays:
    """NumPy-like constructors on a queue (what ``ArrayKind.module`` gives)."""

    def __init__(self, q: Any):
        self.q = q

    def empty(self, shape: Any, dtype: Any) -> Any:
        import pyopencl.array as cla
        return cla.empty(self.q, shape, dtype)

    def zeros(self, shape: Any, dtype: Any) -> Any:
        import pyopencl.array as cla
        return cla.zeros(self.q, shape, dtype)

    def ones(self, shape: Any, dtype: Any) -> Any:
        out = self.zeros(shape, dtype)
        out.fill(1)
        return out

    def empty_like(self, x: Any) -> Any:
        return self.empty(x.shape, x.dtype)

    def zeros_like(self, x: Any) -> Any:
        return self.zeros(x.shape, x.dtype)

    def multiply(self, a: Any, scale: Any, out: Any) -> Any:
        out[...] = a * scale
        return out

    # what the tape's host reductions ask of an array module (tapegrad/tape/hostops.py); on
    # the host for now (PyOpenCL's own reductions need Mako, and wait for the queue as well)
    def sum(self, x: Any) -> Any:
        return np.sum(to_host(x))

    def mean(self, x: Any) -> Any:
        return np.mean(to_host(x))

    def vdot(self, a: Any, b: Any) -> Any:
        return np.vdot(to_host(a), to_host(b))

    @property
    def linalg(self) -> Any:
        return _Linalg(self)


class _Linalg:
    def __init__(self, arrays: _Arrays):
        self.arrays = arrays

    def norm(self, x: Any) -> Any:
        return np.linalg.norm(to_host(x))


def arrays_on(index: int) -> _Arrays:
    return _Arrays(queue(index))


def default_arrays() -> _Arrays:
    return arrays_on(0)
