"""Hypothesis generates stencil kernels (random neighbour offsets, boundary tests, nonlinear
expressions, an Active coefficient, random sizes and workgroup sizes) whose adjoints take the
gather form (tapegrad/ad/gather.py) and whose loops are versioned per group on the CPU; every
adjoint is checked against finite differences, in both forms (accumulating, and
``accumulate=False``, whose gathers store)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error
from tests.ad.test_random_kernels import expressions, load_kernel


@st.composite
def stencils_1d(draw) -> tuple[str, int]:
    offsets = sorted(draw(st.sets(st.integers(-2, 2), min_size=1, max_size=4)))
    if not any(offsets):
        offsets.append(1)
    lo = max(0, -min(offsets)) + draw(st.integers(0, 1))
    hi = max(0, max(offsets)) + draw(st.integers(0, 1))
    reads = [f"x{k}" for k in range(len(offsets))]
    lines = ["i = tg.index()", "n = X.size"]
    guard = draw(st.sampled_from([f"i >= {lo} and i < n - {hi}", f"{lo} <= i < n - {hi}",
                                  f"i - {lo} >= 0 and n > i + {hi}"]))
    lines.append(f"if {guard}:")
    for r, o in zip(reads, offsets):
        lines.append(f"    {r} = X[i {'+' if o >= 0 else '-'} {abs(o)}]")
    lines.append(f"    Y[i] = a * {draw(expressions(reads, 2))} + {reads[-1]}")
    lines += ["else:", f"    Y[i] = {draw(st.sampled_from(['0.0', 'X[i] * a', 'math.sin(X[i])']))}"]
    return "def k(Y, X, a):\n" + "\n".join("    " + ln for ln in lines) + "\n", len(offsets)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(stencils_1d(), st.integers(1, 23), st.sampled_from([1, 2, 4, 8]), st.integers(0, 2 ** 32 - 1))
def test_random_1d_stencil_adjoints_match_finite_differences(tmp_path, kernel, n, group, seed):
    source, _ = kernel
    k = load_kernel(source, tmp_path)
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, n)
    try:
        kernel_vjp_error(k(tg.CPU(), group), [np.zeros(n), X, 0.8], n, wrt=[1], outputs=[0],
                         active=[2], functional=True)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkernel:\n{source}") from None
    assert "_gather_X_bar" in k.source(mode="reverse"), source


@st.composite
def stencils_2d(draw) -> str:
    offsets = sorted(draw(st.sets(st.tuples(st.integers(-1, 1), st.integers(-1, 1)),
                                  min_size=2, max_size=5)))
    reads = [f"x{k}" for k in range(len(offsets))]
    lines = ["i, j = tg.index(tg.Global, tg.NTuple)", "n, m = X.shape",
             "if 0 < i < n - 1 and j >= 1 and j + 1 < m:"]
    for r, (a, b) in zip(reads, offsets):
        lines.append(f"    {r} = X[i + {a}, j + {b}]")
    lines.append(f"    Y[i, j] = {draw(expressions(reads, 2))}")
    lines += ["else:", "    Y[i, j] = 2.0 * X[i, j]"]
    return "def k(Y, X):\n" + "\n".join("    " + ln for ln in lines) + "\n"


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(stencils_2d(), st.tuples(st.integers(1, 9), st.integers(1, 9)),
       st.sampled_from([(1, 4), (2, 2), (4, 4)]), st.integers(0, 2 ** 32 - 1))
def test_random_2d_stencil_adjoints_match_finite_differences(tmp_path, source, shape, group, seed):
    k = load_kernel(source, tmp_path)
    X = np.random.default_rng(seed).uniform(-1, 1, shape)
    try:
        kernel_vjp_error(k(tg.CPU(), group), [np.zeros(shape), X], shape, wrt=[1], outputs=[0],
                         functional=True)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkernel:\n{source}") from None
