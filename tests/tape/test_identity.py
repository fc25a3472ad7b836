"""Array identities: the data pointer read from NumPy's struct is the documented one."""

import sys

import numpy as np

from tapegrad.tape import identity


def test_struct_address_matches_the_array_interface():
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    ro = base.copy()
    ro.flags.writeable = False
    arrays = [base, base[1:, ::2, 3:], base[::-1], base.T, np.asfortranarray(base), ro,
              np.zeros(0), np.float64(3.0) * np.ones((2, 2)), base.view(np.int32),
              np.broadcast_to(np.arange(3.0), (4, 3)), np.rec.array(np.zeros(3, "f8,i4"))[1:],
              np.ma.MaskedArray(np.arange(4.0))[1:], np.arange(5.0)[5:], Sub(np.arange(3.0))]
    for a in arrays:
        assert identity._address(a) == a.__array_interface__["data"][0]
    if sys.implementation.name == "cpython":     # the fast path is taken (its check passed)
        assert identity._numpy_address is not identity._address_by_interface


class Sub(np.ndarray):
    def __new__(cls, a):
        return np.asarray(a).view(cls)
