"""Generated source on disk, so that Numba's on-disk cache works across processes.

Numba caches compiled functions next to their source file, which needs a real, importable file:
``exec`` of a string has none, and an ``exec``-ed code object pointing at a file writes a cache
the next process cannot load.  So every generated module is written to
``<cache dir>/gen_<name>_<hash>.py`` and imported from there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def cache_dir() -> Path:
    """Where generated kernels live: ``$TAPEGRAD_CACHE_DIR`` or ``~/.cache/tapegrad``."""
    from tapegrad import __version__
    root = os.environ.get("TAPEGRAD_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache"), "tapegrad")
    path = Path(root) / f"v{__version__}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_source(source: str, name: str) -> tuple[ModuleType, Path]:
    """Write ``source`` to the cache folder (once) and import it as a module."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    modname = f"tapegrad_gen_{name}_{digest}"
    module = sys.modules.get(modname)
    path = cache_dir() / f"{modname}.py"
    if module is not None:
        return module, path
    if not path.exists() or path.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(source)
        os.replace(tmp, path)   # atomic: a concurrent process sees the whole file or none
    spec = importlib.util.spec_from_file_location(modname, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    spec.loader.exec_module(module)
    return module, path
