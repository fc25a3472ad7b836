"""Block reduction: a tree sum per workgroup in local memory, then one atomic add per group.
Run: python examples/reduction.py"""

import numpy as np

import tapegrad as tg


@tg.kernel
def block_sum(total, x):
    li = tg.index(tg.Local)
    gi = tg.index()
    partial = tg.localmem(x.dtype, tg.groupsize())
    partial[li] = x[gi] if gi < x.size else 0.0    # the ndrange is rounded up to whole groups
    tg.synchronize()
    stride = tg.groupsize()[0] // 2                # the same for the whole group, so the
    while stride > 0:                              # loop may contain a barrier
        if li < stride:
            partial[li] += partial[li + stride]
        tg.synchronize()
        stride //= 2
    if li == 0:
        tg.atomic_add(total, 0, partial[0])        # a real atomic: groups run in parallel


if __name__ == "__main__":
    x = np.random.default_rng(0).random(10_000)
    total = np.zeros(1)
    wg = 128
    block_sum(tg.CPU(), wg)(total, x, ndrange=-(-x.size // wg) * wg)
    print(f"sum = {total[0]:.6f}, numpy says {x.sum():.6f}")
    assert np.isclose(total[0], x.sum())
