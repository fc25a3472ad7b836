"""Kernels printed as OpenCL C and run for real on PoCL (tg.OpenCL()): the same results as
the CPU backend and as Python, at sizes that need several workgroups and ragged edges."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pyopencl.array as cla
import pytest

import tapegrad as tg
from tests.test_primitives import ROWS, _inputs, _reference, load_every_row

CPU = tg.CPU()


@pytest.fixture(scope="module")
def cl():
    return tg.OpenCL()


def on(cl, x):
    return cla.to_device(cl.queue, np.ascontiguousarray(x))


@tg.func
def square(x):
    return x * x


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


@tg.kernel
def control_flow(B, A, k):
    """Loops, branches, a device function, Python's // and % on negative ints and floats,
    max with a constant, ** of a float, tuple indices and shapes."""
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = A.shape
    x = A[i, j]
    s = 0.0
    for t in range(k):
        s += math.sin(x * t) + square(x) // 0.3 + (i - 5) // 3 + (j - 3) % 4 + (x - 0.5) % 0.3
    w = 0
    while w < i % 3:
        w += 1
        if w == 2:
            break
    if i > 0 and j < m - 1:
        s = s + max(x, 0.5) + min(x, 0.2, 0.9) + abs(-i) + w
    else:
        s = -s if x > 0.5 else x ** 2.5
    B[i, j] = s


def test_a_saxpy_over_ragged_workgroups(cl):
    X, Y = np.random.default_rng(0).random((2, 1000))
    Xd, Yd = on(cl, X), on(cl, Y)
    saxpy(cl)(Yd, 2.0, Xd, ndrange=1000)          # 1000 = 3 groups of 256 and a part
    np.testing.assert_array_equal(Yd.get(), 2.0 * X + Y)
    assert tg.get_backend(Yd) == cl and tg.to_numpy(Yd).shape == (1000,)
    assert "__kernel void saxpy(" in saxpy.source(backend=cl)


@tg.kernel
def step(u_new, u, k):           # (OpenCL C has a built-in step(); C has exp(), CUDA too)
    i = tg.index()
    u_new[i] = u[i] + k * u[i] * u[i]


@tg.kernel
def exp(Y, X):
    i = tg.index()
    Y[i] = math.exp(X[i])


def test_kernels_named_as_c_reserves_run_and_differentiate(cl):
    x = np.random.default_rng(2).random(100)
    u, y = on(cl, np.zeros(100)), on(cl, np.zeros(100))
    step(cl)(u, on(cl, x), 0.5, ndrange=100)
    exp(cl)(y, on(cl, x), ndrange=100)
    np.testing.assert_allclose(u.get(), x + 0.5 * x * x, rtol=1e-15)
    np.testing.assert_allclose(y.get(), np.exp(x), rtol=1e-14)
    assert "__kernel void step_kernel(" in step.source(backend=cl)
    xd, du = on(cl, x), on(cl, np.zeros(100))
    tg.autodiff(tg.Reverse, step(cl), tg.Const, tg.DuplicatedNoNeed(u, on(cl, np.ones(100))),
                tg.Duplicated(xd, du), 0.5, ndrange=100)
    np.testing.assert_allclose(du.get(), 1.0 + x, rtol=1e-15)


@tg.kernel
def halve(y, local, constant, exp):
    i = tg.index()
    half = local[i] * 0.5          # (OpenCL C: local, constant and half are its words)
    y[i] = half + constant + math.exp(exp)


@tg.kernel
def longer(y, x):
    i = tg.index()
    long = x[i] * 2.0
    y[i] = long


def test_variables_named_as_c_reserves_are_renamed_or_refused(cl):
    x = np.random.default_rng(3).random(50)
    y = on(cl, np.zeros(50))
    halve(cl)(y, on(cl, x), 1.0, 0.5, ndrange=50)
    np.testing.assert_allclose(y.get(), 0.5 * x + 1.0 + np.exp(0.5), rtol=1e-15)
    source = halve.source(backend=cl)
    # (its arrays are disjoint: the variant with restrict pointers ran, c/items.py)
    assert "__global double *restrict local_," in source and "exp(exp_)" in source
    with pytest.raises(tg.KernelSyntaxError, match="a variable named 'long' is a word of C"):
        longer(cl)(y, on(cl, x), ndrange=50)


def test_control_flow_and_pythons_arithmetic_agree_with_the_cpu(cl):
    A = np.random.default_rng(1).random((37, 21))
    B = np.zeros_like(A)
    control_flow(CPU, (4, 8))(B, A, 5, ndrange=A.shape)
    Bd = on(cl, np.zeros_like(A))
    control_flow(cl, (4, 8))(Bd, on(cl, A), 5, ndrange=A.shape)
    np.testing.assert_allclose(Bd.get(), B, rtol=1e-13, atol=1e-13)


@tg.kernel
def python_arithmetic(F, N, a, b, x, y):
    F[0] = x // y
    F[1] = x % y
    F[2] = float(a ** b)
    N[0] = a // b
    N[1] = a % b
    N[2] = a ** b
    N[3] = int(x)


@pytest.mark.parametrize("a, b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (2, 10), (-1, -3),
                                  (2, -1), (0, 5)])
@pytest.mark.parametrize("x, y", [(7.5, 2.0), (-7.5, 2.0), (7.5, -2.0), (-0.0, 3.0),
                                  (1e300, 1e-300), (5.0, math.inf)])
def test_floor_division_modulo_and_powers_are_pythons(cl, a, b, x, y):
    F, N = on(cl, np.zeros(3)), on(cl, np.zeros(4, np.int64))
    python_arithmetic(cl, 1)(F, N, a, b, x, y, ndrange=1)
    # (an int ** a negative int is 0 in a kernel unless the base is 1 or -1: docs/language.md)
    int_pow = a ** b if b >= 0 else (1 if a == 1 else (-1) ** b if a == -1 else 0)
    expected_f = [x // y, x % y, float(int_pow)]
    ints = N.get()
    assert list(ints[:3]) == [a // b, a % b, int_pow]
    if abs(x) < 2 ** 62:                    # (beyond int64, int(x) has no kernel value)
        assert ints[3] == int(x)
    got = F.get()
    for g, e in zip(got, expected_f):
        assert g == e and math.copysign(1, g) == math.copysign(1, e), (got, expected_f)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
def test_every_row_of_the_primitive_table(cl, tmp_path_factory, dtype):
    kernel = load_every_row(tmp_path_factory.mktemp("opencl_rows"))
    A, C, D = _inputs(dtype)
    B = on(cl, np.full(A.shape, -7.0, dtype))
    kernel(cl, 4)(B, on(cl, A), on(cl, C), on(cl, D), ndrange=A.shape[0])
    got = B.get()
    tolerance = dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-13,
                                                                            atol=1e-14)
    failed = []
    for k, row in enumerate(ROWS):
        expected = _reference(row, *(X[:, k] for X in (A, C, D)[:row.arity])).astype(
            np.float64)
        if not np.allclose(got[:, k].astype(np.float64), expected, equal_nan=True, **tolerance):
            failed.append(f"{row.name}: {got[:, k]} != {expected}")
    assert not failed, "\n".join(failed)


@tg.kernel
def float32_literals(B, A):
    i = tg.index()
    B[i] = A[i] * 0.1 + 1e-3


def test_float_literals_take_the_datas_precision(cl):
    A = np.linspace(0, 1, 300, dtype=np.float32)
    Bd = on(cl, np.zeros_like(A))
    float32_literals(cl)(Bd, on(cl, A), ndrange=A.size)
    B = np.zeros_like(A)
    float32_literals(CPU)(B, A, ndrange=A.size)
    np.testing.assert_array_equal(Bd.get(), B)
    assert "0.1f" in float32_literals.source(backend=cl)


@tg.kernel
def self_compared(C, x):
    i = tg.index()
    C[i] = min(x[i], x[i]) + (64 >> -2)


def test_the_compilers_warnings_on_generated_code_stay_quiet(cl):
    """(PoCL's clang warned of a self-comparison and a constant operand of &&, and PyOpenCL
    passed it on to the user as a CompilerWarning.)"""
    x = np.array([-3, 0, 5], np.int64)
    Cd = on(cl, np.zeros_like(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        self_compared(cl)(Cd, on(cl, x), ndrange=x.size)
    np.testing.assert_array_equal(Cd.get(), x)


@tg.kernel
def histograms(H, N, M, idx, X):
    """Every kind of atomic under contention (many work-items, few bins)."""
    i = tg.index()
    tg.atomic_add(H, idx[i], X[i])
    tg.atomic_add(N, idx[i], 1)
    tg.atomic_max(M, idx[i], X[i])
    tg.atomic_sub(H, idx[i], 0.25)
    tg.atomic_min(N, idx[i], 1000000)


@pytest.mark.parametrize("ftype, itype", [(np.float64, np.int64), (np.float32, np.int32)],
                         ids=["float64-int64", "float32-int32"])
def test_atomics_under_contention(cl, ftype, itype):
    rng = np.random.default_rng(6)
    n, m = 100_000, 7
    X, idx = rng.random(n).astype(ftype), rng.integers(0, m, n)
    H, N, M = on(cl, np.zeros(m, ftype)), on(cl, np.zeros(m, itype)), on(cl, np.zeros(m, ftype))
    histograms(cl)(H, N, M, on(cl, idx), on(cl, X), ndrange=n)
    counts = np.bincount(idx, None, m)
    sums = np.bincount(idx, X.astype(np.float64), m) - 0.25 * counts
    np.testing.assert_allclose(H.get(), sums, rtol=1e-12 if ftype == np.float64 else 1e-5)
    np.testing.assert_array_equal(N.get(), counts)
    np.testing.assert_array_equal(M.get(), [X[idx == k].max() for k in range(m)])


@tg.kernel
def squares_of_gathered(Y, X, idx):
    i = tg.index()
    Y[i] = X[idx[i]] ** 2


@tg.kernel
def scaled(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i]


def test_adjoints_that_add_with_atomics(cl):
    """A gather's adjoint (atomics into its shadow), an Active scalar's sum, and a tiled
    product's adjoint (atomics into local-memory shadow tiles), against closed forms."""
    from tests.ad.test_reverse import TILE, matmul
    rng = np.random.default_rng(7)
    X, idx = rng.random(50), rng.integers(0, 50, 2000)
    dX = on(cl, np.zeros(50))
    tg.autodiff(tg.Reverse, squares_of_gathered(cl), tg.Const,
                tg.Duplicated(on(cl, np.zeros(2000)), on(cl, np.ones(2000))),
                tg.Duplicated(on(cl, X), dX), on(cl, idx), ndrange=2000)
    np.testing.assert_allclose(dX.get(), 2 * X * np.bincount(idx, None, 50), rtol=1e-12)
    Z = rng.random(1000)
    (_, da, _) = tg.autodiff(tg.Reverse, scaled(cl), tg.Const,
                             tg.Duplicated(on(cl, np.zeros(1000)), on(cl, np.ones(1000))),
                             tg.Active(2.0), on(cl, Z), ndrange=1000)[0]
    assert da == pytest.approx(Z.sum(), rel=1e-12)
    # 125 workgroups of 8: the sum's slots (64, one per group mod 64) wrap around
    (_, da, _) = tg.autodiff(tg.Reverse, scaled(cl, 8), tg.Const,
                             tg.Duplicated(on(cl, np.zeros(1000)), on(cl, np.ones(1000))),
                             tg.Active(2.0), on(cl, Z), ndrange=1000)[0]
    assert da == pytest.approx(Z.sum(), rel=1e-12)
    A, B, W = rng.random((16, 24)), rng.random((24, 12)), rng.random((16, 12))
    dA, dB = on(cl, np.zeros_like(A)), on(cl, np.zeros_like(B))
    tg.autodiff(tg.Reverse, matmul(cl, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(on(cl, np.zeros((16, 12))), on(cl, W)),
                tg.Duplicated(on(cl, A), dA), tg.Duplicated(on(cl, B), dB), ndrange=(16, 12))
    np.testing.assert_allclose(dA.get(), W @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB.get(), A.T @ W, rtol=1e-12)


def test_arrays_of_another_backend_are_refused(cl):
    with pytest.raises(tg.LaunchError, match="does not live on OpenCL"):
        saxpy(cl)(np.zeros(4), 1.0, np.zeros(4), ndrange=4)


@tg.kernel
def sin_times(B, A):
    i = tg.index()
    B[i] = math.sin(A[i]) * A[i]


def test_a_kernels_derivatives_in_both_modes(cl):
    """The adjoint and the tangent kernels are printed and run like the primal: against the
    closed form d/dx x sin x = sin x + x cos x."""
    An = np.random.default_rng(2).random(1000)
    exact = np.sin(An) + An * np.cos(An)
    A, B, dA, dB = on(cl, An), on(cl, np.zeros(1000)), on(cl, np.zeros(1000)), on(cl, np.ones(1000))
    tg.autodiff(tg.Reverse, sin_times(cl), tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA),
                ndrange=1000)
    np.testing.assert_allclose(dA.get(), exact, rtol=1e-13)
    assert not dB.get().any()                   # B was overwritten: its shadow consumed
    t = on(cl, np.ones(1000))
    B, dB = on(cl, np.zeros(1000)), on(cl, np.zeros(1000))
    tg.autodiff(tg.Forward, sin_times(cl), tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, t),
                ndrange=1000)
    np.testing.assert_allclose(dB.get(), exact, rtol=1e-13)


def test_a_gradient_through_a_tape_with_host_reductions(cl):
    """tg.gradient of a host function on OpenCL arrays, with tg.sum and tg.dot (whose
    cotangent is an array times a scale), against the closed form."""
    An = np.random.default_rng(3).random(700)
    W = on(cl, np.linspace(-1, 1, 700))

    def f(A):
        B = tg.zeros(cl, np.float64, 700)
        sin_times(cl)(B, A, ndrange=700)
        return tg.sum(B) + 0.5 * tg.dot(B, W)

    (g,) = tg.gradient(f, on(cl, An))
    exact = (np.sin(An) + An * np.cos(An)) * (1.0 + 0.5 * np.linspace(-1, 1, 700))
    assert tg.get_backend(g) == cl
    np.testing.assert_allclose(tg.to_numpy(g), exact, rtol=1e-12)


@tg.kernel
def tree_sums(S, X):
    """A workgroup's sum by halving steps through local memory: barriers inside a loop whose
    condition every work-item computes alike."""
    i = tg.index()
    li = tg.index(tg.Local)
    g = tg.index(tg.Group)
    buf = tg.localmem(X.dtype, (64,))
    buf[li] = X[i]
    tg.synchronize()
    step = 32
    while step > 0:
        if li < step:
            buf[li] += buf[li + step]
        tg.synchronize()
        step = step // 2
    if li == 0:
        S[g] = buf[0]


@tg.kernel
def private_slots(B, A):
    i = tg.index()
    p = tg.private(A.dtype, (3,))
    for k in range(3):
        p[k] = A[i] * (k + 1)
    B[i] = p[2] - p[0] * p[1]


def test_local_memory_barriers_and_private_arrays(cl):
    X = np.random.default_rng(4).random(64 * 7)
    S = on(cl, np.zeros(7))
    tree_sums(cl, 64)(S, on(cl, X), ndrange=X.size)
    np.testing.assert_allclose(S.get(), X.reshape(7, 64).sum(axis=1), rtol=1e-13)
    B = on(cl, np.zeros(X.size))
    private_slots(cl)(B, on(cl, X), ndrange=X.size)       # (448 = one group and a part)
    np.testing.assert_allclose(B.get(), 3 * X - 2 * X * X, rtol=1e-13)


def test_a_tiled_product_and_its_tangent(cl):
    """Local-memory tiles between barriers (tests/ad/test_reverse.py's matmul), and its
    tangent kernel, against NumPy: d(AB) = dA B + A dB."""
    from tests.ad.test_reverse import TILE, matmul
    rng = np.random.default_rng(5)
    A, B, dA, dB = rng.random((36, 48)), rng.random((48, 28)), rng.random((36, 48)), \
        rng.random((48, 28))
    C, dC = on(cl, np.zeros((36, 28))), on(cl, np.zeros((36, 28)))
    tg.autodiff(tg.Forward, matmul(cl, (TILE, TILE)), tg.Const, tg.Duplicated(C, dC),
                tg.Duplicated(on(cl, A), on(cl, dA)), tg.Duplicated(on(cl, B), on(cl, dB)),
                ndrange=(36, 28))
    np.testing.assert_allclose(C.get(), A @ B, rtol=1e-13)
    np.testing.assert_allclose(dC.get(), dA @ B + A @ dB, rtol=1e-13)


def _adjoint(backend, move, kernel, args, wrt):
    """Reverse mode of ``kernel`` with ones as the output's (argument 0's) shadow; the shadows
    of the ``wrt`` arguments, as NumPy arrays."""
    shadows, annotated = {}, []
    for k, a in enumerate(args):
        if k == 0 or k in wrt:
            shadows[k] = move(np.ones(a.shape) if k == 0 else np.zeros(a.shape))
            annotated.append(tg.Duplicated(move(a.copy()), shadows[k]))
        else:
            annotated.append(move(a.copy()) if isinstance(a, np.ndarray) else a)
    tg.autodiff(tg.Reverse, kernel(backend, 32), tg.Const, *annotated, ndrange=args[0].shape[0])
    return [tg.to_numpy(shadows[k]) for k in wrt]


@pytest.mark.parametrize("name", ["loops", "fibonacci", "newton_sqrt", "early_exit", "stencil",
                                  "uses_softplus", "dense_tanh"])
def test_adjoints_with_stacks_early_exits_and_rules_agree_with_the_cpu(cl, name):
    """Adjoints that save values on the per-work-item stack (loops), leave early, call
    hand-written rules: the same as the CPU backend's (which tests/ad checks against finite
    differences)."""
    from tests.ad import test_reverse as R
    rng = np.random.default_rng(8)
    n = 100
    args = {"loops": (np.zeros(n), rng.random(n), 3), "fibonacci": (np.zeros(n), rng.random(n), 4),
            "newton_sqrt": (np.zeros(n), rng.random(n) + 0.5),
            "early_exit": (np.zeros(n), rng.random(n)), "stencil": (np.zeros(n), rng.random(n)),
            "uses_softplus": (np.zeros(n), rng.random(n)),
            "dense_tanh": (np.zeros(n), rng.random((n, 3)), rng.random(3), rng.random(n))}[name]
    wrt = [1, 2, 3] if name == "dense_tanh" else [1]
    kernel = getattr(R, name)
    for got, expected in zip(_adjoint(cl, lambda x: on(cl, x), kernel, args, wrt),
                             _adjoint(CPU, lambda x: x, kernel, args, wrt)):
        np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-14)
