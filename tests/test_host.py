"""The host-side API: backends, array helpers, host synchronisation, math aliases."""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends import registry
from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
from tapegrad.lang.intrinsics import BINARY_MATH, TERNARY_MATH, UNARY_MATH


def test_cpu_backend_identity():
    a, b = tg.CPU(), tg.CPU()
    assert repr(a) == "CPU()"
    assert a == b and hash(a) == hash(b)
    assert isinstance(a, tg.Backend)
    assert a != object()
    assert len({a, b}) == 1


def test_get_backend():
    assert tg.get_backend(np.zeros(3)) == tg.CPU()
    assert tg.get_backend(np.zeros((2, 2), np.float32)) == tg.CPU()


@pytest.mark.parametrize("x", [[1.0, 2.0], 3.0, None, "array"], ids=repr)
def test_get_backend_rejects_non_arrays(x):
    with pytest.raises(tg.BackendError, match="expects an array"):
        tg.get_backend(x)


def test_gpu_arrays_are_cuda_arrays_and_their_backend_says_what_is_missing(monkeypatch):
    class FakeGpuArray:
        __cuda_array_interface__ = {"shape": (3,), "typestr": "<f8", "data": (0, False),
                                    "version": 3}

    class FakeCupyArray(FakeGpuArray):
        device = SimpleNamespace(id=1)        # CuPy spells the device index .id

    class FakeTorchTensor(FakeGpuArray):
        device = SimpleNamespace(index=1)     # PyTorch spells it .index

    for x, device in ((FakeGpuArray(), 0), (FakeCupyArray(), 1), (FakeTorchTensor(), 1)):
        assert registry.kind_of(x) is CUDA_ARRAYS and CUDA_ARRAYS.device(x) == device
    monkeypatch.setitem(sys.modules, "cupy", None)      # (as where CuPy is not installed)
    with pytest.raises(tg.BackendError,
                       match=r"tg.CUDA\(\) needs CuPy.*tapegrad\[cuda13\].*tg.OpenCL\(\)"):
        tg.get_backend(FakeCupyArray())


@pytest.mark.parametrize("shape, expected", [(5, (5,)), ((2, 3), (2, 3)), ([4, 1, 2], (4, 1, 2)),
                                             (np.int64(3), (3,))], ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.bool_],
                         ids=lambda d: d.__name__)
def test_allocate_zeros_ones(shape, expected, dtype):
    cpu = tg.CPU()
    a = tg.allocate(cpu, dtype, shape)
    z = tg.zeros(cpu, dtype, shape)
    o = tg.ones(cpu, dtype, shape)
    for arr in (a, z, o):
        assert isinstance(arr, np.ndarray)
        assert arr.shape == expected and arr.dtype == np.dtype(dtype)
        assert tg.get_backend(arr) == cpu
    assert (z == 0).all()
    assert (o == 1).all()


def test_dtype_given_as_string_or_dtype():
    z = tg.zeros(tg.CPU(), "float32", 2)
    o = tg.ones(tg.CPU(), np.dtype("int64"), (1, 2))
    assert z.dtype == np.float32 and o.dtype == np.int64


def test_asarray_copies():
    src = np.arange(4.0)
    a = tg.asarray(tg.CPU(), src)
    assert isinstance(a, np.ndarray) and a.dtype == np.float64
    np.testing.assert_array_equal(a, src)
    src[0] = 100.0
    assert a[0] == 0.0, "asarray must copy host data"
    b = tg.asarray(tg.CPU(), [[1, 2], [3, 4]])
    assert b.shape == (2, 2) and b.dtype.kind == "i"


def test_to_numpy():
    x = np.arange(3.0)
    assert tg.to_numpy(x) is x
    y = tg.to_numpy([1.0, 2.0])
    assert isinstance(y, np.ndarray) and y.tolist() == [1.0, 2.0]

    class HasGet:
        def get(self):
            return np.array([7.0])

    np.testing.assert_array_equal(tg.to_numpy(HasGet()), [7.0])


def test_host_synchronize():
    assert tg.synchronize(tg.CPU()) is None
    assert tg.synchronize(tg.get_backend(np.zeros(1))) is None


def test_synchronize_waits_for_the_given_backend():
    calls = []

    class Recording:
        def synchronize(self):
            calls.append(True)

    tg.synchronize(Recording())
    assert calls == [True]


def test_synchronize_without_backend_is_the_kernel_barrier():
    with pytest.raises(tg.OutsideKernelError):
        tg.synchronize()


# -- math aliases on the host ---------------------------------------------------------------------

def _args(name):
    if name in ("acosh",):
        return (1.5,)
    if name in ("asin", "acos", "atanh"):
        return (0.3,)
    if name in BINARY_MATH:
        return (1.25, 0.75)
    if name in TERNARY_MATH:
        return (1.25, 0.75, -0.3)
    return (0.7,)


# closed forms for the functions Python's math lacks (cbrt before Python 3.11, fma before 3.13)
_CLOSED_FORMS = {"logaddexp": lambda a, b: math.log(math.exp(a) + math.exp(b)),
                 "cbrt": lambda x: math.copysign(abs(x) ** (1.0 / 3.0), x),
                 "fma": lambda x, y, z: x * y + z}


def _reference(name):
    return _CLOSED_FORMS.get(name) or getattr(math, name)


@pytest.mark.parametrize("name", UNARY_MATH + BINARY_MATH + TERNARY_MATH)
def test_math_alias_on_host_scalars(name):
    fn = getattr(tg, name)
    args = _args(name)
    if hasattr(math, name) and name not in _CLOSED_FORMS:
        assert fn(*args) == getattr(math, name)(*args)          # math's own, bit for bit
    else:
        assert fn(*args) == pytest.approx(_reference(name)(*args), rel=1e-15, abs=0)
    assert name in tg.__all__


_NP = {"asin": "arcsin", "acos": "arccos", "atan": "arctan", "asinh": "arcsinh",
       "acosh": "arccosh", "atanh": "arctanh", "atan2": "arctan2", "pow": "power"}


@pytest.mark.parametrize("name", UNARY_MATH + BINARY_MATH + TERNARY_MATH)
def test_math_alias_on_host_arrays(name):
    fn = getattr(tg, name)
    args = tuple(np.array([a, a * 0.5 + 0.5, a]) if not (name == "acosh") else
                 np.array([a, a + 1.0, a]) for a in _args(name))
    got = fn(*args)
    assert isinstance(got, np.ndarray) and got.shape == (3,)
    expected = [_reference(name)(*(float(x[k]) for x in args)) for k in range(3)]
    np.testing.assert_allclose(np.asarray(got, dtype=np.float64), expected, rtol=1e-14)


def test_math_alias_on_float32_array_keeps_dtype():
    x = np.linspace(0.1, 1.0, 5, dtype=np.float32)
    assert tg.sin(x).dtype == np.float32
    np.testing.assert_array_equal(tg.sqrt(x), np.sqrt(x))


def test_where_on_host():
    c = np.array([True, False, True])
    np.testing.assert_array_equal(tg.where(c, np.array([1, 2, 3]), -1), [1, -1, 3])
    assert tg.where(True, 1.0, 2.0) == 1.0


def test_device_function_is_callable_on_host():
    @tg.func
    def cube(x):
        return x * x * x

    assert cube(3) == 27
    assert cube.__name__ == "cube"
    assert "tg.func cube" in repr(cube)


def test_kernel_objects():
    @tg.kernel
    def fill(B, v):
        i = tg.index()
        B[i] = v

    cpu = tg.CPU()
    assert "fill" in repr(fill) and fill.__name__ == "fill"
    cfg = fill(cpu, 8)
    assert cfg is fill(cpu, 8), "configured kernels are reused"
    assert cfg.backend is cpu and cfg.workgroupsize == 8
    with pytest.raises(tg.LaunchError, match="launch it once"):
        fill.source(backend=cpu)
    # the canonical source needs no launch
    text = fill.source()
    assert "def fill(B, v):" in text and "tg.global_index()" in text
    B = np.zeros(5)
    cfg(B, 2.5, ndrange=5)
    assert (B == 2.5).all()
    lowered = fill.source(backend=cpu)
    assert "numba" in lowered and "def fill(" in lowered
    with pytest.raises(tg.LaunchError, match="mode"):
        fill.source(mode="no-such-mode")
    # the code of the most recent launch, also when its compiled code was cached
    fill(cpu, 4)(B, 1.0, ndrange=5)
    assert "groupsize (4,)" in fill.source(backend=cpu)
    cfg(B, 2.5, ndrange=5)
    assert "groupsize (8,)" in fill.source(backend=cpu)


def test_error_hierarchy():
    for cls in (tg.KernelError, tg.KernelSyntaxError, tg.KernelTypeError, tg.KernelCompileError,
                tg.KernelIndexError, tg.LaunchError, tg.BackendError, tg.OutsideKernelError):
        assert issubclass(cls, tg.TapegradError)
    for cls in (tg.KernelSyntaxError, tg.KernelTypeError, tg.KernelCompileError,
                tg.KernelActivityError):
        assert issubclass(cls, tg.KernelError) and issubclass(cls, SyntaxError)
    assert issubclass(tg.LaunchError, ValueError)
    assert issubclass(tg.KernelIndexError, IndexError)
    assert issubclass(tg.OutsideKernelError, RuntimeError)


def test_public_names_exist():
    for name in tg.__all__:
        assert hasattr(tg, name), name
    assert tg.__version__
