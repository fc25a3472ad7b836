"""What ``kern.source(mode, backend)`` shows: the code the last launch of each mode ran."""

from __future__ import annotations

import ast
from typing import Any

from tapegrad.errors import LaunchError
from tapegrad.frontend import kernel_ir


def show(kernel: Any, mode: str, backend: Any, launcher: Any, ir: Any = None) -> None:
    """What ``kern.source(mode, backend)`` shows: the code of the last launch (``ir()``: the
    kernel-language IR it came from, for ``kern.source(mode)``), also for the kernel a merged
    variant was made from (``one_parameter_per_array``), which a launch through another
    variant may have changed.  The hot path is an identity test per launch."""
    origin = getattr(kernel, "merged_from", None)
    if kernel.shown.get(mode) is launcher and (origin is None
                                               or origin.shown.get(mode) is launcher):
        return
    entries = {("last", mode, backend): launcher}
    if ir is not None:
        entries[_IR_SHOWN[mode]] = ir()
    for k in (kernel, origin):
        if k is not None:
            k.cache.update(entries)
            k.shown[mode] = launcher     # (a launcher belongs to one backend)


_IR_SHOWN = {"reverse": ("last adjoint",), "forward": ("last tangent",)}


def source_of(kernel: Any, mode: str, backend: Any) -> str:
    """``kern.source(mode, backend)``: see ``Kernel.source``."""
    if mode not in ("primal", "reverse", "forward"):
        raise LaunchError(f"source(mode={mode!r}): mode is 'primal', 'forward' or 'reverse'")
    if mode in ("reverse", "forward"):
        ir_key = ("last adjoint",) if mode == "reverse" else ("last tangent",)
        last = kernel.cache.get(("last", mode, backend) if backend else ir_key)
        if last is None:
            raise LaunchError(f"{kernel.name} has not been differentiated in {mode} mode yet "
                              f"(on {backend!r}); "
                              "the generated kernel depends on the argument types, so "
                              "differentiate it "
                              "once with tg.autodiff, then ask for its source")
        if backend is not None:
            return last.source
        return "\n\n".join(_unparse(ir) for ir in (last if isinstance(last, list) else [last]))
    if backend is None:
        return _unparse(kernel_ir(kernel))
    launcher = kernel.cache.get(("last", mode, backend))
    if launcher is None:
        raise LaunchError(f"{kernel.name} has not been launched on {backend!r} yet; launch it "
                          "once, then ask for its source")
    return launcher.source


PASSES_HEADER = "The CPU passes:"


def passes_of(kernel: Any, mode: str, backend: Any) -> str:
    """``kern.passes(mode, backend)``: the notes the CPU writer put at the top of the module
    (of each module, when a replay ran several)."""
    if backend is None:
        raise LaunchError("passes(backend=...): say which backend's launch to describe")
    blocks, lines = [], source_of(kernel, mode, backend).splitlines()
    for k, line in enumerate(lines):
        if line.endswith(PASSES_HEADER):
            notes = []
            for note in lines[k + 1:]:
                if not note.startswith("#   "):
                    break
                notes.append(note[4:])
            blocks.append("\n".join(notes))
    if not blocks:
        raise LaunchError(f"{backend!r} has no optimisation passes to describe (the CPU has)")
    return "\n\n".join(blocks)


def _unparse(ir: Any) -> str:
    """Kernel IR as kernel-language source (what the frontend or a transform produced)."""
    fn = ast.FunctionDef(name=ir.name, args=ast.arguments(
        posonlyargs=[], args=[ast.arg(arg=p) for p in ir.params], kwonlyargs=[],
        kw_defaults=[], defaults=[]), body=ir.body, decorator_list=[], returns=None)
    return ast.unparse(ast.fix_missing_locations(fn)) + "\n"


class Shown:
    """What ``kern.source(mode="reverse", backend=...)`` shows after a replay: the code its
    launches ran (the storing variant of a gather, in the rows the CPU chose), not the
    adjoint's launcher as first compiled."""

    def __init__(self, steps: tuple):
        self.steps = steps

    @property
    def source(self) -> str:
        return "\n\n".join(run.source for run, _ in self.steps)
