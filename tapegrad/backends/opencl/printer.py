"""OpenCL C as the C printer writes it, with an element offset per array argument.

OpenCL passes a buffer, never a pointer into one: a view that starts inside its buffer
(``x[3:]``, a row ``A[1]`` of a 2-D array) needs its start passed beside the buffer.  A
sub-buffer would need the start aligned to the device's ``CL_DEVICE_MEM_BASE_ADDR_ALIGN`` (1024
bits on PoCL, so ``x[3:]`` of doubles would not do); an offset argument takes any view.  Each
array argument of the kernel is followed by its offset in elements, and the kernel moves the
pointer first, so the body indexes every array from 0 as the CUDA dialect's does:

    __kernel void saxpy(__global double *Y, const long Y__offset, const long Y_shape0, ...) {
        Y += Y__offset;
        ...

(``__`` belongs to tapegrad's names: no parameter of the user's can be ``Y__offset``.)  Device
functions take the moved pointers and print as the C printer writes them.
"""

from __future__ import annotations

from tapegrad.backends.c.printer import OPENCL, CPrinter
from tapegrad.errors import KernelCompileError
from tapegrad.frontend.types import Array, TypedKernel


def offset_name(param: str) -> str:
    """The kernel parameter holding array ``param``'s offset in elements."""
    return f"{param}__offset"


def offset_arrays(tk: TypedKernel) -> list[str]:
    """The kernel's array parameters (each takes an offset; a kernel's arrays are global)."""
    return [p for p, t in zip(tk.ir.params, tk.argtypes) if isinstance(t, Array)]


class OpenCLPrinter(CPrinter):
    """The C printer in the OpenCL dialect, with the kernel's arrays' offsets (see above)."""

    def __init__(self, tk: TypedKernel, items: int | None = None, restrict: bool = False):
        super().__init__(tk, OPENCL, items=items, restrict=restrict)

    def _params(self, tk: TypedKernel, entry: bool = False, restrict: bool = False
                ) -> list[str]:
        params = super()._params(tk, entry, restrict)
        if not entry:                      # (device functions take moved pointers)
            return params
        out, arrays = [], offset_arrays(tk)
        for text in params:
            out.append(text)
            if arrays and "*" in text and text.split()[-1].lstrip("*") == arrays[0]:
                out.append(f"const {self.d.int64} {offset_name(arrays.pop(0))}")
        if arrays:
            raise KernelCompileError(f"{tk.name}: tapegrad's bug: the OpenCL printer found no "
                                     f"pointer for argument {arrays[0]} to give an offset")
        return out

    def _prologue(self) -> list[str]:
        return [f"    {p} += {offset_name(p)};" for p in offset_arrays(self.tk)]
