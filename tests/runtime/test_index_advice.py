"""What a refused out-of-range launch tells the user to write (runtime/bounds.py): an index
that depends on the work-item gets "launch over the extent, or guard it"; a constant index
gets advice that fits it: a negative one does not count from the end as in NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def minus_ends(B, A, n):
    i = tg.index()
    B[i] = A[i] + A[n] - A[-1]


def test_a_negative_constant_index_does_not_wrap_and_the_last_element_is_shown():
    with pytest.raises(tg.KernelIndexError) as info:
        minus_ends(CPU)(np.zeros(4), np.arange(4.0), 0, ndrange=4)
    message = str(info.value)
    assert "A[-1] would index A from -1 to -1" in message
    assert "never wrap around" in message and "write A[A.shape[0] - 1]" in message
    assert "guard the access" not in message and "ndrange=A.shape" not in message


def test_a_constant_index_past_the_end_is_not_helped_by_another_ndrange():
    with pytest.raises(tg.KernelIndexError) as info:
        minus_ends(CPU)(np.zeros(4), np.arange(4.0), 4, ndrange=4)
    message = str(info.value)
    assert "A[n] would index A from 4 to 4" in message
    assert "no ndrange brings it in range; its last index is A.shape[0] - 1" in message


def test_an_index_of_the_work_item_gets_the_extent_and_the_guard():
    with pytest.raises(tg.KernelIndexError, match=r"A\[i\] would index A from 0 to 7.*"
                       r"Launch over the array's extent \(e.g. ndrange=A.shape\) or guard "
                       r"the access \(if i < A.shape\[0\]:\)"):
        minus_ends(CPU)(np.zeros(8), np.arange(4.0), 0, ndrange=8)
