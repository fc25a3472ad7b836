"""The tape's fingerprint of a GPU array computed on the GPU: the same hash as the host's
(``tapegrad.tape.fingerprint``: each 8-byte word mixed with its position by splitmix64's
finaliser, the results summed), so a tape watching CuPy arrays copies none of them to the host.
The result stays on the GPU (a one-element CuPy array) until the tape compares two of them.

An array whose size is not a multiple of 8 bytes mixes its last bytes in as a last word padded
with zeros (the host uses CRC-32 for them), so such fingerprints equal each other on the GPU
but not the host's.  The sum is modulo 2^64, so the order the blocks add in does not change it.
"""

from __future__ import annotations

import functools
from typing import Any

from tapegrad.backends.cuda.device import limits_of, load_function
from tapegrad.backends.cuda.nvrtc import compile_cuda

SOURCE = r"""
#define BLOCK 256
extern "C" __global__ void tg_fingerprint(const unsigned char *bytes, const long long n,
                                          unsigned long long *out) {
    const unsigned long long *words = (const unsigned long long *)bytes;
    const long long whole = n / 8;
    unsigned long long total = 0;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= whole;
         i += stride) {
        unsigned long long w = 0;
        if (i < whole) {
            w = words[i];
        } else if (n % 8 == 0) {
            break;
        } else {
            for (long long k = 8 * whole; k < n; k++)
                w |= (unsigned long long)bytes[k] << (8 * (k - 8 * whole));
        }
        unsigned long long z = w + (unsigned long long)(i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        total += z ^ (z >> 31);
    }
    // the block's sum first (the warp's by shuffles, then the warps' in shared memory):
    // one atomic per block instead of one per thread, all on one address
    for (int offset = 16; offset > 0; offset /= 2)
        total += __shfl_down_sync(0xffffffffu, total, offset);
    __shared__ unsigned long long warps[BLOCK / 32];
    if (threadIdx.x % 32 == 0)
        warps[threadIdx.x / 32] = total;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long block = 0;
        for (int w = 0; w < BLOCK / 32; w++)
            block += warps[w];
        atomicAdd(out, block);
    }
}
"""
BLOCK = 256            # (SOURCE's too)
MAX_BLOCKS = 4096       # a grid-stride loop: enough blocks to fill any GPU


@functools.cache
def _function(device: int) -> Any:
    import cupy
    binary = compile_cuda(SOURCE, "tg_fingerprint", limits_of(device).arch)
    with cupy.cuda.Device(device):
        return load_function(cupy, binary, "tg_fingerprint")


def fingerprint(x: Any) -> Any:
    """A one-element CuPy array holding the hash of ``x``'s bytes (computed on ``x``'s GPU, on
    CuPy's current stream; nothing waits for it)."""
    import cupy
    import numpy as np
    data = cupy.ascontiguousarray(cupy.asarray(x))
    if data.data.ptr % 8:           # (a view at an odd offset: its words would be misaligned)
        data = data.copy()
    with data.device:
        out = cupy.zeros(1, np.uint64)
        n = data.nbytes
        if n:
            blocks = min(MAX_BLOCKS, -(-(n // 8 + 1) // BLOCK))
            _function(data.device.id)((blocks,), (BLOCK,), (data, np.int64(n), out))
    return out
