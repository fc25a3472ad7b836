"""The tape and the Enzyme-style API on host programs; every gradient meets an independent
oracle (finite differences in float64, a closed form, or forward-vs-reverse consistency)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

rng = np.random.default_rng(7)
CPU = tg.CPU()


@tg.kernel
def sin_kernel(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def scale(B, A, s):
    i = tg.index()
    B[i] = A[i] * s


@tg.kernel
def add_into(C, A, B):
    i = tg.index()
    C[i] = A[i] + B[i] * B[i]


@tg.kernel
def axpy_inplace(Y, a, X):
    i = tg.index()
    Y[i] = a * X[i] + Y[i]


def fd_gradient(f, x, eps=1e-6):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        p, m = x.copy(), x.copy()
        p[idx] += eps
        m[idx] -= eps
        g[idx] = (float(f(p)) - float(f(m))) / (2 * eps)
    return g


# -- the seed's three variants ------------------------------------------------------------

def run(B, A):
    sin_kernel(tg.get_backend(B))(B, A, ndrange=B.size)
    return tg.sum(B)


def test_seed_active_return_with_tg_sum():
    A, B = rng.random(100), np.zeros(100)
    dA, dB = tg.make_zero(A), tg.make_zero(B)
    out = tg.autodiff(tg.Reverse, run, tg.Active, tg.DuplicatedNoNeed(B, dB), tg.Duplicated(A, dA))
    assert out == ((None, None),)
    np.testing.assert_allclose(dA, np.cos(A))


def test_seed_const_return_with_seeded_shadow_is_a_vjp():
    A, B = rng.random(50), np.zeros(50)
    w = rng.random(50)
    dA, dB = tg.make_zero(A), w.copy()

    def run_nothing(B, A):
        sin_kernel(tg.get_backend(B))(B, A, ndrange=B.size)

    tg.autodiff(tg.Reverse, run_nothing, tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA))
    np.testing.assert_allclose(dA, np.cos(A) * w)
    assert not dB.any()          # B was overwritten: its shadow was consumed


def test_seed_non_scalar_active_return_names_the_ways_out():
    A, B = rng.random(5), np.zeros(5)

    def returns_array(B, A):
        sin_kernel(tg.get_backend(B))(B, A, ndrange=B.size)
        return B

    with pytest.raises(tg.TapegradError, match="must be a scalar") as info:
        tg.autodiff(tg.Reverse, returns_array, tg.Active, tg.DuplicatedNoNeed(B, np.zeros(5)),
                    tg.Duplicated(A, np.zeros(5)))
    for way in ("tg.Const", "tg.jacobian", "tg.Tape", "tg.sum"):
        assert way in str(info.value)


def test_tape_gradient_matches_the_design_example():
    A, B = rng.random(20), np.zeros(20)
    with tg.Tape() as tape:
        loss = run(B, A)
    (gA,) = tape.gradient(loss, [A])
    np.testing.assert_allclose(gA, np.cos(A))
    (again,) = tape.gradient(loss, [A])      # a tape can be asked twice
    np.testing.assert_allclose(again, gA)
    np.testing.assert_allclose(tape.gradient(loss, A), gA)   # a single source, no list


def test_reverse_with_primal_returns_the_value():
    A, B = rng.random(8), np.zeros(8)
    derivs, value = tg.autodiff(tg.ReverseWithPrimal, run, tg.Active,
                                tg.DuplicatedNoNeed(B, np.zeros(8)), tg.Duplicated(A, np.zeros(8)))
    assert value == pytest.approx(np.sin(A).sum())


# -- pipelines, temporaries, overwrites --------------------------------------------------------

def pipeline(A, B):
    n = A.size
    T1 = tg.zeros(CPU, np.float64, n)            # temporaries get shadows automatically
    T2 = np.empty(n)
    sin_kernel(CPU)(T1, A, ndrange=n)
    add_into(CPU)(T2, T1, B, ndrange=n)
    scale(CPU)(T1, T2, 3.0, ndrange=n)           # overwrites T1, which add_into read
    return tg.dot(T1, T1) + 0.5 * tg.sum(B)


def test_multi_kernel_pipeline_with_temporaries_and_an_overwrite():
    A, B = rng.random(6), rng.random(6)
    gA, gB = tg.gradient(pipeline, A, B)
    np.testing.assert_allclose(gA, fd_gradient(lambda a: pipeline(a, B), A), rtol=1e-6)
    np.testing.assert_allclose(gB, fd_gradient(lambda b: pipeline(A, b), B), rtol=1e-6)


def overwrite_input(A):
    B = np.empty_like(A)
    sin_kernel(CPU)(B, A, ndrange=A.size)        # reads A
    scale(CPU)(A, B, 2.0, ndrange=A.size)        # then overwrites A
    return tg.sum(A)


def test_overwriting_an_input_an_earlier_launch_read():
    # NVIDIA Warp gets this wrong silently; the tape keeps A's old contents for sin's adjoint
    A0 = rng.random(7)
    A = A0.copy()
    with tg.Tape() as tape:
        loss = overwrite_input(A)
    (g,) = tape.gradient(loss, [A])
    np.testing.assert_allclose(g, 2 * np.cos(A0))


def test_in_place_kernel_in_a_loop():
    X = rng.random(5)

    def loss(y0):
        Y = tg.copy(y0)                          # a recorded copy (NumPy's is invisible)
        for k in range(4):
            axpy_inplace(CPU)(Y, 0.5 + k, X, ndrange=Y.size)   # reads and overwrites Y
        return tg.dot(Y, Y)

    y0 = rng.random(5)
    (g,) = tg.gradient(loss, y0)
    np.testing.assert_allclose(g, fd_gradient(loss, y0), rtol=1e-6)


def test_a_source_the_tape_never_saw_is_an_error_not_a_zero_gradient():
    def loss(y0):
        Y = y0.copy()                            # NumPy: not recorded
        axpy_inplace(CPU)(Y, 2.0, Y.copy(), ndrange=Y.size)
        return tg.dot(Y, Y)

    with pytest.raises(tg.TapegradError, match="tg.copy"):
        tg.gradient(loss, rng.random(3))


@pytest.mark.parametrize("view", [lambda x: x[1:], lambda x: x[::2], lambda x: x.reshape(2, 3)])
def test_a_source_that_is_a_view_of_a_recorded_array_is_named_as_such(view):
    # (and a tracked array no record touched is not called a view of itself: see below)
    x, y = rng.random(6), np.zeros(6)
    with tg.Tape() as tape:
        sin_kernel(CPU)(y, x, ndrange=6)
        loss = tg.sum(y)
    with pytest.raises(tg.TapegradError, match=r"view of .* shape \(6,\).* slice its gradient"):
        tape.gradient(loss, view(x))
    np.testing.assert_allclose(view(tape.gradient(loss, x)), view(np.cos(x)), rtol=1e-12)


def test_changing_a_recorded_array_before_gradient_is_an_error():
    A, B = rng.random(4), np.zeros(4)
    with tg.Tape() as tape:
        loss = run(B, A)
    A[0] += 1.0
    with pytest.raises(tg.TapegradError, match="changed after recording"):
        tape.gradient(loss, [A])


def _record_chain(A, B, C):
    sin_kernel(CPU)(B, A, ndrange=A.size)
    sin_kernel(CPU)(C, B, ndrange=A.size)
    return tg.sum(C)


@pytest.mark.parametrize("keep", ["array", "view", "base", "list"])
def test_an_intermediate_the_user_can_still_reach_is_watched(keep):
    A = rng.random(4)
    base = np.zeros(8)
    held = []
    with tg.Tape() as tape:
        B = base[:4] if keep == "base" else np.zeros(4)
        loss = _record_chain(A, B, np.zeros(4))
        handle = {"array": B, "view": B[1:], "base": base, "list": None}[keep]
        if keep == "list":
            held.append(B)
        del B                            # before the recording ends: only `handle` or `held`
    (held[0] if keep == "list" else handle)[1] += 1.0   # changes what the 2nd launch read
    with pytest.raises(tg.TapegradError, match="changed after recording"):
        tape.gradient(loss, [A])


def test_intermediates_only_the_tape_holds_are_not_fingerprinted():
    # fingerprinting a 100-step simulation's states cost more than its gradient did
    A = rng.random(4)
    with tg.Tape() as tape:
        loss = _record_chain(A, np.zeros(4), np.zeros(4))
    assert len(tape.fingerprints) == 1   # A only: B and C are out of the user's reach
    (g,) = tape.gradient(loss, [A])
    np.testing.assert_allclose(g, np.cos(np.sin(A)) * np.cos(A), rtol=1e-12)


def test_partially_overlapping_views_are_refused():
    A = rng.random(10)

    def f(A):
        B = np.zeros(10)
        sin_kernel(CPU)(B[:5], A[:5], ndrange=5)
        sin_kernel(CPU)(B[2:7], A[2:7], ndrange=5)
        return tg.sum(B)

    with pytest.raises(tg.TapegradError, match="views"):
        tg.gradient(f, A)


def test_an_empty_view_does_not_hide_an_overlap():
    # an empty view has an empty byte range: listed among the ranges, it sat between B[:5]
    # and B[3:8] and hid their overlap from the neighbour check
    A = rng.random(10)

    def f(A):
        B = np.zeros(10)
        sin_kernel(CPU)(B[:5], A[:5], ndrange=5)
        sin_kernel(CPU)(B[2:][:0], A[2:][:0], ndrange=0)   # (B[2:2] starts at B's start)
        sin_kernel(CPU)(B[3:8], A[3:8], ndrange=5)
        return tg.sum(B[:5])

    with pytest.raises(tg.TapegradError, match="views"):
        tg.gradient(f, A)


def test_an_array_in_freed_memory_is_still_checked_for_overlapping_views():
    # a new array at a freed one's exact memory takes over its listed byte range; a view
    # overlapping part of the new array must still be refused
    A = rng.random(16)
    reused = []

    def f(A):
        for _ in range(10):
            D = np.empty(16)
            sin_kernel(CPU)(D, A, ndrange=16)
            address = D.ctypes.data
            del D
            D = np.empty(16)
            if D.ctypes.data == address:
                reused.append(True)
                break
        sin_kernel(CPU)(D, A, ndrange=16)               # D takes the freed array's range
        sin_kernel(CPU)(D[4:12], np.ones(8), ndrange=8)  # (A[4:12] would clash with A)
        return tg.sum(D)

    with pytest.raises(tg.TapegradError, match="views"):
        tg.gradient(f, A)
    assert reused, "the allocator never reused the memory: the test proves nothing"


# -- a 50-step simulation --------------------------------------------------------------------

@tg.kernel
def diffuse(T_new, T, kappa):
    i = tg.index()
    n = T.size
    left = T[i - 1] if i > 0 else T[i]
    right = T[i + 1] if i < n - 1 else T[i]
    T_new[i] = T[i] + kappa * (left - 2.0 * T[i] + right) - 0.01 * T[i] * T[i] * T[i]


def simulate(T0, kappa, steps=50):
    a, b = tg.copy(T0), np.empty_like(T0)
    for _ in range(steps):
        diffuse(CPU, 8)(b, a, kappa, ndrange=a.size)
        a, b = b, a
    return tg.dot(a, a)


def test_fifty_step_simulation_gradient_matches_finite_differences():
    T0 = rng.random(12)
    (g,) = tg.gradient(lambda t: simulate(t, 0.2), T0)
    fd = fd_gradient(lambda t: simulate(t, 0.2), T0)
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-9)


def test_active_scalar_argument_through_many_launches():
    T0 = rng.random(10)
    (derivs,) = tg.autodiff(tg.Reverse, lambda t, k: simulate(t, k, 20), tg.Active, T0,
                            tg.Active(0.15))
    eps = 1e-6
    fd = (simulate(T0, 0.15 + eps, 20) - simulate(T0, 0.15 - eps, 20)) / (2 * eps)
    assert derivs[1] == pytest.approx(float(fd), rel=1e-6)


# -- dynamic loops with loop-carried swaps inside a kernel, driven from the host --------------

@tg.kernel
def fib_like(B, A, n):
    i = tg.index()
    a = A[i]
    b = 0.5 * A[i]
    for _ in range(n):
        a, b = b, math.sin(a) + b
    B[i] = b


def test_dynamic_loop_with_swaps_under_the_tape():
    A = rng.random(5)

    def f(A):
        B = np.zeros(5)
        fib_like(CPU)(B, A, 6, ndrange=5)
        return tg.norm(B)

    (g,) = tg.gradient(f, A)
    np.testing.assert_allclose(g, fd_gradient(f, A), rtol=1e-6)


# -- host scalar arithmetic ---------------------------------------------------------------------

def test_arithmetic_on_reductions_stays_differentiable():
    x = rng.random(6) + 0.5

    def f(x):
        s = tg.sum(x)
        m = tg.mean(x)
        return (s * m - 2.0 / s + s ** 1.5 + tg.sqrt(tg.dot(x, x)) + tg.exp(-m) + tg.log(s)
                + abs(m - 3.0) + np.sqrt(s) - (-m))

    (g,) = tg.gradient(f, x)
    np.testing.assert_allclose(g, fd_gradient(f, x), rtol=1e-6)


def test_vjp_and_jacobian_against_each_other():
    x = rng.random(4)

    def f(x):
        y = np.zeros(4)
        sin_kernel(CPU)(y, x, ndrange=4)
        z = np.zeros(4)
        add_into(CPU)(z, y, x, ndrange=4)
        return z

    J = tg.jacobian(f, x)
    assert J.shape == (4, 4)
    np.testing.assert_allclose(J, np.diag(np.cos(x) + 2 * x), rtol=1e-12)
    w = rng.random(4)
    y, x_bar = tg.vjp(f, x, w)
    np.testing.assert_allclose(y, np.sin(x) + x * x)
    np.testing.assert_allclose(x_bar, J.T @ w, rtol=1e-12)


# -- registered adjoints ------------------------------------------------------------------------

def _np_cumsum_reverse(y_bar, x):
    return np.cumsum(y_bar[::-1])[::-1]


cumsum = tg.register_adjoint(np.cumsum, reverse=_np_cumsum_reverse)
bad_cumsum = tg.register_adjoint(np.cumsum, reverse=lambda y_bar, x: y_bar)  # wrong on purpose


def test_registered_adjoint_is_replayed():
    x = rng.random(6)

    def f(x):
        y = np.zeros(6)
        sin_kernel(CPU)(y, x, ndrange=6)
        return tg.dot(cumsum(y), x)

    (g,) = tg.gradient(f, x)
    np.testing.assert_allclose(g, fd_gradient(f, x), rtol=1e-6)


def test_wrong_registered_rule_is_caught_by_finite_differences():
    x = rng.random(6)

    def f(x):
        return tg.dot(bad_cumsum(x), x)

    (g,) = tg.gradient(f, x)
    assert not np.allclose(g, fd_gradient(f, x), rtol=1e-4)


def test_reused_shadows_of_finished_temporaries_start_from_zero():
    """The sweep hands a temporary's shadow to the next temporary of the same shape once no
    earlier record needs it.  Here each temporary is written only on its first half, so its
    shadow is only half consumed when it is handed on: it must be cleaned, not reused as is."""
    def f(x):
        total = tg.sum(x)
        t = x
        for _ in range(4):
            u = tg.copy(x)                       # a fresh temporary, fully defined
            scale(CPU, 4)(u, t, 1.5, ndrange=x.size // 2)   # first half only
            total = total + tg.dot(u, u)
            t = u
        return total

    x = rng.random(10)
    (g,) = tg.gradient(f, x)
    np.testing.assert_allclose(g, fd_gradient(f, x), rtol=1e-6, atol=1e-9)
    (again,) = tg.gradient(f, x)
    np.testing.assert_array_equal(g, again)


def test_replayed_adjoints_follow_each_records_pattern():
    """A sweep works an adjoint launch out once per kernel, argument types, ndrange and
    pattern of shadows (holding no values yet, covering the launch, read afterwards) and
    reuses it.  Here one kernel's records see several patterns at one ndrange (the last
    launch over all of x stores into x's new gradient, the earlier ones add to it), over
    more ndranges than a kernel keeps launches for, across sweeps and forms."""
    x = rng.random(80)
    sizes = list(range(1, x.size + 1)) + [x.size] * 3
    scales = 1.0 + np.arange(1, len(sizes) + 1) / 64

    def f(x):
        total = 0.0
        for n, s in zip(sizes, scales):
            u = np.empty(n)       # written whole by the launch: its shadow is read by no one
            scale(CPU)(u, x, s, ndrange=n)
            total = total + tg.dot(u, u)
        return total

    # d/dx_i of sum_k sum_{i < n_k} (x_i s_k)^2 = 2 x_i sum_{k: n_k > i} s_k^2
    expected = 2 * x * np.array([sum(s * s for n, s in zip(sizes, scales) if n > i)
                                 for i in range(x.size)])
    for _ in range(2):
        (g,) = tg.gradient(f, x)
        np.testing.assert_allclose(g, expected, rtol=1e-12)
    dx = np.ones_like(x)
    tg.autodiff(tg.Reverse, f, tg.Active, tg.Duplicated(x, dx))      # adds into dx
    np.testing.assert_allclose(dx, 1 + expected, rtol=1e-12)
    # a sweep whose one launch stores into x's new gradient: the IR view shows the adjoint
    # proper, the backend's source the code that ran (docs/autodiff.md): the storing variant
    (g,) = tg.gradient(_scaled_square, x)
    np.testing.assert_allclose(g, 2 * 1.5 ** 2 * x, rtol=1e-12)
    assert "A_bar[i] += " in scale.source(mode="reverse")
    ran = scale.source(mode="reverse", backend=CPU)
    assert "A_bar[np.uint64(i)] = _a1 * s" in ran and "A_bar[np.uint64(i)] += " not in ran


def _scaled_square(x):
    u = np.empty_like(x)
    scale(CPU)(u, x, 1.5, ndrange=x.size)
    return tg.dot(u, u)


def test_ndarray_subclasses_get_shadows_on_the_host():
    """A NumPy subclass is a host array: its shadow is a NumPy array (the tape once took any
    type but ndarray itself for a CuPy array and failed importing CuPy)."""

    class Tagged(np.ndarray):
        pass

    x = rng.random(6).view(Tagged)
    y = np.zeros(6).view(Tagged)
    with tg.Tape() as tape:
        sin_kernel(CPU)(y, x, ndrange=6)
        loss = tg.sum(y)
    np.testing.assert_allclose(tape.gradient(loss, x), np.cos(np.asarray(x)), rtol=1e-12)


def test_a_target_the_tape_did_not_record_says_why():
    x, y = rng.random(4), np.zeros(4)
    with tg.Tape() as tape:
        sin_kernel(CPU)(y, x, ndrange=4)
        s, m = tg.sum(y), tg.mean(y)
    with tg.Tape() as other:
        z = np.zeros(4)
        sin_kernel(CPU)(z, x, ndrange=4)
        elsewhere = tg.sum(z)
    with pytest.raises(tg.TapegradError, match=r"plain float .*after the `with tg.Tape\(\)`"):
        tape.gradient(s + m, x)            # arithmetic after the block is not recorded
    with pytest.raises(tg.TapegradError, match="must be a scalar, got an array of shape"):
        tape.gradient(y, x)
    with pytest.raises(tg.TapegradError, match="another tape"):
        tape.gradient(elsewhere, x)
    with pytest.raises(tg.TapegradError, match=r"a view of an array of shape \(4,\)"):
        tape.gradient(y[2:3], x)
    np.testing.assert_allclose(other.gradient(elsewhere, x), np.cos(x), rtol=1e-12)


@tg.kernel
def scaled_by_length(Y, X, S):
    i = tg.index()
    Y[i] = X[i] * S.shape[0]


def test_a_source_used_only_for_its_shape_is_not_called_a_view_of_itself():
    x, s, y = rng.random(5), rng.random(5), np.zeros(5)
    with tg.Tape() as tape:
        scaled_by_length(CPU)(y, x, s, ndrange=5)
        loss = tg.sum(y)
    with pytest.raises(tg.TapegradError, match="was not used by any recorded") as info:
        tape.gradient(loss, s)
    assert "view" not in str(info.value)
    np.testing.assert_allclose(tape.gradient(loss, x), np.full(5, 5.0))


# -- verify mode on arrays that live elsewhere ----------------------------------------------

class DeviceHash:
    """A fingerprint left on a GPU, as CuPy's is (tapegrad/backends/cuda/fingerprint.py): a
    one-element array that compares on the device, copies to the host with ``get()``, and
    refuses NumPy's implicit conversion, as CuPy's arrays do."""

    __cuda_array_interface__ = {"shape": (1,), "typestr": "<u8", "data": (0, False),
                                "version": 3}
    shape, dtype, ndim = (1,), np.dtype(np.uint64), 1

    def __init__(self, value):
        self.value = np.array([value], np.uint64)

    def get(self):
        return self.value.copy()

    def __eq__(self, other):
        return DeviceBool(self.value[0] == other.value[0])

    def __ne__(self, other):
        return DeviceBool(self.value[0] != other.value[0])

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


DeviceHash.__module__ = "cupy"


class DeviceBool(DeviceHash):
    def __init__(self, value):
        self.value = np.array([value])

    def __bool__(self):
        return bool(self.value[0])


def test_verify_compares_fingerprints_left_on_a_gpu_and_says_what_changed():
    from tapegrad.tape.fingerprint import fingerprint
    from tapegrad.tape.stamps import same_bits
    assert same_bits(DeviceHash(5), DeviceHash(5))
    assert not same_bits(DeviceHash(5), DeviceHash(6))
    A = rng.random(6)
    with tg.Tape(verify=True) as tape, pytest.raises(tg.TapegradError, match="changed by code"):
        tape.sample = lambda x: DeviceHash(fingerprint(x))
        B = np.zeros(6)
        sin_kernel(CPU)(B, A, ndrange=6)
        B[2] = 7.0
        tg.sum(B)
    with tg.Tape(verify=True) as tape:      # unchanged: nothing to say
        tape.sample = lambda x: DeviceHash(fingerprint(x))
        B = np.zeros(6)
        sin_kernel(CPU)(B, A, ndrange=6)
        loss = tg.sum(B)
    np.testing.assert_allclose(tape.gradient(loss, [A])[0], np.cos(A))


def test_verify_catches_host_code_changing_an_opencl_array():
    import pyopencl.array as cla  # (a test dependency: never skipped)
    cl = tg.OpenCL()
    A = tg.asarray(cl, rng.random(6))
    with tg.Tape(verify=True), pytest.raises(tg.TapegradError, match="changed by code"):
        B = tg.zeros(cl, np.float64, 6)
        sin_kernel(cl)(B, A, ndrange=6)
        B[2:3] = cla.to_device(cl.queue, np.array([7.0]))   # neither end: only verify sees it
        tg.sum(B)
    with tg.Tape(verify=True) as tape:
        B = tg.zeros(cl, np.float64, 6)
        sin_kernel(cl)(B, A, ndrange=6)
        loss = tg.sum(B)
    np.testing.assert_allclose(tape.gradient(loss, [A])[0].get(), np.cos(A.get()))
