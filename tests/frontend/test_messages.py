"""Frontend errors found in a review: unpacking a per-dimension intrinsic into more names
than the launch has dimensions says the launch's rank (frontend/types.py); a lambda made a
kernel or device function is refused at the user's line (a StopIteration escaped)."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def rows(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = A[i, j]


def test_unpacking_two_indices_of_a_1d_launch_says_its_ndrange_is_1d():
    with pytest.raises(tg.KernelTypeError) as info:
        rows(tg.CPU())(np.zeros((4, 4)), np.ones((4, 4)), ndrange=4)
    assert ("cannot unpack (int64) into 2 names: this launch's ndrange is 1-D, so "
            "tg.index(tg.Global, tg.NTuple) gives 1 value; launch with a 2-D ndrange "
            "(ndrange=(n0, n1))") in str(info.value)
    assert info.value.text.strip() == "i, j = tg.index(tg.Global, tg.NTuple)"


@pytest.mark.parametrize("make", [tg.kernel, tg.func], ids=["kernel", "func"])
def test_a_lambda_is_refused_at_its_line(make):
    with pytest.raises(tg.KernelSyntaxError, match="defined with def, not lambda") as info:
        make(lambda x: x)
    assert info.value.filename == __file__
    assert "make(lambda x: x)" in info.value.text
