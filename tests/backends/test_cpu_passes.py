"""The CPU's pass list (tapegrad/backends/cpu/passes.py): each pass does something for a kernel
made for it, says so in ``kern.passes()``, and switched off by name gives the same results."""

from __future__ import annotations

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu import passes
from tapegrad.bench.problems import matmul_k
from tapegrad.bench.problems import stencil2d_k as diffuse
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul
from tests.backends.test_cpu_scaled_sums import weighted_histogram


@tg.kernel
def scale_rows(Y, X):
    i, j = tg.index(tg.Global, tg.NTuple)
    Y[i, j] = 2.0 * X[i, j] + i


def tiled_product(backend):
    rng = np.random.default_rng(1)
    A, B, W = rng.random((32, 16)), rng.random((16, 48)), rng.random((32, 48))
    dA, dB = np.zeros_like(A), np.zeros_like(B)
    tg.autodiff(tg.Reverse, tiled_matmul(backend, (TILE, TILE)), tg.Const,
                tg.DuplicatedNoNeed(np.zeros((32, 48)), W.copy()), tg.Duplicated(A, dA),
                tg.Duplicated(B, dB), ndrange=(32, 48))
    np.testing.assert_allclose(dA, W @ B.T, rtol=1e-12)         # against NumPy, always
    return tiled_matmul.passes("reverse", backend), (dA, dB)


def diffusion_adjoint(backend):
    rng = np.random.default_rng(2)
    x, w = rng.random((64, 256)), rng.standard_normal((64, 256))
    dx = np.zeros_like(x)
    tg.autodiff(tg.Reverse, diffuse(backend, (8, 64)), tg.Const,
                tg.DuplicatedNoNeed(np.empty_like(x), w.copy()), tg.Duplicated(x, dx), 0.2,
                ndrange=x.shape)
    return diffuse.passes("reverse", backend), (dx,)


def scaled_scatter(backend):
    rng = np.random.default_rng(3)
    weight, X, idx = rng.random(32), rng.random(4096), rng.integers(0, 32, 4096)
    H = np.zeros(32)
    weighted_histogram(backend)(H, weight, X, idx, ndrange=4096)
    np.testing.assert_allclose(H, weight * np.bincount(idx, X, minlength=32), rtol=1e-12)
    return weighted_histogram.passes(backend=backend), (H,)


def long_rows(backend):
    X = np.random.default_rng(4).random((64, 512))
    Y = np.zeros_like(X)
    scale_rows(backend, (16, 64))(Y, X, ndrange=X.shape)
    np.testing.assert_array_equal(Y, 2.0 * X + np.arange(64)[:, None])
    return scale_rows.passes(backend=backend), (Y,)


def float32_product(backend):
    rng = np.random.default_rng(5)
    A, B = rng.random((32, 16), np.float32), rng.random((16, 48), np.float32)
    C = np.zeros((32, 48), np.float32)
    matmul_k(backend, (16, 16))(C, A, B, ndrange=C.shape)     # (its tiles' size)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5)
    assert ("(jam.py)" in matmul_k.source(backend=backend)) == ("jam" not in backend.without)
    return matmul_k.passes(backend=backend), (C,)


# pass -> (a run that should use it, what its note says when it did something)
CASES = {
    "transposed": (tiled_product, "reads "),
    "rows": (long_rows, "runs in rows of"),
    "phases": (tiled_product, "barrier(s) dropped"),
    "private_sums": (tiled_product, "_bar"),
    "bands": (tiled_product, "bands of rows"),
    "scaled_sums": (scaled_scatter, "H scaled by weight"),
    "versioning": (diffusion_adjoint, "index-range test(s) hold"),
    "edge_columns": (diffusion_adjoint, "split by index ranges"),
    "jam": (float32_product, "rows in fours"),
    "outline": (scaled_scatter, "its own function"),
}


def _note(report: str, name: str) -> str:
    # (a replay's report has a block per module it ran; the first is the kernel's own)
    return next(line for line in report.splitlines() if line.split()[0] == name)


def test_every_pass_has_a_case_and_the_list_is_in_order():
    assert set(CASES) == set(passes.NAMES)
    assert passes.NAMES.index("private_sums") < passes.NAMES.index("bands")


@pytest.mark.parametrize("name", passes.NAMES)
def test_each_pass_does_its_work_and_switched_off_the_results_agree(name):
    run, says = CASES[name]
    report, results = run(tg.CPU())
    note = _note(report, name)
    assert says in note and "off" not in note.split()[1], report
    off = tg.CPU(without=[name])
    report_off, results_off = run(off)
    assert "off" in _note(report_off, name)
    for a, b in zip(results, results_off):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)


def test_switching_off_a_pass_switches_off_the_passes_built_on_it():
    assert passes.switched_off(["private_sums"]) == {"private_sums", "bands", "scaled_sums"}
    assert repr(tg.CPU(without=["scaled_sums", "private_sums"])) == \
        "CPU(without=('private_sums', 'bands', 'scaled_sums'))"
    assert tg.CPU(without=["outline"]) == tg.CPU(without=("outline",)) != tg.CPU()


def test_an_unknown_pass_name_is_refused_with_the_list():
    with pytest.raises(tg.BackendError, match="no CPU pass named band; the passes are "):
        tg.CPU(without=["band"])


def test_passes_needs_a_launch_on_a_backend_with_passes():
    with pytest.raises(tg.LaunchError, match="say which backend"):
        scale_rows.passes()
