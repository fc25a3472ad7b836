"""What the OpenCL C and CUDA C++ dialects of one kernel may differ by (the tests compare
every kernel's two sources through these)."""

from __future__ import annotations

import re


def without_atomic_helpers(source: str) -> str:
    """The source without the atomics' helper functions, whose bodies differ as the two
    languages' atomic instructions do (a compare-and-swap loop where one has none; CUDA's
    warp sums before an Active scalar's atomic), and without preprocessor lines (OpenCL's
    pragmas, CUDA's names for inf and NaN)."""
    kept, skipping = [], False
    for ln in source.splitlines():
        if ln.startswith("#"):
            continue
        if ln.startswith("static") and (" tg_atomic_" in ln or " tg_group_add_" in ln):
            skipping = ln.endswith("{")         # (a helper of several lines, to its "}")
        elif skipping:
            skipping = ln != "}"
        else:
            kept.append(ln)
    return "\n".join(kept)


def as_cuda(opencl: str) -> str:
    """The OpenCL C source with each of the dialects' differences respelled as CUDA's."""
    text = "\n".join(ln for ln in opencl.splitlines() if not ln.startswith("#pragma"))
    text = text.replace("for opencl:", "for cuda:")
    text = re.sub(r"(?<!\w)__global ", "", text)
    text = text.replace("__kernel void", 'extern "C" __global__ void')
    # (one work-item's body, c/items.py: CUDA inlines it always; restrict pointers)
    text = text.replace("static inline void tg_item(",
                        "static __device__ __forceinline__ void tg_item(")
    text = text.replace(" *restrict ", " *__restrict__ ")
    text = text.replace("static inline", "static __device__ inline")
    text = re.sub(r"^static (\w+ \w+\()", r"static __device__ \1", text, flags=re.M)
    text = re.sub(r"(?<!\w)__local ", "__shared__ ", text)
    text = text.replace("barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);", "__syncthreads();")
    text = re.sub(r"\blong\b", "long long", text)
    text = re.sub(r"(?<![\w.])(\d+)L\b", r"\1LL", text)      # (int64 literals)
    text = re.sub(r"\buchar\b", "unsigned char", text)
    axes = "xyz"
    text = re.sub(r"get_local_id\((\d)\)", lambda m: f"threadIdx.{axes[int(m.group(1))]}", text)
    return re.sub(r"get_group_id\((\d)\)", lambda m: f"blockIdx.{axes[int(m.group(1))]}", text)
