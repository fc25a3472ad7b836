"""tg.debug_nans(): the first launch that writes a new NaN or infinity is named — kernel, mode
(primal, adjoint of which launch, tangent), the user's line, the element and the values
there — on every backend, and its arrays are put back; off, nothing is checked."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

import tapegrad as tg


@tg.kernel
def ratio(B, A):
    i = tg.index()
    B[i] = A[i] / A[i]                  # 0/0 where A is 0


@tg.kernel
def root(B, A):
    i = tg.index()
    B[i] = math.sqrt(A[i])              # fine at 0; its derivative there is inf


@tg.kernel
def keep_max(out, A):
    i = tg.index()
    out[i] = max(out[i], A[i])


def here() -> int:
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def raised(call, expected=tg.NonFiniteError) -> str:
    with tg.debug_nans(), pytest.raises(expected) as info:
        call()
    return str(info.value)


def test_a_primal_nan_names_the_launch_the_element_and_the_inputs(backend):
    A, B = np.array([1.0, 2.0, 0.0, 4.0]), np.full(4, 7.0)
    line = here() + 1
    message = raised(lambda: ratio(backend)(B, A, ndrange=4))
    assert f"test_nans.py:{line}: the launch of kernel ratio wrote nan into B[2]" in message
    assert "A[2] = 0.0" in message and "Every input was finite: the kernel made it" in message
    statement_line = ratio.pyfunc.__code__.co_firstlineno + 3
    assert f"run again in Python for that element: test_nans.py:{statement_line}: " \
           "B[i] = A[i] / A[i]" in message
    assert B.tolist() == [7.0] * 4                      # put back as it was
    ratio(backend)(B, A, ndrange=4)                     # off: nothing checked
    assert np.isnan(B[2]) and B[3] == 1.0


def _sqrt_loss(backend, A, w):
    B = np.empty_like(A)
    root(backend)(B, A, ndrange=A.size)
    return tg.dot(B, w)


LAUNCH_LINE = _sqrt_loss.__code__.co_firstlineno + 2


def test_an_adjoint_only_nan_names_the_adjoint_and_its_launch(backend):
    A, w = np.array([1.0, 4.0, 0.0, 9.0]), np.array([1.0, 1.0, 0.0, 1.0])  # a zero seed at 0
    with tg.debug_nans():
        with tg.Tape() as tape:
            value = _sqrt_loss(backend, A, w)           # the primal is finite: sqrt(0) = 0
        line = here() + 2
        with pytest.raises(tg.NonFiniteError) as info:
            tape.gradient(value, [A])
    message = str(info.value)
    assert message.startswith(f"test_nans.py:{line}: the adjoint of kernel root (of its "
                              f"launch at test_nans.py:{LAUNCH_LINE}) wrote nan into the "
                              "gradient of A[2]")
    assert "A[2] = 0.0" in message
    (g,) = tape.gradient(value, [A])                    # off: 0 * inf
    assert np.isnan(g[2]) and g[0] == 0.5


def test_tg_autodiff_of_a_launch_is_checked(backend):
    A, B = np.array([0.0, 1.0]), np.zeros(2)
    dA, dB = np.zeros(2), np.array([0.0, 1.0])
    line = here() + 1
    message = raised(lambda: tg.autodiff(tg.Reverse, root(backend), tg.Const,
                                         tg.Duplicated(B, dB), tg.Duplicated(A, dA), ndrange=2))
    assert f"test_nans.py:{line}: the adjoint of kernel root wrote nan into the gradient of A[0]" \
        in message
    assert dA.tolist() == [0.0, 0.0]


def _roots(backend, A):
    B = np.empty_like(A)
    root(backend)(B, A, ndrange=A.size)
    return B


def test_a_tangent_nan_names_forward_mode(backend):
    A, v = np.array([4.0, 0.0, 1.0]), np.array([1.0, 0.0, 1.0])
    message = raised(lambda: tg.jvp(lambda A: _roots(backend, A), A, v))
    line = _roots.__code__.co_firstlineno + 2
    assert message.startswith(f"test_nans.py:{line}: the forward-mode launch (values and "
                              "tangents) of kernel root wrote nan into the tangent of B[1]")
    assert "A[1] = 0.0" in message and "the tangent of A[1] = 0.0" in message


def test_a_captured_function_is_checked_launch_by_launch(backend):
    loss = tg.capture(lambda A, w: _sqrt_loss(backend, A, w))
    A, w = np.array([1.0, 0.0]), np.array([1.0, 0.0])
    for _ in range(2):
        loss(A, w)                                      # recorded, then replayed: no check
    message = raised(lambda: tg.gradient(lambda A: loss(A, w), A))
    assert f"of its launch at test_nans.py:{LAUNCH_LINE}" in message


def test_a_nan_that_came_in_is_said_so(backend):
    A, B = np.array([1.0, np.nan, 2.0]), np.zeros(3)
    message = raised(lambda: ratio(backend)(B, A, ndrange=3))
    assert "B[1]" in message and "A[1] = nan" in message and "it may have come in" in message


def test_values_already_infinite_and_unchanged_are_not_blamed(backend):
    out, A = np.full(4, -np.inf), np.array([-np.inf, 1.0, -np.inf, 2.0])
    with tg.debug_nans():
        keep_max(backend)(out, A, ndrange=4)
        keep_max(backend)(out, A, ndrange=4)
    assert out.tolist() == [-np.inf, 1.0, -np.inf, 2.0]


def test_old_nans_of_an_array_the_kernel_only_writes_hide_no_new_one(backend):
    """(np.empty may hand back memory that held NaNs: a launch writing NaN there is still
    the one that made it, and the elements it does not write keep what they held)"""
    A = np.array([1.0, 0.0, 2.0, 3.0])
    B = np.full(6, np.nan)
    B[4] = np.inf
    message = raised(lambda: ratio(backend)(B, A, ndrange=4))
    assert "wrote nan into B[1]" in message and "B[1] = nan" not in message
    assert np.isnan(B[:4]).all() and B[4] == np.inf          # put back
    A[1] = 5.0
    with tg.debug_nans():
        ratio(backend)(B, A, ndrange=4)                       # no new NaN: no error
    assert B[:4].tolist() == [1.0] * 4 and np.isnan(B[5]) and B[4] == np.inf


def test_on_pyopencl_arrays_the_check_runs_on_the_device():
    cla = pytest.importorskip("pyopencl.array", reason="PyOpenCL comes with the [test] extra")
    cl = tg.OpenCL()
    A = cla.to_device(cl.queue, np.array([1.0, 0.0, 3.0, 4.0, 0.0]))
    B = cla.to_device(cl.queue, np.full(5, 7.0))
    message = raised(lambda: ratio(cl)(B, A, ndrange=5))
    assert "wrote nan into B[1]" in message and B.get().tolist() == [7.0] * 5
    view = B[2:]                                        # a view inside its buffer
    message = raised(lambda: ratio(cl)(view, A[2:], ndrange=3))
    assert "wrote nan into B[2]" in message and B.get().tolist() == [7.0] * 5
    kind = tg.backends.registry.kind_of(A)
    assert kind.first_new_nonfinite(kind.snapshot(A), A) is None
    B = cla.to_device(cl.queue, np.array([np.nan, 7.0, np.inf, np.nan, 7.0]))
    message = raised(lambda: ratio(cl)(B[:4], A[:4], ndrange=4))   # old NaNs, B only written
    assert "wrote nan into B[1]" in message
    A = cla.to_device(cl.queue, np.array([1.0, 2.0, 3.0, 4.0]))
    with tg.debug_nans():
        ratio(cl)(B[1:3], A[:2], ndrange=2)                           # a view, no new NaN
    got = B.get()
    assert np.isnan(got[0]) and got[1:3].tolist() == [1.0, 1.0] and np.isnan(got[3])


def test_the_environment_variable_turns_it_on_for_the_process(tmp_path):
    script = tmp_path / "sim.py"
    script.write_text("import numpy as np, tapegrad as tg\n"
                      "from tests.runtime.test_nans import ratio\n"
                      "ratio(tg.CPU())(np.zeros(2), np.zeros(2), ndrange=2)\n")
    root_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TAPEGRAD_DEBUG_NANS="1", PYTHONPATH=root_dir)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode != 0 and "NonFiniteError: sim.py:3: the launch of kernel ratio" \
        in proc.stderr


@tg.func
def log_of_less_one(x):
    y = x - 1.0
    return math.log(y)                  # Python raises for y < 0; the device gives nan


@tg.kernel
def two_steps(B, A, k):
    i, j = tg.index(tg.Global, tg.NTuple)
    a = A[i, j] * k
    B[i, j] = a + log_of_less_one(A[i, j])


def test_the_statement_is_found_inside_a_device_function_on_a_2d_launch(backend):
    A, B = np.array([[2.0, 3.0], [0.5, 4.0]]), np.zeros((2, 2))
    message = raised(lambda: two_steps(backend, (1, 2))(B, A, 2.0, ndrange=(2, 2)))
    line = log_of_less_one.pyfunc.__code__.co_firstlineno + 3
    assert "wrote nan into B[1, 0]" in message and "A[1, 0] = 0.5" in message and "k = 2.0" \
        in message
    assert f"test_nans.py:{line}: return math.log(y)" in message


@tg.kernel
def total(out, A):
    i = tg.index()
    tg.atomic_add(out, 0, 1.0 / A[i])


def test_no_statement_where_the_array_is_not_the_launchs_shape(backend):
    """(which work-item wrote out[0] is not known: the message says no statement)"""
    A, out = np.array([1.0, 0.0, 2.0]), np.zeros(1)
    message = raised(lambda: total(backend)(out, A, ndrange=3))
    assert "wrote inf into out[0]" in message and "run again in Python" not in message
    assert out.tolist() == [0.0]


@tg.kernel
def add_into(M, A, seg):
    i = tg.index()
    tg.atomic_add(M, seg[i], A[i])


def test_an_atomics_target_is_not_taken_for_written_only(backend):
    """(atomics read what is there: its old infinity is an input, so -inf + inf is a NaN the
    launch made, and nothing of M is changed before the launch)"""
    M = np.array([-np.inf, 0.0])
    message = raised(lambda: add_into(backend)(M, np.array([np.inf, 1.0]), np.array([0, 1]),
                                                ndrange=2))
    assert "wrote nan into M[0]" in message and M.tolist() == [-np.inf, 0.0]


@tg.kernel
def count_and_divide(cnt, out, A):
    i = tg.index()
    cnt[i] += 1
    out[i] = 1.0 / A[i]


def test_integer_arrays_are_put_back_too(backend):
    cnt, out = np.zeros(2, np.int64), np.zeros(2)
    raised(lambda: count_and_divide(backend)(cnt, out, np.array([1.0, 0.0]), ndrange=2))
    assert cnt.tolist() == [0, 0] and out.tolist() == [0.0, 0.0]


@tg.kernel
def shifted(out, A):
    i = tg.index()
    n = A.shape[0]
    out[i] = A[(i + 1) % n] * 2.0


def test_a_nan_read_from_another_element_is_said_to_have_come_in(backend):
    A, out = np.array([1.0, 2.0, np.nan, 4.0]), np.zeros(4)
    message = raised(lambda: shifted(backend)(out, A, ndrange=4))
    assert "wrote nan into out[1]" in message and "A[1] = 2.0" in message
    assert "Not every input was finite: A[2] = nan" in message


@tg.func
def ratio_of(a, b):
    return a / b


@tg.kernel
def largest_ratio(out, A, B):
    i = tg.index()
    m = -math.inf                        # an infinity meant as such: not the statement
    for k in range(2):
        m = max(m, ratio_of(A[i] - k, B[i]))
    out[i] = m


def test_the_statement_skips_meant_infinities_and_names_the_device_functions_line(backend):
    A, B, out = np.array([1.0, 1.0]), np.array([2.0, 0.0]), np.zeros(2)
    A[1] = 0.0                           # 0/0 in ratio_of for work-item 1
    message = raised(lambda: largest_ratio(backend)(out, A, B, ndrange=2))
    line = ratio_of.pyfunc.__code__.co_firstlineno + 2
    assert "wrote -inf into out[1]" in message and f"test_nans.py:{line}: return a / b" in message


def test_old_nans_of_a_fresh_gradient_hide_no_new_one(backend):
    """(a gradient's new shadows may be memory that held NaNs: the adjoint that stores a NaN
    there is still named, as the adjoint of root, not of a later record)"""
    A, w = np.array([1.0, 4.0, 0.0, 9.0]), np.array([1.0, 1.0, 0.0, 1.0])
    for _ in range(2):
        tg.gradient(lambda A: _sqrt_loss(backend, A, w), A)     # NaNs left in freed memory
    message = raised(lambda: tg.gradient(lambda A: _sqrt_loss(backend, A, w), A))
    assert f"the adjoint of kernel root (of its launch at test_nans.py:{LAUNCH_LINE}) wrote " \
           "nan into the gradient of A[2]" in message


def test_a_launch_that_raises_leaves_its_arrays_as_they_were(monkeypatch):
    out = np.full(3, -np.inf)                # written only: its old values are marked first
    launcher_error = RuntimeError("stopped")

    def failing(*args):
        raise launcher_error

    from tapegrad.runtime import nans
    with tg.debug_nans(), pytest.raises(RuntimeError):
        nans.checked(failing, (out,), ("out",), "a launch", write_only=frozenset({0}))
    assert out.tolist() == [-np.inf] * 3
