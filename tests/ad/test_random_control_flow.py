"""Hypothesis generates kernels whose loop holds nested control flow (if/else and
if/elif/else up to three deep, loops inside branches, while loops, break and continue) and
checks each adjoint against finite differences and each tangent against the adjoint
(<J v, w> == <v, J^T w>).  Their adjoints pop branch flags and trip counts that the forward
sweep assigns on some paths only: the CPU lowering must give those a value before Numba's
parallel loop reads them (tapegrad/backends/cpu/definite.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tapegrad.testing import arrays
from tests.ad.gradcheck import kernel_vjp_error, tangent_adjoint_products
from tests.ad.test_random_kernels import SMOOTH_UNARY, load_kernel
from tests.backends.test_cpu_definite import live_into_tasks

CPU = tg.CPU()
MAX_DEPTH = 3
BUDGET = 6     # statements in the loop, about (branches and loops count one each)
# thresholds no simple float hits (Hypothesis likes 0, 0.5, 1): a test that flips between
# x - eps and x + eps would make the finite differences meaningless.  Hypothesis also draws
# the constants it finds in the code, these among them: inputs are moved off them (apart).
THRESHOLDS = ["0.137", "-0.291", "0.413", "0.0717"]


def apart(a: np.ndarray) -> np.ndarray:
    """``a`` with its values near a threshold moved a little away from it."""
    for t in map(float, THRESHOLDS):
        a = np.where(np.abs(a - t) < 1e-3, t + 1e-2, a)
    return a


def smooth(leaves: list[str]) -> st.SearchStrategy[str]:
    """A smooth expression of one or two leaves (no max/min: Hypothesis's arrays repeat
    values, and a kink where two inputs are equal breaks finite differences)."""
    leaf = st.sampled_from(leaves)
    unary = st.tuples(st.sampled_from(SMOOTH_UNARY), leaf).map(
        lambda t: t[0].format(*([t[1]] * t[0].count("{}"))))
    binary = st.tuples(st.sampled_from(["({} + {})", "({} - {})", "({} * {})"]), leaf, leaf
                       ).map(lambda t: t[0].format(t[1], t[2]))
    return st.one_of(unary, binary)


def conditions(loops: list[str]) -> st.SearchStrategy[str]:
    on_values = st.tuples(st.sampled_from(["x > {}", "y < {}", "s > {}", "s < x + {}"]),
                          st.sampled_from(THRESHOLDS)).map(lambda t: t[0].format(t[1]))
    on_trips = st.tuples(st.sampled_from(loops), st.sampled_from(["{} < {}", "({} + {}) % 2 == 0"]),
                         st.integers(1, 2)).map(lambda t: t[1].format(t[0], t[2]))
    return st.one_of(on_values, on_trips)


@st.composite
def blocks(draw, depth: int, loops: list[str], exits: tuple[str, ...], budget: list[int]
           ) -> list[str]:
    """Statements at nesting ``depth`` inside the loops ``loops`` (innermost last);
    ``exits`` are the jumps the innermost loop allows (a while loop has no continue: it would
    skip its counter).  Each statement takes one from ``budget``, shared by the whole kernel:
    compiling the adjoint takes much longer the more branches it has."""
    def block(inner_loops: list[str] = loops, inner_exits: tuple[str, ...] = exits
              ) -> list[str]:
        return _indent(draw(blocks(depth + 1, inner_loops, inner_exits, budget)))

    lines: list[str] = []
    for _ in range(draw(st.integers(1, 2 if depth == 1 else 1))):
        kinds = ["update", "temp", "store"]
        if depth < MAX_DEPTH and budget[0] > 0:
            kinds += ["if", "elif", "for", "while"]
        if exits:
            kinds.append("exit")
        kind = draw(st.sampled_from(kinds))
        budget[0] -= 1
        e = draw(smooth(["x", "y", "s"]))

        if kind == "update":
            lines.append(draw(st.sampled_from(["s = 0.5 * s + 0.25 * {}",
                                                "s = math.tanh(s + {})",
                                                "s = s * math.cos({})"])).format(e))
        elif kind == "temp":      # a local assigned and read inside a branch or loop
            lines += [f"t{depth} = {e}", f"s = s + 0.3 * t{depth}"]
        elif kind == "store":
            lines.append(f"C[i] += 0.1 * {e}")
        elif kind in ("if", "elif"):
            lines += [f"if {draw(conditions(loops))}:"] + block()
            if kind == "elif":
                lines += [f"elif {draw(conditions(loops))}:"] + block()
            lines += ["else:"] + block()
        elif kind == "for":       # trips fixed, or one more per trip of the loop around it
            var = f"m{depth}"
            trips = draw(st.sampled_from(["2", f"{loops[-1]} + 1"]))
            lines += [f"for {var} in range({trips}):"] + block(loops + [var], ("break", "continue"))
        elif kind == "while":
            var = f"w{depth}"
            lines += [f"{var} = 0", f"while {var} < 2:"] + block(loops + [var], ("break",))
            lines.append(f"    {var} = {var} + 1")
        else:
            lines += [f"if {draw(conditions(loops))}:", f"    {draw(st.sampled_from(exits))}"]
    return lines


def _indent(lines: list[str]) -> list[str]:
    return ["    " + ln for ln in lines]


@st.composite
def nested_kernels(draw) -> str:
    """Source of a random kernel ``k(C, A, B, n)`` whose loop over ``range(n)`` holds nested
    control flow."""
    lines = ["i = tg.index()", "x = A[i]", "y = B[i]", "s = 0.25", "for k in range(n):"]
    lines += _indent(draw(blocks(1, ["k"], ("break", "continue"), [BUDGET])))
    lines.append(f"C[i] = C[i] + s * {draw(smooth(['x', 'y']))}")
    return "def k(C, A, B, n):\n" + "\n".join("    " + ln for ln in lines) + "\n"


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(nested_kernels(), st.integers(0, 3), arrays(shape=(5,)), arrays(shape=(5,)),
       st.integers(0, 2 ** 32 - 1))
def test_nested_control_flow_in_loops_differentiates(tmp_path, source, trips, A, B, seed):
    k = load_kernel(source, tmp_path)
    A, B = apart(A), apart(B)
    try:
        kernel_vjp_error(k(CPU, 4), [np.zeros(5), A, B, trips], 5, wrt=[1, 2], outputs=[0])
        tangent, adjoint = tangent_adjoint_products(k(CPU, 4), A, B, trips, seed)
        assert tangent == pytest.approx(adjoint, rel=1e-9, abs=1e-11), "<J v, w> != <v, J^T w>"
        for mode in ("primal", "forward", "reverse"):
            live = live_into_tasks(k.source(mode=mode, backend=CPU))
            assert not live, f"{mode}: {sorted(live)} may be read unassigned in a task"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkernel:\n{source}\ntrips {trips}, A {A!r}, B {B!r}"
                             ) from None
