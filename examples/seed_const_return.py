"""The seed's last variant: a Const return and a seeded output shadow give the
vector-Jacobian product dA = J^T dB.  Run: python examples/seed_const_return.py"""

import math

import numpy as np

import tapegrad as tg


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def run_nothing(B, A):               # returns nothing: the return activity is tg.Const
    sin_kernel(tg.get_backend(B))(B, A, ndrange=B.size)


if __name__ == "__main__":
    A = np.random.default_rng(0).random(100)
    B = np.zeros(100)
    dA = tg.make_zero(A)
    dB = np.ones(100)                # the seed: dB = w gives dA = J^T w (here cos(A) * 1)
    tg.autodiff(tg.Reverse, run_nothing, tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA))
    assert np.allclose(dA, np.cos(A))
    assert not dB.any()              # B was overwritten, so its shadow was consumed (zeroed)
    print("dA == cos(A):", np.allclose(dA, np.cos(A)), "  dB consumed:", not dB.any())

    # the same kernel differentiated directly, without a host function
    tg.make_zero_(dA)
    dB[:] = 1
    tg.autodiff(tg.Reverse, sin_kernel(tg.CPU()), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(A, dA), ndrange=B.size)
    assert np.allclose(dA, np.cos(A))
    print(sin_kernel.source(mode="reverse"))       # the generated adjoint kernel
