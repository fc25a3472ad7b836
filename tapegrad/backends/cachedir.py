"""Where tapegrad keeps what it compiles, and when that folder can be trusted.

The folder is ``$TAPEGRAD_CACHE_DIR``, else ``$XDG_CACHE_HOME/tapegrad``, else
``~/.cache/tapegrad``; inside it, ``v<version>``.  What lies there is loaded as code (generated
modules, Numba's pickled index and machine code), so anyone who can write there can run code as
you.  The rules, the ones ``ssh`` applies to ``~/.ssh``:

* tapegrad creates its folders with mode 0700 and its files 0600;
* a folder or file must be owned by you or by root and not be writable by group or others;
  a folder that is not is refused with a :class:`~tapegrad.errors.CacheError`, a file is not
  loaded (see :mod:`tapegrad.backends.cache` and :mod:`tapegrad.backends.numba_cache`);
* a folder you cannot write (a cache baked into an image, owned by root) is read, and what is
  compiled anew goes to a private temporary folder of this process (:func:`write_dir`).

>>> import stat
>>> mine = os.stat_result((stat.S_IFDIR | 0o700, 0, 0, 0, 1000, 1000, 0, 0, 0, 0))
>>> unsafe(mine, uid=1000) is None
True
>>> shared = os.stat_result((stat.S_IFDIR | 0o1777, 0, 0, 0, 2000, 2000, 0, 0, 0, 0))
>>> unsafe(shared, uid=1000)
'is owned by uid 2000, not by you (uid 1000) or root'
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from tapegrad._version import __version__
from tapegrad.errors import CacheError, CacheWarning

_private: Path | None = None
_handed_out: set[str] = set()      # every folder cache_dir / write_dir returned: ours to load from


def root() -> Path:
    """The cache root the environment names (not created, not checked)."""
    named = os.environ.get("TAPEGRAD_CACHE_DIR")
    if named:
        return Path(os.path.abspath(named))     # a later chdir must not move it
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "tapegrad"


def unsafe(st: os.stat_result, uid: int | None) -> str | None:
    """Why a folder or file with status ``st`` cannot be trusted by user ``uid``; None if it can.

    Root is trusted (it can replace any file anyway); ``uid=None`` (no uids: Windows) trusts all.
    """
    if uid is None:
        return None
    if st.st_uid not in (uid, 0):
        return f"is owned by uid {st.st_uid}, not by you (uid {uid}) or root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {oct(stat.S_IMODE(st.st_mode))})"
    return None


def untrusted(path: str | os.PathLike) -> str | None:
    """Why the existing file or folder ``path`` cannot be trusted; None if it can."""
    return unsafe(os.stat(path), _uid())


def cache_dir() -> Path:
    """The checked, versioned cache folder, created 0700 where missing.

    Raises :class:`~tapegrad.errors.CacheError` for a folder that cannot be trusted; where the
    folder is missing and cannot be created (a read-only home), this process's private folder.
    """
    top = root()
    path = top / f"v{__version__}"
    try:
        top.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass                        # a read-only home: the folders below may still be there
    for folder in (top, path):      # the outer one checked before anything is made inside it
        try:
            folder.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            if not folder.is_dir():
                return private_dir()
        reason = untrusted(folder)
        if reason:
            raise CacheError(
                f"tapegrad's compile cache folder {folder} {reason}: whoever can write there "
                f"can run code as you, so tapegrad does not use it. Set TAPEGRAD_CACHE_DIR to a "
                f"folder of your own (tapegrad creates a missing one with mode 0700), or make "
                f"this one yours and private (chown to you, chmod 700).")
    _handed_out.add(str(path))
    return path


def write_dir() -> Path:
    """Where new compiled files go: :func:`cache_dir`, or this process's private folder where
    the cache folder cannot be written."""
    path = cache_dir()
    return path if writable(path) else private_dir()


def writable(path: Path) -> bool:
    """Whether this process can create files in the folder ``path``: tried, as the mode bits
    tell neither for root nor for a read-only mount."""
    try:
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def can_write(path: Path) -> bool:
    """Whether ``path`` (a folder, maybe not created yet) is or could be made writable."""
    while not path.is_dir() and path.parent != path:
        path = path.parent
    return writable(path)


def make_private(path: Path) -> None:
    """Create the folder ``path`` and its missing parents with mode 0700."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)


def private_dir() -> Path:
    """This process's own temporary folder (mode 0700, removed at exit)."""
    global _private
    if _private is None:
        _private = Path(tempfile.mkdtemp(prefix="tapegrad-"))
        atexit.register(shutil.rmtree, _private, ignore_errors=True)
        _handed_out.add(str(_private))
    return _private


def adopt(folder: Path) -> None:
    """Take ``folder``, the private folder of the process a compiler process serves, as one
    of ours: its generated modules may be loaded and compiled code saved beside them.
    :class:`~tapegrad.errors.CacheError` where it cannot be trusted."""
    reason = untrusted(folder)
    if reason:
        raise CacheError(f"tapegrad's compile folder {folder} {reason}")
    _handed_out.add(str(folder))


def is_ours(folder: str) -> bool:
    """Whether ``folder`` is one that :func:`cache_dir` or :func:`write_dir` handed out."""
    return folder in _handed_out


def read_checked(path: Path, valid: Callable[[bytes], bool], damaged: str,
                 then: str) -> bytes | None:
    """The bytes of the cached file ``path`` if it is trusted and ``valid``; None where it is
    missing, and where it is not trusted or not valid (``damaged`` says how) it is removed
    with a CacheWarning saying so and what happens ``then``."""
    try:
        reason = untrusted(path)
        if reason is None:
            data = path.read_bytes()
            if valid(data):
                return data
            reason = damaged
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:       # (ValueError: ``valid`` could not decode it)
        reason = f"cannot be read ({e})"
    warnings.warn(f"tapegrad's compile cache: {path} {reason}; {then}", CacheWarning,
                  stacklevel=5)          # (the user's line, through the cache's own callers)
    with contextlib.suppress(OSError):
        path.unlink()
    return None


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) so that a concurrent process sees the whole file
    or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")      # created 0600
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None
