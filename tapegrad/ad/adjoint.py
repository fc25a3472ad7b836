"""What the adjoint transform produces: the adjoint kernel and how to call it."""

from __future__ import annotations

from dataclasses import dataclass, field

from tapegrad.frontend.ir import KernelIR


@dataclass
class Adjoint:
    """The adjoint kernel and how to call it."""

    ir: KernelIR
    shadow_of: dict[str, str]          # shadow parameter -> primal parameter
    active_scalars: list[str]          # primal scalar parameters whose derivative is returned
    scratch: list[str]                 # array parameters to pass as copies of their old values
    stack_depth: int                   # 0 when no stack is needed
    uses_status: bool
    notes: list[str] = field(default_factory=list)
    gathers: list = field(default_factory=list)   # tapegrad.ad.gather.Gather, run first
    contents_read: frozenset = frozenset()        # array parameters whose contents it reads
    shadows_written: frozenset = frozenset()      # shadow parameters its kernels write
