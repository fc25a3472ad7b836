"""Arrays from other libraries on ``tg.CUDA``, without a GPU: a stand-in CuPy (a module of
recorders: GPUs, streams, events, launches) and stand-in arrays (``__cuda_array_interface__``
objects, a ``torch.Tensor`` subclass that says it is on a GPU).  Kernels are compiled by the
real NVRTC; nothing runs.  What needs a GPU is checked in tests/gpu/test_gpu.py.

The rules under test (docs/gpu.md, "Arrays from other libraries: devices and streams"): an
array on another GPU is refused before anything runs, whatever launches came before; the
launch stream waits for the stream an array was made on; a tensor is on the CPU or a GPU
object by object."""

from __future__ import annotations

import ctypes
import sys
import types
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import tapegrad as tg
from tapegrad.backends import registry
from tapegrad.backends.cuda import device as cuda_device
from tapegrad.backends.cuda import streams
from tapegrad.backends.cuda.arrays import CUDA_ARRAYS
from tapegrad.backends.cuda.limits import DeviceLimits

H100 = DeviceLimits("NVIDIA H100", 90, 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535),
                    232448)
GIB = 1 << 30


@tg.kernel
def double(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i]


class FakeCuda:
    """What tapegrad asks of CuPy, recorded: two GPUs, whose memory starts at (device + 1)
    GiB; the current stream of each GPU; events, waits and launches in order."""

    def __init__(self):
        self.log: list[tuple] = []
        self.current_device = 0
        self.streams = {0: 0, 1: 0}       # each GPU's current stream (0: the null stream)
        self.events = 0
        fake = self

        class RuntimeError_(RuntimeError):
            pass

        class Runtime:
            CUDARuntimeError = RuntimeError_

            @staticmethod
            def getDevice():
                return fake.current_device

            @staticmethod
            def pointerGetAttributes(pointer):
                device = pointer // GIB - 1
                if device not in (0, 1):
                    raise RuntimeError_("cudaErrorInvalidValue")
                return SimpleNamespace(device=device, type=2)

            @staticmethod
            def eventCreateWithFlags(flags):
                fake.events += 1
                return 1000 + fake.events

            @staticmethod
            def eventRecord(event, stream):
                fake.log.append(("record", event, stream, fake.current_device))

            @staticmethod
            def streamWaitEvent(stream, event, flags):
                fake.log.append(("wait", stream, event, fake.current_device))

        class Function:
            ptr = 7

        def launch_kernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            # (the first two arguments' 8-byte slots: an array's address and first extent)
            slots = (ctypes.c_void_p * 2).from_address(params)
            first = tuple(int.from_bytes(ctypes.string_at(p, 8), "little") for p in slots)
            fake.log.append(("launch", fake.current_device, first, (gx, gy, gz), stream))

        class Module:
            def load(self, data):
                pass

            def get_function(self, name):
                return Function()

        @contextmanager
        def device(index):
            before, fake.current_device = fake.current_device, index
            try:
                yield
            finally:
                fake.current_device = before

        self.module = types.ModuleType("cupy")
        self.module.cuda = SimpleNamespace(
            runtime=Runtime, Device=device,
            function=SimpleNamespace(Module=Module),
            driver=SimpleNamespace(funcGetAttribute=lambda attribute, ptr: 1024 if
                                   attribute == 0 else 32,
                                   funcSetAttribute=lambda *a: None,
                                   launchKernel=launch_kernel),
            get_current_stream=lambda device_id=-1: SimpleNamespace(
                ptr=fake.streams[fake.current_device if device_id < 0 else device_id]))

    def launches(self):
        return [entry for entry in self.log if entry[0] == "launch"]


@pytest.fixture
def cuda(monkeypatch, tmp_path):
    """A stand-in CuPy with two H100s; tg.CUDA(0) and tg.CUDA(1) work on it."""
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    fake = FakeCuda()
    monkeypatch.setitem(sys.modules, "cupy", fake.module)
    monkeypatch.setattr(cuda_device, "_LIMITS", {0: H100, 1: H100})
    monkeypatch.setattr(streams, "_EVENTS", streams._Events())
    monkeypatch.setattr(registry, "_BACKENDS", {})
    # (a CUDA(k) made on another test's stand-in equals this test's: none is kept)
    monkeypatch.setattr(double, "_configured", {})
    monkeypatch.setattr(double, "cache", {})
    return fake


class DeviceArray:
    """An array of another library: its memory at ``pointer``, its stream in its interface."""

    def __init__(self, n, pointer, stream=None, version=3):
        self.shape, self.dtype, self.ndim, self.size = (n,), np.dtype(np.float64), 1, n
        self.strides, self.nbytes = (8,), 8 * n
        self.interface = {"shape": (n,), "typestr": "<f8", "data": (pointer, False),
                          "strides": None, "version": version}
        if version >= 3:
            self.interface["stream"] = stream

    @property
    def __cuda_array_interface__(self):
        return self.interface


def on(device, k=0):
    """An address in GPU ``device``'s memory."""
    return (device + 1) * GIB + k * (1 << 20)


def test_an_array_on_another_gpu_is_refused_before_anything_runs(cuda):
    A, B = DeviceArray(8, on(0, 1)), DeviceArray(8, on(0, 2))
    gpu0 = tg.CUDA(0)
    double(gpu0)(B, A, ndrange=8)
    assert len(cuda.launches()) == 1
    elsewhere = DeviceArray(8, on(1, 1))       # the same types: only the device differs
    with pytest.raises(tg.LaunchError, match=r"shape \(8,\) lives on GPU 1, but the launch is "
                       r"on tg.CUDA\(0\) \(GPU 0: NVIDIA H100\).*kern\(tg.get_backend\(x\)\) or "
                       r"kern\(tg.CUDA\(1\)\).*tg.asarray\(tg.CUDA\(0\), x\)"):
        double(gpu0)(B, elsewhere, ndrange=8)
    assert len(cuda.launches()) == 1
    # ... every time: the check is not skipped for a new array of a launch key met before
    with pytest.raises(tg.LaunchError, match="lives on GPU 1"):
        double(gpu0)(B, DeviceArray(8, on(1, 3)), ndrange=8)
    # the arrays' own GPU runs it, on that GPU
    double(tg.get_backend(elsewhere))(DeviceArray(8, on(1, 2)), elsewhere, ndrange=8)
    assert [entry[1] for entry in cuda.launches()] == [0, 1]
    assert tg.get_backend(elsewhere) is tg.get_backend(DeviceArray(4, on(1, 5))) == tg.CUDA(1)


def test_a_shadow_on_another_gpu_is_refused_before_anything_runs(cuda):
    A, B = DeviceArray(8, on(0, 1)), DeviceArray(8, on(0, 2))
    dA, dB = DeviceArray(8, on(0, 3)), DeviceArray(8, on(1, 4))
    with pytest.raises(tg.LaunchError, match="lives on GPU 1.*tg.CUDA\\(0\\)"):
        tg.autodiff(tg.Reverse, double(tg.CUDA(0)), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(A, dA), ndrange=8)
    assert cuda.launches() == []


def test_a_cupy_array_is_placed_by_its_device_id(cuda):
    class ndarray:          # what CuPy's arrays show tapegrad
        def __init__(self, n, device):
            self.shape, self.dtype, self.ndim, self.size = (n,), np.dtype(np.float64), 1, n
            self.device = SimpleNamespace(id=device)
            self.flags = SimpleNamespace(c_contiguous=True)
            self.data = SimpleNamespace(ptr=on(device))

        @property
        def __cuda_array_interface__(self):
            raise AssertionError("a CuPy array is passed as itself")
    ndarray.__module__ = "cupy"
    A, B = ndarray(8, 1), ndarray(8, 1)
    assert registry.kind_of(A) is CUDA_ARRAYS and CUDA_ARRAYS.device(A) == 1
    assert CUDA_ARRAYS.address(A) == on(1) and not CUDA_ARRAYS.per_object(A)
    with pytest.raises(tg.LaunchError, match="lives on GPU 1"):
        double(tg.CUDA(0))(B, A, ndrange=8)
    double(tg.get_backend(A))(B, A, ndrange=8)
    (launch,) = cuda.launches()
    assert launch[1] == 1 and launch[2] == (B.data.ptr, 8)


def test_disjoint_arrays_run_the_restrict_variant_and_overlapping_ones_the_plain(cuda):
    """(tapegrad/backends/c/items.py) four work-items per thread: 1000 work-items in 4
    workgroups, one block; the plain variant compiled when a launch's arrays first overlap"""
    A, B = DeviceArray(5000, on(0, 1)), DeviceArray(5000, on(0, 2))
    gpu = tg.CUDA(0)
    double(gpu)(B, A, ndrange=1000)
    assert "double *__restrict__ B" in double.source(backend=gpu)
    # B's last element is A's first: not disjoint
    double(gpu)(DeviceArray(1000, on(0, 1) - 999 * 8), A, ndrange=1000)
    assert "__restrict__" not in double.source(backend=gpu)
    double(gpu)(B, A, ndrange=5000)
    assert "__restrict__" in double.source(backend=gpu)
    assert [launch[3] for launch in cuda.launches()] == [(1, 1, 1), (1, 1, 1), (5, 1, 1)]


def test_a_launch_waits_for_the_stream_an_array_was_made_on(cuda):
    A, B = DeviceArray(8, on(0, 1), stream=0x5000), DeviceArray(8, on(0, 2), stream=None)
    double(tg.CUDA(0))(B, A, ndrange=8)
    record, wait, launch = cuda.log
    assert record[0] == "record" and record[2] == 0x5000 and record[3] == 0
    assert wait == ("wait", 0, record[1], 0)          # the launch stream (null) waits
    assert launch[0] == "launch"
    # the same event again on this thread; the launch on CuPy's current stream of GPU 0
    cuda.log.clear()
    cuda.streams[0] = 0x7000
    double(tg.CUDA(0))(B, DeviceArray(8, on(0, 3), stream=0x5000), ndrange=8)
    assert [e[0] for e in cuda.log] == ["record", "wait", "launch"]
    assert cuda.log[0][1] == record[1] and cuda.log[1][1] == 0x7000 and cuda.events == 1


@pytest.mark.parametrize("stream, launch_stream", [(None, 0), (1, 0), (0x5000, 0x5000)],
                         ids=["ready", "legacy-default-is-cupy-null", "same-stream"])
def test_no_wait_where_the_array_needs_none(cuda, stream, launch_stream):
    cuda.streams[0] = launch_stream
    A, B = DeviceArray(8, on(0, 1), stream=stream), DeviceArray(8, on(0, 2), version=2)
    double(tg.CUDA(0))(B, A, ndrange=8)
    assert [e[0] for e in cuda.log] == ["launch"]


def test_stream_zero_is_refused_as_the_interface_asks(cuda):
    A, B = DeviceArray(8, on(0, 1), stream=0), DeviceArray(8, on(0, 2))
    with pytest.raises(tg.LaunchError, match="gives stream 0.*never 0"):
        double(tg.CUDA(0))(B, A, ndrange=8)
    assert cuda.launches() == []


def test_an_array_in_host_memory_is_refused(cuda):
    A, B = DeviceArray(8, 12345), DeviceArray(8, on(0, 2))
    with pytest.raises(tg.LaunchError, match="unknown to the CUDA runtime"):
        double(tg.CUDA(0))(B, A, ndrange=8)


class GpuTensor(torch.Tensor):
    """A ``torch.Tensor`` type whose objects are on the CPU or (said to be) on a GPU, as
    ``torch.Tensor``'s are: ``on`` is the GPU, None for the CPU."""

    on: int | None = None
    pointer = 0

    @property
    def is_cuda(self):
        return self.on is not None

    def get_device(self):
        return -1 if self.on is None else self.on

    @property
    def __cuda_array_interface__(self):
        if self.on is None:
            raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor type")
        if self.requires_grad:
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires "
                               "grad. If gradients aren't required, use var.detach() to get "
                               "Variable that doesn't require grad.")
        return {"shape": tuple(self.shape), "typestr": "<f8", "strides": None,
                "data": (self.pointer, False), "version": 2}


def tensor(n, device=None, pointer=0, requires_grad=False):
    t = torch.zeros(n, dtype=torch.float64).as_subclass(GpuTensor)
    t.on, t.pointer = device, pointer
    t.requires_grad_(requires_grad)
    return t


def test_a_tensor_type_is_asked_object_by_object():
    cpu, gpu = tensor(3), tensor(3, device=1, pointer=on(1))
    assert registry.kind_of(cpu) is None                 # first: a CPU tensor
    assert registry.kind_of(gpu) is CUDA_ARRAYS          # not refused for its type
    assert registry.kind_of(cpu) is None
    assert registry.kind_of_type(GpuTensor) is CUDA_ARRAYS
    assert CUDA_ARRAYS.device(gpu) == 1 and CUDA_ARRAYS.dtype(gpu) == np.float64
    assert registry.kind_of(torch.zeros(2)) is None
    assert registry._BY_TYPE[torch.Tensor] is registry._PER_OBJECT


def test_a_cpu_tensor_is_refused_with_the_way_to_pass_it():
    with pytest.raises(tg.BackendError, match=r"a CPU torch.Tensor: pass t.numpy\(\) to run on "
                       r"tg.CPU\(\).*t.cuda\(\) for tg.CUDA\(\).*tapegrad.torch.function"):
        double(tg.CPU())(np.zeros(3), torch.ones(3, dtype=torch.float64), ndrange=3)
    with pytest.raises(tg.BackendError, match="a CPU torch.Tensor"):
        tg.get_backend(torch.ones(3))


def test_a_tensor_that_requires_grad_is_told_to_detach(cuda):
    t = tensor(4, device=0, pointer=on(0), requires_grad=True)
    assert registry.kind_of(t) is CUDA_ARRAYS and CUDA_ARRAYS.per_object(t)
    with pytest.raises(tg.LaunchError, match=r"requires grad.*pass t.detach\(\).*"
                       r"tapegrad.torch.function"):
        CUDA_ARRAYS.launch_key(t)
    with pytest.raises(tg.LaunchError, match=r"pass t.detach\(\)"):
        CUDA_ARRAYS.address(t)
    with pytest.raises(tg.LaunchError, match=r"pass t.detach\(\)"):
        _buffer_of(t)
    assert cuda.launches() == []


def _buffer_of(a):
    """What a CUDA launch packs for array ``a`` (the launch stream ordered after it)."""
    from tapegrad.backends.cuda.backend import _Launcher
    launcher = _Launcher.__new__(_Launcher)
    launcher.device, launcher.cupy = 0, sys.modules["cupy"]
    return launcher.buffer("A", a)


def test_a_tensor_on_another_torch_stream_is_waited_for_and_marked_used(cuda, monkeypatch):
    marked = []
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=0x9000))
    monkeypatch.setattr(torch.cuda, "ExternalStream",
                        lambda pointer, device=None: ("external", pointer, device))
    monkeypatch.setattr(GpuTensor, "record_stream", lambda self, s: marked.append(s),
                        raising=False)
    monkeypatch.setattr(streams, "_TORCH_STREAMS", {})
    t = tensor(4, device=0, pointer=on(0))
    assert _buffer_of(t) == np.uint64(on(0))
    record, wait = cuda.log
    assert record[2] == 0x9000 and wait[1] == 0 and marked == [("external", 0, 0)]
    # PyTorch on the launch stream: nothing to wait for, nothing to mark
    cuda.log.clear()
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: SimpleNamespace(cuda_stream=0))
    _buffer_of(t)
    assert cuda.log == [] and len(marked) == 1
