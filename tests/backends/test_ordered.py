"""tg.deterministic() on GPUs (tapegrad/backends/ordered.py): float atomic additions written
down per work-item and added in work-item order after the launch, so that a gather's
gradient, an Active scalar's and a user's scatter repeat their bits on OpenCL (PoCL on two
threads here; every ordered variant is also compiled as CUDA by the test harness), are right,
and what cannot be ordered is refused by name with the arrays untouched."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.ordered import NOT_REACHED, apply
from tests.backends.test_deterministic import axpy, gather_square, histogram

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@tg.kernel
def histogram2d(H, keys, w):
    i = tg.index()
    if w[i] > 0.25:                      # (some work-items reach neither call)
        tg.atomic_add(H, (keys[i] % 4, keys[i] // 4), w[i])
    elif w[i] > 0.1:
        tg.atomic_sub(H, (0, 1), w[i])


@tg.kernel
def total(T, w):
    i = tg.index()
    if w[i] > 0.5:                       # (a sum into a constant index: reduced on the device)
        tg.atomic_sub(T, 1, w[i])


@tg.kernel
def onto_itself(H, W):
    at = tg.index(tg.Global, tg.NTuple)   # an index tuple, and a call every work-item reaches
    tg.atomic_add(H, at, W[at])
    tg.atomic_add(H, (0, 0), 1.0)


def digests_on(backend, runs: int = 20) -> list[str]:
    """Hex digests of a gather's gradient, an Active scalar's and a scatter on ``backend``'s
    own arrays (``tg.OpenCL()``, ``tg.CUDA()``), ``runs`` times each."""
    rng = np.random.default_rng(7)
    n, m = 200_000, 1_000
    X = backend.asarray(rng.standard_normal(m) * 10.0 ** rng.integers(-8, 8, m))
    idx = backend.asarray(rng.integers(0, m, n))
    w = backend.asarray(rng.standard_normal(n) * 10.0 ** rng.integers(-8, 8, n))
    keys = backend.asarray(rng.integers(0, 64, n))

    def gathered(X):
        out = backend.allocate(np.float64, (n,))
        gather_square(backend)(out, X, idx, ndrange=n)
        return tg.dot(out, w)

    def line(a):
        Z = backend.allocate(np.float64, (n,))
        axpy(backend)(Z, a, w, w, ndrange=n)
        return tg.dot(Z, w)

    out = []
    for _ in range(runs):
        (g,) = tg.gradient(gathered, X)
        (ga,) = tg.gradient(line, 0.5)
        H = backend.zeros(np.float64, (64,))
        histogram(backend)(H, keys, w, ndrange=n)
        out.append(f"{_digest(tg.to_numpy(g))}:{float(ga).hex()}:{_digest(tg.to_numpy(H))}")
    return out


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(a.tobytes()).hexdigest()[:16]


def test_the_same_bits_in_twenty_runs_on_opencl_on_two_threads():
    script = ("import tapegrad as tg\n"
              "from tests.backends.test_ordered import digests_on\n"
              "with tg.deterministic():\n"
              "    print(' '.join(sorted(set(digests_on(tg.OpenCL())))))\n")
    env = dict(os.environ, PYTHONPATH=ROOT, POCL_MAX_PTHREAD_COUNT="2")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    runs = proc.stdout.split()
    assert len(runs) == 1, f"{len(runs)} different results in 20 runs: {runs}"


def test_scatters_with_index_tuples_branches_and_subtractions_are_right(backend):
    rng = np.random.default_rng(2)
    keys, w = rng.integers(0, 16, 3000), rng.random(3000)
    H = np.full((4, 4), 0.5)
    with tg.deterministic():
        histogram2d(backend)(H, keys, w, ndrange=w.size)
    expected = np.full((4, 4), 0.5)
    up = w > 0.25
    np.add.at(expected, (keys[up] % 4, keys[up] // 4), w[up])
    expected[0, 1] -= w[~up & (w > 0.1)].sum()
    np.testing.assert_allclose(H, expected, rtol=1e-12)

    T = np.array([3.0, 2.0, 1.0], np.float32)
    with tg.deterministic():
        total(backend)(T, w.astype(np.float32), ndrange=w.size)
    np.testing.assert_allclose(T, [3.0, 2.0 - w[w > 0.5].sum(), 1.0], rtol=1e-6)

    W = rng.random((30, 20))
    H = np.zeros((30, 20))
    with tg.deterministic():
        onto_itself(backend, (4, 8))(H, W, ndrange=W.shape)
    expected = W.copy()
    expected[0, 0] += W.size
    np.testing.assert_allclose(H, expected, rtol=1e-12)


def test_an_active_scalar_and_a_hessian_vector_product_under_it(backend):
    rng = np.random.default_rng(5)
    X, Y = rng.random(1000), rng.random(1000)

    def loss(a):
        Z = np.empty_like(X)
        axpy(backend)(Z, a, X, Y, ndrange=X.size)
        return tg.dot(Z, Z)

    with tg.deterministic():
        (ga,) = tg.gradient(loss, 0.5)
    np.testing.assert_allclose(ga, 2 * np.dot(0.5 * X + Y, X), rtol=1e-12)

    idx = rng.integers(0, 50, 400)
    x, v = rng.random(50), rng.random(50)

    def quartic(x):
        out = np.empty(idx.size)
        gather_square(backend)(out, x, idx, ndrange=idx.size)
        return tg.dot(out, out)

    with tg.deterministic():
        hv = tg.hvp(quartic, x, v)
    expected = np.zeros(50)         # (the Hessian of sum x[idx]^4: 12 x[k]^2 per occurrence)
    np.add.at(expected, idx, 12 * x[idx] ** 2 * v[idx])
    np.testing.assert_allclose(np.asarray(hv).reshape(-1), expected, rtol=1e-12)


@tg.kernel
def reads_its_target(H, w):
    i = tg.index()
    tg.atomic_add(H, i % 3, w[i] + H[0])


@tg.kernel
def adds_in_a_loop(H, w):
    i = tg.index()
    for k in range(3):
        tg.atomic_add(H, (i + k) % 3, w[i])


@tg.kernel
def adds_in_local_memory(H, w):
    i = tg.index()
    t = tg.localmem(w.dtype, 4)
    tg.atomic_add(t, i % 4, w[i])
    tg.synchronize()
    H[i] = t[i % 4]


@tg.kernel
def hands_out_slots(H, count, w):
    i = tg.index()
    slot = tg.atomic_add(count, 0, 1.0)
    H[int(slot)] = w[i]


@tg.func
def add_into(H, k, v):
    tg.atomic_add(H, k, v)


@tg.kernel
def adds_in_a_function(H, w):
    i = tg.index()
    add_into(H, i % 3, w[i])


REFUSED = [
    (reads_its_target, (), "uses H other than by the atomic additions"),
    (adds_in_a_loop, (), "inside a loop"),
    (adds_in_local_memory, (), "adds into local memory"),
    (hands_out_slots, (np.zeros(1),), "uses the atomic's old value"),
    (adds_in_a_function, (), "device function add_into"),
]


@pytest.mark.parametrize("kernel,extra,why", REFUSED, ids=[k.name for k, _, _ in REFUSED])
def test_what_it_cannot_order_is_refused_by_name_on_opencl(kernel, extra, why):
    import pyopencl.array as cla
    backend = tg.OpenCL()
    H = cla.to_device(backend.queue, np.arange(32.0))
    args = (H, *[cla.to_device(backend.queue, e) for e in extra],
            cla.to_device(backend.queue, np.ones(32)))
    with tg.deterministic():
        with pytest.raises(tg.BackendError, match=why) as e:
            kernel(backend, 16)(*args, ndrange=32)
    assert "test_ordered.py:" in str(e.value) and "tg.CPU()" in str(e.value)
    assert (H.get() == np.arange(32.0)).all()          # untouched
    kernel(backend, 16)(*args, ndrange=32)             # outside it: runs


def test_a_target_sharing_memory_with_another_argument_is_refused():
    import pyopencl.array as cla
    backend = tg.OpenCL()
    both = cla.to_device(backend.queue, np.ones(40))
    with tg.deterministic(), pytest.raises(tg.BackendError, match="shares memory with"):
        histogram(backend)(both[:20], cla.to_device(backend.queue, np.arange(20) % 3),
                           both[10:30], ndrange=20)
    assert (both.get() == 1.0).all()


def test_the_log_is_added_in_work_item_order_and_checked():
    dest = np.zeros(4)
    # two calls (columns), three work-items (rows): flat indices, NOT_REACHED where none
    ats = [np.array([0, NOT_REACHED, 3]), np.array([1, 0, NOT_REACHED])]
    values = [np.array([1.0, 9.0, 3.0]), np.array([2.0, 4.0, 9.0])]
    apply(dest, ats, values, "k: H")
    assert dest.tolist() == [5.0, 2.0, 0.0, 3.0]
    for flat in (4, -1):
        with pytest.raises(tg.LaunchError, match=f"flat index {flat}, outside its 4 elements"):
            apply(dest, [np.array([1, flat])], [np.array([1.0, 1.0])], "k: H")
    assert dest.tolist() == [5.0, 2.0, 0.0, 3.0]


@tg.func
def take_a_slot(count):
    return tg.atomic_add(count, 0, 1)    # an integer counter: its old value is a slot


@tg.kernel
def compacts(out, count, w):
    i = tg.index()
    out[take_a_slot(count)] = w[i]
    tg.atomic_add(out, 0, 0.0)


def test_an_old_value_used_in_a_device_function_is_refused():
    import pyopencl.array as cla
    backend = tg.OpenCL()
    out = cla.zeros(backend.queue, 8, np.float64)
    count = cla.zeros(backend.queue, 1, np.int64)
    with tg.deterministic(), pytest.raises(tg.BackendError, match="uses the atomic's old"):
        compacts(backend, 4)(out, count, cla.to_device(backend.queue, np.arange(8.0)),
                             ndrange=8)
    assert (out.get() == 0).all() and count.get()[0] == 0


@tg.kernel
def shifted_histogram(H, keys, w):
    i = tg.index()
    tg.atomic_add(H, keys[i] - 1, w[i])


def test_an_index_outside_the_array_raises_and_writes_nothing():
    import pyopencl.array as cla
    backend = tg.OpenCL()
    H = cla.to_device(backend.queue, np.arange(4.0))
    keys = np.array([1, 2, 0, 4, 3, 1])           # 0 - 1 = -1: outside H
    with tg.deterministic(), pytest.raises(tg.LaunchError, match="flat index -1"):
        shifted_histogram(backend, 2)(H, cla.to_device(backend.queue, keys),
                                      cla.to_device(backend.queue, np.ones(6)), ndrange=6)
    assert (H.get() == np.arange(4.0)).all()


@tg.kernel
def names_like_its_logs(H, keys, w):
    i = tg.index()
    ordered0_at_shape0 = w[i] * 2.0     # (names the variant's own could have taken)
    ordered_item = keys[i] + 0
    tg.atomic_add(H, ordered_item, ordered0_at_shape0)


def test_a_kernel_using_the_variants_names_is_still_right(backend):
    rng = np.random.default_rng(3)
    keys, w = rng.integers(0, 8, 40), rng.random(40)
    H = np.zeros(8)
    with tg.deterministic():
        names_like_its_logs(backend, 16)(H, keys, w, ndrange=40)
    expected = np.zeros(8)
    np.add.at(expected, keys, 2.0 * w)
    np.testing.assert_allclose(H, expected, rtol=1e-12)
