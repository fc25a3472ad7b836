"""Host code that changes an array the derivatives depend on where no later recorded
operation looks: after its last recorded read (a derivative reads the new contents), a result
after the launch that wrote it (the derivative is of the unchanged one), and in forward mode
between two launches.  Each was a silently wrong derivative; each is refused now, and the
same programs written with recorded operations give the closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
X0 = np.linspace(0.2, 1.0, 5)


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = tg.sin(A[i])


def sin_of(x):
    b = np.empty_like(x)
    sin_k(CPU)(b, x, ndrange=x.size)
    return b


def scratch_cleared(x):                 # sum(sin(sin x)); the second adjoint reads b
    b = sin_of(x)
    s = tg.sum(sin_of(b))
    b[:] = 0.0                          # after its last recorded use
    return s


def _taped(fn, verify):
    x = X0.copy()
    with tg.Tape(verify=verify) as tape:
        s = fn(x)
    return tape.gradient(s, [x])


@pytest.mark.parametrize("call", [
    lambda: tg.gradient(scratch_cleared, X0.copy()),
    lambda: tg.vjp(scratch_cleared, X0.copy(), 1.0),
    lambda: tg.hvp(scratch_cleared, X0.copy(), np.ones(5)),
    lambda: _taped(scratch_cleared, False), lambda: _taped(scratch_cleared, True)],
    ids=["gradient", "vjp", "hvp", "tape", "verify"])
def test_an_array_a_derivative_reads_changed_after_its_last_use_is_refused(call):
    with pytest.raises(tg.TapegradError, match="sin_k read, and whose contents its "
                                               "derivative reads, was changed"):
        call()


def test_the_same_program_without_the_change_matches_the_closed_form():
    (g,) = tg.gradient(lambda x: tg.sum(sin_of(sin_of(x))), X0.copy())
    np.testing.assert_allclose(g, np.cos(np.sin(X0)) * np.cos(X0), rtol=1e-14)


def doubled_after(x):
    b = sin_of(x)
    b *= 2.0                            # after the launch that wrote the result
    return b


def doubled_recorded(x):
    return tg.scale(sin_of(x), 2.0)


@tg.kernel
def cubes_into(out, A):
    i = tg.index()
    tg.atomic_add(out, 0, A[i] * A[i] * A[i])


def total_doubled_after(x):             # a one-element result: 2 sum(x^3)
    out = np.zeros(1)
    cubes_into(CPU)(out, x, ndrange=x.size)
    out *= 2.0
    return out


def total_doubled_recorded(x):
    out = np.zeros(1)
    cubes_into(CPU)(out, x, ndrange=x.size)
    return tg.scale(out, 2.0)


JAC = np.diag(2.0 * np.cos(X0))         # of 2 sin(x)
CASES = [
    ("vjp", lambda f: tg.vjp(f, X0.copy(), np.ones(5))[1], np.ones(5) @ JAC),
    ("jacobian", lambda f: tg.jacobian(f, X0.copy()), JAC),
    ("jacobian forward", lambda f: tg.jacobian(f, X0.copy(), mode=tg.Forward), JAC),
    ("jvp", lambda f: tg.jvp(f, X0.copy(), np.ones(5))[1], JAC @ np.ones(5))]


@pytest.mark.parametrize("name, call, want", CASES, ids=[c[0] for c in CASES])
def test_a_result_changed_after_the_launch_that_wrote_it_is_refused(name, call, want):
    with pytest.raises(tg.TapegradError, match="you differentiate was changed by code"):
        call(doubled_after)
    np.testing.assert_allclose(call(doubled_recorded), want, rtol=1e-14)


@pytest.mark.parametrize("call, want", [
    (lambda f: tg.gradient(f, X0.copy())[0], 6.0 * X0 ** 2),          # of 2 sum(x^3)
    (lambda f: tg.hvp(f, X0.copy(), np.ones(5)), 12.0 * X0)], ids=["gradient", "hvp"])
def test_a_one_element_result_changed_after_its_launch_is_refused(call, want):
    with pytest.raises(tg.TapegradError, match="you differentiate was changed by code"):
        call(total_doubled_after)
    np.testing.assert_allclose(call(total_doubled_recorded), want, rtol=1e-13)


@pytest.mark.parametrize("f", [
    lambda b: np.sum(b) * tg.sum(b), lambda b: b[0] + tg.sum(b) * tg.sum(b),
    lambda b: np.multiply(np.sum(b), tg.sum(b)), lambda b: np.hypot(tg.sum(b), b[1])],
    ids=["left operand", "b[0] +", "ufunc", "ufunc second"])
def test_hvp_refuses_a_numpy_number_on_either_side(f):
    with pytest.raises(tg.TapegradError, match="NumPy number"):
        tg.hvp(lambda x: f(sin_of(x)), X0.copy(), np.ones(5))


def scaled_between(x):
    b = sin_of(x)
    b *= 3.0                            # between two launches
    return tg.sum(sin_of(b))


def scaled_before_sum(x):
    b = sin_of(x)
    b *= 3.0
    return tg.sum(b)


@pytest.mark.parametrize("f, reader", [(scaled_between, "kernel sin_k"),
                                       (scaled_before_sum, "tg.sum")])
def test_forward_mode_refuses_an_array_changed_between_its_uses(f, reader):
    for call in (lambda: tg.jvp(f, X0.copy(), np.ones(5)),
                 lambda: tg.jacobian(f, X0.copy(), mode=tg.Forward)):
        with pytest.raises(tg.TapegradError, match=f"before {reader} read it"):
            call()
    (g,) = tg.gradient(lambda x: tg.sum(sin_of(tg.scale(sin_of(x), 3.0))), X0.copy())
    _, t = tg.jvp(lambda x: tg.sum(sin_of(tg.scale(sin_of(x), 3.0))), X0.copy(), np.ones(5))
    assert t == pytest.approx(float(g.sum()), rel=1e-13)
    b = 3.0 * np.sin(X0)
    np.testing.assert_allclose(g, np.cos(b) * 3.0 * np.cos(X0), rtol=1e-14)


@tg.kernel
def times(C, A, B):
    i = tg.index()
    C[i] = A[i] * B[i]


def test_a_change_the_asked_derivatives_do_not_read_is_fine():
    """d/dA of sum(A * B) reads B, not A; d/dA of sum(A * sum(B)) reads no A: A changed after
    its last use is then no reason to refuse (the adjoints read what their replays need)."""
    A, B = np.arange(1.0, 5.0), np.arange(2.0, 6.0)
    with tg.Tape() as tape:
        C = np.empty(4)
        times(CPU)(C, A, B, ndrange=4)
        s = tg.sum(C)
        A *= 0.0
    np.testing.assert_array_equal(tape.gradient(s, [A])[0], [2.0, 3.0, 4.0, 5.0])
    with pytest.raises(tg.TapegradError, match="times read, and whose contents"):
        tape.gradient(s, [B])                 # (d/dB reads A: refused)
    A = np.arange(1.0, 5.0)
    with tg.Tape() as tape:
        s = tg.sum(tg.scale(A, tg.sum(B)))
        A *= 0.0
    np.testing.assert_array_equal(tape.gradient(s, [A])[0], np.full(4, 14.0))


def test_numba_compiles_math_while_and_after_a_tape_records(tmp_path):
    """The math wrappers are known to Numba: a first tapegrad launch inside a tape (Numba
    reads its tables of math's functions then) leaves math usable by numba.njit afterwards,
    and a numba.njit function compiled while a tape records finds math.sqrt (both failed:
    'Unknown attribute sqrt of type Module(math)', for the rest of the process)."""
    import subprocess
    import sys
    script = tmp_path / "njit_math.py"
    script.write_text(
        "import math, numba, numpy as np, tapegrad as tg\n"
        "@tg.kernel\n"
        "def sk(B, A):\n"
        "    i = tg.index()\n"
        "    B[i] = math.sin(A[i])\n"
        "A, B = np.arange(1.0, 5.0), np.zeros(4)\n"
        "with tg.Tape() as tape:\n"
        "    sk(tg.CPU())(B, A, ndrange=4)\n"
        "    inside = numba.njit(lambda x: math.exp(x))(0.0)\n"
        "    s = tg.sum(B)\n"
        "print(inside, numba.njit(lambda x: math.sqrt(x))(4.0), tape.gradient(s, [A])[0][0],"
        " math.sqrt.__class__.__name__)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["1.0", "2.0", repr(math.cos(1.0)),
                                  "builtin_function_or_method"]
