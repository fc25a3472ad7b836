"""Sums that LLVM can vectorise: the per-workgroup sums of Active scalars' derivatives.

A running ``s += x[k]`` is one chain of dependent floating-point adds (LLVM keeps their order,
as it must without fast-math), so it runs at one add per add-latency.  Eight independent
partial sums, combined pairwise at the end, are eight lanes of one vector add; they are also
at least as accurate as the running sum.
"""

from __future__ import annotations

from tapegrad.backends.numba_cache import njit

# Slots of an Active scalar's sum on the CPU: each task adds its groups' sums into slot
# (task % SUM_SLOTS), and the runtime adds the slots up (a sum that does not depend on which
# thread ran first, up to SUM_SLOTS threads).
SUM_SLOTS = 256


@njit(inline="always", nogil=True)
def group_sum(values):
    """The sum of a 1-D float64 array."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    n = values.size
    k = 0
    while k + 8 <= n:
        s0 += values[k]
        s1 += values[k + 1]
        s2 += values[k + 2]
        s3 += values[k + 3]
        s4 += values[k + 4]
        s5 += values[k + 5]
        s6 += values[k + 6]
        s7 += values[k + 7]
        k += 8
    rest = 0.0
    while k < n:
        rest += values[k]
        k += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) + rest
