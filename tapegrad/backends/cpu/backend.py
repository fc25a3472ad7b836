"""``tg.CPU()``: kernels compiled by Numba, one parallel task per workgroup."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import numba
import numba.np.ufunc.parallel as _parallel
import numpy as np
from numba.core.errors import NumbaError

from tapegrad.backends.base import Backend, host_fma
from tapegrad.backends.cache import load_source
from tapegrad.backends.compiler_process import compile_elsewhere
from tapegrad.backends.cpu.arrays import NUMPY
from tapegrad.backends.cpu.chain import ChainRunner
from tapegrad.backends.cpu.index_report import REPLAY_ITEMS, report
from tapegrad.backends.cpu.lower import lower_kernel
from tapegrad.backends.cpu.outline import one_group_line
from tapegrad.backends.cpu.passes import NAMES, switched_off
from tapegrad.backends.cpu.rows import with_cpu_groupsize
from tapegrad.backends.cpu.sums import SUM_SLOTS
from tapegrad.backends.cpu.threads import thread_count
from tapegrad.backends.cpu.transposed import SUFFIX, transposed_operands
from tapegrad.backends.determinism import CHUNKS, DETERMINISTIC
from tapegrad.backends.launch_chain import LaunchChain
from tapegrad.backends.notice import compiling
from tapegrad.backends.numba_lower import Lowered, compile_error
from tapegrad.backends.registry import offers_cuda_interface
from tapegrad.errors import KernelCompileError, KernelIndexError, LaunchError, TapegradError
from tapegrad.frontend.types import TypedKernel

_DEFAULT_GROUPSIZE = {1: (1024,), 2: (16, 64), 3: (4, 8, 32)}
_POOL_BYTES = 16 << 20    # per-task copies kept between launches up to this size
_POOLS_KEPT = 4           # ... and this many per kernel (larger ones: new memory per launch,
                          # a small cost next to the work they come with)


_NOTHING_OFF = switched_off(())


class CPU(Backend):
    """The default backend: NumPy arrays, kernels compiled for all CPU cores by Numba.

    ``without`` names optimisation passes to leave out (``tapegrad.backends.cpu.passes``
    lists them; for debugging, or to measure what one gains); the results are the same.

    >>> import tapegrad as tg
    >>> tg.CPU()
    CPU()
    >>> tg.CPU(without=["outline"])
    CPU(without=('outline',))
    """

    name = "cpu"
    arrays = NUMPY
    # a workgroup is a loop here, but its local memory is allocated per task: 2**40 items'
    # tile failed inside Numba as "a tapegrad bug" (GPUs allow 1024-4096)
    max_group_items = 1 << 20
    scalar_sum_size = SUM_SLOTS        # (an Active scalar's sum: a slot per task, sums.py)

    def __init__(self, without: Iterable[str] = ()):
        # (tg.CPU() is often made per launch, in a simulation's loop: the common case free)
        self.without = _NOTHING_OFF if without == () else switched_off(without)

    def key(self) -> tuple:
        return (self.without,)

    @property
    def fast_fma(self) -> bool:
        return host_fma()

    def __repr__(self) -> str:
        if not self.without:
            return "CPU()"
        return f"CPU(without={tuple(n for n in NAMES if n in self.without)!r})"

    def asarray(self, x: Any) -> np.ndarray:
        if offers_cuda_interface(x) and hasattr(x, "get"):
            x = x.get()
        return np.array(x, copy=True)

    def default_groupsize(self, rank: int) -> tuple[int, ...]:
        return _DEFAULT_GROUPSIZE[rank]

    def tune_adjoint(self, ir: Any, argtypes: tuple, groupsize: tuple[int, ...]
                     ) -> tuple[Any, tuple]:
        """Transposed tiles read from a transposed array (``transposed.py``); the new
        parameters have their source's type."""
        if "transposed" in self.without:
            return ir, argtypes
        tuned = transposed_operands(ir, groupsize)
        if tuned is ir:
            return ir, argtypes
        return tuned, argtypes + tuple(argtypes[ir.params.index(p[:-len(SUFFIX)])]
                                       for p in tuned.params[len(ir.params):])

    def compile(self, tk: TypedKernel) -> Callable[..., None]:
        # rows of the CPU's choosing, where nothing can tell
        rows = tk if "rows" in self.without else with_cpu_groupsize(tk)
        if rows is tk:
            return _compile(tk, self.without)
        # both lowered now, from the kernel's IR as it is (a typed kernel refers to it node
        # by node); Numba compiles each variant on its first launch
        return _ByLaunchSize(_compile(tk, self.without), _compile(rows, self.without))


def _compile(tk: TypedKernel, without: frozenset[str]) -> _Launcher:
    lowered = lower_kernel(tk, without)
    module, path = load_source(lowered.source, tk.name)
    launcher = _Launcher(getattr(module, lowered.symbol), lowered, str(path), tk.groupsize)
    if lowered.one_group is not None:
        task = getattr(module, f"{lowered.symbol}__task")
        rank = len(tk.groupsize)
        line = one_group_line(lowered.one_group, "TASK", [f"args[{k}]" for k in range(
            len(tk.ir.params))], [f"nd[{d}]" for d in range(rank)], "n")
        launcher.one_group = eval(f"lambda args, nd, n: {line}", {"TASK": task})
    return launcher


class _ByLaunchSize:
    """A kernel the CPU may run in rows of its own choosing (``tapegrad.backends.cpu.rows``):
    launches of ``ROWS_FROM`` work-items or more whose rows (the last dimension) have
    ``ROW_FROM`` or more run that variant; the others the launch's groupsize, where the
    grouping costs little (small launches) or a long row would be mostly empty (narrow
    arrays: an Active scalar's per-group sum of a (262144, 1) launch runs far slower in rows
    than in its own (256, 1) groups; measured: CHANGELOG.md, 'the figures that
    moved')."""

    ROWS_FROM = 16384
    ROW_FROM = 256

    def __init__(self, launch_groups: _Launcher, rows: _Launcher):
        self.launch_groups = launch_groups
        self.rows = rows
        self.last = launch_groups
        self.variant_of: dict[tuple[int, ...], _Launcher] = {}    # ndrange -> the variant
        # one set of per-thread copies for both (same arrays, same shapes; each launch
        # leaves them zero), not one per variant
        rows.pool_cache = launch_groups.pool_cache

    @property
    def source(self) -> str:
        """The code the last launch ran."""
        return self.last.source

    def chain_runner(self, n_args: int, x_slot: int, y_slot: int,
                     states: tuple[int, ...] = ()) -> ChainRunner | LaunchChain | None:
        """The last launch's variant's compiled loop (``_Launcher.chain_runner``); where the
        arguments at ``states`` change each step (given per step), a Python loop of this
        launcher's launches, each as the sweep would launch it."""
        if states:
            return LaunchChain(self, n_args, x_slot, y_slot, states=states)
        return self.last.chain_runner(n_args, x_slot, y_slot)

    def variant(self, ndrange: tuple[int, ...]) -> _Launcher:
        """The variant a launch over ``ndrange`` runs."""
        run = self.variant_of.get(ndrange)
        if run is None:
            items = 1
            for n in ndrange:
                items *= n
            run = self.rows if items >= self.ROWS_FROM and ndrange[-1] >= self.ROW_FROM \
                else self.launch_groups
            if len(self.variant_of) < 64:
                self.variant_of[ndrange] = run
        return run

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        run = self.variant_of.get(ndrange) or self.variant(ndrange)
        self.last = run
        run(args, ndrange)


def _thread_count() -> int:
    """``numba.get_num_threads()`` without its per-call locks (a third of a microsecond per
    launch): once the threading layer is up, Numba's own C function answers."""
    ask = getattr(_parallel, "_get_num_threads", None)
    n = ask() if ask is not None else 0
    return n if n > 0 else numba.get_num_threads()


def launch_threads() -> int:
    """The threads the next launch runs on: Numba's count, at most the cores this process is
    granted (:mod:`tapegrad.backends.cpu.threads`)."""
    return thread_count.for_launch(_thread_count())


def pool_shape(a: np.ndarray, nd: int, ndrange: tuple[int, ...], chunks: int) -> tuple:
    """The shape of the per-task copies of ``a`` (rank ``nd``) a launch over ``ndrange`` in
    ``chunks`` tasks adds into (``_Launcher.pools``)."""
    items = 1
    for n in ndrange:
        items *= n
    return (chunks,) + a.shape if chunks * a.size <= 8 * items else (1,) * (nd + 1)


class _Launcher:
    """Calls a compiled kernel; the first call compiles it (and reports failures at the
    user's line)."""

    def __init__(self, dispatcher: Any, lowered: Lowered, path: str, groupsize: tuple[int, ...]):
        self.dispatcher = dispatcher
        self.lowered = lowered
        self.path = path
        self.groupsize = groupsize
        self.compiled = False
        self.checked = "boundscheck=True" in lowered.source
        self.pool_cache: dict[tuple, np.ndarray] = {}
        self.groups_of: dict[tuple[int, ...], tuple[int, ...]] = {}   # ndrange -> groups
        # a launch of one workgroup: its task called here, in this thread, where Numba's
        # parallel launch would wake the pool for one task (1.8-3.6 us on 2 idle cores,
        # far more on busy ones); set by _compile where the task allows
        self.one_group: Callable[[tuple, tuple, int], None] | None = None
        self.single = (1,) * len(groupsize)

    @property
    def source(self) -> str:
        return self.lowered.source

    threads = staticmethod(launch_threads)      # one parallel task per thread

    def chain_runner(self, n_args: int, x_slot: int, y_slot: int,
                     states: tuple[int, ...] = ()) -> ChainRunner | LaunchChain | None:
        """A compiled loop launching this kernel with two arguments swapped each step
        (:mod:`.chain`), for a tape's chains of replays; None for a kernel not compiled yet,
        one that checks bounds or one with per-task copies.  Where the arguments at
        ``states`` change each step (given per step): a Python loop of its launches."""
        if states:
            return LaunchChain(self, n_args, x_slot, y_slot, states=states)
        if not self.compiled or self.checked or self.lowered.pools \
                or self.lowered.unordered_atomics:    # (its sums' order: the threads')
            return None
        try:
            return ChainRunner(self, n_args, x_slot, y_slot)
        except Exception:    # (a kernel module that cannot be imported by name: go without)
            return None

    def __call__(self, args: tuple, ndrange: tuple[int, ...]) -> None:
        groups = self.groups_of.get(ndrange)
        if groups is None:
            groups = tuple(-(-n // w) for n, w in zip(ndrange, self.groupsize))
            if len(self.groups_of) < 64:
                self.groups_of[ndrange] = groups
        alone = groups == self.single and self.one_group is not None and self.compiled
        if alone and not DETERMINISTIC.on:
            try:
                self.one_group(args, ndrange, launch_threads())
                return
            except NumbaError:  # (its first call here met types that the kernel itself
                pass            # turns away by name: an int past 64 bits; it says so below)
            except BaseException as exc:
                self.stopped(exc)
        if DETERMINISTIC.on:
            chunks, pools, serial = self.ordered(args, ndrange)
        else:
            chunks, serial = launch_threads(), False      # one parallel task per thread
            pools = self.pools(args, ndrange, chunks) if self.lowered.pools else ()
        threads = 0
        if serial and numba.get_num_threads() > 1:
            threads = numba.get_num_threads()
            numba.set_num_threads(1)
        try:
            if self.compiled and not self.checked:
                self.dispatcher(*args, *ndrange, *groups, chunks, *pools)
                return
            self.first_call(args, ndrange, groups, chunks, pools)
        except BaseException as exc:
            self.stopped(exc)
        finally:
            if threads:
                numba.set_num_threads(threads)

    def stopped(self, exc: BaseException) -> None:
        """A launch raised ``exc``: ours and OverflowError (an int argument Numba could not
        pass) as they are, anything else as a tapegrad bug."""
        self.pool_cache.clear()     # a launch cut short may leave its copies dirty
        if isinstance(exc, (TapegradError, OverflowError)) or not isinstance(exc, Exception):
            raise exc
        # (generated code computes IEEE values and raises nothing; should anything still
        # raise inside a parallel task, the launch says so rather than Numba's internals)
        line = min(self.lowered.user_line.values(), default=None)
        raise LaunchError(
            f"{self.lowered.filename}:{line}: kernel {self.lowered.symbol} stopped with "
            f"{type(exc).__name__}: {exc}. Its outputs are partly written: do not use them. "
            f"This is a tapegrad bug; please report it with the generated code ({self.path})"
        ) from exc

    def ordered(self, args: tuple, ndrange: tuple[int, ...]) -> tuple[int, tuple, bool]:
        """Under ``tg.deterministic()`` (backends/determinism.py): the tasks, a number that
        depends on the shapes alone, not the threads (``CHUNKS``, fewer where per-task copies
        would not pay: as many as do), their copies, and whether they must run one after the
        other (the result would still depend on the order of atomics: into an array the
        kernel also reads, into copies too large even for two tasks, an old value used)."""
        chunks = CHUNKS
        if self.lowered.pools:
            items = 1
            for n in ndrange:
                items *= n
            for pos, _ in self.lowered.pools:
                chunks = min(chunks, max(1, 8 * items // max(args[pos].size, 1)))
        pools = self.pools(args, ndrange, chunks) if self.lowered.pools else ()
        serial = self.lowered.unordered_atomics or any(p.shape[0] == 1 for p in pools)
        return chunks, pools, serial

    def first_call(self, args: tuple, ndrange: tuple[int, ...], groups: tuple[int, ...],
                   chunks: int, pools: Any) -> None:
        """A launch that may compile, or that checks bounds: Numba's errors become ours."""
        try:
            if self.compiled:
                self.dispatcher(*args, *ndrange, *groups, chunks, *pools)
            else:
                full = (*args, *ndrange, *groups, chunks, *pools)
                with compiling(self.lowered.symbol,
                               key=(self.lowered.symbol, self.lowered.filename)):
                    compile_elsewhere(self.dispatcher, full)   # or here, by the call
                    self.dispatcher(*full)
        except IndexError:
            raise self.index_error(args, ndrange, (*ndrange, *groups, chunks, *pools)) from None
        except RecursionError:
            raise KernelCompileError(
                f"Numba's parallel-loop analysis recursed without end on the generated kernel "
                f"{self.path}. This is a tapegrad bug: please report it with your kernel and "
                "that file. Meanwhile TAPEGRAD_BOUNDSCHECK=1 compiles kernels without parallel "
                "loops (serial, with index checks), which avoids it",
                self.lowered.filename, min(self.lowered.user_line.values(), default=None)
            ) from None
        except Exception as exc:  # translate Numba's failures to the user's line
            from numba.core.errors import NumbaError
            if not isinstance(exc, NumbaError):
                raise
            raise self.translate(exc) from None
        self.compiled = True

    def pools(self, args: tuple, ndrange: tuple[int, ...], chunks: int) -> list[Any]:
        """The per-task copies of the arrays the kernel updates only atomically, when they
        pay (tasks x size <= 8 x work-items), else one element.  All zero, as each launch
        leaves them; kept for the next launch (per thread, a few shapes), so that a launch
        does not take fresh pages from the system and fault on each of them."""
        out = []
        for pos, nd in self.lowered.pools:
            a = args[pos]
            shape = pool_shape(a, nd, ndrange, chunks)
            key = (threading.get_ident(), pos, shape, a.dtype)
            pool = self.pool_cache.get(key)
            if pool is None:
                pool = np.zeros(shape, a.dtype)
                if pool.nbytes <= _POOL_BYTES:
                    self.pool_cache[key] = pool
                    while len(self.pool_cache) > _POOLS_KEPT:
                        try:                    # the oldest goes
                            self.pool_cache.pop(next(iter(self.pool_cache)), None)
                        except (StopIteration, RuntimeError):   # another thread was at it
                            break
            out.append(pool)
        return out

    def index_error(self, args: tuple, ndrange: tuple[int, ...], rest: tuple) -> KernelIndexError:
        """The out-of-bounds access of a bounds-checked launch, at the user's line with the
        array and the index when a replay finds them (:mod:`.index_report`)."""
        items = 1
        for n in ndrange:
            items *= n
        found = report(self.dispatcher.py_func, args, rest, items, self.lowered, self.path)
        what, line = found if found is not None else (None, None)
        where = f"{self.lowered.filename}:{line}: " if line else ""
        detail = f": {what}" if what else (
            "; check its indices against the array shapes and the ndrange (launches of up to "
            f"{REPLAY_ITEMS} work-items are replayed to name the line, array and index)")
        return KernelIndexError(f"{where}kernel {self.lowered.symbol} indexed outside an array "
                                f"(bounds checks are on: TAPEGRAD_BOUNDSCHECK=1){detail}")

    def translate(self, exc: Exception) -> KernelCompileError:
        return compile_error(exc, self.lowered, self.path, "Numba")
