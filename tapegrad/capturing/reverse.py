"""A captured program's reverse sweep, written down once and then run as compiled code.

The reverse sweep of a captured call (``CapturedRecord.backward``) is the trace tape's own
sweep, pointed at the call's arrays.  Which adjoints it runs, on which shadows, zeroing what,
depends on the records (fixed) and on the sweep's kind: which of the call's arrays have
gradients wanted (``given``: the shadows the outer sweep hands it), and of its float
arguments.  It does not depend on
the values in the arrays or on the float arguments, which the adjoint kernels take as they
are.  So the first sweep of a kind runs in Python with a ``ReverseTrace`` watching, and each
adjoint tells it the array operations it runs (``Record.traceable``): launches of compiled
adjoint kernels, zeroing, copies and (scaled) additions of shadows, a reduction's cotangent
(below).
When every operation was one of those, the trace becomes a ``Reverse``: the same operations over the call's arrays (the
program's slots), the given shadows and buffers the program keeps for the shadows the sweep
made, which later calls of that kind run without the sweep's Python; on the CPU each stretch
of it is one compiled function (``backends/cpu/driver.py``, as the forward's stretches).

The gradients of tape scalars (the caller's seed for a scalar result, a float argument's)
go by operations of the trace too, run on the host between the compiled stretches: a
reduction's cotangent from its scalar's gradient, scalar arithmetic's adjoint from the
call's partials, ``tg.scale``'s factor's, and the sums into which adjoint launches add an
Active scalar's gradient.  An adjoint that recomputes in place gets copies of the arrays
it writes (copy operations) and reports its stack's overflow in one status array, checked
after the reverse (``Reverse.__call__``).  A sweep that needs anything else (another host
operation, shadows given twice, arrays other than NumPy's, CuPy's or OpenCL's) stays a
Python sweep, as before; on CUDA each run of the reverse's launches is one CUDA graph
(``backends/cuda/graphs.py``, where turned on) or called from one list made in advance
(``backends/cuda/launches.py``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tapegrad.backends import to_numpy
from tapegrad.backends.cpu.driver import plan as cpu_plan
from tapegrad.backends.cpu.driver import storage_of
from tapegrad.backends.cuda.graphs import plan as cuda_graphs
from tapegrad.backends.cuda.launches import plan as cuda_launches
from tapegrad.backends.notice import compiling
from tapegrad.backends.opencl.arrays import OPENCL_ARRAYS
from tapegrad.backends.opencl.queue import plan as opencl_plan
from tapegrad.capturing.program import CONST, INPUT, Frame, Op
from tapegrad.runtime.replay import scalar_sums
from tapegrad.tape.arrays import empty_like, repeats
from tapegrad.tape.hostops import factor_gradient, write_cotangent

GIVEN, TEMP = "given", "temp"


class ReverseTrace:
    """What one Python sweep ran, in order: ``steps`` of (kind, fn, arguments, ndrange),
    each argument an array (``("v", x)`` a value the adjoint reads, ``("any", x)`` one it
    does not, ``("sh", x)`` a shadow) or a scalar reference (``("s", node)``, ``("c",
    value)``); ``failed``: why it cannot run compiled (None: it can)."""

    def __init__(self, seeded: int | None = None) -> None:
        self.steps: list[tuple] = []
        self.failed: str | None = None
        self.again = False        # failed for this sweep's values: a later sweep may trace
        self.seeded = seeded      # the node of the scalar result whose gradient is seeded
        # per tape scalar's node: the array the adjoint launches add its gradient into
        # (zeroed before the first; summed into its gradient before anything reads that)
        self.sums: dict[int, Any] = {}
        # the adjoints' copies of arrays they write (recomputing in place), per argument
        # position and layout; the status array their stacks report an overflow in
        self.scratch: dict[tuple, Any] = {}
        self.status: Any = None

    def cotangent(self, record: Any, k: int, shadow: Any, fresh: bool) -> None:
        """A reduction's cotangent for its array ``k`` into ``shadow`` (stored where
        ``fresh``, else added), from its scalar's gradient as the call's runs compute it."""
        self.sum_up()
        args = (("sh", shadow),) + tuple(("any" if record.linear and j == k else "v", v)
                                         for j, v in enumerate(record.views))
        self.steps.append(("cotangent", (record.grad, k, record.scalar_out, fresh,
                                         record.linear), args, ()))

    def scaled_add(self, record: Any, dst: Any, src: Any) -> None:
        """``dst += factor * src`` (``tg.scale``'s adjoint; its factor a float argument or a
        constant)."""
        factor = ("s", record.node) if record.node is not None else ("c", record.factor)
        self.steps.append(("axpy", None, (("sh", src), factor, ("sh", dst)), ()))

    def factor(self, record: Any, bar: Any) -> None:
        """``tg.scale``'s factor's gradient: ``<src, bar>`` added to its node's."""
        self.steps.append(("factor", record.node, (("sh", bar), ("v", record.views[0])), ()))

    def scalar(self, record: Any) -> None:
        """Scalar arithmetic's adjoint: its partials (the call's, which its forward
        computed) times its result's gradient, added to its operands'."""
        self.sum_up()
        self.steps.append(("scalar", (record.scalar_out, tuple(record.inputs)), (), ()))

    def sum_up(self) -> None:
        """The launches' sums so far added to their scalars' gradients (an operation that
        reads a gradient follows)."""
        for node, sums in self.sums.items():
            self.steps.append(("scalar sum", node, (("sh", sums),), ()))
        self.sums = {}

    def fail(self, why: str, again: bool = False) -> None:
        """It cannot run compiled, for ``why``; ``again``: only because of this sweep's
        values (a zero gradient that made an adjoint skip its work)."""
        if self.failed is None:
            self.failed, self.again = why, again

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
        backend = record.cfg.backend
        for pos in replay.scratch:
            v = values[pos]
            key = (pos, type(v), tuple(v.shape), v.dtype)
            if key not in self.scratch:
                self.scratch[key] = empty_like(v)
            self.steps.append(("copy", None, (("v", v), ("sh", self.scratch[key])), ()))
            args[pos] = ("sh", self.scratch[key])
        for p in replay.scalars:
            node = record.nodes[record.params.index(p)]
            if node not in self.sums:
                (self.sums[node],) = scalar_sums(backend, 1)
                self.array_op("zero", self.sums[node])
            args.append(("sh", self.sums[node]))
        if replay.status:     # (one for every launch: the first overflow is what counts)
            if self.status is None:
                self.status = backend.zeros(np.int64, 1)
                self.array_op("zero", self.status)
            args.append(("sh", self.status))
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

    def __init__(self, program: Any, ops: list, temps: list[Any], storage: list[Any],
                 seeded: int | None, status: int | None):
        self.program, self.ops, self.temps, self.storage = program, ops, temps, storage
        self.seeded = seeded
        self.status = status      # the slot of the adjoints' stack status (None: no stack)
        self.name = f"{program.name} (reverse)"
        self.compiled: Any = None
        self.reads_forward = _reads_forward(program, ops)

    def __call__(self, frame: Frame, given: list[Any], seed: float = 0.0
                 ) -> dict[int, float] | None:
        """The sweep on a call's ``frame``, ``given`` its shadows (in the traced order) and
        ``seed`` the gradient of its scalar result (where it has one); the gradients of its
        tape scalars, by node (the float arguments' among them).  None where an adjoint's
        stack overflowed: ``given`` is then as it was, for the Python sweep to run (whose
        general path grows the stack)."""
        rframe = Frame(frame.arrays + given + self.temps, frame.scalars, frame.partials)
        if self.status is not None:
            before = [g.copy() for g in given]
            bars = self.run(rframe, seed)
            if not to_numpy(rframe.arrays[self.status])[0]:
                return bars
            for g, b in zip(given, before):
                g[...] = b
            return None
        return self.run(rframe, seed)

    def run(self, rframe: Frame, seed: float) -> dict[int, float]:
        if self.compiled is None:
            # (its first run compiles its stretches: seconds, said as other compiles say it)
            with compiling(self.name, key=(self.name, id(self.program))):
                self.compiled = cpu_plan(self, rframe, self.storage) \
                    or cuda_graphs(self) or cuda_launches(self) or opencl_plan(self, rframe) \
                    or False
                return self.run_plan(rframe, seed)
        return self.run_plan(rframe, seed)

    def run_plan(self, rframe: Frame, seed: float) -> dict[int, float]:
        plan = self.compiled or [(False, k) for k in range(len(self.ops))]
        bars = {self.seeded: seed} if self.seeded is not None else {}
        for compiled, what in plan:
            if compiled:
                what(rframe)
            elif self.ops[what].kind in _SCALAR_OPS:
                _SCALAR_OPS[self.ops[what].kind](self.ops[what], rframe, bars)
            else:
                self.program.run_op(self.ops[what], what, rframe)
        return bars


def _cotangent(op: Op, rframe: Frame, bars: dict[int, float]) -> None:
    """A reduction's cotangent (``ReductionRecord.backward``'s, for ``ReverseTrace``)."""
    grad, k, node, fresh, linear = op.fn
    shadow, *views = (rframe.arrays[what] for _, what in op.refs)
    bar = bars.get(node, 0.0)
    if bar == 0.0:        # (as the sweep: no work; a shadow holding no values gets zeros)
        if fresh:
            shadow.fill(0)
        return
    # (a linear reduction's value is not read, and not there when the forward did not run)
    value = rframe.scalars.get(node, math.nan) if linear else rframe.scalars[node]
    scale, array = grad(bar, k, value, *views)
    write_cotangent(shadow, scale, array, fresh)


def _scalar(op: Op, rframe: Frame, bars: dict[int, float]) -> None:
    """Scalar arithmetic's adjoint (``ScalarRecord.backward``'s)."""
    out, inputs = op.fn
    bar = bars.get(out, 0.0)
    for node, partial in zip(inputs, rframe.partials[out]):
        if node is not None:
            bars[node] = bars.get(node, 0.0) + bar * partial


def _scalar_sum(op: Op, rframe: Frame, bars: dict[int, float]) -> None:
    """A scalar's gradient as adjoint launches added it up (``ReverseTrace.sums``)."""
    bars[op.fn] = bars.get(op.fn, 0.0) + float(to_numpy(rframe.arrays[op.refs[0][1]]).sum())


def _factor(op: Op, rframe: Frame, bars: dict[int, float]) -> None:
    """``tg.scale``'s factor's gradient (``ScaleRecord.backward``'s)."""
    bar, src = (rframe.arrays[what] for _, what in op.refs)
    bars[op.fn] = bars.get(op.fn, 0.0) + factor_gradient(src, bar)


# the operations on tape scalars' gradients, which the reverse runs on the host in order
_SCALAR_OPS = {"cotangent": _cotangent, "scalar": _scalar, "scalar sum": _scalar_sum,
               "factor": _factor}


def _reads_forward(program: Any, ops: list[Op]) -> bool:
    """Whether ``ops`` read anything the program's forward computes: an array it writes, a
    scalar it makes (any node but a float argument's), a reduction's value.  Where they do
    not (a linear simulation's reverse), a call whose result only seeds the gradient need
    not run its forward at all (``CapturedRecord.pending``)."""
    slots, params = program.slots, {node for _, node in program.params}
    for op in ops:
        if op.kind == "cotangent" and not op.fn[4] or op.kind == "scalar":
            return True           # (a reduction's value, arithmetic's partials)
        for kind, what in op.refs:
            if kind == "s" and what not in params:
                return True
            if kind == "a" and what < len(slots) and not (
                    slots[what].kind == CONST or slots[what].kind == INPUT
                    and not slots[what].written):
                return True
    return False


def usable(given: list[Any]) -> bool:
    """Whether a call's given shadows can go to a ``Reverse``: NumPy, CuPy or OpenCL arrays
    (one kind), none twice."""
    return len({type(g) for g in given}) <= 1 and all(map(_replayable, given)) \
        and not repeats(given)


def _replayable(x: Any) -> bool:
    return type(x) is np.ndarray or type(x).__module__.startswith("cupy") \
        or OPENCL_ARRAYS.owns(x)


def reverse_of(program: Any, frame: Frame, given: list[Any], trace: ReverseTrace) -> Any:
    """The ``Reverse`` of a finished traced sweep over ``frame`` (its given shadows in
    ``given``'s order), or None when it must stay a Python sweep."""
    trace.sum_up()
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
    status = ref(("sh", trace.status))[1] if trace.status is not None else None
    storage = storage_of(program) + [(GIVEN, n) for n in range(len(given))] \
        + [(TEMP, n) for n in range(len(temps))]
    return Reverse(program, ops, temps, storage, trace.seeded, status)
