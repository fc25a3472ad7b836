"""Group-uniform branches decided once per workgroup on the CPU (one work-item loop each)."""

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def by_flag(Y, X, flag):
    i = tg.index()
    x = X[i]
    if flag > 0:
        Y[i] = 2.0 * x
    else:
        Y[i] = -x
    Y[i] += 1.0


@tg.kernel
def by_group(Y, X):
    i = tg.index()
    if tg.index(tg.Group) % 2 == 0:
        Y[i] = X[i] + 10.0


@tg.kernel
def flag_reassigned(Y, X, flag):
    i = tg.index()
    flag = flag - X[i]            # no longer the same for every work-item
    if flag > 0:
        Y[i] = 1.0
    else:
        Y[i] = 2.0


def _loop_inside_branch(source: str) -> bool:
    lines = source.splitlines()
    first_if = next(k for k, ln in enumerate(lines) if ln.strip().startswith("if "))
    first_loop = next(k for k, ln in enumerate(lines) if ln.strip().startswith("for _l0"))
    return first_if < first_loop


@pytest.mark.parametrize("flag", [1, -1])
def test_argument_branch_is_decided_per_group(flag):
    x = np.arange(37, dtype=np.float64)
    y = np.zeros_like(x)
    cpu = tg.CPU()
    by_flag(cpu, 8)(y, x, flag, ndrange=x.size)
    np.testing.assert_array_equal(y, (2 * x if flag > 0 else -x) + 1)
    assert _loop_inside_branch(by_flag.source(backend=cpu))


def test_group_index_branch():
    x = np.arange(40, dtype=np.float64)
    y = np.zeros_like(x)
    cpu = tg.CPU()
    by_group(cpu, 8)(y, x, ndrange=x.size)
    even_group = (np.arange(40) // 8) % 2 == 0
    np.testing.assert_array_equal(y, np.where(even_group, x + 10, 0))
    assert _loop_inside_branch(by_group.source(backend=cpu))


def test_reassigned_argument_stays_per_item(backend):
    """Each work-item starts from the argument (on the CPU, where one thread runs many
    work-items, the assignment once leaked into the next work-item)."""
    x = np.array([0.0, 2.0, 0.5, 3.0])
    y = np.zeros_like(x)
    flag_reassigned(backend, 4)(y, x, 1.0, ndrange=x.size)
    np.testing.assert_array_equal(y, np.where(1.0 - x > 0, 1.0, 2.0))
    if backend.name == "cpu":
        assert not _loop_inside_branch(flag_reassigned.source(backend=backend))


@tg.kernel
def laplace(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if 0 < i < n - 1 and 1 <= j and j + 1 < m:
        Y[i, j] = X[i - 1, j] + X[i + 1, j] + X[i, j - 1] + X[i, j + 1] - 4.0 * X[i, j]
    else:
        Y[i, j] = -1.0


@tg.kernel
def shifted(Y, X):
    i = tg.index()
    if i - 2 >= 0 and X.size > i + 1:
        Y[i] = X[i - 2] * X[i + 1]
    else:
        Y[i] = 7.0


@pytest.mark.parametrize("shape", [(1, 5), (9, 13), (16, 16), (33, 20)])
def test_stencil_interior_groups_skip_the_test(shape):
    x = np.random.default_rng(0).random(shape)
    y = np.zeros_like(x)
    cpu = tg.CPU()
    laplace(cpu, (4, 4))(y, x, ndrange=shape)
    ref = np.full_like(x, -1.0)
    ref[1:-1, 1:-1] = (x[:-2, 1:-1] + x[2:, 1:-1] + x[1:-1, :-2] + x[1:-1, 2:]
                       - 4 * x[1:-1, 1:-1])
    np.testing.assert_array_equal(y, ref)
    source = laplace.source(backend=cpu)      # rows split where the test holds: no test there
    assert "for _l1 in range(_lo, _hi):" in source and "_hi = max(_lo, min(_lim1, m - _g1 * 4 - 1))" in source


@pytest.mark.parametrize("n", [1, 3, 8, 29])
def test_shifted_index_tests(n):
    x = np.random.default_rng(1).random(n)
    y = np.zeros_like(x)
    shifted(tg.CPU(), 4)(y, x, ndrange=n)
    ref = np.full(n, 7.0)
    ref[2:n - 1] = x[:n - 3] * x[3:]
    np.testing.assert_array_equal(y, ref)


@tg.kernel
def guarded_square(Y, X):
    i = tg.index()
    if i < X.size - 3:
        Y[i] = X[i] * X[i]


def test_generated_flag_tests_are_decided_per_group():
    """Adjoints spell a branch as ``_branch1 = tg.bool(...)`` and test the flag in both
    sweeps; interior groups run without those tests, and the derivative is unchanged."""
    n = 29
    x, w = np.random.default_rng(2).random(n), np.random.default_rng(3).random(n)
    dx = np.zeros(n)
    cpu = tg.CPU()
    tg.autodiff(tg.Reverse, guarded_square(cpu, 4), tg.Const, tg.Duplicated(np.zeros(n), w.copy()),
                tg.Duplicated(x, dx), ndrange=n)
    expected = np.where(np.arange(n) < n - 3, 2 * x * w, 0.0)     # closed form
    np.testing.assert_allclose(dx, expected, rtol=1e-14)
    assert "min(_lim0, X.size - 3 - _g0 * 4)" in guarded_square.source(mode="reverse", backend=cpu)


@tg.kernel
def left_part(Y, X):
    i = tg.index()
    if i < X.size / 2:            # int / int is a float: not a bound the split can use
        Y[i] = X[i]
    else:
        Y[i] = -1.0


@tg.kernel
def below_column(Y, X, a):
    i, j = tg.index(tg.Global, tg.NTuple)
    if j < a:
        Y[i, j] = X[i, j]
    else:
        Y[i, j] = -1.0


def test_a_range_test_with_a_float_bound_keeps_every_work_item():
    x = np.arange(1.0, 12.0)
    y = np.full_like(x, np.nan)
    left_part(tg.CPU(), 16)(y, x, ndrange=x.size)
    np.testing.assert_array_equal(y, np.where(np.arange(11) < 11 / 2, x, -1.0))
    x2 = np.random.default_rng(3).random((20, 301))
    for groupsize in [(2, 8), (16, 16)]:        # (16, 16): the CPU's rows (6020 items: not)
        y2 = np.full_like(x2, np.nan)
        below_column(tg.CPU(), groupsize)(y2, x2, 2.5, ndrange=x2.shape)
        np.testing.assert_array_equal(y2, np.where(np.arange(301) < 2.5, x2, -1.0))


@tg.kernel
def half_stencil(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if 0 < j and j < m / 2 and 0 < i and i < n - 1:
        Y[i, j] = X[i, j - 1] + 2.0 * X[i + 1, j] - X[i, j + 1] * X[i - 1, j]
    else:
        Y[i, j] = X[i, j]


def test_the_gather_adjoint_of_a_float_bound_matches_finite_differences():
    rng = np.random.default_rng(4)
    x = rng.random((9, 13))
    w = rng.random((9, 13))

    def loss(x):
        y = np.empty_like(x)
        half_stencil(tg.CPU(), (4, 8))(y, x, ndrange=x.shape)
        return tg.dot(y, w)

    assert tg.testing.check_grad(loss, x, max_elements=117)
