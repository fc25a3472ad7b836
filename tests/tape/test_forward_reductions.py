"""Forward mode through the host operations (tg.sum, tg.mean, tg.dot, tg.norm, tg.scale,
tg.copy, tg.reshape) on NumPy and on OpenCL arrays (PoCL, the arrays' own kind).

Each tangent is checked against central differences in float64 on NumPy, and against reverse
mode on the same arrays: for a scalar result, ``J v`` equals ``<J^T 1, v>``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

rng = np.random.default_rng(42)
X = rng.uniform(0.2, 1.4, (3, 5))
V = rng.standard_normal((3, 5))
W = np.linspace(-1.0, 2.0, 15).reshape(3, 5)


@tg.kernel
def sin_times(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = math.sin(A[i, j]) * A[i, j]


def _launched(x):
    """``sin(x) * x`` by a kernel on ``x``'s backend."""
    be = tg.get_backend(x)
    y = tg.zeros(be, x.dtype, x.shape)
    sin_times(be)(y, x, ndrange=x.shape)
    return y


def _on(kind, x):
    return x if kind == "numpy" else tg.asarray(tg.OpenCL(), x)


# (name, f(x, w) -> a scalar; w is W on x's backend)
FUNCTIONS = {
    "sum": lambda x, w: tg.sum(x),
    "mean": lambda x, w: tg.mean(x),
    "dot x w": lambda x, w: tg.dot(x, w),
    "dot w x": lambda x, w: tg.dot(w, x),
    "dot x x": lambda x, w: tg.dot(x, x),
    "norm": lambda x, w: tg.norm(x),
    "scale by a sum": lambda x, w: tg.dot(tg.scale(x, tg.sum(x)), w),
    "copy": lambda x, w: tg.dot(tg.copy(x), x),
    "reshape": lambda x, w: tg.norm(tg.reshape(x, (5, 3))) * tg.mean(x),
    "kernel then sum": lambda x, w: tg.sum(_launched(x)),
    "arithmetic": lambda x, w: tg.sqrt(tg.dot(_launched(x), w) ** 2 + 1.0) / tg.norm(x)
    - 2.0 * tg.mean(x),
}


def _differences(f, x, v, h=1e-6):
    w = W.copy()
    return (float(f(x + h * v, w)) - float(f(x - h * v, w))) / (2 * h)


@pytest.fixture(params=["numpy", "opencl"])
def kind(request):
    return request.param


@pytest.mark.parametrize("name", FUNCTIONS)
def test_tangents_match_differences_and_reverse_mode(kind, name):
    f = FUNCTIONS[name]
    w = _on(kind, W)
    x, v = _on(kind, X), _on(kind, V)

    y, y_dot = tg.jvp(lambda x: f(x, w), x, v)
    assert float(y) == pytest.approx(float(f(X, W)), rel=1e-13)
    assert y_dot == pytest.approx(_differences(f, X, V), rel=1e-7, abs=1e-9)

    (g,) = tg.gradient(lambda x: f(x, w), _on(kind, X))
    assert tg.get_backend(g) == tg.get_backend(x)
    assert y_dot == pytest.approx(float(np.vdot(tg.to_numpy(g), V)), rel=1e-12, abs=1e-13)


@pytest.mark.parametrize("name", ["sum", "mean", "dot x w", "norm", "arithmetic"])
def test_autodiff_forward_modes_of_a_host_function(kind, name):
    f = FUNCTIONS[name]
    w = _on(kind, W)
    x = _on(kind, X)
    expected = _differences(f, X, V)

    tangent, primal = tg.autodiff(tg.ForwardWithPrimal, lambda x: f(x, w), tg.Duplicated,
                                  tg.Duplicated(x, _on(kind, V)))
    assert float(primal) == pytest.approx(float(f(X, W)), rel=1e-13)
    assert tangent == pytest.approx(expected, rel=1e-7, abs=1e-9)

    (tangent,) = tg.autodiff(tg.Forward, lambda x: f(x, w), tg.Duplicated,
                             tg.Duplicated(x, _on(kind, V)))
    assert tangent == pytest.approx(expected, rel=1e-7, abs=1e-9)

    # two directions at once: V and 3 V - W
    (both,) = tg.autodiff(tg.Forward, lambda x: f(x, w), tg.Duplicated,
                          tg.BatchDuplicated(x, (_on(kind, V), _on(kind, 3 * V - W))))
    assert both[0] == pytest.approx(expected, rel=1e-7, abs=1e-9)
    assert both[1] == pytest.approx(_differences(f, X, 3 * V - W), rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("name", ["sum", "mean", "dot x x", "norm", "kernel then sum"])
def test_float32_arrays_on_opencl_give_the_cpus_tangents(name):
    """The tangents' reductions run on the arrays' own module, in their precision's data:
    OpenCL's agree with NumPy's for float32 arrays too."""
    f = FUNCTIONS[name]
    x32, v32 = X.astype(np.float32), V.astype(np.float32)
    cl = tg.OpenCL()
    y_cpu, dot_cpu = tg.jvp(lambda x: f(x, None), x32, v32)
    y_cl, dot_cl = tg.jvp(lambda x: f(x, None), tg.asarray(cl, x32), tg.asarray(cl, v32))
    assert float(y_cl) == pytest.approx(float(y_cpu), rel=1e-6)
    assert dot_cl == pytest.approx(dot_cpu, rel=1e-5)
    assert dot_cl == pytest.approx(_differences(f, X, V), rel=1e-4)
