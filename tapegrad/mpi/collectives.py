"""Differentiable collectives: ``allreduce`` of tape scalars (a global loss from per-process
``tg.sum``/``tg.dot``) and point-to-point ``sendrecv`` of arrays, each recorded with its
adjoint, which communicates in the reverse sweep in the same order on every process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tapegrad.errors import TapegradError
from tapegrad.mpi import holders  # noqa: F401  (registers how a tape seeds what allreduce made)
from tapegrad.mpi.buffers import (
    check_array,
    checked_sendrecv,
    incoming,
    mpi,
    on_device_of,
    outgoing,
)
from tapegrad.tape.arrays import is_array, zeros_like
from tapegrad.tape.duals import TapedDual, part
from tapegrad.tape.modes import current_forward, new_scalar, recording_tapes, refuse_jacobian
from tapegrad.tape.records import Record
from tapegrad.tape.scalars import DualScalar, TrackedScalar, plain


def allreduce(x: Any, comm: Any = None) -> Any:
    """The sum over the processes of ``comm`` (default ``MPI.COMM_WORLD``) of the number
    ``x``, the same value on every process; differentiable (a tape scalar while a tape
    records, a dual number in forward mode).  Every process must call it.

    The convention (the factor-of-P question): every process asks for the gradient of its
    own target, and what each gets is its share of the gradient of one objective, **the sum
    over the processes of their targets, in which a value held by all of them counts once**.
    So ``tape.gradient(allreduce(local_loss), sources)`` on every process gives the gradient
    of the global loss (not P times it: a target computed from allreduce results and numbers
    alone is seeded 1/P per process); a per-process target (no allreduce) gives the gradient
    of the sum of the per-process targets; ``allreduce(a) + tg.sum(b)`` (a replicated part
    plus a per-process one) is per process, so its objective counts the replicated part P
    times: write ``allreduce(a + tg.sum(b))`` for ``A + sum of b``.  A parameter that every
    process holds (a number given to ``tape.watch`` on each) gets each process's share of
    its gradient: add them with ``comm.allreduce``.  A target taken as held by all must
    have one value on all: a number that differs per process after the allreduce
    (``rank * total``) is refused at the gradient, saying what to write (docs/mpi.md,
    "Guards").

    >>> import numpy as np, tapegrad as tg, tapegrad.mpi as tgm
    >>> x = np.array([1.0, 2.0])
    >>> with tg.Tape() as tape:
    ...     total = tgm.allreduce(tg.dot(x, x))
    >>> float(total), tape.gradient(total, [x])[0].tolist()   # (one process)
    (5.0, [2.0, 4.0])
    """
    MPI = mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    refuse_jacobian("tapegrad.mpi.allreduce", comm)
    if is_array(x) or isinstance(x, bool) or not isinstance(x, (int, float, np.number)):
        raise TapegradError(f"tgm.allreduce sums numbers (tg.sum/tg.dot results, tape scalars), "
                            f"got {type(x).__name__}; reduce an array first (tg.sum(u))")
    ctx = current_forward()
    if ctx is not None and ctx.taped:       # tg.hvp: value and tangent summed, both recorded
        with ctx.on_tape():
            return TapedDual(allreduce(part(x), comm),
                             allreduce(x.tangent if isinstance(x, TapedDual) else 0.0, comm))
    value = comm.allreduce(float(plain(x)), op=MPI.SUM)
    if isinstance(x, DualScalar) or ctx is not None:
        tangents = x.tangents if isinstance(x, DualScalar) else (0.0,) * current_forward().width
        summed = np.empty(len(tangents))
        comm.Allreduce(np.asarray(tangents, dtype=np.float64), summed, op=MPI.SUM)
        return DualScalar(value, tuple(float(t) for t in summed))
    tapes = recording_tapes()
    if not tapes:
        return value
    # (recorded even where x is a constant here: another process's may not be, and every
    # process must run the adjoint's allreduce)
    scalar = new_scalar(value, tapes)
    for tape in tapes:
        node = x.node_on(tape) if isinstance(x, TrackedScalar) else None
        record = AllreduceRecord(reads=[], writes=[], scalars_in=[] if node is None else [node],
                                 scalar_out=scalar.node_on(tape), name="allreduce", comm=comm)
        record.copies = comm.Get_size()
        tape.holds_copies = True
        tape.record_host(record, [])
    return scalar


@dataclass
class AllreduceRecord(Record):
    """``out = sum over processes of x``: ``x_bar += sum over processes of out_bar`` (out's
    cotangent on each process is its share of the objective's: see ``allreduce``)."""

    comm: Any = None
    communicates = True

    @property
    def comms(self) -> tuple:
        return (self.comm,)

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, sweep: Any) -> None:
        bar = self.comm.allreduce(sweep.scalar_bar.get(self.scalar_out, 0.0), op=mpi().SUM)
        if self.scalars_in and self.scalars_in[0] in sweep.active_nodes:
            sweep.add_scalar_bar(self.scalars_in[0], bar)


def sendrecv(x: Any, dest: int, source: int, comm: Any = None, shape: Any = None,
             tag: int = 0) -> Any:
    """Send ``x`` to process ``dest`` and return what process ``source`` sends (a new array of
    ``x``'s dtype and of ``shape``, by default ``x``'s; zeros where ``source`` is
    ``MPI.PROC_NULL``); differentiable: the adjoint sends the result's adjoint back to
    ``source`` and adds what ``dest`` sends back into ``x``'s.  For what a ``Halo`` does not
    cover (irregular neighbours, a pipeline); every pair of processes must call it alike.  A
    message of another size than the result's is refused where it arrives.

    >>> import numpy as np, tapegrad.mpi as tgm
    >>> from mpi4py import MPI
    >>> me = MPI.COMM_WORLD.Get_rank()
    >>> tgm.sendrecv(np.array([1.0, 2.0]), dest=me, source=me).tolist()   # to itself
    [1.0, 2.0]
    """
    MPI = mpi()
    comm = MPI.COMM_WORLD if comm is None else comm
    refuse_jacobian("tapegrad.mpi.sendrecv", comm)
    check_array(x, "tgm.sendrecv")
    shape = tuple(x.shape) if shape is None else tuple(shape)
    ctx = current_forward()
    # (forward mode: the tangents go too, zeros where x has none here, so that every
    # process makes the same calls whatever its own tangents: docs/mpi.md, "Guards")
    if ctx is not None and ctx.taped:       # tg.hvp: the value and the tangent, recorded
        tangent = ctx.tangent_of(x)
        t = tangent[0] if tangent is not None else zeros_like(x)
        with ctx.on_tape():
            y = sendrecv(x, dest, source, comm, shape, tag)
            ctx.seed(y, [sendrecv(t, dest, source, comm, shape, tag)])
        return y
    y = _sendrecv(comm, x, dest, source, shape, tag)
    if ctx is not None:
        tangents = ctx.tangent_of(x) or [zeros_like(x)] * ctx.width
        ctx.seed(y, [_sendrecv(comm, t, dest, source, shape, tag) for t in tangents])
    for tape in recording_tapes():
        record = SendrecvRecord(reads=[tape.track(x)], writes=[tape.track(y)], name="sendrecv",
                                comm=comm, dest=dest, source=source, tag=tag)
        tape.record_host(record, [], read=(x,))
    return y


def _sendrecv(comm: Any, x: Any, dest: int, source: int, shape: tuple, tag: int) -> Any:
    buffer = incoming(x, shape, x.dtype)
    checked_sendrecv(comm, outgoing(x), dest, buffer, source, tag, "tgm.sendrecv",
                     "the result has the dtype of x and the shape given as shape= (by default "
                     "x's): give shape= and a dtype that match what the sending process sends")
    if source == mpi().PROC_NULL:
        buffer[...] = 0
    return on_device_of(x, buffer)


@dataclass
class SendrecvRecord(Record):
    """``y = what source sent``, ``x`` sent to dest: ``y``'s adjoint goes back to ``source``
    (and is consumed), ``dest`` returns ``x``'s share, added in."""

    comm: Any = None
    dest: int = 0
    source: int = 0
    tag: int = 0
    communicates = True

    @property
    def comms(self) -> tuple:
        return (self.comm,)

    def redirect(self, pos: int, copy: Any) -> None:
        pass

    def backward(self, sweep: Any) -> None:
        x_id, y_id = self.reads[0], self.writes[0]
        y_bar = sweep.shadow(y_id)
        x_shape, x_dtype = sweep.ids.meta(x_id)[1:]
        back = _sendrecv(self.comm, y_bar, self.source, self.dest, x_shape, self.tag)
        y_bar[...] = 0
        if x_id in sweep.active_ids and self.dest != mpi().PROC_NULL:
            sweep.shadow(x_id)[...] += back.astype(x_dtype, copy=False)
