"""Numba compiles generated kernels in a child process; this process loads the machine code.

A function that Numba compiles in this process keeps its optimised LLVM module in Numba's
execution engine for the life of the process (Numba does not remove modules: LLVM's
``removeModule`` crashed for it), many times what the same function costs when loaded from
Numba's on-disk cache (measured: CHANGELOG.md, 'the figures that moved').  A
long session, or a test suite, that compiles a thousand kernel variants would hold gigabytes.
So the first launch of a generated function with new argument types asks a compiler process
to compile it into the cache (:func:`main`), and then loads it from there as a later process
would.  The compiler process is started on first need, is replaced once it holds
more than ``RETIRE_MB`` of memory, and ends with this process.

The child reads the generated module from the cache folder by its path, only if the file is
trusted (:mod:`~tapegrad.backends.cachedir`) and holds the code its name's hash stands for.
Where anything goes wrong (the child fails to compile, dies, or cannot start; a cache that
this process cannot write), the function is compiled here as before: errors are reported
the usual way, at the user's line.  ``TAPEGRAD_COMPILE_PROCESS=0`` compiles everything here.

>>> enabled() in (True, False)
True
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

from tapegrad.backends import cache, cachedir

RETIRE_MB = 1024          # a compiler process holding more is replaced (a few s to start)


def enabled() -> bool:
    """Whether first launches compile in a compiler process (``TAPEGRAD_COMPILE_PROCESS``)."""
    return os.environ.get("TAPEGRAD_COMPILE_PROCESS", "1") != "0"


def compile_elsewhere(dispatcher: Any, args: tuple) -> bool:
    """Have the compiler process put ``dispatcher``'s code for ``args`` in the on-disk cache,
    where the call that follows finds it; True if it is there.  False (compile here) for a
    function that is not a generated module's, one in a cache this process cannot write
    (a read-only cache's new modules are written to this process's private folder, and
    compiled from there), or any failure in the compiler process."""
    if not enabled():
        return False
    module = sys.modules.get(getattr(dispatcher.py_func, "__module__", ""))
    path = Path(getattr(module, "__file__", "") or ".")
    numba_cache = getattr(dispatcher, "_cache", None)
    if not path.name.startswith(cache.PREFIX) or not hasattr(numba_cache, "holds"):
        return False
    try:
        if path.parent != cachedir.write_dir():
            return False
        sig = tuple(dispatcher.typeof_pyval(a) for a in args)
        if numba_cache.holds(sig, dispatcher.targetctx):
            return True
    except Exception:
        return False
    return _compiler.run((str(cachedir.root()), str(path), dispatcher.py_func.__name__, sig))


class _Compiler:
    """The compiler process, seen from this one: one request at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.owner = 0               # the pid that started it (a forked child starts its own)
        self.answered = False        # whether it has answered once
        self.broken = False          # one could not start, or died before answering: not again

    def run(self, request: tuple) -> bool:
        with self.lock:
            if self.broken:
                return False
            if self.proc is not None and (self.owner != os.getpid()
                                          or self.proc.poll() is not None):
                self.proc = None                # a fork's parent's, or it ended since (killed)
            try:
                if self.proc is None:
                    self.start()
                pickle.dump(request, self.proc.stdin)
                self.proc.stdin.flush()
                ok, rss_mb = pickle.load(self.proc.stdout)
            except Exception:               # it died (or never started): compile here
                self.broken = not self.answered
                self.stop()
                return False
            self.answered = True
            if rss_mb > RETIRE_MB:
                self.stop()
            return bool(ok)

    def start(self) -> None:
        self.answered = False
        self.owner = os.getpid()
        self.proc = subprocess.Popen([sys.executable, "-c", f"import {__name__} as m; m.main()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def stop(self) -> None:
        """End the compiler process: it exits at the end of its input (not waited for: its
        teardown takes most of a second)."""
        proc, self.proc = self.proc, None
        if proc is not None:
            try:
                proc.stdin.close()
            except OSError:
                proc.kill()
            threading.Thread(target=proc.wait, daemon=True).start()   # reaped, not waited


_compiler = _Compiler()
atexit.register(_compiler.stop)


# --- the compiler process -------------------------------------------------------------------

class _GeneratedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import tapegrad_gen_...`` (a generated module importing another) in the compiler
    process: from the cache folder, through :func:`~tapegrad.backends.cache.load_file`."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if not name.startswith(cache.PREFIX):
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: Any) -> ModuleType:
        for folder in _folders:         # (the serving process's private folder first)
            if (folder / f"{spec.name}.py").is_file():
                return cache.load_file(folder / f"{spec.name}.py")
        return cache.load_file(cachedir.cache_dir() / f"{spec.name}.py")

    def exec_module(self, module: ModuleType) -> None:
        pass


_folders: list[Path] = []     # private folders of the process served, adopted


def _serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """Compile what each request names into the cache; answer (ok, resident MB)."""
    sys.meta_path.insert(0, _GeneratedFinder())
    while True:
        try:
            root, path, symbol, sig = pickle.load(requests)
        except EOFError:
            return
        try:
            os.environ["TAPEGRAD_CACHE_DIR"] = root
            home = cachedir.cache_dir()      # hands the folder out: its modules may be loaded
            folder = Path(path).parent
            if folder != home and folder not in _folders:
                # (a read-only cache: the module is in the served process's private folder,
                # its compiled code is saved beside it, where that process loads it from)
                cachedir.adopt(folder)
                _folders.insert(0, folder)
            dispatcher = getattr(cache.load_file(Path(path)), symbol)
            dispatcher.compile(sig)          # saves to the cache (a checked one: adopt)
            ok = dispatcher._cache.holds(sig, dispatcher.targetctx)
        except Exception:                    # reported by the compile that follows, here
            ok = False
        pickle.dump((ok, _resident_mb()), replies)
        replies.flush()


def _resident_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def main() -> None:
    """The compiler process: requests on stdin, replies on stdout."""
    # the replies get their own copy of stdout; what Numba or a module prints goes to stderr
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)
