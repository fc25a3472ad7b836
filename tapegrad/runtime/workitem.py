"""One work-item of a kernel run in Python on the host, line by line: which statement of the
kernel (or of a device function it calls) first made a NaN or an infinity.

``tg.debug_nans`` (nans.py) asks it after a primal launch wrote a new non-finite element.  The
work-item that wrote element ``k`` is known to be work-item ``k`` only where the array has the
launch's shape and every write into it is at the work-item's own global index (ad/ownership.py's
test of an index: ``out[i]``, not ``out[(i + 1) % n]`` nor an atomic); elsewhere the answer is
an ``Unattributed`` saying so.  The kernel's own Python function runs on host copies of the
arguments, with ``tg.index()`` and the other kernel-language functions answering for that
work-item (``lang.intrinsics.emulated``), under a line tracer: the first line after which a
local variable or the bad element holds a new NaN or infinity (a local's infinity only where
the line made it from finite values: not ``m = -math.inf``), or which raises (Python's
``math.sqrt(-1.0)``, ``1 / 0`` on ints), is the statement.  Python's arithmetic is not the
device's in every corner (integer division by zero, rounding of float32), so this names a
statement, not a value; None where it cannot (barriers, local memory).
"""

from __future__ import annotations

import ast
import copy
import linecache
import os
import re
import sys
from typing import Any

import numpy as np

from tapegrad.ad import normalize
from tapegrad.ad.ownership import own_index_reads
from tapegrad.backends.registry import kind_of
from tapegrad.frontend import kernel_ir
from tapegrad.lang.intrinsics import Global, Group, Linear, Local, NTuple, emulated
from tapegrad.lang.kernel import KernelFunction
from tapegrad.runtime.nans import Unattributed


class _CannotRun(Exception):
    """What this work-item does cannot be run alone (a barrier, local memory)."""


class _Found(Exception):
    def __init__(self, filename: str, line: int):
        self.filename, self.line = filename, line


class WorkItem:
    """The answers of the kernel-language functions for one work-item."""

    def __init__(self, index: tuple[int, ...], nd: tuple[int, ...], groupsize: tuple[int, ...]):
        self.g, self.nd, self.wgs = index, nd, groupsize

    def index(self, space: Any = Global, kind: Any = Linear) -> Any:
        if space is Local:
            idx, shape = tuple(g % w for g, w in zip(self.g, self.wgs)), self.wgs
        elif space is Group:
            idx = tuple(g // w for g, w in zip(self.g, self.wgs))
            shape = tuple(-(-n // w) for n, w in zip(self.nd, self.wgs))
        else:
            idx, shape = self.g, self.nd
        if kind is NTuple:
            return idx
        return int(np.ravel_multi_index(idx, shape))

    def groupsize(self) -> tuple[int, ...]:
        return self.wgs

    def ndrange(self) -> tuple[int, ...]:
        return self.nd

    def localmem(self, *args: Any) -> Any:
        raise _CannotRun("local memory")

    def synchronize(self) -> None:
        raise _CannotRun("a barrier")

    def private(self, dtype: Any, shape: Any) -> Any:
        return np.zeros(shape, dtype)

    def _atomic(self, arr: Any, idx: Any, v: Any, op: Any) -> Any:
        old = arr[idx]
        arr[idx] = op(old, v)
        return old

    def atomic_add(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, lambda a, b: a + b)

    def atomic_sub(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, lambda a, b: a - b)

    def atomic_min(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, min)

    def atomic_max(self, arr: Any, idx: Any, v: Any) -> Any:
        return self._atomic(arr, idx, v, max)


def statement(pyfunc: Any, args: tuple, nd: tuple[int, ...], groupsize: tuple[int, ...],
              written: int, flat: int, write_only: frozenset[int] = frozenset()) -> str | None:
    """``file:line: source`` of the statement with which the work-item that wrote element
    ``flat`` of argument ``written`` made it non-finite (``args`` as before the launch;
    ``write_only``: the positions of arrays the kernel only writes, whose old contents do not
    matter); an ``Unattributed`` where which work-item wrote it is not known; None where the
    statement cannot be told.  The element counts when it becomes NaN or infinite; a local
    variable, or a device function's return value, when it becomes NaN, or infinite from
    finite values (``_reads_infinity``: an infinity may be meant, ``m = -math.inf`` before a
    maximum, and what is computed from it is not made here)."""
    array = args[written]
    if tuple(array.shape) != tuple(nd):
        return Unattributed("{array} is not of the launch's shape")
    if not _written_at_own_index(pyfunc, written, len(nd)):
        return Unattributed("not every write into {array} is at a work-item's own index")
    copies = [np.array(kind_of(a).to_numpy(a)) if kind_of(a) is not None else a for a in args]
    for k in write_only:
        if copies[k].dtype.kind == "f":
            copies[k][~np.isfinite(copies[k])] = 0.0
    target = copies[written].reshape(-1)
    index = tuple(int(i) for i in np.unravel_index(flat, nd))
    user_files = {pyfunc.__code__.co_filename}
    frames_seen: dict[Any, int] = {}     # frame -> its line running now
    before: dict[Any, dict[str, Any]] = {}   # frame -> its locals before that line
    given_infinity: set[Any] = set()     # frames a device function returned one to, that line
    already_bad = not np.isfinite(target[flat])   # (non-finite before: not new)
    sources: dict[str, list[ast.stmt]] = {}

    def made_bad(frame: Any, line: int, value: Any, old: Any) -> bool:
        """Whether ``value``, after ``line`` (``old`` before it), is a new NaN, or a new
        infinity made there from finite values."""
        if not _is_float(value) or np.isfinite(value) or (_is_float(old)
                                                          and not np.isfinite(old)):
            return False
        return bool(np.isnan(value)) or not (frame in given_infinity or _reads_infinity(
            _statement_at(sources, frame.f_code.co_filename, line), frame, before[frame]))

    def bad_now(frame: Any, line: int) -> bool:
        old = before[frame]
        for name, value in frame.f_locals.items():
            if made_bad(frame, line, value, old.get(name)):
                return True
        return not already_bad and not np.isfinite(target[flat])

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code.co_filename not in user_files and not _is_device_function(frame):
            return None
        user_files.add(code.co_filename)
        if event == "line" or event == "return":
            last = frames_seen.get(frame)
            if last is not None and (bad_now(frame, last) or event == "return"
                                     and made_bad(frame, last, arg, None)):
                raise _Found(code.co_filename, last)
            if event == "line":
                frames_seen[frame] = frame.f_lineno
                before[frame] = dict(frame.f_locals)
                given_infinity.discard(frame)
            elif _is_float(arg) and not np.isfinite(arg):   # (an infinity it did not make)
                caller = frame.f_back
                while caller is not None and caller not in frames_seen:
                    caller = caller.f_back      # (past tg.func's __call__)
                given_infinity.add(caller)
        elif event == "exception" and not isinstance(arg[1], (_Found, _CannotRun)):
            raise _Found(code.co_filename, frame.f_lineno)
        return tracer

    token = emulated.set(WorkItem(index, tuple(nd), tuple(groupsize)))
    old = sys.gettrace()
    try:
        with np.errstate(all="ignore"):
            sys.settrace(tracer)
            try:
                pyfunc(*copies)
            finally:
                sys.settrace(old)
    except _Found as found:
        text = re.sub(r"\s+#.*$", "", linecache.getline(found.filename, found.line).strip())
        return f"{os.path.basename(found.filename)}:{found.line}: {text}"
    except Exception:     # (_CannotRun, or Python refusing what the device computes)
        return None
    finally:
        emulated.reset(token)
    return None


def _written_at_own_index(pyfunc: Any, k: int, rank: int) -> bool:
    """Whether the kernel writes its ``k``-th parameter only at the work-item's own global
    index: every store into it (device functions inlined) passes ad/ownership.py's test of an
    index, asked of the stores (the body with the loads and stores of subscripts swapped), and
    no call is given it (an atomic)."""
    try:
        ir = normalize(kernel_ir(KernelFunction(pyfunc)), kernel_ir)
    except Exception:       # (it ran: not expected)
        return False
    if k >= len(ir.params):
        return False
    array = ir.params[k]
    body = copy.deepcopy(ir.body)
    for n in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(n, ast.Call) and any(isinstance(a, ast.Name) and a.id == array
                                           for a in n.args):
            return False
        if isinstance(n, ast.Subscript):
            n.ctx = ast.Load() if isinstance(n.ctx, ast.Store) else ast.Store()
    return own_index_reads(body, {}, rank).get(array) == "plain"


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, np.floating))


def _statement_at(sources: dict[str, list[ast.stmt]], filename: str, line: int
                  ) -> ast.stmt | None:
    """The innermost statement of ``filename`` that ``line`` is part of (None where its
    source cannot be parsed)."""
    if filename not in sources:
        try:
            tree = ast.parse("".join(linecache.getlines(filename)))
            sources[filename] = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
        except (SyntaxError, ValueError):
            sources[filename] = []
    around = [s for s in sources[filename]
              if s.lineno <= line <= (s.end_lineno or s.lineno)]
    return max(around, key=lambda s: (s.lineno, -(s.end_lineno or s.lineno)), default=None)


def _reads_infinity(node: ast.stmt | None, frame: Any, locals_before: dict[str, Any]) -> bool:
    """Whether statement ``node`` of ``frame``'s function reads an infinity: a constant
    (``math.inf``, a module's ``NEG = -math.inf``, ``1e999``), or a local, argument or
    array element that held one before it.  True where that cannot be told (its source not
    found): an infinity is then not blamed on it."""
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr)):
        parts = [node.value] if node.value is not None else []
    elif isinstance(node, ast.AugAssign):
        target = copy.deepcopy(node.target)
        for n in ast.walk(target):
            if hasattr(n, "ctx"):
                n.ctx = ast.Load()
        parts = [target, node.value]
    elif isinstance(node, (ast.If, ast.While)):
        parts = [node.test]
    elif isinstance(node, ast.For):
        parts = [node.iter]
    else:
        return True
    for part in parts:
        for n in ast.walk(part):
            if isinstance(n, ast.Constant):
                value = n.value
            elif isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(
                    n.ctx, ast.Load) and not any(isinstance(c, ast.Call) for c in ast.walk(n)):
                try:                # (calls are not run again: an atomic would be)
                    value = eval(compile(ast.Expression(body=n), "<input>", "eval"),
                                 frame.f_globals, locals_before)
                except Exception:
                    continue
            else:
                continue
            if _is_float(value) and np.isinf(value):
                return True
    return False


def _is_device_function(frame: Any) -> bool:
    """Whether ``frame`` runs a ``@tg.func``'s Python (called from the kernel's): the module
    of the kernel's callees is the user's, not tapegrad's or the standard library's."""
    filename = frame.f_code.co_filename
    return not (filename.startswith("<") or "site-packages" in filename
                or filename.startswith(os.path.dirname(os.__file__))
                or filename.startswith(os.path.dirname(os.path.dirname(__file__))))
