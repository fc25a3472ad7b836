"""Tiled matrix multiplication in workgroup-local memory, with barriers inside a loop.
Run: python examples/matmul.py"""

import numpy as np

import tapegrad as tg

TILE = 16   # a module-level constant: frozen into the kernel at compile time


@tg.kernel
def matmul(C, A, B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    tile_a = tg.localmem(A.dtype, (TILE, TILE))    # shared by the work-items of one workgroup
    tile_b = tg.localmem(A.dtype, (TILE, TILE))
    acc = 0.0                                      # lives across the barriers: tapegrad keeps
    for t in range(A.shape[1] // TILE):            # one slot per work-item for you
        tile_a[li, lj] = A[i, t * TILE + lj]
        tile_b[li, lj] = B[t * TILE + li, j]
        tg.synchronize()                           # every tile element is loaded
        for k in range(TILE):
            acc += tile_a[li, k] * tile_b[k, lj]
        tg.synchronize()                           # everyone is done with this tile
    C[i, j] = acc


# For large products a BLAS call with its rule by hand is faster than any generated adjoint
# (docs/performance.md: the tiled kernel's adjoint scatters each group's partial sums).
blas_matmul = tg.register_adjoint(
    np.matmul, reverse=lambda C_bar, A, B: (C_bar @ B.T, A.T @ C_bar))


def loss_kernel(A, B, W):
    C = np.zeros((A.shape[0], B.shape[1]))
    matmul(tg.CPU(), (TILE, TILE))(C, A, B, ndrange=C.shape)
    return tg.dot(C, W)


def loss_blas(A, B, W):
    return tg.dot(blas_matmul(A, B), W)


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    A, B = rng.random((64, 48)), rng.random((48, 32))
    C = np.zeros((64, 32))
    matmul(tg.CPU(), (TILE, TILE))(C, A, B, ndrange=C.shape)
    print("max |C - A @ B| =", np.abs(C - A @ B).max())
    assert np.allclose(C, A @ B)

    # <C, W> with C = A B: dA = W B^T, dB = A^T W, from the generated adjoint and from BLAS
    W = rng.standard_normal(C.shape)
    dA, dB = tg.gradient(lambda A, B: loss_kernel(A, B, W), A, B)
    dA_blas, dB_blas = tg.gradient(lambda A, B: loss_blas(A, B, W), A, B)
    for got in (dA, dA_blas):
        assert np.allclose(got, W @ B.T)
    for got in (dB, dB_blas):
        assert np.allclose(got, A.T @ W)
    print("gradients of <A B, W>: generated adjoint and BLAS rule agree with W B^T, A^T W")
