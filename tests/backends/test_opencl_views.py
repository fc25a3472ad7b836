"""Views of PyOpenCL arrays as kernel arguments on PoCL: a contiguous view that starts inside
its buffer (``x[3:]``, ``x[2:10]``, a row ``A[1]``) is passed with its offset, in the primal,
tangent and adjoint launches and in a captured program's packed launches; a view that skips
elements is refused with the way out."""

from __future__ import annotations

import math

import numpy as np
import pyopencl.array as cla
import pytest

import tapegrad as tg

rng = np.random.default_rng(7)


@pytest.fixture(scope="module")
def cl():
    return tg.OpenCL()


def on(cl, x):
    return cla.to_device(cl.queue, np.ascontiguousarray(x))


@tg.kernel
def saxpy(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


@tg.kernel
def row_sums(S, A):
    i = tg.index()
    s = 0.0
    for j in range(A.shape[1]):
        s += A[i, j] * (j + 1)
    S[i] = s


@tg.kernel
def sin_times(B, A):
    i = tg.index()
    B[i] = math.sin(A[i]) * A[i]


@tg.kernel
def scaled(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i]


@tg.kernel
def gathered(Y, a, X, idx):
    i = tg.index()
    Y[i] = a * X[idx[i]] * X[idx[i]]


def test_launches_read_and_write_offset_views(cl):
    X, Y = rng.random(40), rng.random(30)
    Xd, Yd = on(cl, X), on(cl, Y)
    saxpy(cl)(Yd[2:10], 2.0, Xd[3:11], ndrange=8)
    saxpy(cl)(Yd[17:], -1.5, Xd[5:18], ndrange=13)       # 13 elements: an odd offset and end
    expected = Y.copy()
    expected[2:10] += 2.0 * X[3:11]
    expected[17:] += -1.5 * X[5:18]
    np.testing.assert_array_equal(Yd.get(), expected)   # elements outside the views untouched
    np.testing.assert_array_equal(Xd.get(), X)
    source = saxpy.source(backend=cl)
    assert "const long Y__offset" in source and "    X += X__offset;" in source


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
def test_rows_of_2d_arrays_and_blocks_of_rows(cl, dtype):
    A = rng.random((6, 5)).astype(dtype)
    S = np.zeros((4, 3), dtype)
    Ad, Sd = on(cl, A), on(cl, S)
    row_sums(cl)(Sd[2], Ad[1:4], ndrange=3)              # a block of rows, into a row
    weights = np.arange(1, 6, dtype=dtype)
    expected = S.copy()
    expected[2] = A[1:4] @ weights
    np.testing.assert_allclose(Sd.get(), expected, rtol=1e-6 if dtype == np.float32 else 1e-15)
    out = on(cl, np.zeros(9, dtype))
    saxpy(cl)(out[4:9], dtype(3.0), Ad[5], ndrange=5)    # one row of a 2-D array
    np.testing.assert_allclose(out.get(), np.r_[np.zeros(4), 3.0 * A[5]].astype(dtype),
                               rtol=1e-6)


def test_views_that_skip_elements_are_refused_with_the_way_out(cl):
    X = on(cl, np.arange(20.0))
    A = on(cl, np.arange(20.0).reshape(4, 5))
    Y = on(cl, np.zeros(10))
    for view, n in [(X[::2], 10), (A[:, 1], 4)]:
        with pytest.raises(tg.LaunchError, match="C-contiguous.*index it in the kernel"):
            saxpy(cl)(Y[:n], 1.0, view, ndrange=n)
    assert not Y.get().any()


def _on_sub_buffer(x, start, n):
    """Elements ``start .. start + n`` of ``x`` as an array on a sub-buffer of ``x``'s buffer:
    the same memory, through another buffer object."""
    size = x.dtype.itemsize
    region = x.base_data.get_sub_region(x.offset + start * size, n * size)
    return cla.Array(x.queue, n, x.dtype, data=region)


@pytest.mark.parametrize("kernel_or_plan", [1, 2])
def test_arrays_on_sub_buffers_are_the_memory_they_share(cl, kernel_or_plan):
    """A shadow on a sub-buffer of its own array's buffer is its array, and two shadows on a
    buffer and on a sub-buffer of it overlap: refused (by the general path and by the
    autodiff plan a first call leaves), nothing changed."""
    A, B = on(cl, np.linspace(0.1, 1.0, 64)), on(cl, np.zeros(64))
    dA, dB = on(cl, np.zeros(64)), on(cl, np.ones(64))
    for _ in range(kernel_or_plan - 1):     # (a plan for these types)
        tg.autodiff(tg.Reverse, sin_times(cl), tg.Const, tg.Duplicated(B, dB.copy()),
                    tg.Duplicated(A, dA.copy()), ndrange=64)
    shared = on(cl, np.full(96, 3.0))
    cases = [("its own array",
              (tg.Duplicated(B, dB), tg.Duplicated(A, _on_sub_buffer(A, 0, 64)))),
             ("share some of their elements",
              (tg.Duplicated(B, shared[:64]), tg.Duplicated(A, _on_sub_buffer(shared, 32, 64))))]
    for message, args in cases:
        before = [(a.val.get(), a.dval.get()) for a in args]
        with pytest.raises(tg.TapegradError, match=message):
            tg.autodiff(tg.Reverse, sin_times(cl), tg.Const, *args, ndrange=64)
        for a, (val, dval) in zip(args, before):
            np.testing.assert_array_equal(a.val.get(), val)
            np.testing.assert_array_equal(a.dval.get(), dval)


def test_a_reverse_gradient_through_offset_views_matches_differences(cl):
    An = rng.uniform(0.1, 1.5, 20)
    w = rng.standard_normal(8)
    A, dA = on(cl, An), on(cl, np.zeros(20))
    B, dB = on(cl, np.zeros(16)), on(cl, np.r_[np.full(2, 5.0), w, np.full(6, 7.0)])
    tg.autodiff(tg.Reverse, sin_times(cl), tg.Const, tg.Duplicated(B[2:10], dB[2:10]),
                tg.Duplicated(A[3:11], dA[3:11]), ndrange=8)

    def loss(a):
        return float(np.vdot(np.sin(a) * a, w))
    h, fd = 1e-6, np.zeros(8)
    for k in range(8):
        e = np.zeros(8)
        e[k] = h
        fd[k] = (loss(An[3:11] + e) - loss(An[3:11] - e)) / (2 * h)
    got = dA.get()
    np.testing.assert_allclose(got[3:11], fd, rtol=1e-7, atol=1e-9)
    assert not got[:3].any() and not got[11:].any()
    # B[2:10] was overwritten: its shadow consumed there, and only there
    np.testing.assert_array_equal(dB.get(), np.r_[np.full(2, 5.0), np.zeros(8), np.full(6, 7.0)])


def test_tangents_and_an_active_scalar_through_offset_views(cl):
    """Forward mode on views, and the reverse with an atomic adjoint and an Active scalar,
    against the closed forms of y = a x[idx]^2 and forward-vs-reverse consistency."""
    Xn, idx = rng.uniform(0.5, 1.5, 12), np.array([3, 3, 0, 5, 1, 3], np.int64)
    Xv, dXv = on(cl, np.r_[np.zeros(4), Xn]), on(cl, np.r_[np.zeros(4), rng.standard_normal(12)])
    Y, dY = on(cl, np.zeros(9)), on(cl, np.zeros(9))
    idx_d = on(cl, np.r_[np.zeros(1, np.int64), idx])
    tg.autodiff(tg.Forward, gathered(cl), tg.Const, tg.Duplicated(Y[3:], dY[3:]),
                tg.Duplicated(0.7, 1.0), tg.Duplicated(Xv[4:], dXv[4:]), idx_d[1:], ndrange=6)
    v = dXv.get()[4:]
    x_at = Xn[idx]
    np.testing.assert_allclose(Y.get()[3:], 0.7 * x_at ** 2, rtol=1e-15)
    y_dot = dY.get()[3:]
    np.testing.assert_allclose(y_dot, x_at ** 2 + 2 * 0.7 * x_at * v[idx], rtol=1e-13)
    assert not dY.get()[:3].any()

    wn = rng.standard_normal(6)
    dX = on(cl, np.zeros(16))
    Yr, dYr = on(cl, np.zeros(9)), on(cl, np.r_[np.zeros(3), wn])
    (derivs,) = tg.autodiff(tg.Reverse, gathered(cl), tg.Const, tg.Duplicated(Yr[3:], dYr[3:]),
                            tg.Active(0.7), tg.Duplicated(Xv[4:], dX[4:]), idx_d[1:],
                            ndrange=6)
    x_bar = dX.get()[4:]
    assert not dX.get()[:4].any()
    # <J v, w> == <J^T w, v>, the scalar's direction 1.0 with it
    assert float(np.vdot(y_dot, wn)) == pytest.approx(float(np.vdot(x_bar, v)) + derivs[1],
                                                      rel=1e-12)
    assert derivs[1] == pytest.approx(float(np.vdot(x_at ** 2, wn)), rel=1e-12)


def test_tg_gradient_of_a_host_function_given_a_view(cl):
    An = rng.uniform(0.1, 1.5, 20)
    A = on(cl, An)
    W = on(cl, np.linspace(-1, 1, 8))

    def f(a):
        B = tg.zeros(cl, np.float64, 8)
        sin_times(cl)(B, a, ndrange=8)
        return tg.dot(B, W) + tg.sum(B)

    (g,) = tg.gradient(f, A[3:11])
    a = An[3:11]
    np.testing.assert_allclose(g.get(), (np.sin(a) + a * np.cos(a)) * (1 + np.linspace(-1, 1, 8)),
                               rtol=1e-13)
    y, y_dot = tg.jvp(f, A[5:13], on(cl, np.ones(8)))
    a = An[5:13]
    assert y_dot == pytest.approx(float(np.sum((np.sin(a) + a * np.cos(a))
                                               * (1 + np.linspace(-1, 1, 8)))), rel=1e-13)


def test_a_captured_program_replays_on_a_view_at_another_offset(cl):
    """The packed launches put each call's offsets in their places with its buffers."""
    N, kappa = 50, 0.8
    big = rng.random(N + 20)

    def sim(u, kappa):
        for _ in range(4):
            u_new = cla.empty_like(u)
            scaled(cl)(u_new, kappa, u, ndrange=N)
            u = u_new
        return tg.dot(u, u)

    captured = tg.capture(sim)
    for start in (0, 3, 17):
        u = on(cl, big)[start:start + N]
        x = big[start:start + N]
        assert float(captured(u, kappa)) == pytest.approx(kappa ** 8 * np.vdot(x, x), rel=1e-13)
        g, g_kappa = tg.gradient(captured, u, kappa)
        np.testing.assert_allclose(g.get(), 2 * kappa ** 8 * x, rtol=1e-13)
        assert g_kappa == pytest.approx(8 * kappa ** 7 * np.vdot(x, x), rel=1e-12)
    assert captured.recordings == 1
    (program,) = captured.programs[next(iter(captured.programs))]
    assert [type(what).__name__ for packed, what in program.compiled if packed] == \
        ["QueuedLaunches"]


def test_host_reductions_and_their_tangents_on_views(cl):
    """tg.sum/dot/mean/norm of a row and of a block of rows, values and tangents against
    NumPy's closed forms; a view that skips elements is refused, not read wrongly."""
    An = rng.standard_normal((4, 6))
    Vn = rng.standard_normal((4, 6))
    A, V = on(cl, An), on(cl, Vn)
    assert float(tg.sum(A[1])) == pytest.approx(An[1].sum(), rel=1e-14)
    assert float(tg.mean(A[2:])) == pytest.approx(An[2:].mean(), rel=1e-14)
    assert float(tg.dot(A[1:3], A[2:4])) == pytest.approx(np.vdot(An[1:3], An[2:4]), rel=1e-14)
    y, y_dot = tg.jvp(lambda a: tg.norm(a) + tg.dot(a, A[0]), A[3], V[3])
    a, v = An[3], Vn[3]
    assert y == pytest.approx(np.linalg.norm(a) + np.vdot(a, An[0]), rel=1e-14)
    assert y_dot == pytest.approx(np.vdot(a, v) / np.linalg.norm(a) + np.vdot(v, An[0]),
                                  rel=1e-13)
    # (a view that skips elements is read through its strides, in one copy of its span)
    assert float(tg.sum(A[:, 1])) == pytest.approx(An[:, 1].sum(), rel=1e-14)
    assert float(tg.mean(A.T[::-1])) == pytest.approx(An.mean(), rel=1e-14)


@tg.kernel
def squares(Y, X):
    i = tg.index()
    Y[i] = X[i] * X[i]


def test_forward_mode_follows_a_view_made_again(cl):
    """A view's tangent belongs to its memory: ``a[1:4]`` made again (a new view object of
    the same buffer) carries the tangent the first one got (it was dropped as zero)."""
    def f(x):
        a = cla.zeros(cl.queue, 5, np.float64)
        squares(cl)(a[1:4], x, ndrange=3)
        return tg.dot(a[1:4], a[1:4])         # sum x^4
    x = np.array([1.0, 2.0, 3.0])
    _, tangent = tg.jvp(f, on(cl, x), on(cl, np.ones(3)))
    assert tangent == pytest.approx(float(np.sum(4 * x ** 3)), rel=1e-12)


@pytest.mark.parametrize("context", ["its own", "tapegrad's"])
def test_arrays_on_another_queue_are_refused_with_the_way_out(cl, context):
    """tapegrad launches on its own queue, in its own context: an array on another queue
    (of another context, whose buffers its kernels cannot use; or of its context, whose work
    its launches would not wait for) is refused, before and after a launch plan exists for
    those types, arrays untouched; the advice given works."""
    import pyopencl
    ctx = pyopencl.Context([cl.queue.device]) if context == "its own" else cl.queue.context
    queue = pyopencl.CommandQueue(ctx)
    X, Y = cla.to_device(queue, np.arange(8.0)), cla.zeros(queue, 8, np.float64)
    for planned in (False, True):
        if planned:
            saxpy(cl)(on(cl, np.zeros(8)), 2.0, on(cl, np.ones(8)), ndrange=8)
        with pytest.raises(tg.LaunchError, match=r"argument Y .* another queue.*"
                                                 r"tg.asarray\(tg.OpenCL\(0\), Y\)"):
            saxpy(cl)(Y, 2.0, X, ndrange=8)
        assert not Y.get().any()
    with pytest.raises(tg.LaunchError, match="shadow of X does not live on.*another queue"):
        tg.autodiff(tg.Reverse, saxpy(cl), tg.Const, tg.Duplicated(on(cl, np.zeros(8)),
                                                                   on(cl, np.ones(8))),
                    2.0, tg.Duplicated(on(cl, np.ones(8)), cla.zeros(queue, 8, np.float64)),
                    ndrange=8)
    Y, X = tg.asarray(cl, Y), tg.asarray(cl, X)
    saxpy(cl)(Y, 2.0, X, ndrange=8)
    np.testing.assert_array_equal(Y.get(), 2.0 * np.arange(8.0))


def test_a_captured_function_sees_views_of_one_buffer_on_a_replay_too(cl):
    """(A PyOpenCL view knows no base: a replay's key asks its bytes. After a first call on
    distinct arrays, two views of one memory, or of memory they share in part, are refused
    as in a first call; before, they replayed the distinct arrays' program.)"""
    def f(X, Y):
        saxpy(cl)(Y, 2.0, X, ndrange=8)
        return tg.sum(Y)

    captured = tg.capture(f)
    captured(on(cl, np.ones(8)), on(cl, np.zeros(8)))          # recorded on distinct arrays
    X = on(cl, np.arange(8.0))
    with pytest.raises(tg.errors.CaptureError, match="arguments 0 and 1 are the same array"):
        captured(X, X[:])
    np.testing.assert_array_equal(X.get(), np.arange(8.0))
    big = on(cl, np.arange(10.0))
    with pytest.raises(tg.TapegradError, match="two different views of the same memory"):
        captured(big[:8], big[2:10])
    np.testing.assert_array_equal(big.get(), np.arange(10.0))


def test_a_tape_follows_temporary_views_of_one_buffer(cl):
    """A PyOpenCL view knows no base: the tape holds the buffer that temporary views share,
    so a new view of the same elements is the array the kernel wrote (it was taken for a
    new, unwritten one: the kernel's share of the gradient was lost), and a view of other
    elements of a written buffer is refused as on the CPU."""
    An = np.linspace(0.1, 1.0, 20)
    for make, be in ((on, cl), (lambda _, x: x.copy(), tg.CPU())):
        A, B = make(cl, An), make(cl, np.zeros(16))
        with tg.Tape() as tape:
            sin_times(be)(B[2:10], A[3:11], ndrange=8)        # temporaries, dropped here
            loss = tg.sum(B[2:10]) + tg.dot(A[3:11], A[3:11])
        (g,) = tape.gradient(loss, [A[3:11]])
        a = An[3:11]
        np.testing.assert_allclose(tg.to_numpy(g), np.sin(a) + a * np.cos(a) + 2 * a,
                                   rtol=1e-13)

        def stencil(A, make=make, be=be):
            B, C = make(cl, np.zeros(16)), make(cl, np.zeros(16))
            sin_times(be)(B[2:10], A, ndrange=8)
            sin_times(be)(C, B, ndrange=16)
            return tg.sum(C)
        with pytest.raises(tg.TapegradError, match="two different views of the same memory"):
            tg.gradient(stencil, make(cl, An[:8]))


def test_a_change_after_the_recording_through_a_parent_array_is_refused(cl):
    """An input read through a temporary view and changed through its parent after the
    recording: refused at gradient(), as on the CPU (it was taken for memory only the tape
    held, and the gradient used the new contents: 0.0 for 6.0)."""
    An = np.linspace(0.1, 1.6, 16)
    A, B = on(cl, An), on(cl, np.zeros(8))
    with tg.Tape() as tape:
        k = tape.watch(0.5)
        saxpy(cl)(B, k, A[3:11], ndrange=8)
        loss = tg.sum(B)
    A.fill(0.0)
    with pytest.raises(tg.TapegradError, match="changed after recording"):
        tape.gradient(loss, [k])
    A.set(An)
    assert tape.gradient(loss, [k])[0] == pytest.approx(An[3:11].sum(), rel=1e-14)


def test_buffers_on_one_host_memory_are_one_memory(cl):
    """Two buffers made with USE_HOST_PTR on one NumPy array share their elements: a shadow
    on the other is refused before anything runs (the adjoint added into A itself)."""
    import pyopencl
    flags = pyopencl.mem_flags.READ_WRITE | pyopencl.mem_flags.USE_HOST_PTR
    An = np.linspace(0.1, 1.6, 16)
    host = An.copy()
    A, dA = (cla.Array(cl.queue, 16, np.float64,
                       data=pyopencl.Buffer(cl.queue.context, flags, hostbuf=host))
             for _ in range(2))
    B, dB = on(cl, np.zeros(16)), on(cl, np.ones(16))
    with pytest.raises(tg.TapegradError, match="shares memory with it"):
        tg.autodiff(tg.Reverse, sin_times(cl), tg.Const, tg.Duplicated(B, dB),
                    tg.Duplicated(A, dA), ndrange=16)
    np.testing.assert_array_equal(A.get(), An)
    np.testing.assert_array_equal(dB.get(), np.ones(16))


def test_arrays_on_shared_virtual_memory_are_refused_with_the_way_out(cl):
    import pyopencl.tools
    svm = pyopencl.tools.SVMAllocator(cl.queue.context, alignment=0, queue=cl.queue)
    X = cla.to_device(cl.queue, np.arange(8.0), allocator=svm)
    Y = cla.zeros(cl.queue, 8, np.float64, allocator=svm)
    for call in (lambda: saxpy(cl)(Y, 2.0, X, ndrange=8),
                 lambda: tg.gradient(lambda A: tg.sum(A), X)):
        with pytest.raises(tg.LaunchError, match="shared virtual memory.*default allocator"):
            call()
    assert not Y.get().any()


def test_host_operations_on_views_that_skip_elements(cl):
    """Read: the values NumPy's view has (tg.to_numpy, tg.asarray, reductions). Computed on
    the device (tg.copy/scale/reshape/make_zero_/dot), which PyOpenCL cannot do on such a
    view: a tapegrad error with the way out, the array untouched; it works as advised."""
    An = np.arange(12.0).reshape(3, 4)
    A, x = on(cl, An), on(cl, np.arange(10.0))
    for view, host in ((A[:, 1], An[:, 1]), (A.T, An.T), (x[::-3], np.arange(10.0)[::-3])):
        np.testing.assert_array_equal(tg.to_numpy(view), host)
        np.testing.assert_array_equal(tg.asarray(cl, view).get(), host)
    for call, name in ((lambda: tg.copy(A[:, 1]), "copy"), (lambda: tg.scale(A.T, 2.0), "scale"),
                       (lambda: tg.reshape(A.T, (12,)), "reshape"),
                       (lambda: tg.make_zero_(x[::2]), "make_zero_"),
                       (lambda: tg.dot(A.T, A.T), "dot"), (lambda: tg.norm(A.T), "norm")):
        with pytest.raises(tg.TapegradError, match=rf"tg.{name} got a view .* skips elements"
                                                   r".*tg.asarray\(backend, tg.to_numpy\(x\)\)"):
            call()
    np.testing.assert_array_equal(A.get(), An)
    np.testing.assert_array_equal(x.get(), np.arange(10.0))
    np.testing.assert_array_equal(tg.copy(tg.asarray(cl, tg.to_numpy(A[:, 1]))).get(), An[:, 1])
    with pytest.raises(tg.TapegradError, match=r"two kinds \(opencl and numpy\).*tg.asarray"):
        tg.dot(x, np.ones(10))
    for arr in (x, np.arange(10.0)):
        with pytest.raises(tg.TapegradError, match=r"shape \(10,\) cannot take shape \(3, 3\)"):
            tg.reshape(arr, (3, 3))


def test_a_captured_call_that_fails_on_entry_leaves_no_tape_recording(cl):
    """A captured call refused while it starts (a view that skips elements) leaves nothing
    behind: no tape records afterwards and math is Python's again (the tape stayed on)."""
    from tapegrad.tape.modes import recording_tapes

    def f(Y, X):
        saxpy(cl)(Y, 2.0, X, ndrange=8)
        return tg.sum(Y)
    captured = tg.capture(f)
    captured(on(cl, np.zeros(8)), on(cl, np.ones(8)))
    with pytest.raises(tg.TapegradError):
        captured(on(cl, np.zeros(8)), on(cl, np.arange(16.0))[::2])
    assert recording_tapes() == ()
    assert math.sin is math.sin.__self__.sin and float(tg.sum(np.ones(3))) == 3.0


def test_a_tape_counts_the_buffers_it_holds_for_views(cl):
    """A simulation launched on temporary views of new buffers: the tape holds each state's
    buffer (a later view of it is the same array), and tape.memory() says so; launched on
    the whole arrays, it holds none of them (linear steps: no adjoint reads a state)."""
    n, steps = 8, 20
    for views in (True, False):
        u = u0 = on(cl, np.linspace(0.0, 1.0, n))
        with tg.Tape() as tape:
            for _ in range(steps):
                out = cla.zeros(cl.queue, n, np.float64)
                scaled(cl)(out[:] if views else out, 0.5, u[:] if views else u, ndrange=n)
                u = out
            loss = tg.sum(u)
        held = tape.memory()["arrays"]
        assert held >= steps * n * 8 if views else held < 2 * n * 8, held
        (g,) = tape.gradient(loss, [u0])
        np.testing.assert_allclose(g.get(), np.full(n, 0.5 ** steps), rtol=1e-14)
