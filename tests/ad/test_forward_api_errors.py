"""tg.jvp, tg.jacobian(mode=tg.Forward) and tg.autodiff(tg.Forward, f, ...) on host functions:
a result that carries no tangent is refused where reverse mode refuses it (a source nothing
used, an array or number NumPy made: it was a silent 0), and zero where reverse mode gives zero
(an array kernels wrote from constants); bad arguments of tg.jvp and tg.vjp are tapegrad
errors at the user's line, before anything is written (they were bare AttributeErrors and
TypeErrors, and tg.vjp(f, x, None) an all-NaN gradient); the valid forms, several inputs and
outputs included, against central differences."""

from __future__ import annotations

import re
import traceback

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
X = np.linspace(0.2, 1.0, 6)
V = np.linspace(1.0, -0.5, 6)
K = np.linspace(0.1, 0.5, 6)          # a constant


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = tg.sin(A[i])


def sines(a):
    b = np.empty_like(a)
    sin_kernel(tg.get_backend(a))(b, a, ndrange=a.size)
    return b


def raised(call, kind=tg.TapegradError):
    """The message of the tapegrad error ``call()`` raises, checked to point at this file's
    lines only (the user's line: tapegrad's frames are taken out)."""
    with pytest.raises(kind) as info:
        call()
    assert {f.filename for f in traceback.extract_tb(info.tb)} == {__file__}
    return str(info.value)


def central(f, xs, vs, h=1e-5):
    """The directional derivative of ``f(*xs)`` along ``vs`` by central differences (float64;
    several outputs: a tuple)."""
    def at(t):
        ys = f(*(x + t * v for x, v in zip(xs, vs)))
        return tuple(np.asarray(y, dtype=np.float64) for y in (ys if isinstance(ys, tuple)
                                                               else (ys,)))
    d = tuple((p - m) / (2 * h) for p, m in zip(at(h), at(-h)))
    return d if isinstance(f(*xs), tuple) else d[0]


# -- results that carry no tangent ----------------------------------------------------------

def _through_a_numpy_copy(x):
    return tg.dot(sines(x.copy()), K)       # (the copy is invisible: x itself is never read)


def _numpy_only(x):
    return sines(np.exp(x))


FORWARD = {
    "jvp": lambda f, x: tg.jvp(f, x, V.copy()),
    "jacobian": lambda f, x: tg.jacobian(f, x, mode=tg.Forward),
    "autodiff": lambda f, x: tg.autodiff(tg.Forward, f, tg.Duplicated,
                                         tg.Duplicated(x, V.copy())),
}
WHO = {"jvp": "tg.jvp: x", "jacobian": "tg.jacobian: x", "autodiff": "tg.autodiff: argument 0"}


@pytest.mark.parametrize("f", [_through_a_numpy_copy, _numpy_only], ids=["copy", "np.exp"])
@pytest.mark.parametrize("api", list(FORWARD))
def test_a_source_nothing_used_is_refused_as_reverse_mode_refuses_it(api, f):
    # (the tangent was 0.0, the Jacobian all zeros: sin(2x) . v by differences)
    x = X.copy()
    message = raised(lambda: FORWARD[api](f, x))
    assert message.startswith(f"{WHO[api]}, an array of shape (6,), was not used by any kernel "
                              "launch or tapegrad operation, so f's result carries no tangent")
    assert "tg.copy(x)" in message
    np.testing.assert_array_equal(x, X)
    with pytest.raises(tg.TapegradError, match="was not used by any recorded kernel launch"):
        tg.vjp(f, x, 1.0 if f is _through_a_numpy_copy else np.ones(6))


def _doubled(x):
    return sines(x) * 2.0            # NumPy's product: no tangent


def _summed_by_numpy(x):
    return np.sum(sines(x))          # a NumPy number


@pytest.mark.parametrize("api", ["jvp", "jacobian"])
def test_a_result_numpy_made_is_refused_as_reverse_mode_refuses_it(api):
    message = raised(lambda: FORWARD[api](_doubled, X.copy()))
    assert message.startswith(f"tg.{api}: f returned an array of shape (6,) that carries no "
                              "tangent and that no kernel launch or tapegrad operation was "
                              "given: NumPy made it")
    assert "tg.scale(B, 2.0)" in message
    message = raised(lambda: FORWARD[api](_summed_by_numpy, X.copy()))
    assert message.startswith(f"tg.{api}: f returned the number {float(np.sum(np.sin(X)))!r}, "
                              "which carries no tangent")
    assert "tg.sum" in message
    for f in (_doubled, _summed_by_numpy):
        with pytest.raises(tg.TapegradError, match="need f.x. to return an array its kernels"):
            tg.vjp(f, X.copy(), 1.0)


def test_a_constant_result_is_what_reverse_mode_makes_of_it():
    # an array kernels wrote from constants while x was used: zero, as tg.vjp and tg.jacobian
    def constant_array(x):
        sines(x)
        return sines(K)

    _, y_dot = tg.jvp(constant_array, X.copy(), V.copy())
    np.testing.assert_array_equal(y_dot, 0.0)
    np.testing.assert_array_equal(tg.jacobian(constant_array, X.copy(), mode=tg.Forward),
                                  tg.jacobian(constant_array, X.copy()))
    # a number: refused, as tg.gradient refuses it (forward mode cannot tell tg.sum of a
    # constant from a number NumPy computed)
    for f, x, v in [(lambda c: 3.0, 2.0, 1.0),
                    (lambda x: (sines(x), tg.sum(K))[1], X.copy(), V.copy())]:
        assert "which carries no tangent" in raised(lambda f=f, x=x, v=v: tg.jvp(f, x, v))
        with pytest.raises(tg.TapegradError, match="not from an operation|does not depend"):
            tg.gradient(f, x)
    # and the identity carries x's own tangent
    np.testing.assert_array_equal(tg.jvp(lambda x: x, X.copy(), V.copy())[1], V)


# -- arguments ------------------------------------------------------------------------------

JVP_ARGUMENTS = {
    "number for an array": ((X, 1.0), tg.LaunchError,
                            r"tg.jvp\(f, x, v\): got a float for v, but v must be an array like "
                            r"x \(shape \(6,\), dtype float64, same device: a numpy ndarray\); "
                            r"for the same number along every element, np.full_like\(x, 1.0\)"),
    "array for a number": ((2.0, np.ones(2)), tg.TapegradError,
                           r"tg.jvp\(f, x, v\): got an array of shape \(2,\) for v, but v must "
                           r"be a number, as x is"),
    "None direction": ((X, None), tg.LaunchError, r"got None for v, but v must be an array like x"),
    "None": ((None, None), tg.TapegradError,
             r"tg.jvp\(f, x, v\): x is an array or a number, got None"),
    "list": ((X, [1.0] * 6), tg.LaunchError, r"got a list for v, but v must be an array like x"),
    "dtype": ((X, V.astype(np.float32)), tg.LaunchError,
              r"got an array of shape \(6,\), dtype float32 for v, but v must be an array "
              r"like x"),
    "ints": ((np.arange(6), np.arange(6)), tg.TapegradError, "x must be a float array"),
    "one tuple": (((X, X + 1), V), tg.TapegradError,
                  r"several inputs are a tuple x, f\(\*x\), with a tuple v of as many "
                  r"directions.*got x a tuple of 2 and v ndarray"),
    "lengths": (((X, X + 1), (V,)), tg.TapegradError, "got x a tuple of 2 and v a tuple of 1"),
    "in a tuple": (((X, X + 1), (V, 1.0)), tg.LaunchError,
                   r"got a float for v\[1\], but v\[1\] must be an array like x\[1\]"),
    "one array twice": (((X, X), (V, V)), tg.TapegradError,
                        r"tg.jvp: x\[0\] and x\[1\] share memory .* so they would carry one "
                        r"tangent, not one each"),
    "empty": (((), ()), tg.TapegradError, "x is an empty tuple"),
}


@pytest.mark.parametrize("case", list(JVP_ARGUMENTS))
def test_bad_arguments_of_jvp_are_tapegrad_errors_before_anything_runs(case):
    (x, v), kind, match = JVP_ARGUMENTS[case]
    ran = []

    def f(*args):
        ran.append(True)
        return tg.sum(args[0])

    before = [np.copy(a) for a in (x, v) if isinstance(a, np.ndarray)]
    message = raised(lambda: tg.jvp(f, x, v), kind)
    assert re.search(match, message), message
    assert not ran
    assert all(np.array_equal(a, b) for a, b in zip([a for a in (x, v)
                                                     if isinstance(a, np.ndarray)], before))
    np.testing.assert_array_equal(X, np.linspace(0.2, 1.0, 6))


VJP_ARGUMENTS = {
    "None": (sines, None, tg.LaunchError,
             r"tg.vjp\(f, x, w\): got None for w, but w must be an array like f's output "
             r"\(shape \(6,\), dtype float64, same device: a numpy ndarray, or a number for "
             r"every element\)$"),
    "shape": (sines, np.ones(5), tg.LaunchError, r"got an array of shape \(5,\), dtype float64 for w"),
    "dtype": (sines, np.ones(6, np.float32), tg.LaunchError, r"got an array of shape \(6,\), dtype float32 for w"),
    "tuple for one output": (sines, (np.ones(6),), tg.LaunchError, "got a tuple for w, but w must be an array like"),
    "scalar output": (lambda x: tg.sum(sines(x)), np.ones(2), tg.TapegradError,
                      r"got an array of shape \(2,\) for w, but w must be a number, as "
                      r"f's output is"),
    "None for a scalar": (lambda x: tg.sum(sines(x)), None, tg.TapegradError,
                          "got None for w, but w must be a number, as f's output is"),
    "several outputs": (lambda x: (sines(x), tg.sum(x)), (np.ones(6), None), tg.TapegradError,
                        r"got None for w\[1\], but w\[1\] must be a number, as f's "
                        r"output 1 is"),
}


@pytest.mark.parametrize("case", list(VJP_ARGUMENTS))
def test_a_cotangent_unlike_the_output_is_refused_before_the_sweep(case):
    # (tg.vjp(f, x, None) returned an all-NaN gradient)
    f, w, kind, match = VJP_ARGUMENTS[case]
    x = X.copy()
    kept = [np.copy(a) for a in (w if isinstance(w, tuple) else (w,)) if a is not None]
    message = raised(lambda: tg.vjp(f, x, w), kind)
    assert re.search(match, message), message
    np.testing.assert_array_equal(x, X)
    for a, b in zip([a for a in (w if isinstance(w, tuple) else (w,)) if a is not None], kept):
        np.testing.assert_array_equal(a, b)


def test_vjp_refuses_one_array_given_as_two_inputs():
    # each got the gradient with respect to both (2 x twice for tg.dot(a, b))
    message = raised(lambda: tg.vjp(lambda a, b: tg.dot(a, b), (X, X[:]), 1.0))
    assert message.startswith("tg.vjp: x[0] and x[1] share memory")
    assert "each get the sum of both gradients" in message
    assert "tg.vjp(f, x, w): x is an array or a number" in raised(
        lambda: tg.vjp(tg.sum, None, 1.0))
    _, (a_bar, b_bar) = tg.vjp(lambda a, b: tg.dot(a, b), (X, X.copy()), 1.0)
    np.testing.assert_allclose(a_bar, X)
    np.testing.assert_allclose(b_bar, X)


def test_a_direction_on_another_device_is_refused_as_hvp_refuses_it():
    cl = tg.OpenCL()          # (PyOpenCL and PoCL: the test extra, as every OpenCL test)
    x = tg.asarray(cl, X)
    f = lambda a: tg.sum(sines(a))        # noqa: E731
    for who, call in [("tg.jvp(f, x, v)", lambda: tg.jvp(f, x, V.copy())),
                      ("tg.hvp(f, x, v)", lambda: tg.hvp(f, x, V.copy()))]:
        message = raised(call, tg.LaunchError)
        assert message.startswith(f"{who}: got an array of shape (6,), dtype float64, on "
                                  "another device (a numpy ndarray) for v, but v must be an "
                                  "array like x (shape (6,), dtype float64, same device: a "
                                  "pyopencl Array)")
    dx = V.copy()
    message = raised(lambda: tg.autodiff(tg.Forward, f, tg.Duplicated, tg.Duplicated(x, dx)),
                     tg.LaunchError)
    assert message.startswith("<lambda>: got an array of shape (6,), dtype float64, on "
                              "another device (a numpy ndarray) for its tangent, but its "
                              "tangent must be an array like argument 0")
    np.testing.assert_array_equal(dx, V)


# -- the valid forms, against central differences --------------------------------------------

def test_jvp_and_forward_jacobian_against_central_differences():
    x, v = X.copy(), V.copy()
    y, y_dot = tg.jvp(sines, x, v)
    np.testing.assert_allclose(y, np.sin(X), rtol=1e-15)
    np.testing.assert_allclose(y_dot, central(sines, (X,), (V,)), rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(v, V)            # (the caller's v is left as it was)
    J = tg.jacobian(sines, x, mode=tg.Forward)
    columns = np.stack([central(sines, (X,), (e,)) for e in np.eye(6)], axis=1)
    np.testing.assert_allclose(J, columns, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(J, tg.jacobian(sines, x), rtol=1e-14)
    (t,) = tg.autodiff(tg.Forward, lambda a: tg.dot(sines(a), K), tg.Duplicated,
                       tg.Duplicated(X.copy(), V.copy()))
    assert t == pytest.approx(float(central(lambda a: np.sin(a) @ K, (X,), (V,))), rel=1e-8)
    # a number x, its direction a number
    y, y_dot = tg.jvp(lambda c: tg.sum(sines(tg.scale(X, c))), 0.7, 2.0)
    assert y_dot == pytest.approx(float(central(lambda c: np.sum(np.sin(c * X)), (0.7,),
                                                (2.0,))), rel=1e-8)


def test_jvp_with_several_inputs_and_outputs_against_central_differences():
    def f(a, c, b):
        s = sines(a)
        return s, tg.dot(s, b) * c

    va, vc, vb = V.copy(), 0.5, np.cos(X)
    (s, d), (s_dot, d_dot) = tg.jvp(f, (X.copy(), 1.5, K.copy()), (va, vc, vb))
    s_fd, d_fd = central(lambda a, c, b: (np.sin(a), np.sin(a) @ b * c), (X, 1.5, K),
                         (V, 0.5, np.cos(X)))
    np.testing.assert_allclose(s, np.sin(X), rtol=1e-15)
    assert d == pytest.approx(float(np.sin(X) @ K * 1.5), rel=1e-14)
    np.testing.assert_allclose(s_dot, s_fd, rtol=1e-8, atol=1e-10)
    assert d_dot == pytest.approx(float(d_fd), rel=1e-8)
    # the sum of each input's part
    parts = [tg.jvp(lambda a: f(a, 1.5, K)[1], X.copy(), V.copy())[1],
             tg.jvp(lambda c: f(X, c, K)[1], 1.5, 0.5)[1],
             tg.jvp(lambda b: f(X, 1.5, b)[1], K.copy(), np.cos(X))[1]]
    assert d_dot == pytest.approx(sum(parts), rel=1e-13)
