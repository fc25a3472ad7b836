"""Tracebacks of tapegrad's errors show the user's frames and at most two of tapegrad's
(tapegrad/tracebacks.py), none of the standard library's that tapegrad called (ast.py's
visitors); TAPEGRAD_TRACEBACK_FILTERING=off shows them all; other exceptions keep every
frame."""

from __future__ import annotations

import sysconfig
import traceback

import numpy as np
import pytest

import tapegrad as tg
from tests.capture.test_guards import sq
from tests.runtime.test_launch_ranges import double

CPU = tg.CPU()


@tg.kernel
def uses_print(B):
    i = tg.index()
    print(i)
    B[i] = 1.0


def uses_a_list(B):              # (made a kernel in the tests: refused when decorated)
    i = tg.index()
    xs = [1.0, 2.0]
    B[i] = xs[0]


def simulate(A, n):
    B = np.zeros(4)
    double(CPU)(B, A, ndrange=n)            # the user's launch
    return tg.sum(B)


def user_raises(A):
    return simulate(A, 4) / 0


def _frames(call):
    with pytest.raises(Exception) as info:
        call()
    frames = traceback.extract_tb(info.value.__traceback__)
    ours = [f for f in frames if "/tapegrad/" in f.filename or f.filename.startswith("<tapegrad")]
    return info.value, frames, ours


def _stdlibs(frames):
    stdlib = sysconfig.get_paths()["stdlib"]
    return [f for f in frames if f.filename.startswith(stdlib) and "-packages" not in f.filename]


@pytest.mark.parametrize("call", [
    lambda: simulate(np.ones(4), 8),                                  # a launch out of range
    lambda: tg.gradient(lambda A: simulate(A, 8), np.ones(4)),
    lambda: tg.autodiff(tg.Reverse, double(CPU), tg.Const, tg.Duplicated(np.zeros(4), 1.0),
                        np.ones(4), ndrange=4),                        # a shadow that is no array
    lambda: uses_print(CPU)(np.zeros(4), ndrange=4),                  # a kernel error
    lambda: tg.capture(lambda A: simulate(A, 8))(np.ones(4)),
    lambda: tg.checkpoint_loop(lambda u: simulate(u, 8), np.ones(4), 3),
    lambda: tg.gradient(tg.checkpoint(lambda A: simulate(A, 8)), np.ones(4)),
    lambda: tg.sum(3),
    lambda: tg.kernel(uses_a_list),                                   # refused when decorated
    lambda: double(np.zeros(4), np.ones(4)),                          # no backend
    lambda: tg.testing.check_grad(lambda A: tg.sum(A), np.arange(4)),  # an int array
], ids=["launch", "gradient", "autodiff", "kernel-error", "capture", "checkpoint-loop",
        "checkpoint", "host-reduction", "decorated", "no-backend", "check-grad"])
def test_a_tapegrad_error_shows_the_users_frames(call, request):
    error, frames, ours = _frames(call)
    assert isinstance(error, tg.TapegradError) and len(ours) <= 2, ours
    assert any(f.filename == __file__ for f in frames)
    assert not _stdlibs(frames), _stdlibs(frames)     # (ast.py's visitors: tapegrad called them)
    if isinstance(error, tg.KernelError):    # (Python shows the kernel's line itself)
        shown = "".join(traceback.format_exception(error))
        line = {"kernel-error": "print(i)", "decorated": "xs = [1.0, 2.0]"}[
            request.node.callspec.id]                # (the kernel's own line, per case)
        assert line in shown and "uses_" not in str(ours)


@pytest.mark.parametrize("call", [
    lambda: tg.kernel(uses_a_list),
    lambda: uses_print(CPU)(np.zeros(4), ndrange=4),
    lambda: double(np.zeros(4), np.ones(4)),
    lambda: tg.testing.check_grad(lambda A: tg.sum(A), np.arange(4)),
], ids=["decorated", "kernel-error", "no-backend", "check-grad"])
def test_an_error_at_the_users_call_shows_that_line_alone(call):
    """(nothing of tapegrad's or the standard library's between the user's call and the
    error; a kernel error's own line, like a SyntaxError's, is no frame)"""
    error, frames, _ = _frames(call)
    assert isinstance(error, tg.TapegradError)
    assert [f.filename for f in frames] == [__file__, __file__], frames
    if isinstance(error, tg.KernelSyntaxError):
        assert error.text.strip() in "".join(traceback.format_exception(error))


def test_the_no_backend_error_names_the_kernel_and_its_parameters():
    error, _, _ = _frames(lambda: uses_print(np.zeros(4)))
    assert "uses_print(tg.get_backend(B))" in str(error)
    assert "uses_print(backend)(B, ndrange=n); got ndarray" in str(error)
    error, _, _ = _frames(lambda: double(CPU, 64, np.zeros(4), np.ones(4), ndrange=4))
    assert "double(backend)(B, A, ndrange=n); got the arguments with the backend" in str(error)


def test_the_launch_line_is_the_last_frame_of_a_launch_error():
    error, frames, _ = _frames(lambda: tg.gradient(lambda A: simulate(A, 8), np.ones(4)))
    assert isinstance(error, tg.KernelIndexError)
    assert frames[-1].name == "simulate"
    assert frames[-1].line.startswith("double(CPU)(B, A, ndrange=n)")


def test_filtering_off_keeps_every_frame(monkeypatch):
    monkeypatch.setenv("TAPEGRAD_TRACEBACK_FILTERING", "off")
    _, _, ours = _frames(lambda: tg.gradient(lambda A: simulate(A, 8), np.ones(4)))
    assert len(ours) > 2


def test_other_exceptions_keep_every_frame():
    error, _, ours = _frames(lambda: tg.gradient(user_raises, np.ones(4)))
    assert isinstance(error, ZeroDivisionError) and len(ours) >= 1


def energy(x):
    y = np.empty_like(x)
    sq(CPU)(y, x, ndrange=x.size)             # y = x * x: its adjoint reads x
    return tg.sum(y)


def _torch_changed_in_place():
    import tapegrad.torch
    torch = pytest.importorskip("torch", reason="PyTorch comes with the [test] extra")
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    loss = tapegrad.torch.function(energy)(x)
    with torch.no_grad():
        x.mul_(2.0)                          # the backward reads x: refused there
    loss.backward()


def _torch_launch():
    import tapegrad.torch
    torch = pytest.importorskip("torch", reason="PyTorch comes with the [test] extra")
    tapegrad.torch.function(lambda A: simulate(A, 8))(torch.ones(4, dtype=torch.float64))


def _jax_launch(grad):
    import tapegrad.jax
    jax = pytest.importorskip("jax", reason="JAX comes with the [test] extra")
    f = tapegrad.jax.function(lambda A: simulate(A, 8))
    (jax.grad(f) if grad else f)(jax.numpy.ones(4, dtype=jax.numpy.float32))


@pytest.mark.parametrize("call", [_torch_launch, _torch_changed_in_place,
                                  lambda: _jax_launch(False), lambda: _jax_launch(True)],
                         ids=["torch-forward", "torch-backward", "jax", "jax-grad"])
def test_wrapped_for_torch_and_jax_the_users_frames_too(call):
    error, frames, ours = _frames(call)
    assert isinstance(error, tg.TapegradError) and len(ours) <= 2, ours
    assert any(f.filename == __file__ for f in frames)


@pytest.mark.parametrize("call", [
    lambda: tg.zeros("cpu", np.float64, 3), lambda: tg.get_backend([1.0]),
    lambda: tg.make_zero([1.0]), lambda: tg.asarray(None, [1.0])])
def test_array_helpers_refuse_at_the_users_line(call):
    """tg.zeros/asarray without a backend (a bare AttributeError), tg.get_backend and
    tg.make_zero of a list: tapegrad errors whose traceback ends in the caller's code."""
    with pytest.raises(tg.TapegradError) as info:
        call()
    assert [f.filename for f in traceback.extract_tb(info.tb)] == [__file__, __file__]


def test_tape_watch_outside_its_block_refuses_at_the_users_line():
    with pytest.raises(tg.TapegradError) as info:
        tg.Tape().watch(0.5)
    assert [f.filename for f in traceback.extract_tb(info.tb)] == [__file__]
