"""What OpenCL C and CUDA C++ spell differently, and the names C keeps for itself.

A ``Dialect`` holds the spellings (qualifiers, the work-item's coordinates, barriers); every
other part of the printer is the same for both.  A kernel or variable named as C, OpenCL C or
CUDA reserves is renamed in the generated text (``step`` -> ``step_kernel``, a local ``half``
-> ``half_``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """What OpenCL C and CUDA C++ spell differently."""

    name: str
    kernel: str              # what starts a kernel's definition
    function: str            # ... and a device function's
    global_ptr: str          # the qualifier of a pointer to global memory
    int64: str
    int64_suffix: str        # of an int64 literal (CUDA's long is 32-bit on Windows hosts)
    preamble: str            # pragmas and includes
    local_id: str            # "{}" is the device dimension
    group_id: str
    local_memory: str        # the qualifier of workgroup-shared memory
    local_ptr: str           # ... of a pointer to it (CUDA's pointers are generic)
    barrier: str
    restrict: str            # the qualifier of a pointer no other parameter's overlaps
    item_function: str       # what starts the definition of one work-item's body (items.py)

    def ctype(self, dtype: str) -> str:
        return {"float64": "double", "float32": "float", "int64": self.int64,
                "int32": "int", "bool": "bool"}[dtype]

    def element_type(self, dtype: str) -> str:
        """An array's element type (bool arrays hold bytes)."""
        return "uchar" if dtype == "bool" and self.name == "opencl" else \
            "unsigned char" if dtype == "bool" else self.ctype(dtype)


OPENCL = Dialect(
    name="opencl", kernel="__kernel void", function="static", global_ptr="__global ",
    int64="long", int64_suffix="L",
    # (no contraction into fma: the results are the CPU's and Python's, rounded per operation)
    preamble="#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#pragma OPENCL FP_CONTRACT OFF",
    local_id="get_local_id({})", group_id="get_group_id({})", local_memory="__local ",
    local_ptr="__local ", barrier="barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);",
    restrict="restrict", item_function="static inline")

CUDA = Dialect(
    name="cuda", kernel='extern "C" __global__ void', function="static __device__",
    global_ptr="", int64="long long", int64_suffix="LL",
    # (NVRTC has no math.h: C's names for the infinite and NaN floats, as CUDA's bits)
    preamble="#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
             "#ifndef NAN\n#define NAN __int_as_float(0x7fffffff)\n#endif",
    local_id="threadIdx.{}", group_id="blockIdx.{}", local_memory="__shared__ ",
    local_ptr="", barrier="__syncthreads();", restrict="__restrict__",
    item_function="static __device__ __forceinline__")

CUDA_AXES = "xyz"

# Names a kernel may not take in C: keywords and type names of C, OpenCL C and CUDA, and the
# built-in functions of OpenCL C (CUDA's math functions are C's: among them).  A kernel
# named ``step`` or ``dot`` (OpenCL's) or ``exp`` (both) is emitted as ``step_kernel``.
_RESERVED = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool half uchar ushort uint ulong size_t ptrdiff_t
    intptr_t uintptr_t kernel global local constant private read_only write_only read_write
    image2d_t image3d_t sampler_t event_t true false class new delete template this
    acos acosh acospi asin asinh asinpi atan atan2 atanh atanpi atan2pi cbrt ceil copysign
    cos cosh cospi erfc erf exp exp2 exp10 expm1 fabs fdim floor fma fmax fmin fmod fract
    frexp hypot ilogb ldexp lgamma lgamma_r log log2 log10 log1p logb mad maxmag minmag modf
    nan nextafter pow pown powr remainder remquo rint rootn round rsqrt sin sincos sinh sinpi
    sqrt tan tanh tanpi tgamma trunc abs abs_diff add_sat hadd rhadd clamp clz ctz mad_hi
    mad_sat max min mul_hi rotate sub_sat upsample popcount mad24 mul24 degrees mix radians
    step smoothstep sign cross dot distance length normalize isequal isnotequal isgreater
    isgreaterequal isless islessequal islessgreater isfinite isinf isnan isnormal isordered
    isunordered signbit any all bitselect select barrier mem_fence read_mem_fence
    write_mem_fence prefetch printf wait_group_events shuffle shuffle2 assert main
    """.split())
_RESERVED_PREFIXES = ("get_", "atomic_", "atom_", "native_", "half_", "convert_", "as_",
                      "vload", "vstore", "async_", "fast_", "__", "_Z")


# C words the printer writes itself (a variable of that name cannot be renamed in the text)
PRINTED_WORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool uchar threadIdx blockIdx blockDim gridDim
    warpSize tg_item""".split())


def renamed(lines: list[str], names: set[str]) -> list[str]:
    """``lines`` of C with the user's variables in ``names`` (named as C reserves: a local
    ``half``, an argument ``local``) renamed ``<name>_``: every whole word that is one, except
    where it is called (the built-in function of that name: variables are never called)."""
    if not names:
        return lines
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b(?!\s*\()")
    return [line if line.lstrip().startswith("//") else word.sub(r"\1_", line)
            for line in lines]


def kernel_symbol(name: str) -> str:
    """The name kernel ``name`` has in generated C: its own, unless C, OpenCL C or CUDA
    reserves it (a kernel named ``step`` clashed with OpenCL's ``step()``)."""
    reserved = name in _RESERVED or name.startswith(_RESERVED_PREFIXES)
    return f"{name}_kernel" if reserved else name
