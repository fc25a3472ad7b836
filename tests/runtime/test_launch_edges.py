"""What crosses the launch boundary, at its edges: NumPy integer scalars in the launch's index
check (runtime/bounds.py: computed as Python ints, which neither wrap nor refuse negative
values), np.uint64 scalars past 2**63 - 1, read-only shadows and tangents, different views
of shared memory in one ``tg.autodiff`` call, masked arrays and empty PyOpenCL arrays: each
is run correctly or refused with a tapegrad error before anything runs.  Derivatives are
checked against float64 central differences."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg

rng = np.random.default_rng(3)
EPS = 1e-6


@tg.kernel
def strided(B, A, n):
    i = tg.index()
    B[i * n] = A[i * n]


@tg.kernel
def rev(B, A, n):
    i = tg.index()
    B[i] = A[n - 1 - i]


@tg.kernel
def sq(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


@tg.kernel
def mul(C, A, B):
    i = tg.index()
    C[i] = A[i] * B[i]


@tg.kernel
def sq2(C, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    C[i, j] = A[i, j] * A[i, j]


def fd(f, x: np.ndarray) -> np.ndarray:
    """The gradient of the scalar ``f`` at ``x`` by float64 central differences."""
    g = np.zeros_like(x)
    for k in range(x.size):
        e = np.zeros_like(x)
        e.flat[k] = EPS
        g.flat[k] = (f(x + e) - f(x - e)) / (2 * EPS)
    return g


def readonly(x: np.ndarray) -> np.ndarray:
    x.flags.writeable = False
    return x


# -- 03, 08: the launch check computes with Python ints -----------------------------------

@pytest.mark.parametrize("n", [np.int64(2**62), np.uint64(2**62)], ids=["int64", "uint64"])
def test_a_numpy_integer_in_an_index_does_not_wrap_in_the_launch_check(backend, n):
    """4 * np.int64(2**62) is 0 in NumPy: the check passed, and the launch read A[2**62] and
    wrote B[2**62] (a scatter put every value into B[0]).  As a Python int it was refused."""
    A, B = np.arange(1.0, 9.0), np.full(8, -1.0)
    for value in (int(n), n):
        with pytest.raises(tg.KernelIndexError, match=f"from 0 to {4 * 2**62}"):
            strided(backend)(B, A, value, ndrange=5)
        np.testing.assert_array_equal(B, -1.0)


@pytest.mark.parametrize("n", [np.uint8(4), np.uint32(4), np.uint64(4)],
                         ids=["uint8", "uint32", "uint64"])
def test_an_unsigned_numpy_integer_in_an_index_runs(backend, n):
    """n - 1 - i on an unsigned NumPy scalar raised a bare OverflowError in the check."""
    A = np.arange(4.0)
    for _ in range(2):              # (the general path, then the launch plan)
        B = np.zeros(4)
        rev(backend)(B, A, n, ndrange=4)
        np.testing.assert_array_equal(B, A[::-1])
    B = np.full(5, -1.0)            # past the end: said as an index error, nothing ran
    with pytest.raises(tg.KernelIndexError, match=r"from 0 to 4, but A.shape is \(4,\)"):
        rev(backend)(B, A, type(n)(5), ndrange=5)
    np.testing.assert_array_equal(B, -1.0)


# -- 02: np.uint64 past the int64s ------------------------------------------------------

def test_a_uint64_past_the_int64s_is_refused_as_a_python_int_is(backend):
    """np.uint64(2**63 + 2048) was taken and wrapped negative (B[i] = x stored -9.2e18 on
    OpenCL); a Python int that large is refused, and now so is it, also where a launch plan
    for np.uint64 arguments exists and in tg.autodiff."""
    A, B = np.arange(4.0), np.zeros(4)
    rev(backend)(B, A, np.uint64(4), ndrange=4)          # (a plan for np.uint64 arguments)
    np.testing.assert_array_equal(B, A[::-1])
    big = np.uint64(2**63 + 2048)
    B[:] = -1.0
    for n in (2**63 + 2048, big):
        with pytest.raises(tg.LaunchError, match=r"argument n = 9223372036854777856 .*does "
                                                 r"not fit in a 64-bit integer"):
            rev(backend)(B, A, n, ndrange=4)
    np.testing.assert_array_equal(B, -1.0)
    with pytest.raises(tg.LaunchError, match="does not fit in a 64-bit integer"):
        tg.autodiff(tg.Reverse, rev(backend), tg.Const, tg.Duplicated(B, np.ones(4)),
                    tg.Duplicated(A, np.zeros(4)), big, ndrange=4)
    np.testing.assert_array_equal(B, -1.0)


# -- 01: read-only shadows, tangents and outputs in tg.autodiff -------------------------

def test_read_only_shadows_are_refused_before_anything_runs(backend):
    """They failed inside Numba as 'a tapegrad bug', in reverse mode after the primal launch
    had overwritten B."""
    A = np.arange(1.0, 9.0)
    broadcast = np.broadcast_to(np.ones(1), (8,))
    cases = [   # (the array named, mode, B's annotation, A's annotation)
        ("dA", tg.Reverse, lambda B: tg.Duplicated(B, np.ones(8)),
         tg.Duplicated(A, readonly(np.zeros(8)))),
        ("dB", tg.Reverse, lambda B: tg.Duplicated(B, readonly(np.ones(8))),
         tg.Duplicated(A, np.zeros(8))),
        ("dB", tg.Reverse, lambda B: tg.Duplicated(B, broadcast), tg.Duplicated(A, np.zeros(8))),
        ("dB", tg.Forward, lambda B: tg.Duplicated(B, readonly(np.zeros(8))),
         tg.Duplicated(A, np.ones(8))),
        ("B", tg.Forward, lambda B: tg.Duplicated(readonly(B), np.zeros(8)),
         tg.Duplicated(A, np.ones(8))),
    ]
    for name, mode, make_b, a in cases:
        B = np.full(8, -1.0)
        b = make_b(B)
        before = [x.copy() for x in (A, a.dval, b.dval)]
        with pytest.raises(tg.LaunchError) as info:
            tg.autodiff(mode, sq(backend), tg.Const, b, a, ndrange=8)
        msg = str(info.value)
        assert f"{name} is read-only ({name}.flags.writeable is False" in msg, msg
        assert f"e.g. {name}.copy()" in msg and "Numba" not in msg, msg
        assert ("np.broadcast_to" in msg) == (b.dval is broadcast), msg
        np.testing.assert_array_equal(B, -1.0)             # nothing ran
        for x, old in zip((A, a.dval, b.dval), before):
            np.testing.assert_array_equal(x, old)
    # a tangent of an array the kernel only reads, and accumulate=False's seed (read, never
    # changed), may be read-only
    x0, w = rng.random(8), rng.random(8)
    B, dA = np.zeros(8), np.empty(8)
    tg.autodiff(tg.Reverse, sq(backend), tg.Const, tg.Duplicated(B, readonly(w.copy())),
                tg.Duplicated(x0.copy(), dA), ndrange=8, accumulate=False)
    np.testing.assert_allclose(dA, fd(lambda x: np.dot(w, x * x), x0), rtol=1e-6)
    v = readonly(np.broadcast_to(np.ones(1), (8,)))
    B, dB = np.zeros(8), np.zeros(8)
    tg.autodiff(tg.Forward, sq(backend), tg.Const, tg.Duplicated(B, dB),
                tg.Duplicated(x0.copy(), v), ndrange=8)
    np.testing.assert_allclose(dB, ((x0 + EPS) ** 2 - (x0 - EPS) ** 2) / (2 * EPS), rtol=1e-6)


# -- 04, 05: different views of one memory in one tg.autodiff call ----------------------

def _reversed(x0):
    x = x0.copy()
    return x, x[::-1]


def _in_part(x0):
    buf = np.concatenate([x0, x0])
    return buf[:8], buf[2:10]


def test_overlapping_views_in_one_autodiff_call_are_refused(backend):
    """x as Duplicated and x[::-1] as Const: the derivative through the view was dropped
    (silently wrong, in both modes).  Overlap in part too; every array left as it was."""
    x0, w = rng.random(8), rng.random(8)
    for mode in (tg.Reverse, tg.Forward):
        for views in (_reversed, _in_part):
            x, B = views(x0)
            xs, Bs = x.copy(), B.copy()
            C, dC, dx = np.zeros(8), w.copy(), np.full(8, 0.5)
            with pytest.raises(tg.LaunchError, match="arguments A and B are different views "
                                                     "of memory they share"):
                tg.autodiff(mode, mul(backend), tg.Const, tg.Duplicated(C, dC),
                            tg.Duplicated(x, dx), tg.Const(B), ndrange=8)
            for got, old in ((C, 0.0), (dC, w), (dx, 0.5), (x, xs), (B, Bs)):
                np.testing.assert_array_equal(got, old)
    # views that share no element are apart, and right (interleaved)
    x0 = rng.random(16)
    x, dx, C = x0.copy(), np.zeros(16), np.zeros(8)
    tg.autodiff(tg.Reverse, mul(backend), tg.Const, tg.Duplicated(C, w.copy()),
                tg.Duplicated(x[::2], dx[::2]), tg.Duplicated(x[1::2], dx[1::2]), ndrange=8)
    np.testing.assert_allclose(dx, fd(lambda v: np.dot(w, v[::2] * v[1::2]), x0), rtol=1e-6)
    # with a plan for separate arrays, the reversed view still takes the general path
    x, dx, C = x0[:8].copy(), np.zeros(8), np.zeros(8)
    for B in (x0[8:].copy(), x0[8:].copy(), x[::-1]):
        args = (tg.Duplicated(C, w.copy()), tg.Duplicated(x, dx), tg.Const(B))
        if B.base is None:
            tg.autodiff(tg.Reverse, mul(backend), tg.Const, *args, ndrange=8)
            continue
        dx[:] = 0.0
        with pytest.raises(tg.LaunchError, match="different views"):
            tg.autodiff(tg.Reverse, mul(backend), tg.Const, *args, ndrange=8)
        np.testing.assert_array_equal(dx, 0.0)


def test_views_of_the_same_elements_are_one_array(backend):
    """x[:, None] and x.reshape(4, 1) differ only in the stride of a size-1 dimension: the
    same elements in the same order, one array (an in-place kernel).  Taken as two, the
    adjoint read the overwritten x: 2 * x**2 instead of 2 * x."""
    x0 = np.arange(1.0, 5.0)
    grad = fd(lambda v: np.sum(v * v), x0)
    for shadows in ("one object", "views"):
        x, d = x0.copy(), np.ones(4)
        dC, dA = (d[:, None], d[:, None]) if shadows == "one object" else \
            (d[:, None], d.reshape(4, 1))
        tg.autodiff(tg.Reverse, sq2(backend), tg.Const, tg.Duplicated(x[:, None], dC),
                    tg.Duplicated(x.reshape(4, 1), dA), ndrange=(4, 1))
        np.testing.assert_allclose(x, x0 ** 2)
        np.testing.assert_allclose(d, grad, rtol=1e-6)
    x, t = x0.copy(), np.ones(4)                  # forward: one tangent, updated in place
    tg.autodiff(tg.Forward, sq2(backend), tg.Const, tg.Duplicated(x[:, None], t[:, None]),
                tg.Duplicated(x.reshape(4, 1), t.reshape(4, 1)), ndrange=(4, 1))
    np.testing.assert_allclose(t, grad, rtol=1e-6)
    x = x0.copy()                                 # one array, two different shadows
    with pytest.raises(tg.TapegradError, match="with different shadows"):
        tg.autodiff(tg.Reverse, sq2(backend), tg.Const, tg.Duplicated(x[:, None], np.ones((4, 1))),
                    tg.Duplicated(x.reshape(4, 1), np.zeros((4, 1))), ndrange=(4, 1))
    np.testing.assert_array_equal(x, x0)


# -- 06: masked arrays ------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")    # (np.matrix)
def test_a_masked_array_is_refused_with_the_way_out(backend):
    """It reached Numba ('Unsupported array type ... a tapegrad bug'); np.matrix, another
    subclass, runs."""
    A = np.ma.MaskedArray([[1.0, 2.0], [3.0, 4.0]], mask=[[0, 1], [0, 0]])
    C = np.zeros((2, 2))
    with pytest.raises(tg.LaunchError, match=r"argument A is a numpy.ma.MaskedArray; .*"
                                             r"np.ma.getdata\(A\).*A.filled\(value\)"):
        sq2(backend)(C, A, ndrange=(2, 2))
    with pytest.raises(tg.LaunchError, match=r"argument A's shadow dA is a numpy.ma"):
        tg.autodiff(tg.Reverse, sq2(backend), tg.Const, tg.Duplicated(C, np.ones((2, 2))),
                    tg.Duplicated(np.ma.getdata(A), np.ma.zeros((2, 2))), ndrange=(2, 2))
    np.testing.assert_array_equal(C, 0.0)
    M, C = np.matrix([[1.0, 2.0], [3.0, 4.0]]), np.matrix(np.zeros((2, 2)))
    sq2(backend)(C, M, ndrange=(2, 2))
    np.testing.assert_array_equal(C, np.square(M))


@tg.kernel
def scaled_by(B, A, s):
    i = tg.index()
    B[i] = A[i] * s


@pytest.mark.parametrize("s", [np.float16(1.5), np.longdouble(1.5)], ids=["float16", "longdouble"])
def test_a_numpy_number_of_another_precision_is_refused_as_a_number(backend, s):
    """(It was 'a float16, which does not live on CPU(); move it with tg.asarray'.)"""
    B = np.zeros(4)
    with pytest.raises(tg.LaunchError, match=r"argument s is a NumPy float\d+ number; .*"
                                             r"np.float64\(s\)"):
        scaled_by(backend)(B, np.arange(4.0), s, ndrange=4)
    assert not B.any()


def test_a_list_under_duplicated_is_named_as_a_list(backend):
    """(It was called 'a scalar'.)"""
    with pytest.raises(tg.TapegradError, match=r"argument A is a Python list; .*np.asarray\(A\)"):
        tg.autodiff(tg.Reverse, scaled_by(backend), tg.Const,
                    tg.DuplicatedNoNeed(np.zeros(4), np.ones(4)),
                    tg.Duplicated([0.0, 1.0, 2.0, 3.0], [0.0] * 4), 1.5, ndrange=4)


# -- 07: empty PyOpenCL arrays ----------------------------------------------------------

@tg.kernel
def add_extra(Y, X, E):
    i = tg.index()
    s = X[i]
    if i < E.shape[0]:
        s += E[i] * X[i]
    Y[i] = s


def _devices():
    def cpu():
        return tg.CPU(), lambda x: np.array(x, copy=True), lambda x: x

    def opencl():
        import pyopencl.array as cla
        cl = tg.OpenCL()
        return cl, lambda x: cla.to_device(cl.queue, np.ascontiguousarray(x)), \
            lambda x: x.get()
    return {"cpu": cpu, "opencl": opencl}


@pytest.mark.parametrize("device", sorted(_devices()))
def test_an_empty_array_has_no_elements_and_overlaps_nothing(device):
    """PyOpenCL gives a size-0 array no buffer (base_data None): launches, tg.autodiff, a tape
    and tg.debug_nans died with bare AttributeErrors (IndexError under debug_nans); the CPU
    ran them."""
    backend, on, back = _devices()[device]()
    x0, w = rng.random(3), rng.random(3)
    empty = np.zeros(0)
    Y, X = on(np.zeros(3)), on(x0)
    add_extra(backend)(Y, X, on(empty), ndrange=3)
    np.testing.assert_array_equal(back(Y), x0)
    with tg.debug_nans():
        add_extra(backend)(Y, X, on(empty), ndrange=3)
    dX, E, dE = on(np.zeros(3)), on(empty), on(empty)
    tg.autodiff(tg.Reverse, add_extra(backend), tg.Const, tg.Duplicated(Y, on(w)),
                tg.Duplicated(X, dX), tg.Duplicated(E, dE), ndrange=3)
    grad = fd(lambda v: np.dot(w, v), x0)
    np.testing.assert_allclose(back(dX), grad, rtol=1e-6)
    (g,) = tg.gradient(lambda x: (add_extra(backend)(Y, x, E, ndrange=3), tg.dot(Y, on(w)))[1],
                       on(x0))
    np.testing.assert_allclose(back(g), grad, rtol=1e-6)
    from tapegrad.tape.identity import array_key, overlapping
    E2 = on(empty)
    assert array_key(E) != array_key(E2) and not overlapping(E, E2)
