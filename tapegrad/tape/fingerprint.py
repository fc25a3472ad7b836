"""A cheap change detector for arrays a tape read: a 64-bit hash of their bytes.

A tape fingerprints each input it read that user code can still reach, once when the recording
ends and once before the gradient, to catch arrays changed in between.  The check is paid on
every gradient, so it must run at memory speed, which this compiled loop does and
``zlib.crc32`` does not (measured: CHANGELOG.md, 'the figures that moved').

Each 8-byte word is mixed with its position through splitmix64's finaliser (every output bit
depends on every input bit), then the results are summed.  The mixing is a bijection of the
word for a fixed position, so changing any one word always changes the sum; changes to several
words go unnoticed only if their mixed terms cancel, which for a finaliser this thorough is
as unlikely as a collision of random 64-bit values.  (A single multiply was not thorough
enough: flipping the signs of two elements changed their terms by exactly 2^63 each, and
they cancelled.)  It guards against mistakes, not adversaries.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from tapegrad.backends import registry
from tapegrad.backends.numba_cache import njit

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)    # the constants of splitmix64
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(nogil=True)
def _hash_words(words: np.ndarray) -> np.uint64:
    total = np.uint64(0)
    for i in range(words.size):       # (a sum of independent terms: LLVM vectorises it)
        z = words[i] + np.uint64(i + 1) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        total += z ^ (z >> np.uint64(31))
    return total


def fingerprint(x: Any) -> Any:
    """A hash of the contents of array ``x``, equal for equal contents: an int for NumPy
    arrays, computed where the array lives for a kind of array that can (a one-element CuPy
    array for GPU arrays: ``tapegrad/backends/cuda/fingerprint.py``), else of a host copy.

    >>> import numpy as np
    >>> a = np.arange(5.0)
    >>> before = fingerprint(a)
    >>> a[3] = -1.0
    >>> fingerprint(a) != before
    True
    """
    if isinstance(x, np.ndarray):
        host = x
    else:
        kind = registry.kind_of(x)
        on_device = kind.fingerprint(x) if kind is not None else None
        if on_device is not None:
            return on_device
        host = kind.to_numpy(x) if kind is not None else x.get()
    data = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
    whole = data.size // 8 * 8
    h = int(_hash_words(data[:whole].view(np.uint64))) if whole else 0
    if whole < data.size:             # the last few bytes of an odd-sized array
        h ^= zlib.crc32(data[whole:]) << 32
    return h
