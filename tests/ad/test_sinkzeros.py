"""A consumed shadow's zero store comes after the statement's updates (tapegrad/ad/sinkzeros.py:
faster on an H200), never past anything that reads or writes that shadow or changes its
index, and the derivatives stay exact (closed forms)."""

import ast

import numpy as np

import tapegrad as tg
from tapegrad.ad.sinkzeros import sink_zero_stores
from tapegrad.bench.problems import sin_k


def _sunk(source: str, shadows=("Y_bar", "X_bar")) -> list[str]:
    body = ast.parse(source).body
    return [ast.unparse(st) for st in sink_zero_stores(body, set(shadows))]


def test_the_zero_store_moves_below_the_updates_of_other_shadows():
    assert _sunk("a = Y_bar[i]\nY_bar[i] = 0.0\nX_bar[i] = X_bar[i] + a * c\nZ[i] = a") == [
        "a = Y_bar[i]", "X_bar[i] = X_bar[i] + a * c", "Z[i] = a", "Y_bar[i] = 0.0"]


def test_it_stops_at_its_own_array_a_new_index_a_call_or_a_branch():
    stops = ["Y_bar[j] = Y_bar[j] + a",          # the same shadow, another element
             "i = i + 1",                         # its index changes
             "tg.barrier()",                      # other work-items may read it after this
             "if a > 0:\n    X_bar[i] = a"]       # a branch
    for stop in stops:
        source = f"a = Y_bar[i]\nY_bar[i] = 0.0\nX_bar[i] = a\n{stop}\nX_bar[i] = 2 * a"
        lines = _sunk(source)
        assert lines.index("Y_bar[i] = 0.0") == 2, stop


def test_stores_into_other_arrays_and_other_values_stay_put():
    source = "a = Y[i]\nY[i] = 0.0\nX_bar[i] = a\nY_bar[i] = a\nX_bar[i] = X_bar[i] + 1.0"
    assert _sunk(source) == source.split("\n")


def test_inside_a_loop_body_too():
    source = "for k in range(3):\n    a = Y_bar[k]\n    Y_bar[k] = 0.0\n    X_bar[k] = a"
    (loop,) = _sunk(source)
    assert loop.split("\n")[2:] == ["    X_bar[k] = a", "    Y_bar[k] = 0.0"]


@tg.kernel
def square_in_place(X):
    i = tg.index()
    X[i] = X[i] * X[i]


def test_the_adjoint_consumes_the_seed_after_adding_its_gradient():
    n = 7
    x = np.linspace(-1.0, 1.0, n)
    seed, x_bar = np.linspace(0.5, 2.0, n), np.full(n, 0.25)
    tg.autodiff(tg.Reverse, sin_k(tg.CPU()), tg.Const, tg.Duplicated(np.zeros(n), seed),
                tg.Duplicated(x, x_bar), ndrange=n)
    np.testing.assert_allclose(x_bar, 0.25 + np.linspace(0.5, 2.0, n) * np.cos(x), rtol=1e-15)
    assert not seed.any()
    lines = [ln.strip() for ln in sin_k.source("reverse").splitlines()]
    assert lines.index("Y_bar[i] = 0.0") > next(k for k, ln in enumerate(lines)
                                                 if ln.startswith("X_bar[i] +="))


def test_an_in_place_update_keeps_its_zero_before_its_own_gradient():
    n = 5
    x = np.linspace(0.5, 2.5, n)
    x_bar = np.linspace(1.0, 3.0, n)
    tg.autodiff(tg.Reverse, square_in_place(tg.CPU()), tg.Const,
                tg.Duplicated(x.copy(), x_bar), ndrange=n)
    # d(x^2)/dx times the seed, the seed itself consumed (not added to)
    np.testing.assert_allclose(x_bar, 2 * x * np.linspace(1.0, 3.0, n), rtol=1e-15)
