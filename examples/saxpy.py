"""saxpy: Y = a * X + Y, the smallest useful kernel.  Run: python examples/saxpy.py"""

import numpy as np

import tapegrad as tg


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()                     # this work-item's global linear index
    Y[i] = a * X[i] + Y[i]


if __name__ == "__main__":
    X = np.arange(10, dtype=np.float32)
    Y = np.ones(10, dtype=np.float32)
    expected = 2.0 * X + Y
    saxpy(tg.get_backend(Y), 64)(Y, 2.0, X, ndrange=Y.size)   # kern(backend, workgroupsize)(args..., ndrange=)
    assert np.allclose(Y, expected) and Y.dtype == np.float32  # a float literal/argument keeps float32 data float32
    print("saxpy:", Y)
    print(saxpy.source(backend=tg.CPU()))                      # the code that actually ran
