"""A captured program's launches on the CPU as compiled functions (``tapegrad/capturing``):
each stretch of consecutive launches (and copies) becomes one generated Numba function that
calls the kernels one after another, so that a replay pays one Python call per stretch
instead of a launcher call per launch.  Runs of the same launch whose arrays take turns (a
simulation's state and its next state, sharing two buffers) are written as a loop, so that a
10,000-step run is a short function.  A launch of one workgroup calls its kernel's task, as
a launch from Python does (``outline.py``): no parallel launch for one task.  The generated
source is readable in the cache folder.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba.core.errors import NumbaError
from numba.typed import List as TypedList

from tapegrad.backends.cache import load_source
from tapegrad.backends.compiler_process import compile_elsewhere
from tapegrad.backends.cpu.backend import _ByLaunchSize, _Launcher, launch_threads, pool_shape
from tapegrad.backends.cpu.outline import one_group_line
from tapegrad.backends.numba_cache import njit_line

LOOP_FROM = 4          # a run of this many alternating launches or more is written as a loop
# ... and a run of this many launches of a few kernels over arrays that differ from launch
# to launch, written as a loop over lists of them: each call builds the lists, where a line
# per launch costs compile time once; so only long runs, whose lines would take far longer
# to compile than their lists to build (the figures: docs/performance.md, "Captured
# functions")
LIST_FROM = 256
MOST_CHANGED = 8       # a list with more arrays new since the call before is built anew
MOST_PERIOD = 4        # ... of runs of up to this many launches repeated
MOST_ARGUMENTS = 200   # a stretch with more distinct arrays and scalars is cut in two


class Stretch:
    """Ops ``[start, stop)`` of a program as one compiled function: ``arrays`` the slot of
    each of its array parameters, ``lists`` the slots of each list of arrays a loop takes
    one of per launch, ``scalars`` each scalar parameter's reference, ``pools`` (slot, rank,
    ndrange) of each array a kernel adds into through per-task copies (its launcher's pools:
    the function takes them, zeroed, after the thread count)."""

    def __init__(self, fn: Any, arrays: list[int], scalars: list[tuple], start: int,
                 stop: int, pools: list[tuple] = (), lists: list[list[int]] = ()):
        self.fn, self.arrays, self.scalars = fn, arrays, scalars
        self.start, self.stop = start, stop
        self.pools = pools
        self.pool_arrays: dict[int, list[np.ndarray]] = {}   # per thread count
        self.lists = lists
        self.built: dict[int, tuple] = {}    # per list: (its arrays' ids, the list kept)

    def __call__(self, frame: Any) -> None:
        values = frame.scalars
        call = [frame.arrays[k] for k in self.arrays]
        call += [self.array_list(n, [frame.arrays[k] for k in slots])
                 for n, slots in enumerate(self.lists)]
        call += [values[what] if kind == "s" else what for kind, what in self.scalars]
        chunks = launch_threads()
        call.append(chunks)
        if self.pools:
            pools = self.pool_arrays.get(chunks)
            if pools is None:      # (each launch leaves them zero, as it found them)
                pools = self.pool_arrays[chunks] = [
                    np.zeros(pool_shape(frame.arrays[k], nd, ndrange, chunks),
                             frame.arrays[k].dtype) for k, nd, ndrange in self.pools]
            call += pools
        if not self.fn.overloads:       # its first run: compiled apart, loaded here
            compile_elsewhere(self.fn, tuple(call))
        try:
            self.fn(*call)
        except BaseException:
            self.pool_arrays.clear()    # a launch cut short may leave its copies dirty
            raise


    def array_list(self, n: int, arrays: list[Any]) -> Any:
        """List ``n`` of a call.  Most of its arrays are the program's own memory, the same
        each call (and a list is built an array at a time): the one built before, with the
        few that differ put in their places (a call's output, its inputs); a new one where
        more differ (under a tape: the states the reverse reads are new each call), kept
        only when few differed from the call before (a call's new arrays stay alive in a
        kept list until the next call)."""
        ids = tuple(map(id, arrays))
        seen = self.built.get(n)
        if seen is None:
            self.built[n] = (ids, None)
            return TypedList(arrays)
        # (a kept list keeps its arrays alive: an id it holds is that same array)
        changed = [i for i, (a, b) in enumerate(zip(ids, seen[0])) if a != b]
        if len(changed) > MOST_CHANGED:
            self.built[n] = (ids, None)
            return TypedList(arrays)
        made = seen[1]
        if made is None:
            made = TypedList(arrays)
        else:
            for i in changed:
                made[i] = arrays[i]
        self.built[n] = (ids, made)
        return made


def plan(program: Any, frame: Any, storage: list[Any] | None = None
         ) -> list[tuple[bool, Any]] | None:
    """``program``'s ops as (compiled, what): a ``Stretch`` for each stretch of two or more
    launches the CPU can run compiled, else the op's index; None if no stretch was found.
    ``frame``: a call's arrays (the layouts every later call shares); ``storage``: per
    array of the frame, what memory it is (default: ``storage_of(program)``)."""
    ops = program.ops
    storage = storage_of(program) if storage is None else storage
    out: list[tuple[bool, Any]] = []
    k = 0
    while k < len(ops):
        end, arguments = k, set()
        while end < len(ops) and _compilable(ops[end], program, frame):
            # (a launch like one of the few before it may go in a loop: its arrays in lists)
            if not any(_same_template(ops[end], ops[before])
                       for before in range(max(k, end - MOST_PERIOD), end)):
                arguments |= _arguments(ops[end], storage)
            if len(arguments) > MOST_ARGUMENTS:
                break
            end += 1
        if sum(ops[j].kind == "launch" for j in range(k, end)) >= 2:
            try:
                out.append((True, _stretch(program, storage, k, end, frame)))
                k = end
                continue
            except (NumbaError, ImportError, SyntaxError):
                pass              # (not expected: the ops run one by one instead)
        out += [(False, j) for j in range(k, max(end, k + 1))]
        k = max(end, k + 1)
    return out if any(compiled for compiled, _ in out) else None


def _variant(op: Any) -> Any:
    """The ``_Launcher`` that ``op``'s launch runs (a ``_ByLaunchSize`` picks by ndrange)."""
    fn = op.fn
    return fn.variant(op.nd) if isinstance(fn, _ByLaunchSize) else fn


def _compilable(op: Any, program: Any, frame: Any) -> bool:
    if op.kind == "launch":
        run = _variant(op)
        return (isinstance(run, _Launcher) and run.compiled and not run.checked
                and 0 not in op.nd)
    if op.kind in ("copy", "add", "zero"):      # (a reverse's: capturing/reverse.py)
        arrays = [frame.arrays[k] for _, k in op.refs]
        return (all(type(x) is np.ndarray and x.flags.c_contiguous for x in arrays)
                and all(x.size == arrays[0].size and x.dtype == arrays[0].dtype
                        for x in arrays))
    return False


def storage_of(program: Any) -> list[Any]:
    """Per slot, what memory it is: temporaries that share the program's scratch memory are
    one array (a replay's arguments take turns in it); every other slot its own."""
    storage = []
    for k, slot in enumerate(program.slots):
        shared = program.scratch[k] if slot.kind == "temp" and not slot.kept else None
        storage.append(("scratch", id(shared)) if shared is not None else ("slot", k))
    return storage


def _arguments(op: Any, storage: list[Any]) -> set:
    """What ``op`` makes a parameter of its stretch's function: its arrays' memories and its
    scalars."""
    return {storage[what] if kind == "a" else (kind, _scalar_key(what))
            for kind, what in op.refs}


def _scalar_key(value: Any) -> Any:
    return (type(value), value)


def _stretch(program: Any, storage: list[Any], start: int, stop: int, frame: Any) -> Stretch:
    """The compiled function of ops ``[start, stop)`` (``frame``: a call's arrays)."""
    ops = program.ops[start:stop]
    array_names: dict[Any, str] = {}
    array_slots: list[int] = []
    scalar_names: dict[Any, str] = {}
    scalar_refs: list[tuple] = []
    kernels: dict[tuple, str] = {}
    imports: list[str] = []
    pool_names: dict[Any, str] = {}
    pools: list[tuple] = []
    list_names: dict[tuple, str] = {}
    list_slots: list[list[int]] = []

    def array(k: int) -> str:
        key = storage[k]
        if key not in array_names:
            array_names[key] = f"a{len(array_names)}"
            array_slots.append(k)
        return array_names[key]

    def scalar(ref: tuple) -> str:
        key = (ref[0], _scalar_key(ref[1]))
        if key not in scalar_names:
            scalar_names[key] = f"s{len(scalar_names)}"
            scalar_refs.append(ref)
        return scalar_names[key]

    def kernel(run: _Launcher, task: bool = False) -> str:
        key = (id(run), task)
        if key not in kernels:
            kernels[key] = f"{'t' if task else 'k'}{len(kernels)}"
            symbol = run.lowered.symbol + ("__task" if task else "")
            imports.append(f"from {run.dispatcher.py_func.__module__} import "
                           f"{symbol} as {kernels[key]}")
        return kernels[key]

    def array_list(slots: tuple[int, ...]) -> str:
        key = tuple(storage[k] for k in slots)
        if key not in list_names:
            list_names[key] = f"l{len(list_names)}"
            list_slots.append(list(slots))
        return list_names[key]

    def call(op: Any, arrays: dict[int, str] | None = None) -> str:
        """``op``'s line; ``arrays``: the text of some of its array arguments (by position)."""
        if op.kind in ("copy", "add"):
            return f"_{op.kind}({array(op.refs[1][1])}, {array(op.refs[0][1])})"
        if op.kind == "zero":
            return f"_zero({array(op.refs[0][1])})"
        run = _variant(op)
        args = [(arrays or {}).get(pos) or array(what) if kind == "a" else
                scalar((kind, what)) for pos, (kind, what) in enumerate(op.refs)]
        groups = [-(-n // w) for n, w in zip(op.nd, run.groupsize)]
        # (np.int64, not literals: a literal would compile the kernel again for its value)
        nd = [f"np.int64({n})" for n in op.nd]
        if run.one_group is not None and all(g == 1 for g in groups):
            # one workgroup: its task, as a launch calls it (backends/cpu/outline.py)
            return one_group_line(run.lowered.one_group, kernel(run, True), args, nd,
                                  "_chunks")
        extra = nd + [f"np.int64({g})" for g in groups]
        extra.append("_chunks")
        for pos, nd in run.lowered.pools:
            k = op.refs[pos][1]
            key = (id(run), pos, storage[k], op.nd)
            if key not in pool_names:
                pool_names[key] = f"_p{len(pool_names)}"
                pools.append((k, nd, op.nd))
            extra.append(pool_names[key])
        return f"{kernel(run)}({', '.join(args + extra)})"

    body: list[str] = []
    j = 0
    while j < len(ops):
        run_end = _alternating_run(ops, j, storage)
        if run_end - j >= LOOP_FROM:
            count = run_end - j
            body += [f"    for _s in range({count // 2}):",
                     f"        {call(ops[j])}",
                     f"        {call(ops[j + 1])}"]
            if count % 2:
                body.append(f"    {call(ops[j])}")
            j = run_end
            continue
        run_end, period, varying = _listed_run(ops, j, storage, frame)
        if run_end - j >= LIST_FROM:
            # (a run of a few launches repeated over arrays that differ from step to step, a
            # nonlinear simulation's states that the reverse reads: a loop over lists of
            # them, not a line per launch for Numba to compile, see LIST_FROM)
            body.append(f"    for _s in range({(run_end - j) // period}):")
            for t in range(period):
                phase = ops[j + t:run_end:period]
                lists = {pos: array_list(tuple(op.refs[pos][1] for op in phase)) + "[_s]"
                         for pos in varying[t]}
                body.append(f"        {call(ops[j + t], lists)}")
            j = run_end
            continue
        body.append(f"    {call(ops[j])}")
        j += 1
    params = list(array_names.values()) + list(list_names.values()) \
        + list(scalar_names.values()) + ["_chunks"] + list(pool_names.values())
    source = "\n".join([
        f"# Generated by tapegrad: ops {start} to {stop - 1} of the captured function "
        f"{program.name} (tapegrad/backends/cpu/driver.py).",
        "import numba", "import numpy as np", *imports, "", "",
        njit_line(),
        "def _copy(dst, src):",
        "    d, s = dst.reshape(-1), src.reshape(-1)",
        "    for i in range(d.size):",
        "        d[i] = s[i]", "", "",
        njit_line(),
        "def _add(dst, src):",
        "    d, s = dst.reshape(-1), src.reshape(-1)",
        "    for i in range(d.size):",
        "        d[i] += s[i]", "", "",
        njit_line(),
        "def _zero(dst):",
        "    d = dst.reshape(-1)",
        "    for i in range(d.size):",
        "        d[i] = 0", "", "",
        njit_line(),
        f"def stretch({', '.join(params)}):", *body, ""])
    module, _ = load_source(source, f"captured_{_safe(program.name)}")
    return Stretch(module.stretch, array_slots, scalar_refs, start, stop, pools, list_slots)


def _alternating_run(ops: list[Any], j: int, storage: list[Any]) -> int:
    """The end of the run from ``ops[j]`` of launches of one kernel over one ndrange with
    the same scalars, whose arrays repeat every second launch."""
    first = ops[j]
    if first.kind != "launch":
        return j + 1
    end = j + 1
    while end < len(ops) and _same_template(ops[end], first) and (
            end < j + 2 or all(ka != "a" or storage[a] == storage[b]
                               for (ka, a), (_, b) in zip(ops[end].refs, ops[end - 2].refs))):
        end += 1
    return end


def _same_template(op: Any, first: Any) -> bool:
    """Whether ``op`` launches what ``first`` launches (kernel, ndrange, scalars) on arrays
    in the same places."""
    return (op.kind == "launch" and first.kind == "launch" and _variant(op) is _variant(first)
            and op.nd == first.nd
            and all(ka == kb and (ka == "a" or _scalar_key(a) == _scalar_key(b))
                    for (ka, a), (kb, b) in zip(op.refs, first.refs)))


def _listed_run(ops: list[Any], j: int, storage: list[Any], frame: Any
                ) -> tuple[int, int, list[list[int]]]:
    """The longest run from ``ops[j]`` of whole periods of up to ``MOST_PERIOD`` launches
    repeated alike (kernels, ndranges, scalars) whose arrays at some positions differ from
    period to period (each such position a list of arrays of one Numba type): its end, its
    period, and per launch of the period those positions."""
    best: tuple[int, int, list[list[int]]] = (j + 1, 1, [[]])
    for period in range(1, MOST_PERIOD + 1):
        head = ops[j:j + period]
        if len(head) < period or any(op.kind != "launch" or _variant(op).lowered.pools
                                     for op in head):
            break
        end = j + period
        while end < len(ops) and _same_template(ops[end], ops[end - period]):
            end += 1
        end = j + (end - j) // period * period
        if end - j <= best[0] - j or end - j < LIST_FROM:
            continue
        varying = [_varying(ops[j + t:end:period], storage, frame) for t in range(period)]
        if all(v is not None for v in varying):
            best = (end, period, varying)
    return best


def _varying(phase: list[Any], storage: list[Any], frame: Any) -> list[int] | None:
    """The array positions where the launches ``phase`` differ (None: their arrays there are
    of more than one Numba type, which one list cannot hold)."""
    first, out = phase[0], []
    for pos, (kind, k) in enumerate(first.refs):
        if kind != "a" or all(storage[op.refs[pos][1]] == storage[k] for op in phase):
            continue
        if len({numba.typeof(frame.arrays[op.refs[pos][1]]) for op in phase}) > 1:
            return None
        out.append(pos)
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)[:40]

