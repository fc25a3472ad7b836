"""The bench's overhead per launch: a tiny kernel called directly, launched, recorded on a
tape, its adjoint replayed, differentiated with ``tg.autodiff``, and captured."""

from __future__ import annotations

from typing import Any

import numpy as np

import tapegrad as tg
from tapegrad.bench.problems import sin_k as sin_kernel
from tapegrad.bench.timing import _median_ms


def _launch_overheads(quick: bool, backend: Any = None) -> dict:
    """Microseconds per launch of a 64-element kernel, where the work is nothing and the cost
    is all overhead: the compiled kernel called directly, a plain launch, a launch recorded
    on a tape, an adjoint replayed by the tape's sweep, and ``tg.autodiff`` of one launch
    (the costs a simulation of many small steps pays per step), on the CPU or ``backend``."""
    from tapegrad.bench.problems import saxpy_k
    from tapegrad.runtime.launch import prepare
    from tapegrad.tape import chains
    backend = backend or tg.CPU()
    n, steps = 64, 100
    cfg = saxpy_k(backend)
    x = backend.asarray(np.linspace(0.0, 1.0, n, dtype=np.float32))
    w, y = backend.ones(np.float32, (n,)), backend.asarray(np.full(n, 0.5, np.float32))
    z, dx = backend.allocate(np.float32, (n,)), backend.allocate(np.float32, (n,))
    launcher, nd, key = prepare(cfg, (z, 0.5, x, y), n)
    _, bounds = cfg.kernel.cache[key]          # its launch check (tapegrad/runtime/bounds.py)

    def states(x: Any) -> Any:
        for _ in range(steps):
            out = backend.allocate(np.float32, (n,))
            cfg(out, 0.5, x, y, ndrange=n)
            x = out
        return x

    def chain(x: Any) -> Any:
        return tg.sum(states(x))

    def recorded(f: Any) -> Any:
        tape = tg.Tape(watch_changes=False)
        with tape:
            loss = f(x)
        return tape, loss

    def autodiff() -> Any:
        return tg.autodiff(tg.Reverse, cfg, tg.Const, tg.DuplicatedNoNeed(z, w), 0.5,
                           tg.Duplicated(x, dx), y, ndrange=n, accumulate=False)

    def autodiff_forward() -> Any:
        return tg.autodiff(tg.Forward, cfg, tg.Const, tg.Duplicated(z, w), 0.5,
                           tg.Duplicated(x, dx), y, ndrange=n)

    def replay_one_by_one() -> Any:
        chains.enabled = False
        try:
            return tape.gradient(loss, x)
        finally:
            chains.enabled = True

    def sines(x: Any) -> Any:     # (nonlinear steps: each adjoint reads its step's state)
        for _ in range(steps):
            out = backend.allocate(np.float32, (n,))
            sin_kernel(backend)(out, x, ndrange=n)
            x = out
        return tg.sum(x)

    captured, captured_sines = tg.capture(chain), tg.capture(sines)
    repeats = 5 if quick else 20
    tape, loss = recorded(chain)
    tape.gradient(loss, x)
    sine_tape, sine_loss = recorded(sines)
    sine_tape.gradient(sine_loss, x)
    autodiff()
    autodiff_forward()
    for _ in range(3):      # records, then compiles its replay (and its reverse)
        captured(x)
        tg.gradient(captured, x)
        tg.gradient(captured_sines, x)
        tg.gradient(sines, x)
    us = {
        "kernel_call": _median_ms(lambda: [launcher((z, 0.5, x, y), nd) for _ in range(steps)],
                                  repeats) * 1e3 / steps,
        "launch": _median_ms(lambda: [cfg(z, 0.5, x, y, ndrange=n) for _ in range(steps)],
                             repeats) * 1e3 / steps,
        "launch_check": _median_ms(lambda: [bounds.failing((z, 0.5, x, y), nd)
                                            for _ in range(steps)], repeats) * 1e3 / steps,
        "recorded_launch": _median_ms(lambda: recorded(chain), repeats) * 1e3 / steps,
        "allocation": _median_ms(lambda: [backend.allocate(np.float32, (n,))
                                          for _ in range(steps)], repeats) * 1e3 / steps,
        "replayed_adjoint": _median_ms(lambda: tape.gradient(loss, x), repeats) * 1e3 / steps,
        "replayed_one_by_one": _median_ms(replay_one_by_one, repeats) * 1e3 / steps,
        "recorded_nonlinear_launch": _median_ms(lambda: recorded(sines), repeats) * 1e3 / steps,
        "replayed_nonlinear_adjoint": _median_ms(lambda: sine_tape.gradient(sine_loss, x),
                                                 repeats) * 1e3 / steps,
        "autodiff": _median_ms(lambda: [autodiff() for _ in range(steps)], repeats) * 1e3 / steps,
        "autodiff_forward": _median_ms(lambda: [autodiff_forward() for _ in range(steps)],
                                       repeats) * 1e3 / steps,
        "captured_replay": _median_ms(lambda: captured(x), repeats) * 1e3 / steps,
        "captured_gradient": _median_ms(lambda: tg.gradient(captured, x), repeats) * 1e3 / steps,
        "nonlinear_gradient": _median_ms(lambda: tg.gradient(sines, x), repeats) * 1e3 / steps,
        "captured_nonlinear_gradient": _median_ms(lambda: tg.gradient(captured_sines, x),
                                                  repeats) * 1e3 / steps,
    }
    us.update(_captured_kernels_alone(captured, x, repeats, steps))
    print(f"\nper launch of a {n}-element kernel (all overhead): compiled kernel called "
          f"{us['kernel_call']:.1f} us, launch {us['launch']:.1f} us (of which its index "
          f"range check {us['launch_check']:.2f} us), recorded on a tape "
          f"{us['recorded_launch']:.1f} us (with the step's new array, whose allocation alone "
          f"takes {us['allocation']:.1f} us), adjoint replayed {us['replayed_adjoint']:.1f} us "
          f"({us['replayed_one_by_one']:.1f} us record by record, where the launches are not "
          "one chain: tapegrad/tape/chains.py), "
          f"tg.autodiff {us['autodiff']:.1f} us (forward mode {us['autodiff_forward']:.1f} us); "
          f"a sin step (its adjoint reads its state) recorded "
          f"{us['recorded_nonlinear_launch']:.1f} us, its adjoint replayed "
          f"{us['replayed_nonlinear_adjoint']:.1f} us")
    split = (f", of which the compiled kernels themselves {us['compiled_kernels']:.2f} us: "
             f"{us['captured_overhead']:.2f} us of replay overhead per launch"
             if "compiled_kernels" in us else "")
    how = ("the reverse compiled too" if isinstance(x, np.ndarray)
           else "the reverse's launches packed in advance") + ": tapegrad/capturing/reverse.py"
    print(f"captured (tg.capture) chain of {steps}: replayed {us['captured_replay']:.2f} us per "
          f"launch{split}; its gradient {us['captured_gradient']:.2f} us per launch ({how}); "
          "a chain of sin steps (each "
          f"adjoint reads its state): gradient {us['nonlinear_gradient']:.2f} us per launch "
          f"recorded, {us['captured_nonlinear_gradient']:.2f} us captured")
    return us


def _captured_kernels_alone(captured: Any, x: Any, repeats: int, steps: int) -> dict:
    """A captured replay's compiled launches called without the replay around them (what the
    kernels cost from compiled code), and the replay's overhead per launch beyond that."""
    from tapegrad.backends.cpu.driver import Stretch
    (program,) = next(iter(captured.programs.values()))
    stretches = [what for compiled, what in program.compiled or () if compiled]
    if not stretches or not isinstance(stretches[0], Stretch):
        return {}
    frame = program.frame((x,), fresh_kept=False)
    alone = _median_ms(lambda: [s(frame) for s in stretches], repeats) * 1e3 / steps
    replay = _median_ms(lambda: captured(x), repeats) * 1e3 / steps
    return {"compiled_kernels": alone, "captured_overhead": replay - alone}
