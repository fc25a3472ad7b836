"""What a CUDA launch may ask of its GPU, checked with tapegrad's errors before the driver
fails with its own: threads per block (fewer where a kernel uses many registers), shared
memory per block, and blocks along each grid dimension.

>>> h200 = DeviceLimits("H200", 90, 1024, (1024, 1024, 64), (2**31 - 1, 65535, 65535), 232448)
>>> launch_shape((1000, 3), (16, 16), h200)     # (x, y, z): the last dimension along x
(1, 63, 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tapegrad.errors import KernelCompileError, LaunchError
from tapegrad.frontend.types import TypedKernel

_AXES = "xyz"


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    arch: int                          # compute capability, as 90 for sm_90
    max_threads: int                   # threads per block
    max_block: tuple[int, int, int]    # threads along x, y, z of a block
    max_grid: tuple[int, int, int]     # blocks along x, y, z
    max_shared: int                    # bytes of shared memory a block may opt in to


def launch_shape(ndrange: tuple[int, ...], groupsize: tuple[int, ...],
                 limits: DeviceLimits, items: int = 1) -> tuple[int, int, int]:
    """The grid (blocks along x, y, z) covering ``ndrange``, a block taking ``items``
    workgroups of dimension 0 (``c/items.py``); a LaunchError past the GPU's."""
    rank = len(ndrange)
    grid = [1, 1, 1]
    for k in range(rank):
        axis = rank - 1 - k
        blocks = -(-ndrange[k] // groupsize[k])
        if k == 0:
            blocks = -(-blocks // items)
        if blocks > limits.max_grid[axis]:
            raise _too_many_blocks(ndrange, groupsize, k, blocks, limits, items)
        grid[axis] = blocks
    return grid[0], grid[1], grid[2]


def _too_many_blocks(ndrange: tuple[int, ...], groupsize: tuple[int, ...], k: int, blocks: int,
                     limits: DeviceLimits, items: int) -> LaunchError:
    axis = len(ndrange) - 1 - k
    what = f"blocks of {items} workgroups" if items > 1 and k == 0 else "workgroups"
    return LaunchError(
        f"ndrange {ndrange} with groupsize {groupsize} needs {blocks} {what} along its "
        f"dimension {k}, which runs along CUDA's grid {_AXES[axis]}: {limits.name} allows "
        f"{limits.max_grid[axis]} there. Put the longest dimension last (it runs along x, "
        f"which allows {limits.max_grid[0]}) or give dimension {k} a larger groupsize.")


def check_function(tk: TypedKernel, limits: DeviceLimits, shared_bytes: int, max_threads: int,
                   registers: int) -> None:
    """Refuse a compiled kernel whose workgroup the GPU cannot run: too much shared memory, or
    more threads than its registers allow."""
    items = math.prod(tk.groupsize)
    where = f"{tk.name} ({tk.ir.filename}:{tk.ir.lineno})"
    rank = len(tk.groupsize)
    for k, n in enumerate(tk.groupsize):
        axis = rank - 1 - k
        if n > limits.max_block[axis]:
            raise KernelCompileError(
                f"{where}: groupsize {tk.groupsize} puts {n} work-items along dimension {k}, "
                f"which runs along CUDA's block {_AXES[axis]}: {limits.name} allows "
                f"{limits.max_block[axis]} there. Put the larger sizes last (the last "
                f"dimension runs along x, which allows {limits.max_block[0]}).")
    if shared_bytes > limits.max_shared:
        raise KernelCompileError(
            f"{where}: a workgroup of groupsize {tk.groupsize} needs {shared_bytes} bytes of "
            f"local memory (tg.localmem, with what its adjoint adds), and {limits.name} gives a "
            f"workgroup at most {limits.max_shared}. Use a smaller groupsize or tile, or "
            "float32 tiles.")
    if items > max_threads:
        raise KernelCompileError(
            f"{where}: compiled for {limits.name} it uses {registers} registers per "
            f"work-item, so a workgroup may have at most {max_threads} work-items, not "
            f"{items} (groupsize {tk.groupsize}). Launch it with a smaller groupsize.")
