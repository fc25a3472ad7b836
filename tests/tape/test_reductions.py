"""Host reductions on a tape (tg.sum, tg.mean, tg.dot, tg.norm) and the change detector.

Each reduction's cotangent is computed only for the active arrays and written straight into
a shadow that holds no values yet, or added to one that does; every gradient here is checked
against central differences in float64.
"""

from __future__ import annotations

import weakref

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.tape.fingerprint import fingerprint


def _differences(f, x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    g = np.zeros(x.shape)
    for k in np.ndindex(x.shape):
        up, down = x.astype(np.float64), x.astype(np.float64)
        up[k] += h
        down[k] -= h
        g[k] = (f(up) - f(down)) / (2 * h)
    return g


def _tape_gradient(loss, x: np.ndarray) -> np.ndarray:
    with tg.Tape() as tape:
        value = loss(x)
    return tape.gradient(value, x)


W = np.array([[0.5, -1.0, 2.0], [3.0, 0.25, -0.75]])
MASK = np.array([[1, 0, 2], [0, 3, 1]], dtype=np.int32)


@pytest.mark.parametrize("loss, reference", [
    (lambda x: tg.sum(x), lambda x: float(np.sum(x))),
    (lambda x: tg.mean(x), lambda x: float(np.mean(x))),
    (lambda x: tg.dot(x, W), lambda x: float(np.vdot(x, W))),
    (lambda x: tg.dot(W, x), lambda x: float(np.vdot(W, x))),
    (lambda x: tg.dot(x, x), lambda x: float(np.vdot(x, x))),
    (lambda x: tg.dot(x, MASK), lambda x: float(np.vdot(x, MASK))),     # an int constant
    (lambda x: tg.norm(x), lambda x: float(np.linalg.norm(x))),
    # one shadow reached twice: the first cotangent is stored, the second added
    (lambda x: tg.dot(x, W) + 2.0 * tg.sum(x) - tg.norm(x),
     lambda x: float(np.vdot(x, W) + 2.0 * np.sum(x) - np.linalg.norm(x))),
], ids=["sum", "mean", "dot x w", "dot w x", "dot x x", "dot x int", "norm", "sum of three"])
def test_reduction_gradients_match_differences(loss, reference):
    x = np.array([[0.3, -1.2, 0.7], [2.0, -0.4, 1.1]])
    assert np.allclose(_tape_gradient(loss, x), _differences(reference, x), atol=1e-7)


def test_float32_array_against_float64_weights():
    # the cotangent bar * w (float64) lands in the float32 shadow
    x = np.array([[0.3, -1.2, 0.7], [2.0, -0.4, 1.1]], dtype=np.float32)
    g = _tape_gradient(lambda x: tg.dot(x, W), x)
    assert g.dtype == np.float32
    assert np.allclose(g, W, rtol=1e-6)


def test_norm_at_zero_has_zero_gradient():
    g = _tape_gradient(lambda x: tg.norm(x) + tg.sum(x), np.zeros(4))
    assert np.array_equal(g, np.ones(4))       # only the sum's part


def test_a_constant_factor_gets_no_shadow_work():
    # the gradient with respect to one factor of a dot is the other factor, whichever it is
    x, w = np.arange(1.0, 4.0), np.array([2.0, -1.0, 0.5])
    with tg.Tape() as tape:
        loss = tg.dot(x, w)
    gx, gw = tape.gradient(loss, [x, w])
    assert np.array_equal(gx, w) and np.array_equal(gw, x)
    assert np.array_equal(tape.gradient(loss, x), w)     # asked again, one source


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int8, np.bool_, np.complex64])
@pytest.mark.parametrize("size", [0, 1, 3, 7, 8, 13])
def test_fingerprint_sees_every_single_element_change(dtype, size):
    rng = np.random.default_rng(size)
    x = (rng.random(size) * 10).astype(dtype)
    before = fingerprint(x)
    assert fingerprint(x.copy()) == before
    for k in range(size):
        y = x.copy()
        y[k] = (not y[k]) if dtype is np.bool_ else y[k] + 1
        assert fingerprint(y) != before, (dtype, size, k)


def test_fingerprint_of_views_and_unaligned_data():
    x = np.arange(24.0).reshape(4, 6)
    assert fingerprint(x[:, ::2]) == fingerprint(np.ascontiguousarray(x[:, ::2]))
    assert fingerprint(x.T) == fingerprint(np.ascontiguousarray(x.T))
    raw = np.zeros(8 * 5 + 1, np.uint8)
    shifted = raw[1:].view(np.float64)          # data at an odd address
    shifted[:] = [1.0, 2.0, 3.0, 4.0, 5.0]
    before = fingerprint(shifted)
    assert before == fingerprint(shifted.copy())
    shifted[2] = -3.0
    assert fingerprint(shifted) != before
    assert fingerprint(np.full((), 2.5)) == fingerprint(np.array(2.5))          # 0-d


def test_swapped_elements_change_the_fingerprint():
    x = np.arange(10.0)
    y = x.copy()
    y[[2, 7]] = y[[7, 2]]
    assert fingerprint(y) != fingerprint(x)


def test_shadows_kept_for_the_next_gradient_start_from_nothing():
    # finished shadows go to tape.spares for the next sweep; poisoned with NaN there, they
    # must still be written or zeroed before anything reads them
    from tapegrad.tape.arrays import spares

    @tg.kernel
    def smooth(B, A):
        i = tg.index()
        n = A.size
        B[i] = 0.5 * A[i] + 0.25 * (A[(i + n - 1) % n] + A[(i + 1) % n])

    cpu = tg.CPU()
    x, w = np.linspace(0.0, 1.0, 16), np.cos(np.arange(16.0))

    def loss(x):
        t = tg.copy(x)
        for _ in range(3):
            t_new = np.empty_like(t)
            smooth(cpu)(t_new, t, ndrange=t.size)
            t = t_new
        return tg.dot(t, w) + tg.sum(t)

    first = tg.gradient(loss, x)
    assert any(meta[1] == x.shape for meta, _ in spares.kept)
    for _, a in spares.kept:
        a.fill(np.nan)
    again = tg.gradient(loss, x)
    assert np.array_equal(first, again)
    step = lambda v: 0.5 * v + 0.25 * (np.roll(v, 1) + np.roll(v, -1))   # noqa: E731
    assert np.allclose(first, _differences(lambda v: float(np.dot(step(step(step(v))), w + 1)),
                                           x))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("size", [2, 3, 4, 100])
def test_fingerprint_sees_sign_flips_and_high_bit_changes(dtype, size):
    # found in review: with one multiply per word, the terms of two words whose top bit
    # flipped changed by exactly 2^63 each and cancelled (x *= -1 went unnoticed ~half the time)
    rng = np.random.default_rng(size)
    for _ in range(100):
        x = (rng.standard_normal(size) * 1000).astype(dtype)
        before = fingerprint(x)
        if dtype is np.int64:
            x ^= np.int64(1) << np.int64(62)
        else:
            x *= -1
        assert fingerprint(x) != before


def test_negating_a_recorded_array_before_the_gradient_is_caught():
    A = np.array([1.0, 2.0])
    with tg.Tape() as tape:
        loss = tg.dot(A, A)
    A *= -1
    with pytest.raises(tg.TapegradError, match="changed after recording"):
        tape.gradient(loss, [A])


@pytest.mark.parametrize("dtype, x, factor", [
    (np.float64, [1e-150, 0.0], 1e300),      # bar / value alone overflows: 1e450
    (np.float32, [1e-15, 0.0], 1e30),        # 1e45 is no float32
])
def test_norm_gradient_with_a_large_adjoint_and_a_small_norm_stays_finite(dtype, x, factor):
    x = np.array(x, dtype)
    g = tg.gradient(lambda x: tg.norm(x) * factor, x)
    expected = factor * x.astype(np.float64) / np.linalg.norm(x.astype(np.float64))
    assert np.all(np.isfinite(g))
    assert np.allclose(g, expected.astype(dtype), rtol=1e-6)


@pytest.mark.parametrize("loss", [lambda x: tg.dot(x, np.ones(3)), lambda x: tg.sum(x),
                                  lambda x: tg.norm(x)], ids=["dot", "sum", "norm"])
def test_gradient_with_respect_to_an_int_array_is_refused(loss):
    with pytest.raises(tg.TapegradError, match="float arrays.*int64.*astype"):
        tg.gradient(loss, np.arange(3))


def test_a_finished_tape_leaves_no_reference_cycles():
    # found in review: identities and their entries in the sorted ranges pointed at each
    # other, so a dropped tape waited for the cycle collector (and held any owner that
    # cannot be weakly referenced until then)
    import gc

    @tg.kernel
    def scale(B, A, s):
        i = tg.index()
        B[i] = A[i] * s

    cpu = tg.CPU()

    def record():
        s = np.ones(4)
        with tg.Tape() as tape:
            for _ in range(20):
                t = np.empty(4)
                scale(cpu)(t, s, 2.0, ndrange=4)
                s = t
        return tape

    record()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)       # (what the collector finds is kept in gc.garbage)
    gc.disable()
    try:
        tape = record()
        # the tape and its records go by reference counting alone, the collector off
        refs = [weakref.ref(tape)] + [weakref.ref(r) for r in tape.records]
        del tape
        assert [r() for r in refs] == [None] * len(refs)
        gc.collect()
        # and nothing of tapegrad's (its objects, its functions) is left in a cycle; other
        # threads of the process (JAX's, PyTorch's) may leave garbage of their own any time
        ours = [type(o).__qualname__ for o in gc.garbage
                if type(o).__module__.startswith("tapegrad")
                or str(getattr(o, "__module__", "")).startswith("tapegrad")]
        assert not ours, ours
    finally:
        gc.enable()
        gc.set_debug(0)
        gc.garbage.clear()


def test_a_tape_with_scalars_and_a_sweep_leaves_no_reference_cycles():
    # found while timing the heat gradient: the tape kept a list of its scalars and each
    # scalar refers to its tape, so every tape with a loss waited for the cycle collector,
    # with its records and kept arrays (a 100-step gradient paid 0.35 ms of collections)
    import gc

    @tg.kernel
    def cube(B, A):
        i = tg.index()
        B[i] = A[i] * A[i] * A[i]

    cpu = tg.CPU()
    x = np.linspace(0.5, 1.0, 4)

    def loss(s):
        for _ in range(5):
            t = np.empty(4)
            cube(cpu)(t, s, ndrange=4)
            s = t
        return tg.sum(s) * 2.0 + tg.dot(s, s)

    def sweep():
        with tg.Tape() as tape:
            value = loss(x)
        (g,) = tape.gradient(value, [x])
        return g

    expected = 2.0 * 243 * x ** 242 + 2.0 * x ** 243 * 243 * x ** 242
    np.testing.assert_allclose(sweep(), expected, rtol=1e-12)
    tg.gradient(loss, x)
    gc.collect()
    gc.disable()
    try:
        sweep()
        tg.gradient(loss, x)
        assert gc.collect() == 0
    finally:
        gc.enable()


@pytest.mark.parametrize("reduce", [tg.sum, tg.mean])
def test_a_sum_along_an_axis_is_refused_with_the_way_out(reduce):
    B = np.arange(6.0).reshape(2, 3)
    with pytest.raises(tg.TapegradError, match="takes no axis; for a .* along an axis, write it "
                                            "as a kernel"):
        reduce(B, axis=0)
    with pytest.raises(tg.TapegradError, match="takes no axis"):
        reduce(B, 1)
    assert float(reduce(B, axis=None)) == float(getattr(np, reduce.__name__)(B))
