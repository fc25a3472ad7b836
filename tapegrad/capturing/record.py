"""A call of a captured function on a recording tape: one record, whose adjoint is the reverse
sweep of the function's own trace tape pointed at that call's arrays (``Program.bind``)."""

from __future__ import annotations

from typing import Any

from tapegrad.capturing.program import CONST, INPUT, OUTPUT, Frame, Program
from tapegrad.capturing.reverse import ReverseTrace, reverse_of, usable
from tapegrad.tape.modes import new_scalar
from tapegrad.tape.records import Record
from tapegrad.tape.scalars import TrackedScalar
from tapegrad.tape.sweep import Sweep


class CapturedRecord(Record):
    """One call: ``arrays_in`` (slot, identity on this tape) of the inputs and consts it
    read, ``arrays_out`` of the arrays it wrote (outputs, inputs written in place),
    ``params`` (node on the trace tape, node here) of its tracked float arguments,
    ``result_node`` the trace tape's node of its scalar result (if any), ``live`` the slots
    of the inputs whose contents the adjoint reads (``redirect``'s positions)."""

    def __init__(self, program: Program, frame: Frame, arrays_in: list, arrays_out: list,
                 params: list, result_node: int | None, scalar_out: int | None,
                 live: list[int], pending: bool = False):
        super().__init__(reads=[i for _, i in arrays_in], writes=[i for _, i in arrays_out],
                         scalars_in=[n for _, n in params], scalar_out=scalar_out,
                         name=f"captured {program.name}")
        self.program, self.frame = program, frame
        self.arrays_in, self.arrays_out, self.params = arrays_in, arrays_out, params
        self.result_node, self.live = result_node, live
        # the call's forward has not run yet: its sweep runs it, unless the written-down
        # reverse reads nothing it computes (Captured.replay's value_unused)
        self.pending = pending

    def redirect(self, pos: int, copy: Any) -> None:
        self.frame.arrays[self.live[pos]] = copy

    def held(self) -> Any:
        """The call's arrays whose contents its reverse reads (``Tape.memory``; and what
        tells ``tg.checkpoint_loop`` that a captured step is not linear)."""
        for slot, x in zip(self.program.slots, self.frame.arrays):
            if slot.kept and x is not None:
                yield "arrays", x

    def run_pending(self) -> None:
        if self.pending:
            self.pending = False
            self.program.run(self.frame)

    def backward(self, sweep: Any) -> None:
        with self.program.lock:
            self.sweep(sweep)

    def sweep(self, sweep: Any) -> None:
        program = self.program
        slots, tape = program.slots, program.tape
        shadows, sources, targets, kind = {}, [], [], []
        for k, outer in self.arrays_in:
            if outer in sweep.active_ids:
                shadows[slots[k].ident] = sweep.shadow(outer)
                sources.append(slots[k].ident)
                kind.append(k)
        for k, outer in self.arrays_out:
            shadows[slots[k].ident] = sweep.shadow(outer)
            targets.append(slots[k].ident)
            kind.append(k)
        scalars = [(inner, outer) for inner, outer in self.params if outer in sweep.active_nodes]
        for inner, _ in scalars:
            sources.append(TrackedScalar(0.0, tape, inner))
        if self.result_node is not None:
            targets.append(TrackedScalar(0.0, tape, self.result_node))
        trace = None
        seed = sweep.scalar_bar.get(self.scalar_out, 0.0) if self.result_node is not None \
            else None
        # (a scalar result's seeded: reverse.py's case; a zero seed skips the reduction's
        # adjoint, which a trace would miss)
        if seed != 0.0:
            given = list(shadows.values())
            key = (tuple(kind), tuple(inner for inner, _ in scalars), seed is not None)
            reverse = program.reverses.get(key)
            if reverse and usable(given):
                if reverse.reads_forward:
                    self.run_pending()
                grads = reverse(self.frame, given, seed or 0.0)
                if grads is not None:
                    for inner, outer in scalars:
                        sweep.add_scalar_bar(outer, grads.get(inner, 0.0))
                    return
                # (an adjoint's stack overflowed: the Python sweep grows it; the reverse
                # is written down again, deeper, by a later sweep)
                reverse = program.reverses[key] = None
            elif reverse is None and usable(given):
                if all(r.traceable for r in tape.records):
                    trace = ReverseTrace(self.result_node)
                else:     # (a host operation it cannot write down: spare the trace)
                    program.reverses[key] = False
        self.run_pending()
        program.bind(self.frame)
        try:
            inner = Sweep(tape, shadows, sources, frozen=program.frozen)
            inner.trace = trace
            if self.result_node is not None:
                inner.scalar_bar[self.result_node] = seed
            inner.run(targets, sources)
        finally:
            program.bind(None)
        if trace is not None:
            reverse = reverse_of(program, self.frame, given, trace)
            if reverse is not None or not trace.again:
                program.reverses[key] = reverse or False
        for node, outer in scalars:
            sweep.add_scalar_bar(outer, inner.scalar_bar.get(node, 0.0))


def record_call(program: Program, frame: Frame, args: tuple, results: list[Any],
                tapes: tuple, pending: bool = False) -> list[Any]:
    """Record a finished call (``frame``; ``pending``: one whose forward waits for its
    sweep) on each of ``tapes``; the results to return (a scalar result becomes the tapes'
    scalar).  The tapes saw the inputs it writes before it ran (``before_writes``)."""
    slots = program.slots
    scalar_at = [j for j, (kind, _) in enumerate(program.results) if kind == "s"]
    out = list(results)
    scalar = None
    if scalar_at:
        (j,) = scalar_at      # (Captured refuses more than one scalar result)
        scalar = out[j] = new_scalar(results[j], tapes)
    for tape in tapes:
        arrays_in, arrays_out, live, read = [], [], [], []
        for k, slot in enumerate(slots):
            x = frame.arrays[k]
            if slot.kind in (INPUT, CONST) and x is not None:
                ident = tape.track(x)
                arrays_in.append((k, ident))
                if slot.kind == INPUT and slot.written:
                    arrays_out.append((k, ident))
                elif slot.kept:
                    live.append(k)
                else:
                    read.append(x)
            elif slot.kind == OUTPUT:
                arrays_out.append((k, tape.track(x)))
                if slot.kept:     # (returned, so the user may change it before the sweep
                    live.append(k)    # reads it: the tape fingerprints it, as it does inputs)
        params = [(node, args[pos].node_on(tape)) for pos, node in program.params
                  if isinstance(args[pos], TrackedScalar) and args[pos].node_on(tape) is not None]
        result_node = program.results[scalar_at[0]][1] if scalar_at else None
        record = CapturedRecord(program, frame, arrays_in, arrays_out, params, result_node,
                                scalar.node_on(tape) if scalar is not None else None, live,
                                pending)
        tape.record_host(record, [(frame.arrays[k], n) for n, k in enumerate(live)],
                         read=tuple(read))
        for k, ident in arrays_out:
            tape.after_host_write(frame.arrays[k], ident)
    return out


def before_writes(program: Program, args: tuple, tapes: tuple) -> None:
    """Before a call writes its inputs in place: each tape checks they are as it last saw
    them and copies them for records that still read them."""
    for slot in program.slots:
        if slot.kind == INPUT and slot.written:
            for tape in tapes:
                tape.before_host_write(args[slot.index], f"captured {program.name}")
