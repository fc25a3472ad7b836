"""The seed question, answered: differentiate a host function that launches a kernel and
returns a scalar (tg.Active return).  Run: python examples/seed_active_return.py

In Julia this is Enzyme.autodiff(Reverse, cos_run!, Active, DuplicatedNoNeed(B, dB),
Duplicated(A, dA)) with cos_run! returning sum(B).
"""

import math

import numpy as np

import tapegrad as tg


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


def run(B, A):                       # a host function: launches the kernel, returns a scalar
    sin_kernel(tg.get_backend(B))(B, A, ndrange=B.size)
    return tg.sum(B)                 # a differentiable reduction: the Active return


if __name__ == "__main__":
    A = np.random.default_rng(0).random(100)
    B = np.zeros(100)
    dA, dB = tg.make_zero(A), tg.make_zero(B)     # shadows accumulate: start them at zero
    print(tg.autodiff(tg.Reverse, run, tg.Active, tg.DuplicatedNoNeed(B, dB), tg.Duplicated(A, dA)))
    assert np.allclose(dA, np.cos(A))
    print("dA == cos(A):", np.allclose(dA, np.cos(A)))

    # the same with a tape: wrap the code, then ask for gradients
    with tg.Tape() as tape:
        loss = run(B, A)
    (gA,) = tape.gradient(loss, [A])
    assert np.allclose(gA, np.cos(A))
