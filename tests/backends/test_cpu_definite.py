"""Locals that some path reads before assigning them get a value when a CPU task starts
(tapegrad/backends/cpu/definite.py): adjoints of branches nested in loops compile and are
right, and a recursion in Numba's parallel-loop pass is reported as a tapegrad error."""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest

import tapegrad as tg
import tapegrad.backends.cpu.lower as lower
from tapegrad.backends.cpu.backend import _Launcher
from tapegrad.backends.structure import upward_exposed
from tapegrad.errors import KernelCompileError

CPU = tg.CPU()


@tg.kernel
def nest(s, x, n):
    i = tg.index(); acc = 0.0  # noqa: E702  (the reproducer of issue 23, as filed)
    for k in range(n):
        if k < 16:
            if k < 8: acc = acc + x[i] * 2.0  # noqa: E701
            else:     acc = acc + x[i] * 4.0  # noqa: E701
        else:         acc = acc + x[i] * 6.0  # noqa: E701
    s[i] = acc


def task_body(source: str) -> tuple[list[ast.stmt], set[str]]:
    """What a parallel task of a generated CPU kernel runs (the ``__task`` function, or the
    ``prange`` loop's body with tg.CPU(without=["outline"])) and the names it starts with."""
    tree = ast.parse(source)
    outlined = [n for n in tree.body if isinstance(n, ast.FunctionDef)
                and n.name.endswith("__task")]
    if outlined:
        return outlined[-1].body, {a.arg for a in outlined[-1].args.args}
    loop = next(n for n in ast.walk(tree.body[-1]) if isinstance(n, ast.For)
                and ast.unparse(n.iter).startswith("numba.prange"))
    return loop.body, {loop.target.id}


def live_into_tasks(source: str) -> set[str]:
    """The locals of a generated CPU kernel that some path from the start of a parallel
    task reads before assigning them (what definite.py must leave none of)."""
    body, given = task_body(source)
    assigned = {n.id for n in ast.walk(ast.Module(body=body, type_ignores=[]))
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return (upward_exposed(body) & assigned) - given


def nest_slope(n: int) -> float:
    """d s[i] / d x[i] of ``nest``: each trip adds x[i] times its branch's factor."""
    return sum(2.0 if k < 8 else 4.0 if k < 16 else 6.0 for k in range(n))


def test_branch_nested_in_a_branch_in_a_loop_differentiates():
    dx = np.zeros(8)
    tg.autodiff(tg.Reverse, nest(CPU, 4), tg.Const, tg.Duplicated(np.zeros(8), np.ones(8)),
                tg.Duplicated(np.random.rand(8), dx), 32, ndrange=8)
    assert nest_slope(32) == 144.0
    np.testing.assert_array_equal(dx, np.full(8, 144.0))
    for n in (0, 5, 12, 40):     # no trip, the inner branches only, all three, a longer stack
        seed, dx = np.linspace(-1.0, 2.0, 8), np.zeros(8)
        tg.autodiff(tg.Reverse, nest(CPU, 4), tg.Const, tg.Duplicated(np.zeros(8), seed.copy()),
                    tg.Duplicated(np.random.rand(8), dx), n, ndrange=8)
        np.testing.assert_allclose(dx, seed * nest_slope(n), rtol=1e-15)
    source = nest.source(mode="reverse", backend=CPU)
    body, _ = task_body(source)
    # the popped flags get a value as the task starts, before anything reads them
    task = source.index("__task(_c")
    assert "(definite.py)" in source[task:source.index("for _g in", task)]
    assert not isinstance(body[0], ast.For)
    assert live_into_tasks(source) == set()


@tg.kernel
def edges(Y, X, n):
    i, j = tg.index(tg.Global, tg.NTuple)
    h, w = X.shape
    if 0 < i < h - 1 and 0 < j < w - 1:
        Y[i, j] = X[i - 1, j] + X[i + 1, j] + X[i, j - 1] + X[i, j + 1]
    else:
        acc = 0.0
        for k in range(n):
            if k < 4:
                if k < 2:
                    acc = acc + X[i, j] * 2.0
                else:
                    acc = acc + X[i, j] * 4.0
            else:
                acc = acc + X[i, j] * 6.0
        Y[i, j] = acc


def test_edge_columns_pass_gives_its_own_copies_a_value(monkeypatch):
    """A 2-D stencil whose edge branch nests branches in a loop: the edge columns run in a
    second copy of the body with renamed locals (lower.split_item_loop), which need values
    of their own.  Checked on the generated code, without compiling it."""
    monkeypatch.setattr(_Launcher, "first_call", lambda self, *args: None)
    X = np.random.rand(40, 40)
    tg.autodiff(tg.Reverse, edges(CPU, (4, 16)), tg.Const,
                tg.Duplicated(np.zeros_like(X), np.ones_like(X)),
                tg.Duplicated(X, np.zeros_like(X)), 6, ndrange=X.shape)
    source = edges.source(mode="reverse", backend=CPU)
    assert "column by column" in source and re.search(r"_branch\d+__col = 0\n", source)
    assert live_into_tasks(source) == set()


def test_a_recursion_in_numba_is_a_tapegrad_error(monkeypatch):
    """Without the task's first assignments and with the task's body inside the parallel
    loop, Numba's parallel-loop pass recurses without end on this adjoint; what the user
    sees is a tapegrad error saying what to do."""
    monkeypatch.setattr(lower, "unassigned_locals", lambda tk, body=None: {})
    with pytest.raises(KernelCompileError, match="TAPEGRAD_BOUNDSCHECK=1") as info:
        tg.autodiff(tg.Reverse, nest(tg.CPU(without=["outline"]), 2), tg.Const, tg.Duplicated(np.zeros(8), np.ones(8)),
                    tg.Duplicated(np.random.rand(8), np.zeros(8)), 32, ndrange=8)
    assert "parallel-loop analysis recursed" in str(info.value)
    assert "test_cpu_definite.py" in str(info.value)


def test_an_outlined_task_needs_no_first_assignments(monkeypatch):
    """With the body in a serial function of its own (outline.py), the parallel-loop pass
    never sees the body, so the adjoint compiles even without definite.py's assignments."""
    monkeypatch.setattr(lower, "unassigned_locals", lambda tk, body=None: {})
    seed, dx = np.linspace(-1.0, 2.0, 8), np.zeros(8)
    tg.autodiff(tg.Reverse, nest(CPU, 8), tg.Const, tg.Duplicated(np.zeros(8), seed.copy()),
                tg.Duplicated(np.random.rand(8), dx), 20, ndrange=8)
    np.testing.assert_allclose(dx, seed * nest_slope(20), rtol=1e-15)
