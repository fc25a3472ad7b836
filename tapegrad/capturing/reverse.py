"""A captured program's reverse sweep, written down once and then run as compiled code.

The reverse sweep of a captured call (``CapturedRecord.backward``) is the trace tape's own
sweep, pointed at the call's arrays.  Which adjoints it runs, on which shadows, zeroing what,
depends on the records (fixed) and on the sweep's kind: which of the call's arrays have
gradients wanted (``given``: the shadows the outer sweep hands it).  It does not depend on
the values in the arrays or on the float arguments, which the adjoint kernels take as they
are.  So the first sweep of a kind runs in Python with a ``ReverseTrace`` watching, and each
adjoint tells it the array operations it runs (``Record.traceable``): launches of compiled
adjoint kernels, zeroing, copies and (scaled) additions of shadows, a reduction's cotangent
(below).
When every operation was one of those, the trace becomes a ``Reverse``: the same operations over the call's arrays (the
program's slots), the given shadows and buffers the program keeps for the shadows the sweep
made, which later calls of that kind run without the sweep's Python; on the CPU each stretch
of it is one compiled function (``backends/cpu/driver.py``, as the forward's stretches).

A scalar result's gradient (the caller's seed) reaches the arrays through the reduction
that made it (``tg.dot``, ``tg.sum``, ...): its cotangent is an operation of the trace too,
computed per call from the seed and the call's arrays.  A sweep that needs anything else (a
float argument's gradient, scalar arithmetic between a reduction and the result, a host
operation other than a copy or a reduction, an adjoint by its general path, arrays other
than NumPy's) stays a Python sweep, as before.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tapegrad.backends import to_numpy
from tapegrad.backends.cpu.driver import plan as cpu_plan
from tapegrad.backends.cpu.driver import storage_of
from tapegrad.backends.opencl.arrays import OPENCL_ARRAYS
from tapegrad.backends.opencl.queue import plan as opencl_plan
from tapegrad.capturing.program import CONST, INPUT, Frame, Op
from tapegrad.runtime.replay import scalar_sums
from tapegrad.tape.arrays import empty_like, repeats
from tapegrad.tape.hostops import write_cotangent

GIVEN, TEMP = "given", "temp"


class ReverseTrace:
    """What one Python sweep ran, in order: ``steps`` of (kind, fn, arguments, ndrange),
    each argument an array (``("v", x)`` a value the adjoint reads, ``("any", x)`` one it
    does not, ``("sh", x)`` a shadow) or a scalar reference (``("s", node)``, ``("c",
    value)``); ``failed``: why it cannot run compiled (None: it can)."""

    def __init__(self, seeded: int | None = None) -> None:
        self.steps: list[tuple] = []
        self.failed: str | None = None
        self.seeded = seeded      # the node of the scalar result whose gradient is seeded
        # per float argument's node: the array the adjoints add its gradient into (zeroed
        # before the first, summed after the last: ``Reverse`` returns the sums)
        self.sums: dict[int, Any] = {}

    def cotangent(self, record: Any, k: int, shadow: Any, fresh: bool) -> None:
        """A reduction's cotangent for its array ``k`` into ``shadow`` (stored where
        ``fresh``, else added): the reduction of the scalar result alone (its gradient is
        the call's seed; others' come through scalar arithmetic, which stays Python)."""
        if record.scalar_out != self.seeded:
            self.fail(f"the adjoint of {record.name} (its gradient from scalar arithmetic)")
            return
        args = (("sh", shadow),) + tuple(("any" if record.linear and j == k else "v", v)
                                         for j, v in enumerate(record.views))
        self.steps.append(("cotangent", (record.grad, k, record.scalar_out, fresh,
                                         record.linear), args, ()))

    def scaled_add(self, record: Any, dst: Any, src: Any) -> None:
        """``dst += factor * src`` (``tg.scale``'s adjoint; its factor a float argument or a
        constant)."""
        factor = ("s", record.node) if record.node is not None else ("c", record.factor)
        self.steps.append(("axpy", None, (("sh", src), factor, ("sh", dst)), ()))

    def fail(self, why: str) -> None:
        if self.failed is None:
            self.failed = why

    def array_op(self, kind: str, dst: Any, src: Any = None) -> None:
        """``zero`` dst; ``copy`` src into dst; ``add`` src to dst (shadows, flattened)."""
        refs = (("sh", dst),) if src is None else (("sh", src), ("sh", dst))
        self.steps.append((kind, None, refs, ()))

    def launch(self, record: Any, replay: Any, values: list, shadows: dict[str, Any]) -> None:
        """The launches of ``record``'s replayed adjoint (``runtime.replay.run_replay``)."""
        if 0 in record.nd:
            self.fail(f"the adjoint of {record.name} over an empty ndrange")
            return
        for p in replay.zeroed:
            self.array_op("zero", shadows[p])
        args: list[tuple] = []
        read = replay.adjoint.contents_read
        for pos, v in enumerate(values):
            if record.ids[pos] is not None:
                # (an array whose contents the adjoint does not read may be a stand-in the
                # sweep made for it: any array of its type will do)
                args.append(("v" if record.params[pos] in read else "any", v))
            elif pos in record.tracked_at:     # a float argument, or computed from one
                args.append(("s", record.nodes[pos]))
            else:
                args.append(("c", v))
        args += [("sh", shadows[p]) for p in replay.order]
        for p in replay.scalars:
            node = record.nodes[record.params.index(p)]
            if node not in self.sums:
                (self.sums[node],) = scalar_sums(record.cfg.backend, 1)
                self.array_op("zero", self.sums[node])
            args.append(("sh", self.sums[node]))
        for run, shaped_by in replay.steps:
            if shaped_by is None:
                self.steps.append(("launch", run, tuple(args), record.nd))
            else:       # a gather kernel: over its shadow, the ndrange appended
                self.steps.append(("launch", run,
                                   tuple(args) + tuple(("c", n) for n in record.nd),
                                   tuple(args[shaped_by][1].shape)))


class Reverse:
    """A sweep kind's operations (``ops``, as the program's) over a reverse frame: the call's
    arrays (slots ``[0, S)``), then the given shadows, then the program's ``temps``."""

    def __init__(self, program: Any, ops: list, temps: list[Any], storage: list[Any]):
        self.program, self.ops, self.temps, self.storage = program, ops, temps, storage
        self.name = f"{program.name} (reverse)"
        self.compiled: Any = None
        self.reads_forward = _reads_forward(program, ops)

    def __call__(self, frame: Frame, given: list[Any], seed: float = 0.0) -> dict[int, float]:
        """The sweep on a call's ``frame``, ``given`` its shadows (in the traced order) and
        ``seed`` the gradient of its scalar result (where it has one); the gradients of the
        float arguments, by node."""
        rframe = Frame(frame.arrays + given + self.temps, frame.scalars)
        if self.compiled is None:
            self.compiled = cpu_plan(self, rframe, self.storage) \
                or opencl_plan(self, rframe) or False
        plan = self.compiled or [(False, k) for k in range(len(self.ops))]
        grads: dict[int, float] = {}
        for compiled, what in plan:
            op = self.ops[what] if not compiled else None
            if compiled:
                what(rframe)
            elif op.kind == "cotangent":
                _cotangent(op, rframe, seed)
            elif op.kind == "scalar sum":
                grads[op.out] = float(to_numpy(rframe.arrays[op.refs[0][1]]).sum())
            else:
                self.program.run_op(op, what, rframe)
        return grads


def _cotangent(op: Op, rframe: Frame, seed: float) -> None:
    """A reduction's cotangent (``ReductionRecord.backward``'s, for ``ReverseTrace``)."""
    grad, k, node, fresh, linear = op.fn
    shadow, *views = (rframe.arrays[what] for _, what in op.refs)
    # (a linear reduction's value is not read, and not there when the forward did not run)
    value = rframe.scalars.get(node, math.nan) if linear else rframe.scalars[node]
    scale, array = grad(seed, k, value, *views)
    write_cotangent(shadow, scale, array, fresh)


def _reads_forward(program: Any, ops: list[Op]) -> bool:
    """Whether ``ops`` read anything the program's forward computes: an array it writes, a
    scalar it makes (any node but a float argument's), a reduction's value.  Where they do
    not (a linear simulation's reverse), a call whose result only seeds the gradient need
    not run its forward at all (``CapturedRecord.pending``)."""
    slots, params = program.slots, {node for _, node in program.params}
    for op in ops:
        if op.kind == "cotangent" and not op.fn[4]:       # (not linear: reads the value)
            return True
        for kind, what in op.refs:
            if kind == "s" and what not in params:
                return True
            if kind == "a" and what < len(slots) and not (
                    slots[what].kind == CONST or slots[what].kind == INPUT
                    and not slots[what].written):
                return True
    return False


def usable(given: list[Any]) -> bool:
    """Whether a call's given shadows can go to a ``Reverse``: NumPy or OpenCL arrays (one
    kind), none twice.  (CuPy's would replay op by op too, but have not run on a GPU yet.)"""
    return len({type(g) for g in given}) <= 1 and all(map(_replayable, given)) \
        and not repeats(given)


def _replayable(x: Any) -> bool:
    return type(x) is np.ndarray or OPENCL_ARRAYS.owns(x)


def reverse_of(program: Any, frame: Frame, given: list[Any], trace: ReverseTrace) -> Any:
    """The ``Reverse`` of a finished traced sweep over ``frame`` (its given shadows in
    ``given``'s order), or None when it must stay a Python sweep."""
    if trace.failed is not None or not trace.steps or not usable(given):
        return None
    slot_of: dict[int, int] = {}
    for k, x in enumerate(frame.arrays):
        if x is not None:
            slot_of.setdefault(id(x), k)
    base = len(frame.arrays)
    given_of = {id(g): base + n for n, g in enumerate(given)}
    temp_of: dict[Any, int] = {}
    temps: list[Any] = []

    def temp(key: Any, like: Any) -> int:
        k = temp_of.get(key)
        if k is None:
            k = temp_of[key] = base + len(given) + len(temps)
            temps.append(empty_like(like))
        return k

    def ref(arg: tuple) -> tuple | None:
        kind, x = arg
        if kind in ("s", "c"):
            return arg
        if not _replayable(x):
            return None
        if kind == "v":                 # an array the adjoint reads: one of the call's
            k = slot_of.get(id(x))
            return None if k is None else ("a", k)
        if kind == "any":               # one stand-in per type: runs of launches repeat
            return ("a", temp((x.shape, x.dtype, x.strides), x))
        k = given_of.get(id(x))         # a shadow: given, or one the sweep made, for
        return ("a", k if k is not None else temp(id(x), x))    # which the program keeps one

    ops = []
    for kind, fn, args, nd in trace.steps:
        refs = tuple(ref(a) for a in args)
        if any(r is None for r in refs):
            return None
        ops.append(Op(kind, fn=fn, refs=refs, nd=nd))
    for node, sums in trace.sums.items():
        ops.append(Op("scalar sum", refs=(ref(("sh", sums)),), out=node))
    storage = storage_of(program) + [(GIVEN, n) for n in range(len(given))] \
        + [(TEMP, n) for n in range(len(temps))]
    return Reverse(program, ops, temps, storage)
