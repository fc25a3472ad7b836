"""The host API at its edges: each case here gave a silently wrong number or a bare Python
error before (an adversarial review of tg.gradient, tape scalars and host operations)."""

import numpy as np
import pytest

import tapegrad as tg

X = np.array([0.5, 1.0, 2.0])


@tg.kernel
def times(B, A, s):
    i = tg.index()
    B[i] = A[i] * s


@pytest.mark.parametrize("f", [lambda s: s.real * s, lambda s: s.conjugate() * s,
                               lambda s: np.real(s) * s, lambda s: np.conj(s) * s],
                         ids=["real", "conjugate", "np.real", "np.conj"])
def test_the_real_part_of_a_scalar_keeps_its_derivative_in_both_modes(f):
    # forward mode's .real was float's own: the tangent dropped, d(s.real * s) 1.5 for 3.0
    assert tg.gradient(f, 1.5)[0] == pytest.approx(3.0)
    assert tg.jvp(f, 1.5, 1.0)[1] == pytest.approx(3.0)


@pytest.mark.parametrize("f", [lambda x: tg.sum(x) ** 0.5, lambda x: tg.sum(x) ** tg.sum(x)])
def test_a_negative_scalar_to_a_fractional_power_is_refused(f):
    # Python's ** gives a complex number there: float() of it was a bare TypeError
    x = np.array([-0.5, -0.2])
    for call in (lambda: tg.gradient(f, x), lambda: tg.jvp(f, x, np.ones(2)),
                 lambda: tg.hvp(f, x, np.ones(2))):
        with pytest.raises(tg.TapegradError, match="complex"):
            call()


def test_numpy_numbers_are_refused_in_forward_mode_as_in_reverse():
    # tg.sum(x) * np.sum(x) gave half the tangent, and H v = 0 under tg.hvp
    v = np.array([1.0, 2.0, -0.5])
    f = lambda x: tg.sum(x) * np.sum(x)      # noqa: E731
    for call in (lambda: tg.gradient(f, X), lambda: tg.jvp(f, X, v),
                 lambda: tg.jacobian(f, X, mode=tg.Forward), lambda: tg.hvp(f, X, v)):
        with pytest.raises(tg.TapegradError, match="NumPy number"):
            call()
    # as a Python float, the same constant is a constant in every mode
    c = float(np.sum(X))
    g = lambda x: tg.sum(x) * c              # noqa: E731
    assert tg.jvp(g, X, v)[1] == pytest.approx(c * v.sum())
    np.testing.assert_allclose(tg.gradient(g, X)[0], c)


def test_another_tapes_scalar_as_a_source_is_refused():
    # its gradient came back 0.0 where another source kept the target connected
    A, B = X.copy(), np.zeros(3)
    with tg.Tape() as first:
        a = first.watch(1.5)
    with tg.Tape() as second:
        times(tg.CPU())(B, A, a, ndrange=3)
        loss = tg.sum(B) + tg.dot(A, A)
    for call in (lambda: second.gradient(loss, [A, a]),
                 lambda: second.vjp([loss], [1.0], [A, a])):
        with pytest.raises(tg.TapegradError, match="did not record"):
            call()


def test_scale_of_an_integer_array_promotes_as_numpy():
    # the factor was cast to the array's dtype first: tg.scale(arange(4), 0.5) was all 0
    ints = np.arange(4)
    for a in (0.5, 2.7, 3):
        got = tg.scale(ints, a)
        np.testing.assert_array_equal(got, a * ints)
        assert got.dtype == (a * ints).dtype
    assert tg.jvp(lambda a: tg.sum(tg.scale(ints, a)), 0.5, 1.0) == pytest.approx((3.0, 6.0))
    xf = np.array([1.0, 2.0])
    (g,) = tg.gradient(lambda xf: tg.sum(tg.scale(ints, 0.5)) * tg.sum(xf), xf)
    np.testing.assert_allclose(g, 3.0)


@pytest.mark.parametrize("scale", [1e20, 1e-30, 1e200])
def test_norm_where_the_squares_over_or_underflow(scale):
    dtype = np.float32 if scale < 1e100 else np.float64
    x = np.array([1.0, 3.0], dtype) * dtype(scale)
    exact = float(np.hypot(np.float64(x[0]), np.float64(x[1])))
    assert float(tg.norm(x)) == pytest.approx(exact, rel=1e-6)
    (g,) = tg.gradient(tg.norm, x)
    np.testing.assert_allclose(g, [1 / np.sqrt(10), 3 / np.sqrt(10)], rtol=1e-6)
    assert tg.jvp(tg.norm, x, np.array([1.0, 0.0], dtype))[1] == pytest.approx(
        1 / np.sqrt(10), rel=1e-6)


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value")
def test_small_misuses_get_tapegrad_errors_or_their_natural_answers():
    with tg.Tape() as tape:
        assert tg.make_zero(tape.watch(1.0)) == 0.0
    assert tg.gradient(tg.mean, np.zeros(0))[0].shape == (0,)
    assert tg.vjp(lambda s: s * s, 3.0, np.array([2.0])) == (9.0, 12.0)
    for mode in (tg.Reverse, tg.Forward):
        with pytest.raises(tg.TapegradError, match="takes an array x.*tg.jvp"):
            tg.jacobian(lambda s: s * s, 3.0, mode=mode)


def test_one_array_passed_twice_to_gradient_is_refused():
    # each argument got the derivative with respect to both (2x twice); numbers give partials
    for second in (X, X[:]):
        with pytest.raises(tg.TapegradError, match="arguments 0 and 1 share memory"):
            tg.gradient(lambda a, b: tg.dot(a, b), X, second)
    np.testing.assert_allclose(tg.gradient(lambda a, b: tg.dot(a, b), X, X.copy())[0], X)


def test_host_operations_refuse_an_opencl_array_of_another_queue():
    import pyopencl as cl
    import pyopencl.array as cla
    device = tg.OpenCL().queue.device
    own = cla.to_device(cl.CommandQueue(cl.Context([device])), X)
    # a bare AssertionError from PyOpenCL before ("queues must match")
    with pytest.raises(tg.TapegradError, match="another queue"):
        tg.gradient(lambda x: tg.dot(x, x), own)


def test_host_reductions_add_in_one_order_under_deterministic():
    # tg.dot and tg.norm were BLAS's, whose threads split the sum: a gradient through
    # tg.norm had other bits with OPENBLAS_NUM_THREADS=1 and 2; NumPy's own sum is pairwise,
    # in one order whatever the threads
    rng = np.random.default_rng(3)
    a, b = rng.random(100_003), rng.random(100_003)
    with tg.deterministic():
        assert float(tg.dot(a, b)) == float(np.sum(a * b))
        assert float(tg.norm(a)) == float(np.sqrt(np.sum(a * a)))
        (g,) = tg.gradient(tg.norm, a)
    np.testing.assert_allclose(g, a / np.linalg.norm(a), rtol=1e-12)


@tg.kernel
def cubed(E, X):
    i = tg.index()
    E[i] = X[i] * X[i] * X[i]


@tg.kernel
def moved(Y, X, F, dt):
    i = tg.index()
    Y[i] = X[i] + dt * F[i]


def _simulate(x, constant_forces=False, steps=3):
    """Forces F = dE/dx computed by a kernel-level tg.autodiff inside the recording."""
    for _ in range(steps):
        E, F = np.zeros_like(x), np.zeros_like(x)
        tg.autodiff(tg.Reverse, cubed(tg.CPU()), tg.Const, tg.Duplicated(E, np.ones_like(x)),
                    tg.Duplicated(x, F), ndrange=x.size)
        y = np.empty_like(x)
        moved(tg.CPU())(y, x, F.copy() if constant_forces else F, -0.01, ndrange=x.size)
        x = y
    return tg.sum(x)


def test_derivatives_a_kernel_level_autodiff_wrote_inside_a_recording_are_refused_when_read():
    # its derivative launches are not recorded: the gradient lost the forces' own derivative
    # (d/dx of x - 0.03 x^2 per step), silently
    x = np.linspace(0.1, 1.0, 5)
    with pytest.raises(tg.TapegradError, match="holds derivatives tg.autodiff"):
        tg.gradient(_simulate, x)
    h = 1e-6
    exact = np.array([(float(_simulate(x + h * e)) - float(_simulate(x - h * e))) / (2 * h)
                      for e in np.eye(5)])
    (constant,) = tg.gradient(lambda x: _simulate(x, constant_forces=True), x)
    np.testing.assert_allclose(constant, 1.0)           # the copy: constants, on purpose
    assert np.abs(exact - 1.0).max() > 1e-2             # (which is not the true gradient)


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_numpy_subclasses_as_inputs_and_directions(tmp_path):
    """(tg.dot of an np.matrix was NumPy's ValueError, tg.jacobian of one an IndexError, and
    tg.jvp refused a plain direction for a memmap as 'on another device'.)"""
    M = np.matrix(np.arange(12.0).reshape(3, 4))
    assert tg.dot(M, np.ones((3, 4))) == 66.0 and tg.dot(M, M) == float(np.sum(np.square(M)))
    (g,) = tg.gradient(lambda m: tg.dot(m, m), M)
    np.testing.assert_array_equal(np.asarray(g), 2.0 * np.asarray(M))
    J = tg.jacobian(lambda m: tg.scale(m, 2.0), M)
    np.testing.assert_array_equal(J, 2.0 * np.eye(12))
    x = np.memmap(tmp_path / "x.bin", dtype=np.float64, mode="w+", shape=(4,))
    x[:] = [1.0, 2.0, 3.0, 4.0]
    y, y_dot = tg.jvp(lambda a: tg.dot(a, a), x, np.array([1.0, 0.0, 0.0, 1.0]))
    assert (y, y_dot) == (30.0, 10.0)                # 2 (x0 + x3)
    g = tg.vjp(lambda a: tg.scale(a, 3.0), x, np.ones(4))[1]
    np.testing.assert_array_equal(g, np.full(4, 3.0))
    dx = np.zeros(4)                                 # (a plain shadow for a memmap)
    tg.autodiff(tg.Reverse, lambda a: tg.dot(a, a), tg.Active, tg.Duplicated(x, dx))
    np.testing.assert_array_equal(dx, 2.0 * np.asarray(x))
