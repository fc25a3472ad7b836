"""A call that writes memory (an atomic, a device function that stores) runs exactly once, in
Python's order, wherever it sits in an expression (tapegrad/frontend/once.py); where Python
runs it only sometimes and a printer could repeat or skip it, the kernel is refused."""

from __future__ import annotations

import ast
import re

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.frontend import kernel_ir

N = 4   # work-items


@tg.func
def mark(M, k):
    """Counts its calls in M[k] (a store, not an atomic: writing memory through a function)."""
    M[k] += 1
    return M[k]


@tg.kernel
def effects(Out, C, M):
    i = tg.index()
    if 0 <= tg.atomic_add(C, 0, 1) < 100:               # a chain's middle operand
        Out[0, i] = 1
    Out[1, i] = tg.atomic_add(C, 1, 1) ** 2             # x ** 2 printed as x * x
    Out[2, tg.atomic_add(C, 2, 1)] += 1                 # A[k] += v printed A[k] = A[k] + v
    Out[3, i] = max(tg.atomic_add(C, 3, 1), -1)         # max printed as a conditional
    Out[4, i] = abs(mark(M, 3 * i)) + max(mark(M, 3 * i + 1), 0)
    t = (10, 20, 30)
    Out[5, i] = t[tg.atomic_add(C, 4, 1) % 3]           # a tuple at a run-time index
    if i < 0:
        pass
    elif M[3 * i + 2] + mark(M, 3 * i + 2) == 1:        # M read before mark writes it
        Out[6, i] = 1
    Out[7, i] = 100 // (tg.atomic_add(C, 5, 1) + 1)     # an integer // tests its divisor
    Out[8, i] = 1 << (tg.atomic_add(C, 6, 1) % 8)       # a shift tests its count's range


def reference():
    """``effects`` run by Python, work-item after work-item."""
    Out, C, M = np.zeros((9, 8), np.int64), np.zeros(7, np.int64), np.zeros(3 * N, np.int64)

    def atomic_add(A, k, v):
        A[k] += v
        return A[k] - v

    def mark_(k):
        M[k] += 1
        return M[k]

    for i in range(N):
        if 0 <= atomic_add(C, 0, 1) < 100:
            Out[0, i] = 1
        Out[1, i] = atomic_add(C, 1, 1) ** 2
        Out[2, atomic_add(C, 2, 1)] += 1
        Out[3, i] = max(atomic_add(C, 3, 1), -1)
        Out[4, i] = abs(mark_(3 * i)) + max(mark_(3 * i + 1), 0)
        Out[5, i] = (10, 20, 30)[atomic_add(C, 4, 1) % 3]
        if M[3 * i + 2] + mark_(3 * i + 2) == 1:
            Out[6, i] = 1
        Out[7, i] = 100 // (atomic_add(C, 5, 1) + 1)
        Out[8, i] = 1 << (atomic_add(C, 6, 1) % 8)
    return Out, C, M


def test_calls_that_write_memory_run_once_in_order(backend):
    Out, C, M = np.zeros((9, 8), np.int64), np.zeros(7, np.int64), np.zeros(3 * N, np.int64)
    effects(backend, N)(Out, C, M, ndrange=N)
    want_out, want_c, want_m = reference()
    # which work-item gets which old value depends on the order they run in: rows whose
    # values come from an atomic's old value are compared as multisets
    bad = [f"counters {C.tolist()} != {want_c.tolist()}"] if (C != want_c).any() else []
    bad += [f"M {M.tolist()} != {want_m.tolist()}"] if (M != want_m).any() else []
    for row in range(9):
        got, want = Out[row, :N], want_out[row, :N]
        if row in (1, 3, 5, 7, 8):
            got, want = np.sort(got), np.sort(want)
        if (got != want).any() or (Out[row, N:] != want_out[row, N:]).any():
            bad.append(f"row {row}: {Out[row].tolist()} != {want_out[row].tolist()}")
    assert not bad, "\n".join(bad)


def test_hoisted_calls_are_readable_locals():
    ir = kernel_ir(effects)
    source = ast.unparse(ast.Module(body=ir.body, type_ignores=[]))
    assert "_once0 = tg.atomic_add(C, 0, 1)\nif 0 <= _once0 < 100:" in source
    assert re.search(r"(_once\d+) = tg.atomic_add\(C, 2, 1\)\nOut\[2, \1\] \+= 1", source)
    # elif: hoisted inside the else, before the inner if; the read of M first
    assert re.search(r"else:\n    (_once\d+) = M\[3 \* i \+ 2\]\n    (_once\d+) = mark\(M, "
                     r"3 \* i \+ 2\)\n    if \1 \+ \2 == 1:", source)
    hoisted = set(re.findall(r"_once\d+", source))
    assert len(hoisted) == 11 and hoisted <= ir.locals


@tg.kernel
def kept(Out, C, X):
    i = tg.index()
    old = tg.atomic_add(C, 0, 1)
    tg.atomic_add(C, 1, 1)
    Out[i] = mark(C, 2)
    if X[i] > 0 and tg.atomic_add(C, 3, 1) < 5 and old >= 0:
        Out[i] = old + X[i] ** 2
    while tg.atomic_add(C, 4, 1) < 2:
        Out[i] = X[i] if X[i] > 0 else tg.atomic_add(C, 5, 1)


def test_whole_values_and_safe_conditional_calls_are_left_as_written():
    assert ast.dump(ast.Module(body=kernel_ir(kept).body, type_ignores=[])) == ast.dump(ast.parse(
        "i = tg.global_index()\n"
        "old = tg.atomic_add(C, 0, 1)\n"
        "tg.atomic_add(C, 1, 1)\n"
        "Out[i] = mark(C, 2)\n"
        "if X[i] > 0 and tg.atomic_add(C, 3, 1) < 5 and old >= 0:\n"
        "    Out[i] = old + X[i] ** 2\n"
        "while tg.atomic_add(C, 4, 1) < 2:\n"
        "    Out[i] = X[i] if X[i] > 0 else tg.atomic_add(C, 5, 1)"))


@tg.func
def bump(M, k):
    """Adds 10 to M[k] and returns 2."""
    M[k] = M[k] + 10
    return 2


@tg.kernel
def read_before_the_call(A, B, E):
    i = tg.index()
    A[i] //= bump(A, i)          # Python reads A[i], then bump writes it
    B[i] += 1 + bump(B, i)
    E[i] **= bump(E, i)


def test_an_augmented_array_element_is_read_before_the_value_runs(backend):
    """(The value's call was hoisted above the read of A[i]: (old + 10) // 2, not old // 2;
    B[i] += 1 + bump(B, i) was old + 13 on both backends.)"""
    A, B, E = (np.arange(8, dtype=np.int64) for _ in range(3))
    read_before_the_call(backend, 4)(A, B, E, ndrange=8)
    old = np.arange(8)
    assert A.tolist() == (old // 2).tolist() and B.tolist() == (old + 3).tolist()
    assert E.tolist() == (old ** 2).tolist()


@tg.kernel
def chain(Out, C, X):
    i = tg.index()
    if X[i] < 0 <= tg.atomic_add(C, 0, 1) < 100:   # ERR:chain
        Out[i] = 1


@tg.kernel
def loop(C):
    while 0 <= tg.atomic_add(C, 0, 1) < 10:   # ERR:while
        pass


@tg.kernel
def squared_branch(Out, C, X):
    i = tg.index()
    Out[i] = (mark(C, 0) if X[i] > 0 else 0) ** 2   # ERR:branch


@tg.kernel
def shift_branch(Out, C, X):
    i = tg.index()
    Out[i] = (i >> mark(C, 0)) if X[i] > 0 else 0   # ERR:shift


@tg.kernel
def index_and_value(Out, C):
    Out[tg.atomic_add(C, 0, 1)] //= mark(C, 1)   # ERR:both


def line_of(tag: str) -> int:
    with open(__file__) as f:
        return next(n for n, line in enumerate(f, 1) if line.rstrip().endswith(f"# ERR:{tag}"))


@pytest.mark.parametrize("kern, tag, says", [
    (chain, "chain", r"tg.atomic_add\(C, 0, 1\) writes memory and Python evaluates it only "
                     r"sometimes here \(after the first comparison of a chain\).*assign it to a "
                     r"local on its own line first \(`v = tg.atomic_add\(C, 0, 1\)`"),
    (loop, "while", r"\(in a while loop's test\).*write `while True:` and begin its body with "
                    r"`v = tg.atomic_add\(C, 0, 1\)` and `if not <the test, using v>: break`"),
    (squared_branch, "branch", r"mark\(C, 0\) writes memory .*\(in a branch of `x if c else "
                               r"y`\).*assign it to a local on its own line first"),
    (index_and_value, "both", r"both the index and the value write memory in one augmented "
                               r"assignment; compute the index into a local"),
    (shift_branch, "shift", r"mark\(C, 0\) writes memory .*\(in a branch of `x if c else "
                            r"y`\).*assign it to a local on its own line first"),
])
def test_calls_a_printer_could_repeat_or_skip_are_refused(kern, tag, says):
    with pytest.raises(tg.KernelSyntaxError, match=says) as err:
        kernel_ir(kern)
    assert err.value.filename == __file__ and err.value.lineno == line_of(tag)
    assert str(err.value).startswith(f"{__file__}:{line_of(tag)}: ")
