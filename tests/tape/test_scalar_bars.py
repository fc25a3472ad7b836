"""Active scalars' gradients summed on the device for a whole sweep (tapegrad/tape/bars.py):
one accumulator per scalar, backend and parameter, read once when the scalar's adjoint is
asked for, giving what reading each launch's sum did (central differences)."""

from __future__ import annotations

import numpy as np
import pyopencl  # noqa: F401   (a test dependency: OpenCL runs on PoCL)
import pytest

import tapegrad as tg
from tapegrad.tape.bars import ScalarBars


@tg.kernel
def scaled_add(Out, U, a):
    i = tg.index()
    Out[i] = U[i] + a * U[i] * U[i]


class Counting:
    """A backend whose arrays are NumPy's, counting what the bars read back."""

    scalar_sum_size = 4

    def __init__(self):
        self.reads = 0

    def zeros(self, dtype, n):
        return np.zeros(n, dtype)

    def to_numpy(self, x):
        self.reads += 1
        return x


def test_sums_are_read_once_when_asked_for():
    backend, bars = Counting(), ScalarBars()
    for k in range(10):                 # ten launches adding into one accumulator
        bars.accumulator(7, backend, "a")[k % 4] += 0.5
    bars.accumulator(7, backend, "b")[0] += 1.0        # another parameter: its own array
    assert bars.accumulator(7, backend, "a") is bars.accumulator(7, backend, "a")
    assert backend.reads == 0 and 7 in bars
    bars[3] = 2.0
    assert bars.get(7, 0.0) == 6.0 and backend.reads == 2
    assert bars[7] == 6.0 and backend.reads == 2        # settled: not read again
    bars.accumulator(7, backend, "a")[0] += 1.0          # (a launch after the read)
    bars[7] = bars.get(7, 0.0) + 1.0
    assert bars[7] == 8.0 and bars.get(3) == 2.0 and bars.get(4, 0.0) == 0.0


@pytest.mark.parametrize("backend", [tg.CPU(), tg.OpenCL()], ids=["cpu", "opencl"])
def test_a_scalar_active_in_many_launches_gets_its_whole_gradient(backend):
    rng = np.random.default_rng(4)
    u0 = rng.random(64) * 0.1

    def loss(u, a):
        for _ in range(12):
            out = tg.make_zero(u)
            scaled_add(backend)(out, u, a, ndrange=64)
            u = out
        return tg.sum(u)

    def at(u_host, a):
        return float(loss(backend.asarray(u_host), a))

    g_u, g_a = tg.gradient(loss, backend.asarray(u0), 0.3)
    h = 1e-6
    assert g_a == pytest.approx((at(u0, 0.3 + h) - at(u0, 0.3 - h)) / (2 * h), rel=1e-6)
    e = np.zeros(64)
    e[5] = h
    assert backend.to_numpy(g_u)[5] == pytest.approx((at(u0 + e, 0.3) - at(u0 - e, 0.3)) /
                                                     (2 * h), rel=1e-6)
