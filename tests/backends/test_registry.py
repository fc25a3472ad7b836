"""Arrays reach tapegrad through the backends' registered kinds
(tapegrad/backends/registry.py): an array type that no backend owns is refused with a clear
error wherever it enters, never taken for a constant (its gradient silently zero)."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends import registry


class Foreign:
    """An array-like of a library no backend owns: shape and dtype, nothing tapegrad knows."""

    def __init__(self, data):
        self.data = np.asarray(data, dtype=np.float64)
        self.shape, self.dtype, self.ndim = self.data.shape, self.data.dtype, self.data.ndim


@tg.kernel
def double(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i]


def test_numpy_and_cuda_arrays_have_their_kinds():
    assert registry.kind_of(np.zeros(2)).name == "numpy"
    assert registry.kind_of(np.zeros(2).view(np.ma.MaskedArray)).name == "numpy"
    assert registry.kind_of(1.5) is None and registry.kind_of([1.0]) is None
    assert tg.get_backend(np.zeros(3)) == tg.CPU()


def test_an_array_no_backend_owns_is_refused_at_launch_and_left_alone():
    A, B = Foreign([1.0, 2.0, 3.0]), np.zeros(3)
    with pytest.raises(tg.TapegradError, match="Foreign, which no tapegrad backend owns"):
        double(tg.CPU())(B, A, ndrange=3)
    assert (B == 0).all()
    with pytest.raises(tg.TapegradError, match="no tapegrad backend owns"):
        with tg.Tape():
            double(tg.CPU())(B, A, ndrange=3)
    with pytest.raises(tg.TapegradError, match="no tapegrad backend owns"):
        tg.get_backend(A)
    with pytest.raises(tg.TapegradError, match="no tapegrad backend owns"):
        tg.make_zero(A)


def test_a_registered_kind_is_asked(monkeypatch):
    """A new backend's arrays: one registration, and tapegrad finds their backend, their
    module and their addresses through it."""
    class ForeignArrays(registry.ArrayKind):
        name = "foreign"
        host = True

        def owns(self, x):
            return isinstance(x, Foreign)

        def module(self):
            return np

        def address(self, x):
            return x.data.__array_interface__["data"][0]

    monkeypatch.setattr(registry, "_KINDS", list(registry._KINDS))
    monkeypatch.setattr(registry, "_BY_TYPE", {})
    monkeypatch.setattr(registry, "_BACKEND_OF", dict(registry._BACKEND_OF))
    monkeypatch.setattr(registry, "_OF_TYPE", {})
    monkeypatch.setattr(registry, "_BACKENDS", {})
    registry.register(ForeignArrays(), lambda x: tg.CPU())
    A = Foreign([1.0, 2.0])
    assert registry.kind_of(A).name == "foreign"
    assert tg.get_backend(A) == tg.CPU()
    assert registry.kind_of_type(Foreign).name == "foreign"


def test_launches_through_get_backend_leave_one_configured_kernel():
    """``kern(tg.get_backend(x))`` in a loop: one backend object per device, and configured
    kernels found by the backend's value, so the cache stays at one entry."""
    A, B = np.arange(4.0), np.zeros(4)
    assert tg.get_backend(A) is tg.get_backend(B)
    before = dict(double._configured)
    for _ in range(1000):
        double(tg.get_backend(B))(B, A, ndrange=4)
    for _ in range(1000):
        double(tg.CPU())(B, A, ndrange=4)        # a new (equal) object per launch
    assert set(double._configured) <= set(before) | {(tg.CPU(), None)}
    np.testing.assert_array_equal(B, 2.0 * A)
    # backends that differ in their settings keep their own configured kernels
    off = tg.CPU(without=("transposed",))
    assert double(off) is not double(tg.CPU()) and double(off).backend == off
    assert double(tg.CPU(), 32) is not double(tg.CPU())


class Either:
    """An array type whose objects are on either side, as torch.Tensor's are: its interface
    is computed per object, and raises AttributeError for those on the host."""

    def __init__(self, on_gpu):
        self.on_gpu, self.shape, self.dtype, self.ndim = on_gpu, (2,), np.dtype("f8"), 1

    @property
    def __cuda_array_interface__(self):
        if not self.on_gpu:
            raise AttributeError("on the host")
        return {"shape": (2,), "typestr": "<f8", "data": (0, False), "version": 3}


def test_a_type_whose_objects_live_on_either_side_is_asked_per_object():
    host, gpu = Either(False), Either(True)
    assert registry.kind_of(host) is None              # the first answer is not the type's
    assert registry.kind_of(gpu).name == "cuda"
    assert registry.kind_of(host) is None
    assert registry.kind_of_type(Either).name == "cuda"
    with pytest.raises(tg.TapegradError, match="Either, which no tapegrad backend owns"):
        double(tg.CPU())(np.zeros(2), host, ndrange=2)


def test_a_cuda_array_that_refuses_its_interface_is_still_one():
    """PyTorch raises RuntimeError (not AttributeError) for the interface of a CUDA tensor that
    requires grad, so ``hasattr`` raised where tapegrad asked it."""
    from tapegrad.backends.registry import offers_cuda_interface

    class Refusing:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

    class NotOnGPU:
        @property
        def __cuda_array_interface__(self):
            raise AttributeError("non-CUDA tensor")

    assert offers_cuda_interface(Refusing())
    assert not offers_cuda_interface(NotOnGPU()) and not offers_cuda_interface(np.zeros(2))
    assert not offers_cuda_interface(__import__("torch").zeros(2, requires_grad=True))
