"""Every row of the primitive table (tapegrad/lang/primitives.py), checked from the table alone:
a row added there is tested here without a line of test code.

One generated kernel applies every row to its own column of inputs (``A``, ``C`` and ``D`` for a
row's first, second and third argument), drawn from the row's domain; its values are checked
against NumPy (or math) in float64 and float32, on each backend; its reverse-mode partials against float64 central differences of the kernel itself,
and forward mode against reverse mode.  (The host's tracked and forward-mode scalars run every
row in tests/ad/test_forward.py.)
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.lang import primitives

ROWS = list(primitives.MATH.values()) + [primitives.ABS]
SMOOTH = [row for row in ROWS if row.differentiable]
COLUMN = {row.name: k for k, row in enumerate(ROWS)}
N = 8


def _source() -> str:
    lines = ["import tapegrad as tg", "", "", "@tg.kernel", "def every_row(B, A, C, D):",
             "    i = tg.index()"]
    for k, row in enumerate(ROWS):
        args = ", ".join([f"A[i, {k}]", f"C[i, {k}]", f"D[i, {k}]"][:row.arity])
        call = f"abs({args})" if row is primitives.ABS else f"tg.{row.name}({args})"
        if row.result == "bool":
            call = f"tg.where({call}, 1.0, 0.0)"
        lines.append(f"    B[i, {k}] = {call}")
    return "\n".join(lines) + "\n"


def load_every_row(directory) -> tg.Kernel:
    """``every_row(B, A, C, D)``: ``B[i, k]`` is row k applied to ``A[i, k]`` (and ``C[i, k]``,
    ``D[i, k]``), written as a module in ``directory`` (a kernel's source must be in a file)."""
    path = Path(directory) / "every_row_kernel.py"
    path.write_text(_source())
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.every_row


@pytest.fixture(scope="module")
def every_row(tmp_path_factory):
    return load_every_row(tmp_path_factory.mktemp("primitives"))


def _inputs(dtype=np.float64, seed=0):
    """A, C and D: each row's column drawn from its domain (the tests of inf and nan add
    some)."""
    rng = np.random.default_rng(seed)
    A, C, D = (np.ones((N, len(ROWS))) for _ in range(3))
    for k, row in enumerate(ROWS):
        for X, (lo, hi) in zip((A, C, D), row.domain):
            X[:, k] = rng.uniform(lo, hi, N)
        if row.result == "bool":
            A[:, k] = [0.5, np.nan, np.inf, -np.inf, -2.0, np.nan, 1e30, 0.0][:N]
    return A.astype(dtype), C.astype(dtype), D.astype(dtype)


# where neither NumPy nor this Python's math has the function (math.fma: Python 3.13); fma's
# single rounding is checked exactly in tests/backends/test_fma.py
_CLOSED_FORMS = {"fma": lambda x, y, z: x * y + z}


def _reference(row, *args):
    """float64 values from NumPy (or math, where NumPy has no such function)."""
    args = [a.astype(np.float64) for a in args]
    if row.numpy_name is None:
        return np.vectorize(getattr(math, row.name, None) or _CLOSED_FORMS[row.name])(*args)
    return getattr(np, row.numpy_name)(*args).astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
def test_every_row_computes_what_numpy_computes(backend, every_row, dtype):
    A, C, D = _inputs(dtype)
    B = np.full(A.shape, -7.0, dtype)
    every_row(backend, 4)(B, A, C, D, ndrange=N)
    tolerance = dict(rtol=2e-6, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-14)
    failed = []
    for k, row in enumerate(ROWS):
        expected = _reference(row, *(X[:, k] for X in (A, C, D)[:row.arity]))
        if row.result == "bool":
            expected = expected.astype(np.float64)
        if not np.allclose(B[:, k].astype(np.float64), expected, equal_nan=True, **tolerance):
            failed.append(f"{row.name}: {B[:, k]} != {expected}")
    assert not failed, "\n".join(failed)


_TINY = {np.float64: [5e-324, -5e-324, 3e-320, 1e-310, -2.2e-308, 0.0, -0.0, 1e-300],
         np.float32: [1e-45, -1e-45, 3e-42, 1e-40, -1.1e-38, 0.0, -0.0, 1e-30]}


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=lambda d: d.__name__)
def test_every_row_at_subnormal_and_tiny_inputs(backend, every_row, dtype):
    """Every row at the smallest inputs, subnormals and signed zeros (y = 1 for two-argument
    rows, z = 0 for three) within 2 ulps of NumPy (or math), on each backend; log1p's is x
    itself, exactly (PoCL's log1p(5e-324) is 0)."""
    A = np.tile(np.array(_TINY[dtype], dtype)[:, None], (1, len(ROWS)))
    C, D = np.ones_like(A), np.zeros_like(A)
    B = np.full(A.shape, -7.0, dtype)
    every_row(backend, 4)(B, A, C, D, ndrange=N)
    failed = []
    for k, row in enumerate(ROWS):
        got = B[:, k]
        with np.errstate(all="ignore"):
            expected = _reference(row, *(X[:, k] for X in (A, C, D)[:row.arity])).astype(dtype)
            close = (got == expected) | (np.isnan(got) & np.isnan(expected)) | (
                np.abs(got - expected) <= 2 * np.spacing(np.abs(expected)))
        if not close.all():
            failed.append(f"{row.name}: {got} != {expected}")
    assert not failed, "\n".join(failed)
    k = COLUMN["log1p"]
    assert B[:, k].tobytes() == A[:, k].tobytes(), f"log1p: {B[:, k]} != {A[:, k]}"


def _partials_by_reverse(kernel, inputs, k):
    """dB[:, k]/dX[:, k] for each input X (each output reads only its own inputs)."""
    B = np.zeros_like(inputs[0])
    dB = np.zeros_like(B)
    dB[:, k] = 1.0
    shadows = [tg.make_zero(X) for X in inputs]
    tg.autodiff(tg.Reverse, kernel, tg.Const, tg.Duplicated(B, dB),
                *(tg.Duplicated(X.copy(), dX) for X, dX in zip(inputs, shadows)), ndrange=N)
    return [dX[:, k] for dX in shadows]


def _partials_by_forward(kernel, inputs, k, which):
    B, dB = np.zeros_like(inputs[0]), np.zeros_like(inputs[0])
    tangents = [np.zeros_like(X) for X in inputs]
    tangents[which][:, k] = 1.0
    tg.autodiff(tg.Forward, kernel, tg.Const, tg.Duplicated(B, dB),
                *(tg.Duplicated(X.copy(), dX) for X, dX in zip(inputs, tangents)), ndrange=N)
    return dB[:, k]


@pytest.mark.parametrize("name", [row.name for row in SMOOTH])
def test_every_rows_derivative_matches_finite_differences_in_both_modes(every_row, name):
    row, k = primitives.lookup(name), COLUMN[name]
    kernel = every_row(tg.CPU(), 4)
    inputs = _inputs()
    reverse = _partials_by_reverse(kernel, inputs, k)
    h = 1e-6
    for which in range(row.arity):
        values = []
        for step in (h, -h):
            moved = [X.copy() for X in inputs]
            moved[which][:, k] += step
            B = np.zeros_like(moved[0])
            kernel(B, *moved, ndrange=N)
            values.append(B[:, k])
        fd = (values[0] - values[1]) / (2 * h)
        np.testing.assert_allclose(reverse[which], fd, rtol=1e-6, atol=1e-8,
                                   err_msg=f"{name}: argument {which}, reverse mode")
        forward = _partials_by_forward(kernel, inputs, k, which)
        np.testing.assert_allclose(forward, reverse[which], rtol=1e-13, atol=1e-15,
                                   err_msg=f"{name}: argument {which}, forward mode")
    for which in range(row.arity, len(inputs)):   # a row leaves the columns it lacks alone
        assert not reverse[which].any()


def test_a_row_lowered_as_an_expression_becomes_a_helper_on_the_cpu(tmp_path, monkeypatch):
    """A row may give its CPU lowering as an expression in x and y (when Numba has no such
    function): the CPU module gets a helper function for it, and the values follow it."""
    row = primitives.MATH["hypot"]
    monkeypatch.setitem(primitives.MATH, "hypot", dataclasses.replace(
        row, numba="math.sqrt(x * x + y * y) + 0.0 * 17.0"))
    path = tmp_path / "hypot_kernel.py"
    path.write_text("import tapegrad as tg\n\n\n@tg.kernel\ndef h(B, A, C):\n"
                    "    i = tg.index()\n    B[i] = tg.hypot(A[i], C[i])\n")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    A, C = np.array([3.0, 5.0, 0.5]), np.array([4.0, 12.0, 1.5])
    B = np.zeros(3)
    backend = tg.CPU()
    module.h(backend, 4)(B, A, C, ndrange=3)
    np.testing.assert_allclose(B, np.hypot(A, C), rtol=1e-15)
    text = module.h.source(backend=backend)
    assert "def _tg_hypot(x, y):" in text and "0.0 * 17.0" in text
