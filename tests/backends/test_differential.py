"""Differential testing as a standing net: Hypothesis draws random elementwise kernels and
inputs with special values (0, -0, inf, nan, negative values, denormals) and compares, element
by element (nan == nan, inf with its sign), the primal on the CPU, on OpenCL (PoCL) and in
NumPy (float64), and the adjoint and the tangent on the CPU and on OpenCL; where both are
finite, the tangent also equals the adjoint (the kernels are elementwise: the Jacobian is
diagonal, so J 1 == J^T 1).

Integer kernels (int64 arithmetic, division and remainder by zero, shifts past 63, bit
operations, comparisons) are compared exactly with NumPy on every backend, with inputs small
enough that nothing overflows (an overflow is undefined: docs/language.md).

``TAPEGRAD_DIFFERENTIAL_EXAMPLES=200`` draws more kernels than CI's few.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tests.ad.test_random_control_flow import nested_kernels
from tests.ad.test_random_kernels import load_kernel
from tests.conftest import BACKENDS

# (kernel template, NumPy template): functions and operators whose special values IEEE, C99
# and NumPy agree on
UNARY = [("math.sin({})", "np.sin({})"), ("math.cos({})", "np.cos({})"),
         ("math.tanh({})", "np.tanh({})"), ("math.atan({})", "np.arctan({})"),
         ("math.exp({})", "np.exp({})"), ("math.sqrt({})", "np.sqrt({})"),
         ("math.log({})", "np.log({})"), ("(1.0 / {})", "(1.0 / {})"),
         ("abs({})", "np.abs({})"), ("(-{})", "(-{})"), ("math.expm1({})", "np.expm1({})"),
         ("math.log1p({})", "np.log1p({})")]
BINARY = [("({} + {})", "({} + {})"), ("({} - {})", "({} - {})"), ("({} * {})", "({} * {})"),
          ("({} / {})", "({} / {})"), ("math.hypot({}, {})", "np.hypot({}, {})")]

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -2.5e-310, 1e-300, -1.0, 1.0]
N = 24


def _fill(template: str, *parts: tuple[str, str]) -> tuple[str, str]:
    return (template[0].format(*(p[0] for p in parts)),
            template[1].format(*(p[1] for p in parts)))


LEAVES = [("x", "x"), ("y", "y"), ("0.5", "0.5"), ("2.0", "2.0")]


def expressions(depth: int, leaves: list = LEAVES, unary: list = UNARY, binary: list = BINARY,
                more: Any = None) -> st.SearchStrategy[tuple[str, str]]:
    """(kernel, NumPy) texts of an expression tree ``depth`` deep; ``more(sub)``: further
    forms built from subexpressions."""
    leaf = st.sampled_from(leaves)
    if depth == 0:
        return leaf
    sub = expressions(depth - 1, leaves, unary, binary, more)
    forms = [leaf, st.tuples(st.sampled_from(unary), sub).map(lambda t: _fill(t[0], t[1])),
             st.tuples(st.sampled_from(binary), sub, sub).map(lambda t: _fill(t[0], t[1], t[2]))]
    return st.one_of(*forms, *([more(sub)] if more else []))


def bodies() -> st.SearchStrategy[tuple[str, str]]:
    """An expression, or a choice between two by a test (``x if c else y`` in the kernel,
    ``np.where`` in NumPy: nan compares false in both)."""
    tests = st.sampled_from([("x > y", "x > y"), ("x > 0.5", "x > 0.5"), ("y <= x", "y <= x")])
    choice = st.tuples(tests, expressions(2), expressions(2)).map(
        lambda t: (f"({t[1][0]}) if {t[0][0]} else ({t[2][0]})",
                   f"np.where({t[0][1]}, {t[1][1]}, {t[2][1]})"))
    return st.one_of(expressions(3), choice)


values = st.one_of(st.sampled_from(SPECIAL),
                   st.floats(-3.0, 3.0, allow_nan=False, allow_infinity=False))


def assert_same(got: np.ndarray, want: np.ndarray, what: str, rtol: float = 1e-9,
                atol: float = 1e-300) -> None:
    """Element by element: nan where the other has nan, the same signed infinities, finite
    values to ``rtol`` (libm, tapegrad's vectorised math and PoCL's differ in the last ulps)."""
    bad = np.isnan(got) != np.isnan(want)
    both = ~np.isnan(got) & ~np.isnan(want)
    inf = both & (np.isinf(got) | np.isinf(want))
    bad[inf] = got[inf] != want[inf]
    fin = both & ~inf
    bad[fin] = ~np.isclose(got[fin], want[fin], rtol=rtol, atol=atol)
    if bad.any():
        k = int(np.argmax(bad))
        raise AssertionError(f"{what}: element {k} is {got[k]!r}, expected {want[k]!r}")


def _run(kernel, backend, x: np.ndarray, y: np.ndarray, *rest: int) -> tuple[np.ndarray, ...]:
    """The primal, the adjoint with seed 1 (d/dx, d/dy) and the tangent with v = 1 in x."""
    cfg = kernel(backend, 4)
    C = np.zeros(N)
    cfg(C, x.copy(), y.copy(), *rest, ndrange=N)
    dx, dy = np.zeros(N), np.zeros(N)
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(np.zeros(N), np.ones(N)),
                tg.Duplicated(x.copy(), dx), tg.Duplicated(y.copy(), dy), *rest, ndrange=N)
    tx = np.zeros(N)
    tg.autodiff(tg.Forward, cfg, tg.Const, tg.Duplicated(np.zeros(N), tx),
                tg.Duplicated(x.copy(), np.ones(N)), tg.Const(y.copy()), *rest, ndrange=N)
    return C, dx, dy, tx


def _agree(results: dict[str, tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """The other backends' results equal the CPU's, element by element, subnormal inputs
    included; returns the CPU's."""
    cpu = results.pop("cpu")
    for name, other in results.items():
        for k, what in enumerate(("primal", "adjoint d/dx", "adjoint d/dy", "tangent")):
            assert_same(other[k], cpu[k], f"{name} {what} vs CPU")
    return cpu


def _tiny(*inputs: np.ndarray, below: float = 1e-150) -> np.ndarray:
    """Where an input is not zero but of magnitude below ``below``."""
    return np.logical_or.reduce([(v != 0) & (np.abs(v) < below) for v in inputs])


_EXAMPLES = int(os.environ.get("TAPEGRAD_DIFFERENTIAL_EXAMPLES", "6"))
_examples = settings(max_examples=_EXAMPLES, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


def elementwise(kernel_expr: str, tmp_path: Any) -> tuple[tg.Kernel, str]:
    """``C[i] = <kernel_expr>`` of ``x = A[i]``, ``y = B[i]``, and its source."""
    source = f"def k(C, A, B):\n    i = tg.index()\n    x = A[i]\n    y = B[i]\n" \
             f"    C[i] = {kernel_expr}\n"
    return load_kernel(source, tmp_path), source


@_examples
@given(bodies(), st.lists(values, min_size=N, max_size=N),
       st.lists(values, min_size=N, max_size=N))
def test_backends_and_numpy_agree_element_by_element(tmp_path, expr, xs, ys):
    kernel_expr, numpy_expr = expr
    kernel, source = elementwise(kernel_expr, tmp_path)
    x, y = np.array(xs), np.array(ys)
    with np.errstate(all="ignore"):
        want = np.broadcast_to(eval(numpy_expr, {"np": np, "x": x, "y": y}), (N,))
    results = {name: _run(kernel, make(), x, y) for name, make in BACKENDS.items()}
    try:
        cpu = _agree(results)
        assert_same(cpu[0], want, "CPU primal vs NumPy")
        # (the tangent and the adjoint multiply the same partials in another order: with
        # subnormal and huge inputs an intermediate can underflow in one order only, found:
        # -3.9e-28 against 0.0 for expm1(y) * (y / x) on such inputs; and they add the same
        # chain-rule terms in another order: where terms cancel, their rounding differs,
        # found: 0.27015128 against 0.27015138 for sin(x / log1p(x)) at x = -7e-10, two
        # terms of 1.4e9 summing to 0.27. How much shows one ulp of x away, where the
        # exact derivative moves far less than that noise: allowed four times it. Inputs
        # below 1e-150 make partials past 1e150 (1/x), whose cancelling terms leave only
        # their rounding, the same one ulp away: not compared, found: 1.0 against 0.0 for
        # d/dx x + x / sin(x) at x = 1e-300, terms of +-1e300)
        near = _run(kernel, BACKENDS["cpu"](), np.nextafter(x, np.inf), y)
        with np.errstate(all="ignore"):      # (inf - inf: no noise measured there)
            noise = np.nan_to_num(np.abs(near[1] - cpu[1]) + np.abs(near[3] - cpu[3]),
                                  nan=0.0, posinf=0.0)
            both = np.isfinite(cpu[1]) & np.isfinite(cpu[3]) & ~_tiny(x, y)
            off = np.abs(cpu[3] - cpu[1]) > 1e-7 * np.abs(cpu[1]) + 1e-20 + 4.0 * noise
        if (both & off).any():
            k = int(np.argmax(both & off))
            raise AssertionError(f"CPU tangent vs adjoint: element {k} is {cpu[3][k]!r}, "
                                 f"the adjoint {cpu[1][k]!r} (one ulp of x away: "
                                 f"{near[3][k]!r}, {near[1][k]!r})")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nx = {x!r}\ny = {y!r}\nkernel:\n{source}") from None


@settings(max_examples=max(1, _EXAMPLES // 2), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(nested_kernels(), st.integers(0, 3), st.lists(values, min_size=N, max_size=N),
       st.lists(values, min_size=N, max_size=N))
def test_control_flow_kernels_agree_across_backends(tmp_path, source, trips, xs, ys):
    """The random kernels of tests/ad/test_random_control_flow.py (loops holding nested
    branches, while loops, break, continue), on special values: the same primal, adjoint and
    tangent on every backend."""
    kernel = load_kernel(source, tmp_path)
    x, y = np.array(xs), np.array(ys)
    try:
        _agree({name: _run(kernel, make(), x, y, trips) for name, make in BACKENDS.items()})
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nx = {x!r}\ny = {y!r}\ntrips {trips}\nkernel:\n"
                             f"{source}") from None


INT_BINARY = [("({} + {})", "({} + {})"), ("({} - {})", "({} - {})"),
              ("({} * {})", "({} * {})"), ("({} // {})", "np.floor_divide({}, {})"),
              ("({} % {})", "np.remainder({}, {})"), ("({} >> {})", "np.right_shift({}, {})"),
              ("({} & {})", "({} & {})"), ("({} | {})", "({} | {})"), ("({} ^ {})", "({} ^ {})"),
              ("min({}, {})", "np.minimum({}, {})"), ("max({}, {})", "np.maximum({}, {})")]
INT_UNARY = [("(-{})", "(-{})"), ("abs({})", "np.abs({})"), ("(~{})", "(~{})")]


INT_LEAVES = [("x", "x"), ("y", "y"), ("3", "np.int64(3)"), ("-2", "np.int64(-2)"),
              ("64", "np.int64(64)")]


def _int_choice(sub: st.SearchStrategy) -> st.SearchStrategy[tuple[str, str]]:
    return st.tuples(st.sampled_from(["<", "<=", "==", "!="]), sub, sub, sub, sub).map(
        lambda t: (f"({t[3][0]} if {t[1][0]} {t[0]} {t[2][0]} else {t[4][0]})",
                   f"np.where({t[1][1]} {t[0]} {t[2][1]}, {t[3][1]}, {t[4][1]})"))


small_ints = st.one_of(st.sampled_from([0, 1, -1, 2, -2, 63, 64, 65, -64, 70, -70]),
                       st.integers(-70, 70))


@_examples
@given(expressions(3, INT_LEAVES, INT_UNARY, INT_BINARY, _int_choice),
       st.lists(small_ints, min_size=N, max_size=N), st.lists(small_ints, min_size=N, max_size=N))
def test_integer_kernels_agree_with_numpy_exactly(tmp_path, expr, xs, ys):
    kernel_expr, numpy_expr = expr
    kernel, source = elementwise(kernel_expr, tmp_path)
    x, y = np.array(xs, np.int64), np.array(ys, np.int64)
    with np.errstate(all="ignore"):
        want = np.broadcast_to(eval(numpy_expr, {"np": np, "x": x, "y": y}), (N,))
    for name, make in BACKENDS.items():
        C = np.zeros(N, np.int64)
        kernel(make())(C, x.copy(), y.copy(), ndrange=N)
        bad = np.flatnonzero(C != want)
        assert not bad.size, (f"{name}: element {bad[0]} is {C[bad[0]]}, NumPy's "
                              f"{want[bad[0]]}\nx = {x!r}\ny = {y!r}\nkernel:\n{source}")
