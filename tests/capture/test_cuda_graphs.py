"""The CUDA-graph replay's bookkeeping (tapegrad/backends/cuda/graphs.py), without a GPU: a
stand-in for CuPy whose "graph" keeps the calls made while it was recorded, with the arrays
they were given (as a CUDA graph keeps addresses), and replays them.  A replay that forgot
to copy a call's arrays into the stretch's own, or out of them, or reused a graph recorded
for other scalars, gives other results than the function's Python.  (On a GPU,
tests/gpu/test_gpu.py runs the real thing.)"""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cuda.graphs import GraphStretch
from tests.capture.test_capture import diffuse, simulate

N = 12
CPU = tg.CPU()
_recording: list | None = None


class _Graph:
    def __init__(self, calls: list):
        self.calls = calls

    def upload(self) -> None:
        pass

    def launch(self) -> None:
        for fn, args, nd in self.calls:
            fn(args, nd)


class _Stream:
    def __init__(self, non_blocking: bool = False):
        pass

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def begin_capture(self) -> None:
        global _recording
        _recording = []

    def end_capture(self) -> _Graph:
        global _recording
        graph, _recording = _Graph(_recording), None
        return graph

    def synchronize(self) -> None:
        pass


class _Recorded:
    """A launcher that, while a graph records, is kept with its arguments instead of run."""

    def __init__(self, run):
        self.run = run

    def __call__(self, args: tuple, nd: tuple) -> None:
        if _recording is not None:
            _recording.append((self.run, args, nd))
        else:
            self.run(args, nd)


@pytest.fixture
def fake_cupy(monkeypatch):
    cuda = types.SimpleNamespace(Stream=_Stream, get_current_stream=lambda: _Stream())
    module = types.SimpleNamespace(empty=np.empty, asarray=np.asarray, cuda=cuda)
    monkeypatch.setitem(sys.modules, "cupy", module)


def _as_graphs(captured, args):
    """Record ``captured`` on ``args``, then make its first run of launches one graph
    stretch (as ``graphs.plan`` would; the other operations run one by one)."""
    captured(*args)
    (program,) = next(iter(captured.programs.values()))
    ops = program.ops
    start = next(k for k, op in enumerate(ops) if op.kind == "launch")
    stop = start
    while stop < len(ops) and ops[stop].kind == "launch":
        ops[stop].fn = _Recorded(ops[stop].fn)
        stop += 1
    stretch = GraphStretch(program, start, stop, program.frame(args, fresh_kept=False))
    program.compiled = [(False, j) for j in range(start)] + [(True, stretch)] + [
        (False, j) for j in range(stop, len(ops))]
    return stretch


def test_graphs_read_each_calls_arrays_and_scalars(fake_cupy):
    def sim(u, kappa):
        return simulate(u, kappa, 7)

    captured = tg.capture(sim)
    rng = np.random.default_rng(1)
    stretch = _as_graphs(captured, (rng.random(N), 0.2))
    for kappa in (0.2, 0.1, 0.2, 0.3):
        u = rng.random(N)
        np.testing.assert_array_equal(captured(u, kappa), sim(u, kappa))
    assert sorted(stretch.graphs) == [(0.1,), (0.2,), (0.3,)] and stretch.failed is None
    w = rng.random(N)
    g = tg.gradient(lambda u, k: tg.dot(captured(u, k), w), u, 0.25)
    g_plain = tg.gradient(lambda u, k: tg.dot(sim(u, k), w), u, 0.25)
    np.testing.assert_allclose(g[0], g_plain[0], rtol=1e-13)
    assert g[1] == pytest.approx(g_plain[1], rel=1e-13)


def test_an_input_written_in_place_is_copied_back(fake_cupy):
    def smooth_in_place(u, v):
        diffuse(CPU)(v, u, 0.25, ndrange=N)
        diffuse(CPU)(u, v, 0.25, ndrange=N)
        return tg.sum(u)

    captured = tg.capture(smooth_in_place)
    rng = np.random.default_rng(2)
    _as_graphs(captured, (rng.random(N), np.empty(N)))
    u = rng.random(N)
    u_plain = u.copy()
    assert float(captured(u, np.empty(N))) == float(smooth_in_place(u_plain, np.empty(N)))
    np.testing.assert_array_equal(u, u_plain)


def test_a_stretch_that_cannot_be_recorded_warns_and_runs_one_by_one(fake_cupy, monkeypatch):
    def sim(u):
        v = np.empty_like(u)
        diffuse(CPU)(v, u, 0.2, ndrange=N)
        w = np.empty_like(u)
        diffuse(CPU)(w, v, 0.2, ndrange=N)
        return w

    captured = tg.capture(sim)
    stretch = _as_graphs(captured, (np.ones(N),))

    def refuse(self):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(_Stream, "begin_capture", refuse)
    u = np.random.default_rng(3).random(N)
    with pytest.warns(tg.errors.CaptureWarning, match="could not be recorded as a CUDA graph"):
        np.testing.assert_array_equal(captured(u), sim(u))
    np.testing.assert_array_equal(captured(u), sim(u))
    assert stretch.failed.startswith("RuntimeError")


def test_a_scalar_computed_before_the_stretch_picks_its_graph(fake_cupy):
    def sim(u):
        kappa = 0.1 + 0.2 * tg.mean(u)          # a tape scalar the launches read
        for _ in range(4):
            u_new = np.empty_like(u)
            diffuse(CPU)(u_new, u, kappa, ndrange=N)
            u = u_new
        return tg.dot(u, u)

    captured = tg.capture(sim)
    rng = np.random.default_rng(4)
    stretch = _as_graphs(captured, (rng.random(N),))
    for _ in range(5):
        u = rng.random(N)
        assert float(captured(u)) == float(sim(u))
        np.testing.assert_allclose(tg.gradient(captured, u)[0], tg.gradient(sim, u)[0],
                                   rtol=1e-13)
    assert len(stretch.graphs) == 4        # (MOST_GRAPHS: the oldest one went)
