"""One sum with common factors taken out (tapegrad/ad/factor.py): same values, fewer
operations, and code it must leave alone."""

import ast
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tapegrad.ad.factor import factored_sum


def _run(stmts: list[ast.stmt], values: dict) -> float:
    env = dict(values, math=math, _acc=0.0)
    exec(compile(ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[])),
                 "<test>", "exec"), env)
    return env["_acc"]


HEAT_INTERIOR = """
i = gi + 1
j = gj
_a2 = W[i, j]
_d3 = _a2 * alpha
_acc = _acc + _d3
i = gi
j = gj + 1
_a2 = W[i, j]
_d3 = _a2 * alpha
_acc = _acc + _d3
i = gi
j = gj
_a2 = W[i, j]
_acc = _acc + _a2
_d3 = _a2 * alpha
_acc = _acc + -_d3 * 4.0
i = gi - 1
j = gj
_a2 = W[i, j]
_d3 = _a2 * alpha
_acc = _acc + _d3
"""


def test_heat_interior_takes_alpha_out_once():
    stmts = ast.parse(HEAT_INTERIOR).body
    out = factored_sum(stmts, "_acc")
    assert out is not None and len(out) == 1
    text = ast.unparse(out[0])
    assert text.count("alpha") == 1, text
    rng = np.random.default_rng(0)
    values = dict(W=rng.standard_normal((5, 5)), alpha=0.3, gi=2, gj=2)
    assert math.isclose(_run(out, values), _run(stmts, values), rel_tol=1e-14)
    # four multiplies by alpha and one by 4 before; one by alpha and one by 4 after
    muls = sum(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in ast.walk(out[0]))
    assert muls == 2, text


def test_left_alone_when_not_straight_line_or_nothing_to_gain():
    branchy = ast.parse("_acc = _acc + x * a\nif c:\n    _acc = _acc + y * a\n").body
    assert factored_sum(branchy, "_acc") is None
    one = ast.parse("t = x * a\n_acc = _acc + t\n").body
    assert factored_sum(one, "_acc") is None            # a single update: nothing to gain
    stores = ast.parse("_acc = _acc + x * a\nY[0] = _acc\n_acc = _acc + y * a\n").body
    assert factored_sum(stores, "_acc") is None


def test_a_call_is_computed_once():
    shared = ast.parse("e = math.exp(x)\n_acc = _acc + e * a\n_acc = _acc + e * b\n").body
    out = factored_sum(shared, "_acc")
    assert ast.unparse(out[0]) == "_acc = math.exp(x) * (a + b)"
    values = dict(x=0.3, a=2.0, b=-0.7)
    assert math.isclose(_run(out, values), _run(shared, values), rel_tol=1e-15)
    # e is needed twice in one term: substituted, it would be computed twice
    twice = ast.parse("e = math.exp(x)\n_acc = _acc + e * a\n_acc = _acc + e * e\n").body
    assert factored_sum(twice, "_acc") is None


names = st.sampled_from(["a", "b", "c", "X[0]", "X[1]", "X[2]"])
coefs = st.sampled_from([1.0, -1.0, 2.0, -4.0, 0.5])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(coefs, st.lists(names, min_size=1, max_size=3)), min_size=2,
                max_size=7),
       st.lists(st.floats(-3, 3, allow_nan=False), min_size=6, max_size=6))
def test_random_sums_keep_their_value(terms, xs):
    lines = []
    for k, (c, factors) in enumerate(terms):
        lines.append(f"t{k} = {' * '.join(factors)}")
        if c < 0:        # both ways generated code subtracts
            lines.append(f"_acc = _acc - t{k} * {-c}" if k % 2 else
                         f"_acc = _acc + -t{k} * {-c}")
        else:
            lines.append(f"_acc = _acc + t{k} * {c}")
    stmts = ast.parse("\n".join(lines)).body
    values = dict(a=xs[0], b=xs[1], c=xs[2], X=np.array(xs[3:]))
    out = factored_sum(stmts, "_acc")
    assert out is not None
    want = _run(stmts, values)
    scale = sum(abs(c) * math.prod(abs(_run(ast.parse(f"_acc = {f}").body, values))
                                   for f in factors) for c, factors in terms)
    assert abs(_run(out, values) - want) <= 1e-12 * (1 + scale)
    before = sum(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
                 for n in ast.walk(ast.Module(body=stmts, type_ignores=[])))
    after = sum(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) for n in ast.walk(out[0]))
    assert after <= before
