"""Hypothesis generates whole kernels (expression trees, branches, loops with loop-carried
state) and every adjoint is checked against finite differences, in both forms (Enzyme's
accumulating one and ``accumulate=False``)."""

from __future__ import annotations

import importlib.util
import itertools
import sys

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tapegrad as tg
from tests.ad.gradcheck import kernel_vjp_error

# functions that are smooth on the whole real line, written as templates of one argument
SMOOTH_UNARY = ["math.sin({})", "math.cos({})", "math.tanh({})", "math.atan({})",
                "math.exp(math.sin({}))", "math.sqrt(1.0 + {} * {})", "math.log(1.0 + {} * {})",
                "({} / (1.0 + {} * {}))", "math.erf({})", "(-{})"]
BINARY_OPS = ["({} + {})", "({} - {})", "({} * {})", "max({}, {})", "min({}, {})",
              "math.hypot(1.0 + {}, {})"]


def expressions(leaves: list[str], depth: int) -> st.SearchStrategy[str]:
    leaf = st.sampled_from(leaves + ["0.5", "1.5", "-0.75"])
    if depth == 0:
        return leaf
    sub = expressions(leaves, depth - 1)
    unary = st.tuples(st.sampled_from(SMOOTH_UNARY), sub).map(
        lambda t: t[0].format(*([t[1]] * t[0].count("{}"))))
    binary = st.tuples(st.sampled_from(BINARY_OPS), sub, sub).map(lambda t: t[0].format(t[1], t[2]))
    return st.one_of(leaf, unary, binary)


@st.composite
def kernels(draw) -> tuple[str, int]:
    """Source of a random kernel ``k(C, A, B, n)``, and how many loop trips it wants."""
    leaves = ["x", "y"]
    lines = ["i = tg.index()", "x = A[i]", "y = B[i]", "s = 0.25"]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["assign", "branch", "loop", "while"]))
        e = draw(expressions(leaves + ["s"], 2))
        if kind == "assign":
            lines.append(f"s = {e}")
        elif kind == "branch":
            e2 = draw(expressions(leaves + ["s"], 2))
            lines += [f"if {draw(expressions(leaves, 1))} > 0.4:", f"    s = {e}", "else:",
                      f"    s = s * {e2}"]
        elif kind == "loop":
            lines += ["for k in range(n):", f"    s = math.tanh(s * 0.5 + {e}) + 0.1 * k"]
        else:
            lines += ["j = 0", "while j < n:", f"    s = 0.5 * s + math.sin({e})",
                      "    j += 1", "    if s > 1.2:", "        break"]
    lines.append(f"C[i] = s * {draw(expressions(leaves, 1))}")
    source = "def k(C, A, B, n):\n" + "\n".join("    " + ln for ln in lines) + "\n"
    return source, draw(st.integers(0, 4))


_counter = itertools.count()


def load_kernel(source: str, tmp_dir) -> tg.Kernel:
    path = tmp_dir / f"random_kernel_{next(_counter)}.py"
    path.write_text("import math\nimport tapegrad as tg\n\n\n@tg.kernel\n" + source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module.k


@settings(max_examples=7, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(kernels(), st.integers(0, 2 ** 32 - 1))
def test_random_kernel_adjoints_match_finite_differences(tmp_path, kernel, seed):
    source, trips = kernel
    k = load_kernel(source, tmp_path)
    rng = np.random.default_rng(seed)
    A, B = rng.uniform(-1, 1, 5), rng.uniform(-1, 1, 5)
    try:
        kernel_vjp_error(k(tg.CPU(), 4), [np.zeros(5), A, B, trips], 5, wrt=[1, 2], outputs=[0],
                         functional=True)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkernel:\n{source}") from None
