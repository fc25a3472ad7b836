"""CUDA graphs of a captured program's runs of launches (tapegrad/backends/cuda/graphs.py),
without a GPU: the stand-in CuPy (tapegrad/bench/standin_cupy.py), kernels compiled by the
real NVRTC, whose graph driver keeps each node's parameters as the driver does (copied when
set) and hands them to its ``launchKernel`` when the graph launches.  Every call's graph
must hand the driver exactly what launching its run from the list does (kernels, grids,
blocks, argument bytes), whatever changed since the last call, and update only the nodes
that changed; a graph the driver refuses warns once and its run is launched from the list.
(On a GPU, tests/gpu/test_gpu.py compares results and gradients.)"""

from __future__ import annotations

import gc
import sys
import types
import warnings

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cuda.backend import _Launcher
from tapegrad.backends.cuda.graphs import LaunchGraph
from tapegrad.bench.standin_cupy import installed
from tests.capture.test_capture import diffuse
from tests.capture.test_cuda_reverse import STEPS, N, simulation
from tests.tape.test_host_code import sq


@pytest.fixture
def cupy(monkeypatch, tmp_path):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TAPEGRAD_CAPTURE_CUDA_GRAPHS", "1")
    for k in (diffuse, sq):
        monkeypatch.setattr(k, "cache", {})
        monkeypatch.setattr(k, "_configured", {})
    with installed() as module:
        yield module


@pytest.fixture
def compared(cupy, monkeypatch):
    """Every graph call also runs its run one by one first; the driver must get the same
    launches and fills from both.  Yields the (graph, launches and fills) of each call."""
    driver, calls = cupy.cuda.driver, []
    run = LaunchGraph.__call__

    def both(self, frame):
        driver.keep, driver.keep_fills, driver.kept = True, True, []
        self.one_by_one(frame)
        listed, driver.kept = driver.kept, []
        run(self, frame)
        driver.keep = driver.keep_fills = False
        assert driver.kept == listed
        calls.append((self, len(listed)))
    monkeypatch.setattr(LaunchGraph, "__call__", both)
    return calls


def _simulation(cupy):
    return simulation(tg.CUDA(), cupy.asarray(np.linspace(1.0, 2.0, N)))


def _prepared(cupy):
    """A captured simulation, recorded and differentiated once (every kernel compiled, no
    graph yet), the driver told each kernel's slots (so it keeps every argument's bytes)."""
    captured = tg.capture(_simulation(cupy))
    u = cupy.asarray(np.linspace(0.0, 1.0, N))
    tg.gradient(captured, u, 0.1)
    for launcher in [x for x in gc.get_objects() if type(x) is _Launcher and x.cupy is cupy]:
        for variant in launcher.variants.values():
            cupy.cuda.driver.sizes[variant.function.ptr] = (8,) * launcher.code.slots
    for _ in range(2):          # writes the reverse down, runs it
        tg.gradient(captured, u, 0.1)
    return captured, u


def _graphs(captured):
    """The forward's and the reverse's graphs."""
    (program,) = next(iter(captured.programs.values()))
    plans = [program.compiled] + [r.compiled for r in program.reverses.values()]
    graphs = [what for plan in plans for listed, what in plan if listed]
    assert all(isinstance(g, LaunchGraph) for g in graphs)
    return graphs


def test_each_call_hands_the_driver_its_lists_launches_updating_what_changed(cupy, compared):
    captured, u = _prepared(cupy)
    forward, reverse = _graphs(captured)
    assert forward.failed is None and reverse.failed is None and reverse.ordered
    compared.clear()

    def updates(*args):
        before = forward.updates
        captured(*args)
        return forward.updates - before
    # outside a tape the states are the program's own memory (under one, new each call)
    assert updates(u, 0.1) == STEPS + 1
    assert updates(u, 0.1) == 0                 # nothing new
    assert updates(u, 0.2) == STEPS             # the nodes that read kappa
    assert updates(cupy.asarray(np.linspace(1.0, 2.0, N)), 0.2) == 1     # the first step's
    def reverse_updates(*args):     # (tg.gradient runs the forward inside its reverse)
        before = reverse.updates
        tg.gradient(captured, *args)
        return reverse.updates - before
    assert reverse_updates(u, 0.3) > 0
    assert reverse_updates(u, 0.3) == 0
    assert reverse_updates(u, 0.2) > 0
    assert [n for g, n in compared if g is forward] == [STEPS + 1] * 7
    # (the reverse: 7 launches, 6 zeroings)
    assert [n for g, n in compared if g is reverse] == [2 * STEPS + 1] * 3
    assert cupy.graph_driver.calls["cuGraphInstantiate"] == 2


@pytest.mark.parametrize("call", ["cuGraphInstantiate", "cuGraphExecKernelNodeSetParams",
                                  "cuGraphLaunch", "cuda.bindings"])
def test_a_graph_the_driver_refuses_warns_once_then_launches_from_its_list(cupy, compared,
                                                                        call, monkeypatch):
    from tapegrad.backends.cuda import graphs
    captured, u = _prepared(cupy)
    if call == "cuda.bindings":             # (not installed, or no driver it can load)
        monkeypatch.setattr(graphs, "DRIVER", None)
        monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    if call == "cuGraphInstantiate":        # (a new program: its first call builds)
        captured = tg.capture(_simulation(cupy))
        captured(u, 0.1)
        (program,) = next(iter(captured.programs.values()))
        program.compiled = None
    cupy.graph_driver.refuse.add(call)
    with pytest.warns(tg.errors.CaptureWarning, match=f"could not run as a CUDA graph.*{call}"):
        captured(u, 0.25)
    (program,) = next(iter(captured.programs.values()))
    ((_, graph),) = [c for c in program.compiled if c[0]]
    assert graph.failed.startswith(call)
    compared.clear()
    launches = cupy.graph_driver.calls.get("cuGraphLaunch", 0)
    captured(u, 0.5)                            # (no second warning: pytest's filter errors)
    assert cupy.graph_driver.calls.get("cuGraphLaunch", 0) == launches
    assert [n for _, n in compared] == [STEPS + 1]


def test_a_run_with_ordered_sums_runs_one_by_one_under_deterministic(cupy, compared,
                                                                     monkeypatch):
    """(tg.deterministic() runs a captured function uncaptured: this is the graphs' own guard,
    turned on alone.)"""
    from tapegrad.backends.cuda import graphs
    captured, u = _prepared(cupy)
    forward, reverse = _graphs(captured)
    launches = cupy.graph_driver.calls["cuGraphLaunch"]
    monkeypatch.setattr(graphs, "DETERMINISTIC", types.SimpleNamespace(on=True))
    compared.clear()
    tg.gradient(captured, u, 0.1)
    # the forward's graph ran (no ordered sums in it), the reverse's (kappa's sum) did not
    assert cupy.graph_driver.calls["cuGraphLaunch"] == launches + 1
    assert not forward.ordered and reverse.ordered and reverse.failed is None
    assert [g for g, _ in compared] == [forward, reverse]


def test_a_thread_without_a_current_context_starts_the_runtimes_first(cupy, compared,
                                                                      monkeypatch):
    driver, contexts, freed = cupy.graph_driver, [0], []     # (0 once, then the context)
    monkeypatch.setattr(driver, "cuCtxGetCurrent",
                        lambda: (0, contexts.pop() if contexts else 1))
    monkeypatch.setattr(cupy.cuda.runtime, "free", freed.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error", tg.errors.CaptureWarning)
        captured, u = _prepared(cupy)
        captured(u, 0.3)
    assert freed == [0] and not contexts
    (forward, reverse) = _graphs(captured)
    assert forward.failed is None and forward.ctx == 1


def test_a_tape_scalar_computed_inside_updates_the_nodes_that_read_it(cupy, compared):
    """(A scalar the function computes from its input, not an argument: each call's value
    reaches the nodes that read it, as it reaches the launches one by one.)"""
    gpu = tg.CUDA()

    def sim(u):
        kappa = 0.1 + 0.2 * tg.mean(u)
        for _ in range(4):
            u_new = gpu.allocate(np.float64, (N,))
            diffuse(gpu)(u_new, u, kappa, ndrange=N)
            u = u_new
        return tg.dot(u, u)

    captured = tg.capture(sim)
    u = cupy.asarray(np.linspace(0.0, 1.0, N))
    captured(u)
    for launcher in [x for x in gc.get_objects() if type(x) is _Launcher and x.cupy is cupy]:
        for variant in launcher.variants.values():
            cupy.cuda.driver.sizes[variant.function.ptr] = (8,) * launcher.code.slots
    for scale in (1.0, 2.0, 2.0, 3.0):
        captured(u * scale)                 # (u * scale: a new array and a new mean)
    ((graph, n),) = {(g, n) for g, n in compared}
    assert n == 4 and graph.failed is None and len(compared) == 4
    # (built on the first; every node reads kappa, new on the second and the fourth)
    assert graph.updates >= 2 * 4
