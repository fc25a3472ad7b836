"""A printed kernel's arguments, packed for its launch: an array is its buffer (however the
device API passes one), then its offset in elements where the dialect takes one (OpenCL's:
``tapegrad/backends/opencl/printer.py``), then its extents; a scalar a NumPy scalar of its C
type.

The packers are made once per compiled kernel, so that a launch does no type dispatch beyond
one call per argument.

>>> import numpy as np
>>> from tapegrad.frontend.types import Array, Scalar
>>> pack = packer(["x", "a"], [Array("float64", 1), Scalar("float64")],
...               buffer=lambda name, x: x.ctypes.data)
>>> values = pack((np.zeros(3), 2.0), (3,))
>>> [type(v).__name__ for v in values][1:], [int(v) for v in values[1:]]
(['int64', 'float64', 'int64'], [3, 2, 3])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tapegrad.frontend.types import Array

SCALAR_TYPES = {"float64": np.float64, "float32": np.float32, "int64": np.int64,
                "int32": np.int32, "bool": np.int32}     # (a bool is passed as a C int)


def packer(params: list[str], types: list[Any], buffer: Callable[[str, Any], Any],
           offset: Callable[[str, Any], int] | None = None) -> Callable[[tuple, tuple], list]:
    """``pack(args, ndrange)``: the launch's argument list; ``buffer(name, array)`` gives what
    the device API takes for an array (and refuses an array the kernel cannot read), and
    ``offset(name, array)``, where given, the array's first element's index in that buffer."""
    steps: list[Callable[[Any, list], None]] = []
    for name, t in zip(params, types):
        if isinstance(t, Array):
            steps.append(_array(name, buffer) if offset is None else
                         _offset_array(name, buffer, offset))
        else:       # (the printer refuses other types before a launch is made)
            steps.append(_scalar(SCALAR_TYPES[t.dtype]))

    def pack(args: tuple, ndrange: tuple) -> list:
        values: list = []
        for step, a in zip(steps, args):
            step(a, values)
        values += map(np.int64, ndrange)
        return values
    return pack


def _array(name: str, buffer: Callable[[str, Any], Any]) -> Callable[[Any, list], None]:
    def step(a: Any, values: list) -> None:
        values.append(buffer(name, a))
        values += map(np.int64, a.shape)
    return step


def _offset_array(name: str, buffer: Callable[[str, Any], Any],
                  offset: Callable[[str, Any], int]) -> Callable[[Any, list], None]:
    def step(a: Any, values: list) -> None:
        values.append(buffer(name, a))
        values.append(np.int64(offset(name, a)))
        values += map(np.int64, a.shape)
    return step


def _scalar(ctype: Any) -> Callable[[Any, list], None]:
    def step(a: Any, values: list) -> None:
        values.append(ctype(a))
    return step
