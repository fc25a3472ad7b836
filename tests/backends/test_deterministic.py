"""tg.deterministic(): on the CPU the same gradient bits on every run and with 1 or 2 threads
(scatters into per-thread copies, Active scalars' sums, atomics into an array the kernel
reads); OpenCL's bits: tests/backends/test_ordered.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np

import tapegrad as tg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@tg.kernel
def gather_square(out, X, idx):
    i = tg.index()
    v = X[idx[i]]
    out[i] = v * v                       # its adjoint scatters into X's gradient


@tg.kernel
def axpy(Z, a, X, Y):
    i = tg.index()
    Z[i] = a * X[i] + Y[i]               # its adjoint sums a's gradient over work-items


@tg.kernel
def histogram(H, keys, w):
    i = tg.index()
    tg.atomic_add(H, keys[i], w[i])      # into a large H: per-thread copies would not pay


@tg.kernel
def compact(out, cnt, w):
    i = tg.index()
    slot = tg.atomic_add(cnt, 0, 1)      # an atomic's old value used: a slot per work-item
    out[slot] = w[i]


def digests(runs: int = 20) -> list[str]:
    """Hex digests of the three gradients, ``runs`` times each."""
    rng = np.random.default_rng(7)
    n, m = 200_000, 1_000
    X = rng.standard_normal(m) * 10.0 ** rng.integers(-8, 8, m)     # wide magnitudes: the
    idx = rng.integers(0, m, n)                                      # order of adds shows
    w = rng.standard_normal(n)
    big = 10_000_000                     # (16 copies of it would not pay for n additions)
    keys = rng.integers(0, 64, n) * (big // 64)
    out = []
    for _ in range(runs):
        (g,) = tg.gradient(lambda X: tg.dot(_gather(X, idx, n), w), X)
        (ga,) = tg.gradient(lambda a: tg.dot(_axpy(a, X[idx], w), w), 0.5)

        H = np.zeros(big)
        histogram(tg.CPU())(H, keys, w * 10.0 ** (keys % 13), ndrange=n)
        slots, cnt = np.zeros(n), np.zeros(1, np.int64)
        compact(tg.CPU())(slots, cnt, w, ndrange=n)
        out.append(f"{_digest(g)}:{float(ga).hex()}:{_digest(slots)}:{_digest(H[keys])}")
    return out


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(a.tobytes()).hexdigest()[:16]


def _gather(X, idx, n):
    out = np.empty(n)
    gather_square(tg.CPU())(out, X, idx, ndrange=n)
    return out


def _axpy(a, X, Y):
    Z = np.empty_like(X)
    axpy(tg.CPU())(Z, a, X, Y, ndrange=X.size)
    return Z


SCRIPT = ("import sys, tapegrad as tg\n"
          "from tests.backends.test_deterministic import digests\n"
          "with tg.deterministic():\n"
          "    print(' '.join(sorted(set(digests()))))\n")


def test_the_same_bits_on_every_run_with_one_and_two_threads():
    seen = set()
    for threads in ("1", "2"):
        env = dict(os.environ, NUMBA_NUM_THREADS=threads, PYTHONPATH=ROOT,
                   TAPEGRAD_CAP_THREADS="0")
        proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                              env=env, timeout=600)
        assert proc.returncode == 0, proc.stderr
        runs = proc.stdout.split()
        assert len(runs) == 1, f"{threads} thread(s): {len(runs)} different results in 20 runs"
        seen.add(runs[0])
    assert len(seen) == 1, seen


def test_without_it_one_thread_count_repeats_itself_except_shared_atomics():
    """(what docs/debugging.md says is reproducible without tg.deterministic(): the scatter's
    per-thread copies and the Active scalar's per-task slots repeat on 2 threads; the
    compaction's slots and the histogram's atomics into one large array are not promised to)"""
    script = ("from tests.backends.test_deterministic import digests\n"
              "print(' '.join(sorted({d.rsplit(':', 2)[0] for d in digests(10)})))\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="2", PYTHONPATH=ROOT, TAPEGRAD_CAP_THREADS="0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.split()) == 1, proc.stdout


def test_the_gradients_are_right_under_it():
    rng = np.random.default_rng(3)
    X, idx, w = rng.random(50), rng.integers(0, 50, 400), rng.random(400)
    with tg.deterministic():
        (g,) = tg.gradient(lambda X: tg.dot(_gather(X, idx, 400), w), X)
    expected = np.zeros(50)
    np.add.at(expected, idx, 2 * X[idx] * w)
    np.testing.assert_allclose(g, expected, rtol=1e-13)


def test_every_backend_gives_the_gradient_under_it(backend):
    """(the CPU runs the scatter in tasks in order; OpenCL and CUDA run a variant that writes
    the additions down and adds them in work-item order: tests/backends/test_ordered.py)"""
    X, idx, w = np.random.rand(8), np.arange(16) % 8, np.random.rand(16)
    loss = lambda X: tg.dot(_gather_on(backend, X, idx, 16), w)  # noqa: E731
    with tg.deterministic():
        (g,) = tg.gradient(loss, X)
    np.testing.assert_allclose(g, 2 * X * (w[:8] + w[8:]), rtol=1e-13)
    (plain,) = tg.gradient(loss, X)
    np.testing.assert_allclose(plain, g, rtol=1e-13)


def _gather_on(backend, X, idx, n):
    out = np.empty(n)
    gather_square(backend)(out, X, idx, ndrange=n)
    return out


def test_a_captured_function_runs_plainly_under_it():
    """(docs/capture.md: no replay under tg.deterministic(), so its launches are ordered:
    the captured gradient's bits are the uncaptured one's)"""
    rng = np.random.default_rng(4)
    X, idx, w = rng.standard_normal(300) * 1e4, rng.integers(0, 300, 50_000), rng.random(50_000)
    loss = lambda X: tg.dot(_gather(X, idx, idx.size), w)  # noqa: E731
    captured = tg.capture(loss)
    for _ in range(3):
        tg.gradient(captured, X)                     # recorded, then replayed
    with tg.deterministic():
        (plain,) = tg.gradient(loss, X)
        (replayed,) = tg.gradient(captured, X)
    assert plain.tobytes() == replayed.tobytes()
    expected = np.zeros(300)
    np.add.at(expected, idx, 2 * X[idx] * w)
    np.testing.assert_allclose(plain, expected, rtol=1e-12)
