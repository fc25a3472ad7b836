"""Barriers inside loops, in all three modes on every backend: a tree reduction (``while``), a
Hillis-Steele scan (``for``), rounds whose inner loops take their bounds from an array or run
no trips, against NumPy, float64 finite differences and the dot-product test
``<J v, w> == <v, J^T w>``; on OpenCL also against the CPU, element by element.

An adjoint restores its loops' trip counts per work-item, so the C printer takes work-item
0's through local memory (``tapegrad/backends/c/barriers.py``); the last tests check the
printed code's publication scheme, whose races PoCL, running a group's work-items in order,
would not show.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.c.printer import CUDA, OPENCL, CPrinter
from tapegrad.backends.structure import device_functions
from tests.ad.gradcheck import kernel_vjp_error
from tests.conftest import _opencl_on_numpy

# -- the kernels ---------------------------------------------------------------------------


@tg.kernel
def tree_norms(out, x):
    """Each group's Euclidean norm, summed as a tree in local memory."""
    li = tg.index(tg.Local)
    i = tg.index()
    g = tg.index(tg.Group)
    W = tg.groupsize()[0]
    valid = min(W, tg.ndrange()[0] - g * W)      # the last group may be partial
    part = tg.localmem(x.dtype, tg.groupsize())
    part[li] = x[i] * x[i]
    tg.synchronize()
    s = W // 2
    while s > 0:
        if li < s and li + s < valid:
            part[li] += part[li + s]
        tg.synchronize()
        s //= 2
    if li == 0:
        out[g] = math.sqrt(part[0])


@tg.kernel
def group_scan(out, x, levels):
    """``out[i] = x[i] * (x[first] ** 2 + ... + x[i] ** 2)`` over ``i``'s group (Hillis-Steele:
    ``levels`` rounds, each reading before a barrier and writing after it)."""
    li = tg.index(tg.Local)
    i = tg.index()
    buf = tg.localmem(x.dtype, tg.groupsize())
    v = x[i] * x[i]
    buf[li] = v
    tg.synchronize()
    for d in range(levels):
        off = 1 << d
        if li >= off:
            v += buf[li - off]
        tg.synchronize()
        buf[li] = v
        tg.synchronize()
    out[i] = v * x[i]


@tg.kernel
def ragged_rounds(out, x, counts, rounds):
    """Rounds of a ring exchange in local memory, as many as ``r % 3`` in round ``r`` (none in
    every third: two publications of the adjoint's trip count with no barrier between), and
    a loop whose bound each work-item reads from ``counts``."""
    li = tg.index(tg.Local)
    i = tg.index()
    W = tg.groupsize()[0]
    ring = tg.localmem(x.dtype, tg.groupsize())
    v = x[i]
    for r in range(rounds):
        for t in range(r % 3):
            ring[li] = v
            tg.synchronize()
            v = 0.5 * v + 0.25 * ring[(li + t + 1) % W] * v
            tg.synchronize()
        acc = 0.0
        for k in range(counts[i]):
            acc += math.sin(v * (k + 1))
        v = v + 0.1 * acc
    out[i] = v


# -- references ----------------------------------------------------------------------------

def tree_norms_numpy(x, W):
    groups = -(-x.size // W)
    padded = np.concatenate([x, np.zeros(groups * W - x.size)])
    return np.sqrt((padded.reshape(groups, W) ** 2).sum(1))


def group_scan_numpy(x, W):
    out = np.empty_like(x)
    for s in range(0, x.size, W):
        out[s:s + W] = x[s:s + W] * np.cumsum(x[s:s + W] ** 2)
    return out


def ragged_rounds_numpy(x, counts, rounds, W):
    v = x.copy()
    li = np.arange(x.size) % W
    base = np.arange(x.size) - li
    for r in range(rounds):
        for t in range(r % 3):
            ring = v.copy()
            v = 0.5 * v + 0.25 * ring[base + (li + t + 1) % W] * v
        acc = np.array([sum(math.sin(v[j] * (k + 1)) for k in range(counts[j]))
                        for j in range(x.size)])
        v = v + 0.1 * acc
    return v


# (kernel, workgroup size, ndrange, the arguments after ``out``, out's size, NumPy's result)
def _cases():
    rng = np.random.default_rng(7)
    x29 = rng.uniform(0.2, 1.0, 29)
    x21 = rng.uniform(0.2, 1.0, 21)
    x16 = rng.uniform(0.2, 1.0, 16)
    counts = rng.integers(0, 4, 16)
    return {
        "tree_norms": (tree_norms, 8, 29, [x29], 4, tree_norms_numpy(x29, 8)),
        "group_scan": (group_scan, 8, 21, [x21, 3], 21, group_scan_numpy(x21, 8)),
        "ragged_rounds": (ragged_rounds, 4, 16, [x16, counts, 5], 16,
                          ragged_rounds_numpy(x16, counts, 5, 4)),
    }


CASES = _cases()


def _args(name):
    kernel, wgs, nd, rest, n_out, expected = CASES[name]
    return kernel, wgs, nd, [np.zeros(n_out)] + [a.copy() if isinstance(a, np.ndarray) else a
                                                  for a in rest], expected


def _gradient(backend, name, seed):
    """(out, x's gradient) for the loss ``<w, out>`` with random ``w``."""
    kernel, wgs, nd, args, _ = _args(name)
    w = np.random.default_rng(seed).standard_normal(args[0].shape)
    dx = np.zeros_like(args[1])
    annotated = [tg.Duplicated(args[0], w), tg.Duplicated(args[1], dx), *args[2:]]
    tg.autodiff(tg.Reverse, kernel(backend, wgs), tg.Const, *annotated, ndrange=nd)
    return args[0], dx


def _tangent(backend, name, v):
    """(out, out's tangent along ``v``, a direction of x)."""
    kernel, wgs, nd, args, _ = _args(name)
    out_dot = np.zeros_like(args[0])
    annotated = [tg.Duplicated(args[0], out_dot), tg.Duplicated(args[1], v.copy()), *args[2:]]
    tg.autodiff(tg.Forward, kernel(backend, wgs), tg.Const, *annotated, ndrange=nd)
    return args[0], out_dot


# -- primal, adjoint, tangent ----------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_primal_against_numpy(backend, name):
    kernel, wgs, nd, args, expected = _args(name)
    kernel(backend, wgs)(*args, ndrange=nd)
    np.testing.assert_allclose(args[0], expected, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("name", sorted(CASES))
def test_adjoint_against_finite_differences(backend, name):
    kernel, wgs, nd, args, _ = _args(name)
    error, _, _ = kernel_vjp_error(kernel(backend, wgs), args, nd, wrt=[1], outputs=[0])
    assert error < 1e-6


@pytest.mark.parametrize("name", sorted(CASES))
def test_tangent_against_finite_differences(backend, name):
    kernel, wgs, nd, args, _ = _args(name)
    v = np.random.default_rng(3).standard_normal(args[1].shape)
    _, out_dot = _tangent(backend, name, v)
    eps = 1e-6

    def run(step):
        moved = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        moved[1] = moved[1] + step * v
        kernel(backend, wgs)(*moved, ndrange=nd)
        return moved[0]
    fd = (run(eps) - run(-eps)) / (2 * eps)
    np.testing.assert_allclose(out_dot, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tangent_and_adjoint_agree(backend, name):
    """The dot-product test: ``<J v, w> == <v, J^T w>``."""
    _, _, _, args, _ = _args(name)
    v = np.random.default_rng(4).standard_normal(args[1].shape)
    w = np.random.default_rng(5).standard_normal(args[0].shape)
    _, Jv = _tangent(backend, name, v)
    _, JTw = _gradient(backend, name, 5)
    assert np.isclose(Jv @ w, v @ JTw, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name", sorted(CASES))
def test_opencl_derivatives_equal_the_cpus_element_by_element(backend, name):
    if backend.name == "cpu":
        pytest.skip("the CPU is the reference")
    v = np.random.default_rng(6).standard_normal(_args(name)[3][1].shape)
    for mode in (lambda b: _gradient(b, name, 8), lambda b: _tangent(b, name, v)):
        for got, expected in zip(mode(backend), mode(tg.CPU())):
            np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-15)


def test_a_barrier_loop_bound_read_from_an_array_is_refused(backend):
    @tg.kernel
    def bound_from_array(out, x, n):
        li = tg.index(tg.Local)
        tmp = tg.localmem(x.dtype, tg.groupsize())
        for t in range(n[0]):
            tmp[li] = x[li] + t
            tg.synchronize()
        out[li] = tmp[li]

    with pytest.raises(tg.KernelSyntaxError, match="bounds of this loop must have the same "
                                                   "value for every work-item"):
        bound_from_array(backend, 4)(np.zeros(4), np.ones(4), np.array([2]), ndrange=4)


@tg.kernel
def varying_rounds(out, x, N):
    li = tg.index(tg.Local)
    i = tg.index()
    buf = tg.localmem(x.dtype, tg.groupsize())
    acc = 0.0
    for k in range(N[i]):
        buf[li] = x[i]
        tg.synchronize()
        acc += buf[li] * x[i] * (k + 1)
        tg.synchronize()
    out[i] = acc


def test_forward_and_reverse_mode_refuse_a_barrier_loop_the_primal_refuses(backend):
    x, N = np.arange(1.0, 5.0), np.array([1, 2, 3, 4])
    with pytest.raises(tg.KernelSyntaxError, match="bounds of this loop"):
        varying_rounds(backend, 4)(np.zeros(4), x, N, ndrange=4)
    with pytest.raises(tg.KernelSyntaxError, match="bounds of this loop"):
        tg.autodiff(tg.Forward, varying_rounds(backend, 4), tg.Const,
                    tg.Duplicated(np.zeros(4), np.zeros(4)), tg.Duplicated(x, np.ones(4)), N,
                    ndrange=4)
    with pytest.raises(tg.KernelSyntaxError, match="bounds of this loop"):
        tg.autodiff(tg.Reverse, varying_rounds(backend, 4), tg.Const,
                    tg.Duplicated(np.zeros(4), np.ones(4)), tg.Duplicated(x, np.zeros(4)), N,
                    ndrange=4)


# -- the printed publication of work-item 0's values ------------------------------------------

def _compiled_adjoints(name):
    """The typed kernels a reverse-mode launch of case ``name`` compiles on PoCL."""
    compiled = []
    harness = _opencl_on_numpy()
    run = type(harness).compile

    class Recording(type(harness)):
        def compile(self, tk):
            compiled.append(tk)
            return run(self, tk)
    kernel, wgs, nd, args, _ = _args(name)
    annotated = [tg.Duplicated(args[0], np.ones_like(args[0])),
                 tg.Duplicated(args[1], np.zeros_like(args[1])), *args[2:]]
    tg.autodiff(tg.Reverse, kernel(Recording(), wgs), tg.Const, *annotated, ndrange=nd)
    return [tk for tk in compiled if tk.name.endswith("_adjoint")]


COPY = re.compile(r"^_group_value\d+ = _group_values\[_group_bank\]\[\d+\];$")
WRITE = re.compile(r"^_group_values\[_group_bank\]\[\d+\] = _group_value\d+;$")


# (the scan's adjoint counts its rounds down from ``levels``: no value to share)
@pytest.mark.parametrize("name", ["tree_norms", "ragged_rounds"])
@pytest.mark.parametrize("dialect", [OPENCL, CUDA], ids=["opencl", "cuda"])
def test_work_items_copy_the_shared_values_right_after_their_barrier(name, dialect):
    """Every read of the shared slots is a copy right after the barrier that publishes them,
    followed by the switch of bank; work-item 0 alone writes them, just before that barrier;
    loops and branches read only the copies.  (barriers.py proves this free of races.)"""
    (tk,) = _compiled_adjoints(name)
    source = CPrinter(tk, dialect).module(device_functions(tk))
    lines = [ln.strip() for ln in source.splitlines()]
    declaration = f"{dialect.local_memory}{dialect.int64} _group_values["
    shared = [k for k, ln in enumerate(lines)
              if "_group_values[" in ln and not ln.startswith(("//", declaration))]
    writes = [k for k in shared if WRITE.match(lines[k])]
    copies = [k for k in shared if COPY.match(lines[k])]
    assert sorted(writes + copies) == shared, "the slots are read or written elsewhere"
    for k in writes:
        assert re.match(r"^if \(.* == 0\) \{$", lines[k - 1]) or k - 1 in writes
    blocks = [k for k in copies if k - 1 not in copies]      # each publication's first copy
    for k in blocks:
        end = k
        while end + 1 in copies:
            end += 1
        assert lines[k - 1] == dialect.barrier and lines[k - 2] == "}" and k - 3 in writes
        assert lines[end + 1] == "_group_bank ^= 1;"
    assert len(blocks) >= 2
    headers = [ln for ln in lines if ln.startswith(("for (", "while (", "if ("))]
    assert not any("_group_values" in ln for ln in headers)
    assert any(re.match(r"^(while|for) \(.*_group_value\d+", ln) for ln in headers)
