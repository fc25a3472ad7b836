"""Numba's on-disk cache for tapegrad's dispatchers: in tapegrad's cache folder, and checked.

``numba.njit(cache=True)`` keeps an index (``.nbi``) and machine code (``.nbc``), both pickles,
next to the function's source file: for tapegrad's own functions that is the installed package
(where a folder left by ``pip install .`` shadows a later editable install), and Numba
unpickles whatever it finds there.  tapegrad's dispatchers get a cache of their own kind:

* :class:`Locator` keeps the files in tapegrad's cache folder (:mod:`~tapegrad.backends.cachedir`):
  a generated module's beside it, a function of the package's under ``numba/<folder>_<hash>``;
* a file is unpickled only if it can be trusted (yours or root's, not writable by others);
* an entry that cannot be loaded (truncated, garbage) is removed with a
  :class:`~tapegrad.errors.CacheWarning` and compiled again;
* nothing is saved into a folder this process cannot write (a read-only cache), and new files
  are created 0600.

Write :func:`njit` instead of ``numba.njit(cache=True)``; :func:`adopt` does the same for a
generated module's dispatchers.  Importing this module also puts :class:`Locator` first in
Numba's own list of locators, so that a plain ``cache=True`` in tapegrad's files stays out of
the package too (checked there by the folder rules only).

>>> from tapegrad.backends import cachedir
>>> from tapegrad.backends.cpu.copies import transposed
>>> type(transposed._cache).__name__
'TapegradFunctionCache'
>>> Path(transposed.stats.cache_path).parts[-2]
'numba'
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import sys
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numba
from numba.core import caching

from tapegrad.backends import cachedir
from tapegrad.errors import CacheError, CacheWarning

_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


class Locator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Places the cache of a function from tapegrad's package or from a generated module in
    tapegrad's cache folder; claims no other function."""

    def __init__(self, py_func: Callable, py_file: str):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(_folder_for(py_file))

    def get_cache_path(self) -> str:
        return self._cache_path

    def ensure_cache_path(self) -> None:
        cachedir.make_private(Path(self._cache_path))

    @classmethod
    def from_function(cls, py_func: Callable, py_file: str) -> Locator | None:
        ours = (os.path.realpath(py_file).startswith(_PACKAGE)
                or cachedir.is_ours(os.path.dirname(py_file)))
        return cls(py_func, py_file) if ours else None


def _folder_for(py_file: str) -> Path:
    folder = os.path.dirname(py_file)
    if cachedir.is_ours(folder):
        return Path(folder)                  # a generated module: its entries beside it
    try:
        base = cachedir.cache_dir()
    except CacheError:
        base = cachedir.private_dir()        # refused: the error is raised where kernels compile
    return base / "numba" / Locator.get_suitable_cache_subpath(py_file)


class _Checked:
    """Mixed into a Numba cache class (the CPU's or CUDA's): the checks of the module docstring."""

    def __init__(self, py_func: Callable):
        super().__init__(py_func)
        # Numba creates its files 0666 less the umask; a group-writable one would not be trusted
        self._cache_file._open_for_write = _create_private

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        # the index, then the one data file it names for ``sig``: each checked before it is
        # unpickled (by name: listing a cache folder of 10^5 files took 0.15 s a load)
        cache_file = self._cache_file
        try:
            why = _distrust(cache_file._index_path)
            if not why:
                key = self._index_key(sig, target_context.codegen())
                name = cache_file._load_index().get(key)
                why = _distrust(cache_file._data_path(name)) if name else None
        except Exception as e:      # a truncated or garbled index
            why = (f"an entry in {self.cache_path} could not be loaded "
                   f"({type(e).__name__}: {e})")
        if why:
            return self._discard(why)
        try:
            return super().load_overload(sig, target_context)
        except Exception as e:      # a truncated or garbled entry fails in many ways
            return self._discard(f"an entry in {self.cache_path} could not be loaded "
                                 f"({type(e).__name__}: {e})")

    def save_overload(self, sig: Any, data: Any) -> None:
        if not cachedir.can_write(Path(self.cache_path)):
            return                  # a read-only cache: this process keeps the code in memory
        try:
            super().save_overload(sig, data)
        except OSError as e:
            warnings.warn(f"tapegrad could not save compiled code in {self.cache_path} ({e}); "
                          "it runs, and is compiled again by the next process",
                          CacheWarning, stacklevel=2)

    def holds(self, sig: Any, target_context: Any) -> bool:
        """Whether this function's trusted index lists an entry for ``sig`` (nothing loaded)."""
        try:
            if _distrust(self._cache_file._index_path):
                return False
            key = self._index_key(sig, target_context.codegen())
            return key in self._cache_file._load_index()
        except Exception:           # unreadable: the load that follows says what is wrong
            return False

    def _files(self) -> list[str]:
        """This function's index and data files (by listing the folder: only to remove them)."""
        base = os.path.join(self.cache_path, self._impl.filename_base)
        return glob.glob(glob.escape(base) + "*.nb[ic]")

    def _discard(self, why: str) -> None:
        warnings.warn(f"tapegrad's compile cache: {why}; removed this function's entries, "
                      "compiling it again", CacheWarning, stacklevel=3)
        for path in self._files():
            with contextlib.suppress(OSError):
                os.unlink(path)


def _distrust(path: str) -> str | None:
    """Why the cache file ``path`` cannot be trusted; None where it can, or is missing."""
    try:
        reason = cachedir.untrusted(path)
    except FileNotFoundError:
        return None
    return f"{path} {reason}" if reason else None


@contextlib.contextmanager
def _create_private(filepath: str) -> Iterator[BinaryIO]:
    """Numba's ``_open_for_write`` (a temporary file renamed over ``filepath``), created 0600."""
    tmp = f"{filepath}.tmp.{uuid.uuid4().hex[:16]}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, filepath)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@functools.cache
def _checked(base: type) -> type:
    """``base`` (Numba's ``FunctionCache``) with :class:`_Checked`
    mixed in and :class:`Locator` its only locator."""
    impl = type(f"Tapegrad{base._impl_class.__name__}", (base._impl_class,),
                {"_locator_classes": [Locator], "__module__": __name__})
    return type(f"Tapegrad{base.__name__}", (_Checked, base),
                {"_impl_class": impl, "__module__": __name__})


def adopt(dispatcher: Any) -> None:
    """Give ``dispatcher``, if it caches (``cache=True``), tapegrad's checked cache instead."""
    cache = getattr(dispatcher, "_cache", None)
    if hasattr(type(cache), "_impl_class") and not isinstance(cache, _Checked):
        dispatcher._cache = _checked(type(cache))(dispatcher.py_func)


# IEEE arithmetic: ``1.0 / 0.0`` is ``inf`` and ``0.0 / 0.0`` is ``nan``, as in NumPy, C and
# OpenCL.  Numba's default ``error_model='python'`` raises ZeroDivisionError instead, and an
# exception raised in a parallel task is lost with the rest of that task's work (outputs left
# unwritten, no error); its checks also keep LLVM from vectorising divisions.
IEEE = {"error_model": "numpy"}

# Numba also builds a C-callable wrapper of every function (for ``numba.cfunc`` and functions
# passed as values); tapegrad calls none that way, and leaving it out saves about 3% of a
# kernel's compile time.
LEAN = {"no_cfunc_wrapper": True}


def njit_line(**options: Any) -> str:
    """The decorator line of a generated Numba function: cached, without the GIL, IEEE
    arithmetic, no C-callable wrapper, plus ``options`` (``parallel=True``, ``boundscheck=True``).

    >>> njit_line(parallel=True)
    "@numba.njit(cache=True, nogil=True, error_model='numpy', no_cfunc_wrapper=True, parallel=True)"
    """
    settings = {"cache": True, "nogil": True, **IEEE, **LEAN, **options}
    return f"@numba.njit({', '.join(f'{k}={v!r}' for k, v in settings.items())})"


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` whose dispatcher caches as this module describes (``cache=True`` implied)
    and computes IEEE values (``error_model='numpy'``), without a C-callable wrapper:
    ``@njit`` or ``@njit(nogil=True, ...)``."""
    if args:
        return njit(**options)(*args)

    def decorate(func: Callable) -> Any:
        dispatcher = numba.njit(cache=True, **{**IEEE, **LEAN, **options})(func)
        adopt(dispatcher)
        return dispatcher
    return decorate


def claim_numba_locators() -> None:
    """Put :class:`Locator` first among Numba's locators."""
    module = sys.modules.get("numba.core.caching")
    impl = getattr(module, "CacheImpl", None) or getattr(module, "_CacheImpl", None)
    if impl is not None and Locator not in impl._locator_classes:
        impl._locator_classes.insert(0, Locator)


claim_numba_locators()
