"""Recording state per thread and nested tapes: each thread's tape records only its own
launches, and an enclosing tape records what an inner tape recorded.  Gradients are checked
against closed forms."""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()


@tg.kernel
def sin_k(Y, X):
    i = tg.index()
    Y[i] = math.sin(X[i])


@tg.kernel
def sq_k(Z, Y):
    i = tg.index()
    Z[i] = Y[i] * Y[i]


@tg.kernel
def scale_k(Z, Y, s):
    i = tg.index()
    Z[i] = Y[i] * s


def test_an_outer_tape_sees_what_a_nested_tape_recorded():
    x = np.array([0.1, 0.7, 1.3])
    Y, Z = np.zeros(3), np.zeros(3)
    with tg.Tape() as outer:
        sin_k(CPU)(Y, x, ndrange=3)
        with tg.Tape() as inner:
            sq_k(CPU)(Z, Y, ndrange=3)
            inner_loss = tg.sum(Z)
        loss = tg.sum(Z) + tg.sum(Y)
    (g,) = outer.gradient(loss, [x])
    # d/dx [sin(x)^2 + sin(x)] = 2 sin cos + cos
    assert np.allclose(g, 2 * np.sin(x) * np.cos(x) + np.cos(x))
    (gy,) = inner.gradient(inner_loss, [Y])       # the inner tape alone: Z = Y^2
    assert np.allclose(gy, 2 * np.sin(x))


def test_an_array_an_inner_tape_overwrites_is_not_taken_for_a_host_change():
    x = np.array([0.1, 0.7, 1.3])
    Y, Z = np.zeros(3), np.zeros(3)
    with tg.Tape() as outer:
        scale_k(CPU)(Y, x, 1.0, ndrange=3)
        with tg.Tape():
            scale_k(CPU)(Y, x, 2.0, ndrange=3)      # Y overwritten by a launch both record
            sq_k(CPU)(Z, Y, ndrange=3)              # ... and read: as that launch left it
        loss = tg.sum(Z)
    (g,) = outer.gradient(loss, [x])
    assert np.allclose(g, 8 * x)                # d/dx (2x)^2
    with tg.Tape(), pytest.raises(tg.TapegradError, match="changed"):
        with tg.Tape():
            scale_k(CPU)(Y, x, 2.0, ndrange=3)
            Y *= 3.0                                # a real change by host code
            sq_k(CPU)(Z, Y, ndrange=3)


def test_scalars_made_inside_a_nested_tape_stay_differentiable_outside_it():
    x = np.array([0.3, 0.4])
    Y = np.zeros(2)
    with tg.Tape() as outer:
        with tg.Tape():
            sin_k(CPU)(Y, x, ndrange=2)
            s = tg.sum(Y)
        loss = s * s                  # after the inner tape ended: recorded on the outer one
    (g,) = outer.gradient(loss, [x])
    assert np.allclose(g, 2 * np.sum(np.sin(x)) * np.cos(x))


def test_a_tracked_scalar_passed_to_a_kernel_inside_nested_tapes():
    x = np.array([0.5, 1.5])
    Y, Z = np.zeros(2), np.zeros(2)
    with tg.Tape() as outer:
        sin_k(CPU)(Y, x, ndrange=2)
        s = tg.sum(Y)
        with tg.Tape():
            scale_k(CPU)(Z, Y, s, ndrange=2)      # Z = sin(x) * sum(sin(x))
        loss = tg.sum(Z)                          # = (sum sin x)^2
    (g,) = outer.gradient(loss, [x])
    assert np.allclose(g, 2 * np.sum(np.sin(x)) * np.cos(x))


def test_each_thread_records_its_own_tape():
    """Two threads, each with its own tape, record and differentiate at the same time."""
    rounds, failures = 400, []
    start = threading.Barrier(2)

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        start.wait()
        for _ in range(rounds):
            x = rng.random(16)
            Y, Z = np.zeros(16), np.zeros(16)
            try:
                with tg.Tape() as tape:
                    sin_k(CPU)(Y, x, ndrange=16)
                    sq_k(CPU)(Z, Y, ndrange=16)
                    loss = tg.sum(Z)
                (g,) = tape.gradient(loss, [x])
                if not np.allclose(g, 2 * np.sin(x) * np.cos(x)):
                    failures.append("wrong gradient")
            except Exception as e:    # noqa: BLE001 - reported below, with the thread's error
                failures.append(repr(e))

    threads = [threading.Thread(target=work, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == [], failures[:3]


def test_a_tape_in_one_thread_does_not_record_another_threads_launches():
    x = np.array([0.2, 0.9])
    Y, other = np.zeros(2), np.zeros(2)
    with tg.Tape() as tape:
        t = threading.Thread(target=lambda: sq_k(CPU)(other, x, ndrange=2))
        t.start()
        t.join()
        sin_k(CPU)(Y, x, ndrange=2)
        loss = tg.sum(Y)
    assert len([r for r in tape.records if r.name == "sq_k"]) == 0
    assert np.allclose(other, x * x)
    (g,) = tape.gradient(loss, [x])
    assert np.allclose(g, np.cos(x))


@pytest.mark.parametrize("backend", ["cpu", "opencl"])
def test_an_array_a_worker_thread_wrote_is_refused_where_the_tape_meets_it(backend):
    """(tape/threads.py: the worker's launch is not recorded, so its result was a constant
    to the tape: d/dx sum(x^2) came out 0 instead of 2x)"""
    be = CPU if backend == "cpu" else tg.OpenCL()
    x = be.asarray(np.array([0.2, 0.9, 1.4]))

    def squared(x):
        out = be.allocate(np.float64, (3,))
        sq_k(be)(out, x, ndrange=3)
        return out

    with tg.Tape() as tape:
        with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
            out = pool.submit(squared, x).result()
        with pytest.raises(tg.TapegradError, match=r"an array of shape \(3,\) that kernel sq_k "
                           r"wrote \(or wrote part of\) in thread 'worker.*while this tape "
                           r"recorded in another "
                           r"thread.*Launch the kernel in the recording thread"):
            tg.sum(out)
        loss = tg.sum(squared(x))        # the way out: in the recording thread
    (g,) = tape.gradient(loss, [x])
    np.testing.assert_allclose(be.to_numpy(g), 2 * be.to_numpy(x), rtol=1e-15)


def test_an_array_workers_filled_in_parts_is_refused_too():
    """(the usual chunking: each worker writes a view of one output; the tape meets the
    whole array, which no worker was given)"""
    x = np.array([0.2, 0.9, 1.4, 0.5])
    out = np.empty(4)
    with tg.Tape():
        with ThreadPoolExecutor(2) as pool:
            for part in (slice(0, 2), slice(2, 4)):
                pool.submit(lambda p: sq_k(CPU)(out[p], x[p], ndrange=2), part).result()
        with pytest.raises(tg.TapegradError, match="wrote \\(or wrote part of\\) in thread"):
            tg.sum(out)


def test_a_worker_threads_launches_the_tape_never_reads_are_left_alone():
    x = np.array([0.2, 0.9])
    with tg.Tape() as tape:
        with ThreadPoolExecutor(1) as pool:      # (a logging worker, say: its own arrays)
            logged = pool.submit(lambda: scale_k(CPU)(np.zeros(2), np.ones(2), 2.0,
                                                      ndrange=2)).result()
        Y = np.zeros(2)
        sin_k(CPU)(Y, x, ndrange=2)
        loss = tg.sum(Y)
        assert len(tape.ids.foreign) == 1        # (noted, never met)
    assert logged is None
    (g,) = tape.gradient(loss, [x])
    np.testing.assert_allclose(g, np.cos(x), rtol=1e-15)
    with ThreadPoolExecutor(1) as pool:          # (after the recording: nothing is noted)
        out = pool.submit(lambda: sq_k(CPU)(Y, x, ndrange=2)).result()
    assert out is None and tape.ids.foreign == {}


def test_float_of_an_inner_tapes_scalar_is_refused_while_the_outer_records():
    Y = np.zeros(2)
    with tg.Tape():
        with tg.Tape():
            sin_k(CPU)(Y, np.ones(2), ndrange=2)
            s = tg.sum(Y)
        with pytest.raises(tg.TapegradError, match="float"):
            float(s)
