"""A local read above its only assignment reads 0 (docs/language.md), in derivatives too:
the adjoint used the value assigned later (a wrong gradient on every backend), and the CPU's
tangent kernel started each work-item from the previous one's value (a wrong primal in its
own launch, and a wrong tangent)."""

import numpy as np
import pytest

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error


@tg.kernel
def read_above(B, A):
    i = tg.index()
    x = A[i] * off          # noqa: F821 - off reads 0 here: it is assigned below
    off = 2.0
    B[i] = x * A[i] + off + A[i] * A[i] * off


@tg.kernel
def tile_offset_read_above(B, A, n):
    i = tg.index()
    li = tg.index(tg.Local)
    g = tg.index(tg.Group)
    gs = tg.groupsize()[0]
    tile = tg.localmem(A.dtype, tg.groupsize())
    acc = 0.0
    for t in range(n):
        tile[li] = A[g * gs + (li + t + off) % gs]     # noqa: F821 - off reads 0 here
        tg.synchronize()
        acc += tile[(li + 1) % gs] * tile[li]
        tg.synchronize()
    off = 1
    B[i] = acc * acc + off


def _reference(kern, A, extra):
    B = np.zeros_like(A)
    kern(tg.CPU(), 4)(B, A.copy(), *extra, ndrange=A.size)
    return B


@pytest.mark.parametrize("kern, extra", [(read_above, []), (tile_offset_read_above, [3])],
                         ids=["plain", "tile"])
def test_a_local_read_above_its_assignment_in_both_modes(backend, kern, extra):
    rng = np.random.default_rng(0)
    A, v = rng.standard_normal(8), rng.standard_normal(8)
    if kern is read_above:      # B = 2 + 2 A^2: the read above the assignment gave 0
        np.testing.assert_allclose(_reference(kern, A, extra), 2.0 + 2.0 * A * A)
    error, _, _ = kernel_vjp_error(kern(backend, 4), [np.zeros(8), A, *extra], 8, wrt=[1],
                                   outputs=[0])
    assert error < 1e-6
    B, dB = np.zeros(8), np.zeros(8)
    tg.autodiff(tg.Forward, kern(backend, 4), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A.copy(), v.copy()), *extra, ndrange=8)
    h = 1e-6
    fd = (_reference(kern, A + h * v, extra) - _reference(kern, A - h * v, extra)) / (2 * h)
    np.testing.assert_allclose(B, _reference(kern, A, extra), rtol=1e-13)
    np.testing.assert_allclose(dB, fd, rtol=1e-6, atol=1e-8)
