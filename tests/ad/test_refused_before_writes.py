"""``tg.autodiff`` refuses what it can before it writes anything of the caller's: integer
arrays given a shadow (at the host level as at the kernel level, and said before the shadow's
dtype), one shadow for an array a host function writes and another array, OpenCL shadows that
skip elements (before the primal launch and the seeding), Enzyme's ``Const(f)`` and
``autodiff_deferred``.  After each refusal the caller's arrays are as they were."""

from __future__ import annotations

import math

import numpy as np
import pyopencl.array as cla
import pytest

import tapegrad as tg


@tg.kernel
def sq(B, A, s):
    i = tg.index()
    B[i] = s * A[i] * A[i]


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def sin_times(B, A):
    i = tg.index()
    B[i] = math.sin(A[i]) * A[i]


def squares_sum(backend):
    def run(A):
        B = np.empty(A.shape, np.float64)
        sq(backend)(B, A, 1.5, ndrange=A.size)
        return tg.sum(B)
    return run


# -- integer arrays carry no derivative -----------------------------------------------------

@pytest.mark.parametrize("shadow", ["float", "int"])
def test_an_integer_array_given_a_shadow_is_refused_as_such_by_a_kernel(backend, shadow):
    Ai, B = np.arange(8), np.zeros(8)
    dB = np.ones(8)
    dAi = np.zeros(8) if shadow == "float" else tg.make_zero(Ai)
    for mode, dB_ in ((tg.Reverse, dB), (tg.Forward, dB)):
        with pytest.raises(tg.TapegradError, match=r"sq: A is an array of int64, and integer "
                           r"and boolean arrays carry no (derivative|tangent); pass it as "
                           r"tg.Const\(A\)") as info:
            tg.autodiff(mode, sq(backend), tg.Const, tg.Duplicated(B, dB_),
                        tg.Duplicated(Ai, dAi), 1.5, ndrange=8)
        assert "must match" not in str(info.value)
    assert not B.any() and (dB == 1).all() and not dAi.any()


def test_an_integer_array_given_a_shadow_is_refused_by_a_host_function(backend):
    ran = []

    def run(A):
        ran.append(True)
        return squares_sum(backend)(A)

    Ai = np.arange(8)
    for dAi in (tg.make_zero(Ai), np.zeros(8)):
        with pytest.raises(tg.TapegradError, match=r"run: argument 0 is an array of int64, "
                           r"and integer and boolean arrays carry no derivative; pass it as "
                           r"tg.Const"):
            tg.autodiff(tg.Reverse, run, tg.Active, tg.Duplicated(Ai, dAi))
        assert not dAi.any()
    with pytest.raises(tg.TapegradError, match="carry no tangent"):
        tg.autodiff(tg.Forward, run, tg.Const, tg.Duplicated(Ai, tg.make_zero(Ai)))
    assert not ran
    # as the message says: plain (or tg.Const), and the float argument differentiated
    x = np.linspace(0.1, 0.8, 8)
    dx = np.zeros(8)
    tg.autodiff(tg.Reverse, lambda A, idx: squares_sum(backend)(A), tg.Active,
                tg.Duplicated(x, dx), tg.Const(Ai))
    np.testing.assert_allclose(dx, 3.0 * x, rtol=1e-12)


# -- one shadow for a written array and another ---------------------------------------------

def test_one_shadow_for_a_written_and_a_read_array_is_refused_before_any_shadow_is_written(
        backend):
    def run(B, A):
        sin_k(backend)(B, A, ndrange=B.size)
        return tg.sum(B)

    A, B = np.linspace(0.1, 1.5, 16), np.zeros(16)
    dA = tg.make_zero(A)
    with pytest.raises(tg.LaunchError, match=r"run: one shadow array is given for arguments "
                       r"0 and 1, and a recorded operation wrote argument 0"):
        tg.autodiff(tg.Reverse, run, tg.Active, tg.DuplicatedNoNeed(B, dA),
                    tg.Duplicated(A, dA))
    assert not dA.any()                       # the seed 1 was in it


def test_a_kernels_seed_given_as_another_arrays_shadow_is_refused_before_the_primal(backend):
    A, B = np.linspace(0.1, 1.5, 16), np.zeros(16)
    d = np.ones(16)
    with pytest.raises(tg.LaunchError, match=r"sin_k: one shadow array is given for B, A, and "
                       r"the kernel writes one of them.*own shadow"):
        tg.autodiff(tg.Reverse, sin_k(backend), tg.Const, tg.Duplicated(B, d),
                    tg.Duplicated(A, d), ndrange=16)
    assert not B.any()                        # the primal launch did not run
    np.testing.assert_array_equal(d, 1.0)


def test_one_shadow_for_arrays_written_and_read_by_different_launches_is_refused(backend):
    """No launch sees both (the adjoint's own check cannot), and the sweep's consuming the
    written array's shadow dropped the other's gradient: 0 where d/dA is 1."""
    def run(B, A, C):
        sin_k(backend)(B, C, ndrange=B.size)
        return tg.sum(B) + tg.sum(A)

    A, B, C = np.linspace(0.1, 1.0, 8), np.zeros(8), np.linspace(0.2, 0.9, 8)
    d = np.zeros(8)
    with pytest.raises(tg.LaunchError, match="one shadow array is given for arguments 0 and 1"):
        tg.autodiff(tg.Reverse, run, tg.Active, tg.Duplicated(B, d), tg.Duplicated(A, d), C)
    assert not d.any()
    dA, dB = np.zeros(8), np.zeros(8)           # each its own: d/dA = 1, d/dC = cos C
    tg.autodiff(tg.Reverse, run, tg.Active, tg.Duplicated(B, dB), tg.Duplicated(A, dA), C)
    np.testing.assert_allclose(dA, 1.0, rtol=1e-12)


# -- Enzyme's spellings -------------------------------------------------------------------

def test_enzymes_const_around_the_function_says_to_drop_it():
    def cos_run(B, A):
        sin_k(tg.CPU())(B, A, ndrange=B.size)
        return tg.sum(B)

    A, B = np.linspace(0.1, 1.5, 16), np.zeros(16)
    dA, dB = tg.make_zero(A), tg.make_zero(B)
    with pytest.raises(tg.TapegradError, match=r"takes the function itself, not "
                       r"tg.Const\(...\) around it.*drop the wrapper, "
                       r"tg.autodiff\(tg.Reverse, cos_run, tg.Active"):
        tg.autodiff(tg.Reverse, tg.Const(cos_run), tg.Active, tg.DuplicatedNoNeed(B, dB),
                    tg.Duplicated(A, dA))
    assert not (B.any() or dA.any() or dB.any())


def test_autodiff_deferred_says_there_is_no_deferred_mode():
    with pytest.raises(tg.TapegradError, match=r"no deferred mode.*differentiate the host "
                       r"function that launches the kernel, tg.autodiff\(tg.Reverse, f"):
        tg.autodiff_deferred(tg.Reverse, print, tg.Active)


# -- OpenCL shadows that skip elements -------------------------------------------------------

@pytest.fixture(scope="module")
def cl():
    return tg.OpenCL()


A_HOST = np.linspace(0.1, 1.6, 16)
DERIV = np.sin(A_HOST) + A_HOST * np.cos(A_HOST)


def _launch(be, level, B, sB, A, sA):
    if level == "kernel":
        return tg.autodiff(tg.Reverse, sin_times(be), tg.Const, tg.Duplicated(B, sB),
                           tg.Duplicated(A, sA), ndrange=16)

    def f(B, A):
        sin_times(be)(B, A, ndrange=16)
        return tg.sum(B)
    return tg.autodiff(tg.Reverse, f, tg.Active, tg.Duplicated(B, sB), tg.Duplicated(A, sA))


@pytest.mark.parametrize("level", ["kernel", "host function"])
@pytest.mark.parametrize("which", ["dA", "dB"])
def test_strided_shadows_on_the_cpu_give_the_derivative(level, which):
    A, B = A_HOST.copy(), np.full(16, 9.0)
    dA, dB = np.zeros(32), np.ones(32)
    sA = dA[::2] if which == "dA" else dA[:16]
    sB = dB[::2] if which == "dB" else dB[:16]
    _launch(tg.CPU(), level, B, sB, A, sA)
    seeds = 2.0 if level == "host function" else 1.0       # (the seed dB and the Active return)
    np.testing.assert_allclose(sA, seeds * DERIV, rtol=1e-12)


@pytest.mark.parametrize("level", ["kernel", "host function"])
@pytest.mark.parametrize("which", ["dA", "dB"])
def test_opencl_shadows_that_skip_elements_are_refused_before_anything_runs(cl, level, which):
    def on(x):
        return cla.to_device(cl.queue, np.ascontiguousarray(x))

    A, B = on(A_HOST), on(np.full(16, 9.0))
    dA, dB = on(np.zeros(32)), on(np.ones(32))
    sA = dA[::2] if which == "dA" else dA[:16]
    sB = dB[::2] if which == "dB" else dB[:16]
    name = ("A" if which == "dA" else "B") if level == "kernel" else \
        ("argument 1" if which == "dA" else "argument 0")
    with pytest.raises(tg.LaunchError, match=rf"the shadow of {name} is a view that skips "
                       r"elements \(shape \(16,\), strides \(16,\)\).*tg.make_zero"):
        _launch(cl, level, B, sB, A, sA)
    np.testing.assert_array_equal(B.get(), 9.0)                 # no primal launch
    np.testing.assert_array_equal(dB.get(), 1.0)                # no seed, nothing consumed
    np.testing.assert_array_equal(dA.get(), 0.0)
    # as the message says: a contiguous shadow, copied into the view after
    dA2 = tg.make_zero(A)
    _launch(cl, level, B, dB[:16], A, dA2)
    seeds = 2.0 if level == "host function" else 1.0
    np.testing.assert_allclose(dA2.get(), seeds * DERIV, rtol=1e-12)


def test_an_opencl_tangent_that_skips_elements_is_refused_by_name(cl):
    A = cla.to_device(cl.queue, A_HOST)
    B = cla.to_device(cl.queue, np.full(16, 9.0))
    tA, tB = cla.to_device(cl.queue, np.ones(32)), cla.zeros(cl.queue, 16, np.float64)
    with pytest.raises(tg.LaunchError, match=r"sin_times: the tangent of A is a view that "
                       "skips elements"):
        tg.autodiff(tg.Forward, sin_times(cl), tg.Const, tg.Duplicated(B, tB),
                    tg.Duplicated(A, tA[::2]), ndrange=16)
    np.testing.assert_array_equal(B.get(), 9.0)
    np.testing.assert_array_equal(tB.get(), 0.0)


def test_an_autodiff_plan_takes_no_shadow_that_skips_elements(cl):
    """A plan made on contiguous shadows guards that they stay so: a strided one takes the
    general path, which refuses it before the primal launch (the plan ran it, and the adjoint
    launch refused it as ``B_bar``)."""
    from tapegrad.api.autodiff_plans import plans_of

    cfg = sin_times(cl)

    def on(x):
        return cla.to_device(cl.queue, np.ascontiguousarray(x))

    A, B, dA, dB = on(A_HOST), on(np.full(16, 9.0)), on(np.zeros(16)), on(np.ones(32))
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, dB[:16]), tg.Duplicated(A, dA),
                ndrange=16)
    np.testing.assert_allclose(dA.get(), DERIV, rtol=1e-12)
    assert len(plans_of(cfg)) == 1
    B, dA, dB = on(np.full(16, 9.0)), on(np.zeros(16)), on(np.ones(32))
    for seed in (dB[::2], dB[1::2]):
        with pytest.raises(tg.LaunchError, match="the shadow of B is a view that skips"):
            tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, seed),
                        tg.Duplicated(A, dA), ndrange=16)
    np.testing.assert_array_equal(B.get(), 9.0)
    np.testing.assert_array_equal(dB.get(), 1.0)
    np.testing.assert_array_equal(dA.get(), 0.0)
