"""A source of ``tg.gradient`` (``tg.vjp``, ``tg.jacobian``, ``tg.hvp``, ``tg.autodiff`` of a
function) that ``f`` changes in place with NumPy before a recorded operation reads it, or after
the last one read it where a derivative reads its contents, is refused, naming the argument:
the gradient would be with respect to the changed contents (12x came back as 6x; a constant
function got a nonzero gradient).  The fix the message names, recorded operations on a new
array, gives the closed form."""

from __future__ import annotations

import math

import numpy as np
import pyopencl.array as cla
import pytest

import tapegrad as tg
from tests.tape.test_tape import fd_gradient


@tg.kernel
def sq(B, A, k):
    i = tg.index()
    B[i] = k * A[i] * A[i]


@tg.kernel
def sin_k(B, A):
    i = tg.index()
    B[i] = math.sin(A[i])


@tg.kernel
def lin(B, A):
    i = tg.index()
    B[i] = 3.0 * A[i]


X = np.linspace(0.1, 0.8, 8)


def squares(backend, A):
    B = np.empty_like(A)
    sq(backend)(B, A, 1.5, ndrange=A.size)
    return B


def doubled_in_place(backend):
    def loss(A):
        A *= 2.0                                 # invisible to the tape
        return tg.sum(squares(backend, A))       # 6 sum(x^2) of the x given
    return loss


def normalised_in_place(backend):
    def loss(A):
        A /= np.linalg.norm(A)                   # a constant function of the x given
        return tg.sum(squares(backend, A))
    return loss


@pytest.mark.parametrize("make", [doubled_in_place, normalised_in_place])
def test_gradient_refuses_a_source_changed_in_place_before_its_first_use(backend, make):
    x = X.copy()
    with pytest.raises(tg.TapegradError, match=r"tg.gradient: argument 0, an array of shape "
                       r"\(8,\), was changed in place .* before a recorded operation read "
                       r"it.*tg.scale") as info:
        tg.gradient(make(backend), x)
    assert "was given" in str(info.value)


def test_the_fix_the_message_names_gives_the_closed_form(backend):
    def doubled(A):
        return tg.sum(squares(backend, tg.scale(A, 2.0)))

    def normalised(A):
        return tg.sum(squares(backend, tg.scale(A, 1.0 / tg.norm(A))))

    (g,) = tg.gradient(doubled, X.copy())
    np.testing.assert_allclose(g, 12.0 * X, rtol=1e-12)
    (g,) = tg.gradient(normalised, X.copy())                # 1.5 for every x
    np.testing.assert_allclose(g, 0.0, atol=1e-12)
    np.testing.assert_allclose(g, fd_gradient(lambda v: float(normalised(v)), X), atol=1e-7)


def test_every_host_reverse_entry_point_refuses_it(backend):
    loss = doubled_in_place(backend)

    def values(A):
        A *= 2.0
        return squares(backend, A)

    dx = np.zeros(8)
    calls = {
        "tg.vjp: x": lambda: tg.vjp(values, X.copy(), np.ones(8)),
        "tg.vjp: argument 1": lambda: tg.vjp(lambda a, b: values(b), (X.copy(), X.copy()),
                                             np.ones(8)),
        "tg.jacobian: x": lambda: tg.jacobian(values, X.copy()),
        "tg.hvp: x": lambda: tg.hvp(loss, X.copy(), np.ones(8)),
        "tg.autodiff: argument 0": lambda: tg.autodiff(tg.Reverse, loss, tg.Active,
                                                       tg.Duplicated(X.copy(), dx)),
    }
    for who, call in calls.items():
        with pytest.raises(tg.TapegradError, match=f"{who}, an array .* changed in place"):
            call()
    assert not dx.any()                       # the refused autodiff wrote no shadow


def test_a_change_after_the_last_read_is_refused_where_a_derivative_reads_it(backend):
    def sines_then_changed(A):
        B = np.empty_like(A)
        sin_k(backend)(B, A, ndrange=A.size)     # its adjoint reads A
        loss = tg.sum(B)
        A *= 2.0
        return loss

    with pytest.raises(tg.TapegradError, match=r"sin_k read, and whose contents its "
                       r"derivative reads, was changed .* after that read"):
        tg.gradient(sines_then_changed, X.copy())

    def linear_then_changed(A):                  # an adjoint that reads nothing of A
        B = np.empty_like(A)
        lin(backend)(B, A, ndrange=A.size)
        loss = tg.sum(B)
        A *= 2.0
        return loss

    (g,) = tg.gradient(linear_then_changed, X.copy())
    np.testing.assert_allclose(g, 3.0, rtol=1e-12)


def test_a_source_a_kernel_updates_in_place_is_differentiated(backend):
    def updated(A):
        B = np.empty_like(A)
        sq(backend)(B, A, 1.0, ndrange=A.size)
        sq(backend)(A, B, 0.5, ndrange=A.size)   # A <- 0.5 x^4, recorded
        return tg.sum(squares(backend, A))       # 1.5 * 0.25 x^8

    (g,) = tg.gradient(updated, X.copy())
    np.testing.assert_allclose(g, 3.0 * X ** 7, rtol=1e-12)


def test_one_element_changed_in_the_middle_is_caught_under_verify(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_VERIFY", "1")

    def loss(A):
        A[3] = 0.0                               # neither the first nor the last element
        return tg.sum(squares(tg.CPU(), A))

    with pytest.raises(tg.TapegradError, match="argument 0, .* changed in place"):
        tg.gradient(loss, X.copy())


def test_forward_mode_checks_every_element_and_device_arrays_under_verify(monkeypatch):
    """(tg.jvp sampled a NumPy array's first and last elements only, and no device array:
    a tangent of 3.658 for 4.082 under TAPEGRAD_VERIFY=1.)"""
    monkeypatch.setenv("TAPEGRAD_VERIFY", "1")
    cl = tg.OpenCL()

    def on_cpu(A):
        B = squares(tg.CPU(), A)
        B[3] *= 3.0                              # neither the first nor the last element
        return tg.sum(squares(tg.CPU(), B))

    def on_opencl(A):
        B = cla.empty_like(A)
        sq(cl)(B, A, 1.5, ndrange=A.size)
        B *= 3.0
        C = cla.empty_like(A)
        sq(cl)(C, B, 1.5, ndrange=A.size)
        return tg.sum(C)

    for f, x in [(on_cpu, X.copy()), (on_opencl, cla.to_device(cl.queue, X))]:
        v = np.ones(8) if isinstance(x, np.ndarray) else cla.to_device(cl.queue, np.ones(8))
        with pytest.raises(tg.TapegradError, match="changed"):
            tg.jvp(f, x, v)


def test_an_opencl_source_scaled_in_place_is_caught_under_verify(monkeypatch):
    cl = tg.OpenCL()
    monkeypatch.setenv("TAPEGRAD_VERIFY", "1")

    def loss(A):
        A *= 2.0
        B = cla.empty_like(A)
        sq(cl)(B, A, 1.5, ndrange=A.size)
        return tg.sum(B)

    with pytest.raises(tg.TapegradError, match="argument 0, .* changed in place"):
        tg.gradient(loss, cla.to_device(cl.queue, X))

    def fixed(A):
        B = cla.empty_like(A)
        sq(cl)(B, tg.scale(A, 2.0), 1.5, ndrange=A.size)
        return tg.sum(B)

    (g,) = tg.gradient(fixed, cla.to_device(cl.queue, X))
    np.testing.assert_allclose(g.get(), 12.0 * X, rtol=1e-12)
