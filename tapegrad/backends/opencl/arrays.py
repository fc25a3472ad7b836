"""The OpenCL backend's arrays: PyOpenCL's ``pyopencl.array.Array``, on the backend's queue."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from tapegrad.backends.opencl.buffers import buffer_of, to_host
from tapegrad.backends.registry import MARK, ArrayKind
from tapegrad.errors import LaunchError, TapegradError


class OpenCLArrays(ArrayKind):
    name = "opencl"
    views_know_their_base = False

    def owns(self, x: Any) -> bool:
        # (by module, so that asking costs no import of pyopencl where it is not installed)
        return type(x).__module__.startswith("pyopencl") and hasattr(x, "base_data")

    def memory(self, x: Any) -> Any:
        return x.base_data

    def check_operable(self, x: Any, what: str) -> None:
        if x.size and not x.flags.c_contiguous:
            raise TapegradError(
                f"{what} got a view of an OpenCL array that skips elements (shape "
                f"{tuple(x.shape)}, strides {tuple(x.strides)}), which PyOpenCL cannot operate "
                "on; pass a contiguous array (a view may start anywhere: x[3:], A[1]), or a "
                "contiguous copy made on the host: tg.asarray(backend, tg.to_numpy(x))")

    def device(self, x: Any) -> Any:
        """The OpenCL device ``x`` lives on (its queue's)."""
        if x.queue is None:
            raise LaunchError("a PyOpenCL array without a queue (queue=None) has no device "
                              "to launch on; make it on tg.OpenCL(k).queue, or give it one: "
                              "x.with_queue(tg.OpenCL(k).queue)")
        return x.queue.device

    def launch_key(self, x: Any) -> tuple:
        # (its queue: a launch plan's guards then refuse another queue's arrays)
        return (type(x), np.dtype(x.dtype).num, x.ndim, x.queue)

    def module(self) -> Any:
        from tapegrad.backends.opencl.device import default_arrays
        return default_arrays()

    def address(self, x: Any) -> int:
        # OpenCL 1.2 shows no device addresses: each buffer gets a range of its own (its
        # handle times 2**48, wider than any buffer), offsets within it are real, so that
        # arrays overlap exactly when they share memory (a tape's identities, the shadows'
        # overlap check).  A sub-buffer is its parent's memory from its origin on (OpenCL
        # has no sub-buffer of a sub-buffer); asking costs about 0.1 us.  An empty array
        # (PyOpenCL gives it no buffer: base_data None) has no elements and overlaps nothing:
        # its address is its object's, below every buffer's range, so that two empty arrays
        # are two arrays (as NumPy's are) and a view's range is empty (identity.extent)
        # (the same for a buffer made on host memory (USE_HOST_PTR), whose elements are that
        # memory's, as are those of every other buffer made on it: its address is the host's,
        # below every buffer's range)
        if x.base_data is None:
            return id(x)
        buffer = buffer_of(x)
        parent = buffer.get_info(_info().ASSOCIATED_MEMOBJECT)
        origin = x.offset
        if parent is not None:
            origin += buffer.get_info(_info().OFFSET)
            buffer = parent
        if buffer.flags & _mem_flags().USE_HOST_PTR:
            return buffer.get_host_array((1,), np.uint8).ctypes.data + origin
        return (buffer.int_ptr << 48) + origin

    def to_numpy(self, x: Any) -> np.ndarray:
        return to_host(x)

    def upload(self, x: Any, host: np.ndarray) -> None:
        x.set(host)

    # tg.debug_nans (runtime/nans.py): on the device; one number comes back
    def snapshot(self, x: Any) -> Any:
        return x.copy()

    def mark_nonfinite(self, x: Any) -> None:
        _elementwise("mark", x, x)

    def first_new_nonfinite(self, before: Any, after: Any, marked: bool = False) -> int | None:
        if not after.size:
            return None       # (nothing to look at; an empty array has no buffer)
        # (a view inside its buffer is copied first: the kernel reads from the buffer's start)
        a = after.copy() if after.offset else after
        found = _first_bad(before, a, marked)
        return None if found == _NONE else found

    def unmark(self, x: Any, before: Any) -> None:
        _elementwise("unmark", x, before)

    def element(self, x: Any, flat: int) -> float:
        return x.reshape(-1)[flat:flat + 1].get()[0].item()

    def restore(self, x: Any, before: Any) -> None:
        if not x.nbytes:
            return            # (nothing to copy; an empty array has no buffer)
        import pyopencl as cl
        cl.enqueue_copy(x.queue, x.base_data, before.base_data, byte_count=x.nbytes,
                        dst_offset=x.offset, src_offset=before.offset)


_NONE = 2**62       # (no element found: the reductions' neutral value)

# Each work-item tests one element (a NaN or an infinity that was not that value before) and
# each workgroup keeps its smallest such index; the groups' results are reduced again, by
# the second kernel, until one number is left (no PyOpenCL template engine needed).
_SOURCE = """
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define NONE ((long)%(none)d)
#define REDUCE(v)                                                           \\
    __local long part[%(group)d];                                          \\
    size_t l = get_local_id(0);                                            \\
    part[l] = (v);                                                         \\
    barrier(CLK_LOCAL_MEM_FENCE);                                          \\
    for (size_t s = %(group)d / 2; s > 0; s >>= 1) {                         \\
        if (l < s) part[l] = min(part[l], part[l + s]);                    \\
        barrier(CLK_LOCAL_MEM_FENCE);                                      \\
    }                                                                      \\
    if (l == 0) out[get_group_id(0)] = part[0];

__kernel void first_bad(__global const %(t)s *b, __global const %(t)s *a, ulong n,
                        int marked, __global long *out) {
    size_t i = get_global_id(0);
    long v = NONE;
    if (i < n) {
        %(t)s x = a[i], y = b[i];
        if (!isfinite(x) && (marked ? as_%(u)s(x) != %(mark)s
                                    : !(x == y || (isnan(x) && isnan(y))))) v = (long)i;
    }
    REDUCE(v)
}

/* an array the launch only writes: its non-finite elements get tapegrad's NaN (MARK) */
__kernel void mark(__global %(t)s *x, __global const %(t)s *unused, ulong off, ulong n) {
    size_t i = get_global_id(0);
    if (i < n && !isfinite(x[off + i])) x[off + i] = as_%(t)s((%(u)s)%(mark)s);
}

/* ... and after the launch, those still holding it (not written) get their old value */
__kernel void unmark(__global %(t)s *x, __global const %(t)s *b, ulong off, ulong n) {
    size_t i = get_global_id(0);
    if (i < n && as_%(u)s(x[off + i]) == %(mark)s) x[off + i] = b[i];
}

__kernel void smallest(__global const long *x, ulong n, __global long *out) {
    size_t i = get_global_id(0);
    REDUCE(i < n ? x[i] : NONE)
}
"""


@functools.cache
def _kernels(context: Any, dtype: np.dtype, group: int) -> dict[str, Any]:
    import pyopencl as cl
    ctype, utype = {np.dtype(np.float64): ("double", "ulong"),
                    np.dtype(np.float32): ("float", "uint")}[dtype]
    mark = f"{MARK[dtype.itemsize]:#x}" + ("UL" if dtype.itemsize == 8 else "U")
    program = cl.Program(context, _SOURCE % {"t": ctype, "u": utype, "mark": mark,
                                             "group": group, "none": _NONE}).build()
    return {name: cl.Kernel(program, name)
            for name in ("first_bad", "smallest", "mark", "unmark")}


def _group(queue: Any) -> int:
    return 1 << min(8, queue.device.max_work_group_size.bit_length() - 1)


def _elementwise(name: str, x: Any, other: Any) -> None:
    """The ``mark`` or ``unmark`` kernel over ``x`` (a view: its offset in elements)."""
    if not x.size:
        return            # (no work-items: OpenCL refuses an empty launch)
    queue, group = x.queue, _group(x.queue)
    kernel = _kernels(x.context, np.dtype(x.dtype), group)[name]
    groups = -(-x.size // group)
    kernel(queue, (groups * group,), (group,), x.base_data, other.base_data,
           np.uint64(x.offset // x.dtype.itemsize), np.uint64(x.size))


def _first_bad(before: Any, after: Any, marked: bool) -> int:
    """The smallest flat index of a new NaN or infinity of ``after`` (``_NONE``: none)."""
    import pyopencl.array as cla
    queue, n = after.queue, after.size
    group = _group(queue)
    kernels = _kernels(after.context, np.dtype(after.dtype), group)
    first_bad, smallest = kernels["first_bad"], kernels["smallest"]
    groups = -(-n // group)
    out = cla.empty(queue, groups, np.int64)
    first_bad(queue, (groups * group,), (group,), before.base_data, after.base_data,
              np.uint64(n), np.int32(marked), out.base_data)
    while out.size > 1:
        n, groups = out.size, -(-out.size // group)
        smaller = cla.empty(queue, groups, np.int64)
        smallest(queue, (groups * group,), (group,), out.base_data, np.uint64(n),
                 smaller.base_data)
        out = smaller
    return int(out.get()[0])


OPENCL_ARRAYS = OpenCLArrays()


@functools.cache
def _info() -> Any:
    """PyOpenCL's ``mem_info`` (imported where an OpenCL array is first asked about)."""
    import pyopencl as cl
    return cl.mem_info


@functools.cache
def _mem_flags() -> Any:
    import pyopencl as cl
    return cl.mem_flags
