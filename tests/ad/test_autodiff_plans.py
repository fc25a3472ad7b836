"""Autodiff plans (tapegrad/api/autodiff_plans.py): a reverse-mode ``tg.autodiff`` of a
configured kernel on a signature it has seen runs by the plan the general path wrote, with
the same results; whatever the plan's guards and per-call checks do not cover takes the
general path, which refuses it before anything runs."""

from __future__ import annotations

import math

import numpy as np
import pyopencl.array as cla
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import tapegrad as tg
import tapegrad.api
from tapegrad.api.autodiff_plans import plans_of
from tapegrad.bench.standin_cupy import installed

rng = np.random.default_rng(11)


@tg.kernel
def decay(X, Y, a):
    i = tg.index()
    X[i] = a * math.sin(X[i]) * Y[i]


@tg.kernel
def square(B, A):
    i = tg.index()
    B[i] = A[i] * A[i]


def _plan_keys(kernel):
    return [key for key in kernel.cache if isinstance(key, tuple)
            and key[:1] == ("autodiff plans",)]


@pytest.fixture(autouse=True)
def no_plans_yet():
    """Each test starts without the plans an earlier one left (its counts are its own)."""
    for kernel in (decay, square):
        for key in _plan_keys(kernel):
            del kernel.cache[key]


@pytest.fixture
def general_path_off(monkeypatch):
    """Turns the general path into an error: a call it would have run fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError("the general path ran where a plan should have")
    return lambda: monkeypatch.setattr(tapegrad.api, "autodiff_kernel", refused)


def run_decay(cfg, X, Y, W, n):
    dX, dY = W.copy(), np.zeros_like(Y)
    (derivs,) = tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(X, dX),
                            tg.Duplicated(Y, dY), tg.Active(0.7), ndrange=n)
    return dX, dY, derivs[2]


def test_a_second_call_runs_by_its_plan_with_the_general_paths_results(backend,
                                                                      general_path_off):
    """An in-place kernel (its old X copied for the adjoint), an Active scalar, one plan."""
    n = 37
    X0, Y, W = rng.uniform(-2, 2, n), rng.uniform(0.5, 1.5, n), rng.uniform(-1, 1, n)
    cfg = decay(backend, 8)
    results = []
    for k in range(2):
        if k == 1:
            general_path_off()
        X = X0.copy()
        results.append(run_decay(cfg, X, Y, W, n) + (X,))
    assert len(plans_of(cfg)) == 1
    for dX, dY, da, X in results:                                  # closed forms
        np.testing.assert_allclose(X, 0.7 * np.sin(X0) * Y, rtol=1e-14)
        np.testing.assert_allclose(dX, W * 0.7 * np.cos(X0) * Y, rtol=1e-13)
        np.testing.assert_allclose(dY, W * 0.7 * np.sin(X0), rtol=1e-13)
        assert math.isclose(da, float(np.sum(W * np.sin(X0) * Y)), rel_tol=1e-12)
    assert [r[0].tolist() for r in results[:1]] == [r[0].tolist() for r in results[1:]]


def test_accumulate_false_by_its_plan_leaves_the_seed_and_overwrites_the_result(
        backend, general_path_off):
    n = 16
    A, B, w = rng.uniform(-1, 1, n), np.zeros(n), rng.uniform(-1, 1, n)
    cfg = square(backend, 4)
    for k in range(2):
        if k == 1:
            general_path_off()
        dA = np.full(n, np.nan)                  # overwritten: its contents do not matter
        seed = w.copy()
        tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(B, seed),
                    tg.Duplicated(A, dA), ndrange=n, accumulate=False)
        np.testing.assert_array_equal(seed, w)
        np.testing.assert_allclose(dA, 2 * A * w, rtol=1e-15)
    assert len(plans_of(cfg, accumulate=False)) == 1


def test_forward_mode_by_its_plan_matches_the_closed_form(backend, general_path_off):
    """Tangents of arrays and of a scalar; BatchDuplicated calls take the general path."""
    n = 21
    X0, Y = rng.uniform(-2, 2, n), rng.uniform(0.5, 1.5, n)
    dX, dY = rng.uniform(-1, 1, n), rng.uniform(-1, 1, n)
    tB = (np.zeros(n), np.zeros(n))
    tg.autodiff(tg.Forward, square(backend, 8), tg.Const, tg.BatchDuplicated(np.zeros(n), tB),
                tg.BatchDuplicated(X0, (dX, 2 * dX)), ndrange=n)
    np.testing.assert_allclose(tB[1], 4 * X0 * dX, rtol=1e-14)
    assert not plans_of(square(backend, 8), reverse=False)
    cfg = decay(backend, 8)
    for k in range(3):
        if k == 2:
            general_path_off()
        X, tX = X0.copy(), dX.copy()
        tg.autodiff(tg.Forward, cfg, tg.Const, tg.Duplicated(X, tX), tg.Duplicated(Y, dY),
                    tg.Duplicated(0.7, 0.3), ndrange=n)
        np.testing.assert_allclose(X, 0.7 * np.sin(X0) * Y, rtol=1e-14)
        np.testing.assert_allclose(tX, 0.7 * np.cos(X0) * Y * dX + 0.7 * np.sin(X0) * dY
                                   + 0.3 * np.sin(X0) * Y, rtol=1e-12, atol=1e-15)
    assert len(plans_of(cfg, reverse=False)) == 1


def test_calls_outside_a_plans_guards_are_refused_as_before_with_arrays_untouched():
    n = 16
    cfg = square(tg.CPU(), 4)
    A, B, dB = rng.uniform(-1, 1, n), np.zeros(n), np.ones(n)
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, dB.copy()),
                tg.Duplicated(A, np.zeros(n)), ndrange=n)
    assert len(plans_of(cfg)) == 1
    before = A.copy()
    buffer = np.zeros(2 * n)
    calls = {
        "must match it": (tg.Duplicated(B, dB.copy()), tg.Duplicated(A, np.zeros(n + 1)), n),
        "is its own array": (tg.Duplicated(B, dB.copy()), tg.Duplicated(A, A), n),
        "share some of their elements": (tg.Duplicated(B, buffer[4:4 + n]),
                                         tg.Duplicated(A, buffer[:n]), n),
        "would index A from 0 to 19": (tg.Duplicated(B, dB.copy()), tg.Duplicated(A, np.zeros(n)),
                                       n + 4),
    }
    for message, (b, a, nd) in calls.items():
        with pytest.raises(tg.TapegradError, match=message):
            tg.autodiff(tg.Reverse, cfg, tg.Const, b, a, ndrange=nd)
        np.testing.assert_array_equal(A, before)
    assert not buffer.any()


def test_calls_a_plan_already_covers_write_no_second_one():
    """An ndrange given as a NumPy integer fails the plan's guards; the general path runs the
    call and finds the existing plan covers its arguments."""
    cfg = square(tg.CPU(), 8)
    for _ in range(6):
        tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(np.zeros(16), np.ones(16)),
                    tg.Duplicated(np.ones(16), np.zeros(16)), ndrange=np.int64(16))
    assert len(plans_of(cfg)) == 1


def test_an_ndrange_that_cuts_a_workgroup_gets_its_own_adjoint():
    """The adjoint is compiled for whole workgroups or for cut ones: a plan written for one
    does not run the other."""
    cfg = decay(tg.CPU(), 8)
    for n in (32, 29, 32, 29):
        X0, Y, W = rng.uniform(-2, 2, n), rng.uniform(0.5, 1.5, n), rng.uniform(-1, 1, n)
        X = X0.copy()
        dX, dY, da = run_decay(cfg, X, Y, W, n)
        np.testing.assert_allclose(dX, W * 0.7 * np.cos(X0) * Y, rtol=1e-13)
        assert math.isclose(da, float(np.sum(W * np.sin(X0) * Y)), rel_tol=1e-12)
    assert len(plans_of(cfg)) == 2


def test_pyopencl_arrays_run_by_a_plan(general_path_off):
    cl = tg.OpenCL()
    n = 24
    A = rng.uniform(-1, 1, n)
    cfg = square(cl, 8)
    for k in range(2):
        if k == 1:
            general_path_off()
        a, b = cla.to_device(cl.queue, A), cla.zeros(cl.queue, n, np.float64)
        da, db = cla.zeros(cl.queue, n, np.float64), cla.to_device(cl.queue, np.ones(n))
        tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(b, db), tg.Duplicated(a, da),
                    ndrange=n)
        np.testing.assert_allclose(da.get(), 2 * A, rtol=1e-15)
        np.testing.assert_allclose(b.get(), A * A, rtol=1e-15)


def test_cuda_launches_by_a_plan_hand_the_driver_what_the_general_path_did(
        monkeypatch, tmp_path, general_path_off):
    """On the stand-in CuPy (tapegrad/bench/standin_cupy.py): the same kernels, grids and
    argument bytes, the primal launch and the adjoint's."""
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(square, "cache", {})
    monkeypatch.setattr(square, "_configured", {})
    n = 40
    with installed() as cupy:
        driver = cupy.cuda.driver
        cfg = square(tg.CUDA(), 8)
        A, B, dA, dB = (cupy.asarray(rng.uniform(0.5, 1.5, n)) for _ in range(4))
        handed = []
        for k in range(2):
            if k == 1:
                general_path_off()
            driver.keep, driver.kept = True, []
            tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(B, dB), tg.Duplicated(A, dA),
                        ndrange=n)
            handed.append([(f, grid, block, b"".join(got))
                           for f, grid, block, _, _, got in driver.kept])
        assert len(handed[0]) == 2 and handed[0] == handed[1]


calls = st.fixed_dictionaries({
    "kernel": st.sampled_from(["decay", "square"]),
    "mode": st.sampled_from(["reverse", "functional", "forward"]),
    "n": st.sampled_from([16, 13]),                  # whole workgroups of 8, or a cut one
    "dtype": st.sampled_from(["float64", "float32"]),
    "shadows": st.sampled_from(["own", "views", "overlapping"]),
    # a Python float, a NumPy float of the arrays' dtype, np.float64 whatever the arrays' (a
    # float subclass: passed plain to the adjoint), a 0-d array as a scalar's tangent
    "scalar": st.sampled_from(["float", "numpy", "float64", "0-d tangent"]),
})


def _inputs(c, seed):
    """The arrays of one call (shadows and tangents: separate arrays, views into one buffer,
    or a view overlapping an argument's array), made afresh from ``seed``."""
    r = np.random.default_rng(seed)
    n, dtype = c["n"], np.dtype(c["dtype"])
    X, Y = r.uniform(-2, 2, n).astype(dtype), r.uniform(0.5, 1.5, n).astype(dtype)
    X[:4] = [0.0, -0.0, np.inf, np.nan]             # (special values travel the same way)
    buffer = r.uniform(-1, 1, 3 * n).astype(dtype)
    if c["shadows"] == "own":
        dX, dY = buffer[:n].copy(), buffer[n:2 * n].copy()
    elif c["shadows"] == "views":
        dX, dY = buffer[:n], buffer[n:2 * n]
    else:
        both = np.concatenate([Y, buffer[:n]])
        Y, dX, dY = both[:n], buffer[n:2 * n], both[n // 2:n // 2 + n]
    scalar = {"numpy": dtype.type(0.7), "float64": np.float64(0.7)}.get(c["scalar"], 0.7)
    return X, Y, dX, dY, scalar


def _call(cfg, c, X, Y, dX, dY, scalar):
    n = c["n"]
    if c["kernel"] == "square":
        X, dX = Y, dY.copy() if c["shadows"] == "own" else dX
    if c["mode"] == "forward":
        tangent = np.array(0.3) if c["scalar"] == "0-d tangent" else type(scalar)(0.3)
        rest = (tg.Duplicated(scalar, tangent),) if c["kernel"] == "decay" else ()
        return tg.autodiff(tg.Forward, cfg, tg.Const, tg.Duplicated(X, dX), tg.Duplicated(Y, dY),
                           *rest, ndrange=n)
    rest = (tg.Active(scalar),) if c["kernel"] == "decay" else ()
    first = tg.DuplicatedNoNeed(X, dX) if c["mode"] == "functional" else tg.Duplicated(X, dX)
    return tg.autodiff(tg.Reverse, cfg, tg.Const, first, tg.Duplicated(Y, dY), *rest,
                       ndrange=n, accumulate=c["mode"] != "functional")


def _outcome(cfg, c, seed):
    arrays = _inputs(c, seed)
    try:
        result = repr(_call(cfg, c, *arrays))        # (the derivatives' types too)
    except tg.TapegradError as e:
        result = (type(e), str(e).split(": ", 1)[-1])
    return result, [repr(a.tolist()) for a in arrays[:4]]    # (repr: nan equals nan)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(calls, min_size=4, max_size=8), st.integers(0, 2**32 - 1))
@example([{"kernel": "decay", "mode": m, "n": 16, "dtype": "float32", "shadows": "own",
           "scalar": s} for m, s in (("reverse", "float64"), ("forward", "0-d tangent"))], 5)
def test_calls_by_plans_equal_the_general_paths_bit_for_bit(backend, sequence, seed):
    """A run of calls on one configured kernel, each compared, results, arrays and errors,
    with the same call made on the general path (the kernel's plans set aside for it)."""
    kernels = {"decay": decay(backend, 8), "square": square(backend, 8)}
    for k, c in enumerate(sequence):
        cfg = kernels[c["kernel"]]
        cache = cfg.kernel.cache
        kept = {key: cache.pop(key) for key in _plan_keys(cfg.kernel)}
        expected = _outcome(cfg, c, seed + k)
        cache.update(kept)
        assert _outcome(cfg, c, seed + k) == expected
