"""The seed's first attempt — calling autodiff *inside* a kernel — and the error tapegrad
gives instead of a compiler crash.  Run: python examples/seed_autodiff_in_kernel.py"""

import math

import numpy as np

import tapegrad as tg


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def grad_sin_kernel(dA, dB, A, B):   # the mistake: a kernel that tries to differentiate
    tg.autodiff(tg.Reverse, sin_kernel, tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA))


if __name__ == "__main__":
    A, B = np.random.default_rng(0).random(8), np.zeros(8)
    dA, dB = tg.make_zero(A), np.ones(8)
    try:
        grad_sin_kernel(tg.CPU())(dA, dB, A, B, ndrange=8)
    except tg.KernelSyntaxError as err:
        print("tapegrad says:", err)
        assert "differentiate that" in str(err)
    else:
        raise SystemExit("expected a KernelSyntaxError")
    # what to write instead: differentiate the host function (see seed_active_return.py)
