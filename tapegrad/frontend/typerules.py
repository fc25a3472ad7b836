"""The kernel language's types and how they combine.

Scalars are ``bool``, ``int32``, ``int64``, ``float32`` and ``float64``.  A float literal (and a
Python ``float`` argument, and ``int / int``) is *weak*: it takes the precision of the float data
it meets, so ``2.0 * A[i]`` stays float32 when ``A`` is float32.  Mixing an integer with a float
gives that float's type (``i * A[i]`` is float32 for float32 ``A``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

FLOATS = ("float32", "float64")
INTS = ("int32", "int64")
DTYPE_NAMES = ("bool", "int32", "int64", "float32", "float64")


class Type:
    """Base class of kernel types."""


@dataclass(frozen=True)
class Scalar(Type):
    dtype: str
    weak: bool = False   # only float64 is ever weak

    def __str__(self) -> str:
        return ("weak " if self.weak else "") + self.dtype

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS


@dataclass(frozen=True)
class Array(Type):
    dtype: str
    ndim: int
    space: str = "global"   # "global" (an argument), "local" (tg.localmem) or "private"

    def __str__(self) -> str:
        return f"{self.ndim}-D {self.dtype} array"


@dataclass(frozen=True)
class TupleT(Type):
    items: tuple[Type, ...]

    def __str__(self) -> str:
        return "(" + ", ".join(map(str, self.items)) + ")"


@dataclass(frozen=True)
class DType(Type):
    dtype: str


@dataclass(frozen=True)
class NoneT(Type):
    def __str__(self) -> str:
        return "None"


BOOL, INT64, FLOAT32, FLOAT64 = Scalar("bool"), Scalar("int64"), Scalar("float32"), Scalar("float64")
WEAK_FLOAT = Scalar("float64", weak=True)
NONE = NoneT()


def join(a: Type | None, b: Type | None) -> Type | None:
    """The least type holding both ``a`` and ``b`` (None means "not known yet"); raises
    ``TypeError`` when there is none (the caller adds the location)."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if isinstance(a, Scalar) and isinstance(b, Scalar):
        if a.is_float and b.is_float:
            if a.dtype == b.dtype:
                return Scalar(a.dtype, weak=a.weak and b.weak)
            f64, f32 = (a, b) if a.dtype == "float64" else (b, a)
            return f32 if f64.weak else FLOAT64
        if a.is_float:
            return a
        if b.is_float:
            return b
        if a.dtype == "bool" and b.dtype == "bool":
            return BOOL
        return INT64
    if isinstance(a, TupleT) and isinstance(b, TupleT) and len(a.items) == len(b.items):
        return TupleT(tuple(join(x, y) for x, y in zip(a.items, b.items)))
    raise TypeError(f"{a} and {b}")


def arith(op: ast.operator, a: Scalar, b: Scalar) -> Scalar:
    """Result type of ``a <op> b`` for scalars."""
    if isinstance(op, (ast.BitAnd, ast.BitOr, ast.BitXor)):
        if a.is_float or b.is_float:
            raise TypeError("bitwise operators need integers or booleans")
        return BOOL if a.dtype == b.dtype == "bool" else INT64
    if isinstance(op, (ast.LShift, ast.RShift)):
        if a.is_float or b.is_float:
            raise TypeError("shifts need integers")
        return INT64
    if isinstance(op, ast.Div) and not a.is_float and not b.is_float:
        return WEAK_FLOAT
    t = join(a, b)
    return INT64 if t.dtype in ("bool", "int32") else t


def float_of(t: Scalar) -> Scalar:
    """The float type a math function returns for argument type ``t``."""
    return t if t.is_float else WEAK_FLOAT


def meets_float32(a: Type, b: Type) -> bool:
    """Whether ``a``, compared with ``b``, is taken to float32: a weak float or an integer
    meeting float32 data (``A[i] == 0.1`` compares float32(0.1)).  Each pair of a chain
    decides for itself: in ``A[i] < N < M`` the integers N and M compare as integers."""
    return isinstance(a, Scalar) and (a.weak or not a.is_float) and \
        isinstance(b, Scalar) and b.dtype == "float32"
