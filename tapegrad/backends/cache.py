"""Generated source on disk, so that Numba's on-disk cache works across processes.

Numba caches compiled functions by their source file, which needs a real file: ``exec`` of a
string has none.  So every generated module is written to
``<cache dir>/tapegrad_gen_<name>_<hash>.py`` (:mod:`~tapegrad.backends.cachedir` says where
and when that folder is trusted) and run from there.  It is not imported: ``importlib`` would
run a ``__pycache__/*.pyc`` beside it that tapegrad never checked.  Instead the source text
that tapegrad just generated is compiled and executed into a fresh module whose ``__file__``
is that path (for Numba's cache, ``inspect`` and tracebacks); the file is used only when it
holds exactly that text, and is otherwise removed and written again with a
:class:`~tapegrad.errors.CacheWarning`.  The module's dispatchers then get tapegrad's checked
Numba cache (:mod:`~tapegrad.backends.numba_cache`).

>>> module, path = load_source("import numba\\n\\n@numba.njit(cache=True)\\n"
...                            "def f(x):\\n    return x + 1\\n", "doc_example")
>>> module.f(41), path.name.startswith("tapegrad_gen_doc_example_")
(42, True)
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from types import ModuleType

from tapegrad.backends import cachedir, numba_cache

PREFIX = "tapegrad_gen_"     # every generated module's name starts so


# One module runs at a time: a module is in ``sys.modules`` before its code has run (other
# generated modules import it), so a second thread finding it there could take it half
# built (its kernel function not defined yet: a bare AttributeError on a first launch from
# two threads).  Re-entrant: a module's code may load another.
_LOCK = threading.RLock()
_running: dict[str, int] = {}    # the modules whose code is running -> the thread running it


def _loaded(modname: str) -> ModuleType | None:
    """A module that has run (or runs in this thread: one it imports needs it)."""
    module = sys.modules.get(modname)
    if module is None or _running.get(modname, threading.get_ident()) != threading.get_ident():
        return None
    return module


def load_source(source: str, name: str) -> tuple[ModuleType, Path]:
    """The module that ``source`` defines (once per process), run from its file in the cache."""
    modname = f"{PREFIX}{name}_{_digest(source)}"
    module = _loaded(modname)
    if module is not None:
        return module, Path(module.__file__)
    with _LOCK:
        module = sys.modules.get(modname)
        if module is not None:
            return module, Path(module.__file__)
        path = _source_file(source, f"{modname}.py")
        return _run(source, path), path


def load_file(path: Path) -> ModuleType:
    """The generated module in ``path`` (once per process), written earlier by
    :func:`load_source` (here or in another process); ImportError if the file is not trusted
    or does not hold the code its name's hash stands for."""
    module = _loaded(path.stem)
    if module is not None:
        return module
    with _LOCK:
        module = sys.modules.get(path.stem)
        return module if module is not None else _checked_run(path)


def _checked_run(path: Path) -> ModuleType:
    reason = cachedir.untrusted(path)
    source = path.read_text(encoding="utf-8") if reason is None else ""
    if reason is None and not path.stem.endswith(f"_{_digest(source)}"):
        reason = "does not hold the code its name stands for (damaged)"
    if reason:
        raise ImportError(f"tapegrad's compile cache: {path} {reason}")
    return _run(source, path)


def _digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def _run(source: str, path: Path) -> ModuleType:
    """A fresh module named after ``path`` running ``source``; its dispatchers get tapegrad's
    checked Numba cache."""
    modname = path.stem
    module = ModuleType(modname)
    module.__file__ = str(path)
    numba_cache.claim_numba_locators()
    sys.modules[modname] = module        # before running it: other generated modules import it
    _running[modname] = threading.get_ident()
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[modname]
        raise
    finally:
        del _running[modname]
    for value in list(vars(module).values()):
        if getattr(getattr(value, "py_func", None), "__module__", None) == modname:
            numba_cache.adopt(value)
    return module


def _source_file(source: str, filename: str) -> Path:
    """A trusted file holding exactly ``source``: the cache's, or one written now."""
    home, target = cachedir.cache_dir(), cachedir.write_dir()
    for folder in dict.fromkeys((home, target)):
        if _holds(folder / filename, source):
            return folder / filename
    path = target / filename
    cachedir.write_atomic(path, source.encode("utf-8"))
    return path


def _holds(path: Path, source: str) -> bool:
    """Whether ``path`` is trusted and holds exactly ``source``; a file that is not trusted or
    holds something else (its name carries the hash of ``source``: damaged) is removed."""
    return cachedir.read_checked(path, lambda data: data.decode("utf-8") == source,
                                 "does not hold the code its name stands for (damaged)",
                                 "writing it again") is not None
