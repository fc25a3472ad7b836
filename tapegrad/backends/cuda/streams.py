"""Arrays from other libraries on a CUDA launch: the launch runs after the work that made them.

A tapegrad launch runs on CuPy's current stream of its GPU (the *launch stream*).  An array
another library made was written on a stream of that library's, which the launch must follow
(the rule, for users: docs/gpu.md, "Arrays from other libraries: devices and streams"):

- a CuPy array: nothing to do (CuPy's own operations make the same assumption: the current
  stream);
- an array whose ``__cuda_array_interface__`` (version 3) has a ``stream`` entry: an event is
  recorded on that stream and the launch stream waits for it (the GPU waits, the host does
  not).  ``None`` (or no entry) means the producer says its data is ready; ``1`` is CUDA's
  legacy default stream, ``2`` the per-thread one, other values a ``cudaStream_t``; ``0`` is
  refused, as the interface asks;
- a PyTorch CUDA tensor (its interface has no ``stream`` entry): its stream is PyTorch's
  current stream on its GPU; where that is not the launch stream the launch waits for it as
  above, and the tensor is marked used on the launch stream (``Tensor.record_stream``), so
  that PyTorch's caching allocator does not give its memory to another tensor while the
  launch may still read or write it.

Streams equal to the launch stream, the common case (PyTorch and CuPy both on their default
streams), cost a comparison.
"""

from __future__ import annotations

import threading
from typing import Any

from tapegrad.backends.cuda.arrays import is_torch
from tapegrad.errors import LaunchError

LEGACY_DEFAULT = 1          # cudaStreamLegacy, in the interface's ``stream`` entry
_DISABLE_TIMING = 2         # cudaEventDisableTiming: an event only for ordering is cheaper
_MOST_TORCH_STREAMS = 64


def producer_stream(a: Any, interface: dict, device: int) -> int | None:
    """The stream the launch must follow for array ``a`` (``interface``: its CUDA Array
    Interface), or None where it need not wait."""
    if is_torch(a):
        import torch
        return torch.cuda.current_stream(device).cuda_stream
    stream = interface.get("stream")
    if stream is None:
        return None
    if type(stream) is not int or stream == 0:
        raise LaunchError(f"a {type(a).__module__}.{type(a).__name__}'s "
                          f"__cuda_array_interface__ gives stream {stream!r}: the interface "
                          "(version 3) allows None, 1 (the legacy default stream), 2 (the "
                          "per-thread default stream) or a cudaStream_t, never 0")
    return stream


def same_stream(producer: int, launch: int) -> bool:
    """Whether the two streams are one (CuPy's null stream, 0, is the legacy default)."""
    return producer == launch or {producer, launch} == {0, LEGACY_DEFAULT}


def follow(cupy: Any, device: int, a: Any, interface: dict) -> None:
    """Order the launch stream of GPU ``device`` after the work that made ``a`` (see the
    module's docstring); the host does not wait."""
    producer = producer_stream(a, interface, device)
    if producer is None:
        return
    launch = cupy.cuda.get_current_stream(device).ptr
    if same_stream(producer, launch):
        return
    runtime = cupy.cuda.runtime
    with cupy.cuda.Device(device):
        event = _event(runtime, device)
        runtime.eventRecord(event, producer)
        runtime.streamWaitEvent(launch, event, 0)
    if is_torch(a):
        a.record_stream(_torch_stream(launch, device))


class _Events(threading.local):
    """One event per thread and GPU, recorded again for each wait: a wait waits for the
    record made before it, and a record by another thread between the two would be the
    wrong one."""

    def __init__(self) -> None:
        self.by_device: dict[int, int] = {}


_EVENTS = _Events()


def _event(runtime: Any, device: int) -> int:
    event = _EVENTS.by_device.get(device)
    if event is None:
        event = _EVENTS.by_device[device] = runtime.eventCreateWithFlags(_DISABLE_TIMING)
    return event


_TORCH_STREAMS: dict[tuple[int, int], Any] = {}


def _torch_stream(pointer: int, device: int) -> Any:
    """The launch stream as PyTorch's ``ExternalStream`` (made once per stream)."""
    stream = _TORCH_STREAMS.get((pointer, device))
    if stream is None:
        import torch
        if len(_TORCH_STREAMS) >= _MOST_TORCH_STREAMS:
            _TORCH_STREAMS.clear()
        stream = _TORCH_STREAMS[(pointer, device)] = torch.cuda.ExternalStream(
            pointer, device=device)
    return stream
