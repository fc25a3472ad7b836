"""First launches compile in a compiler process and load the machine code from the cache
(tapegrad/backends/compiler_process.py): results and gradients are the same, this process
compiles nothing, a dead or retired compiler process is replaced, and the switch turns it off."""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends import cache, cachedir, compiler_process

KERNELS = '''
import tapegrad as tg


@tg.kernel
def cube{tag}(B, A):
    i = tg.index()
    B[i] = A[i] * A[i] * A[i] + {tag}.0
'''


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A cold cache, and a factory of kernel modules no process has compiled before."""
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path / "cache"))

    def kernels():
        tag = uuid.uuid4().int % 10**9          # new source: new generated modules
        path = tmp_path / f"kernels_{tag}.py"
        path.write_text(KERNELS.format(tag=tag))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, tag
    return kernels


def _stats(name: str) -> tuple[int, int]:
    """(cache hits, cache misses) of the dispatchers generated for kernel ``name`` (not
    tapegrad's own functions that their modules import)."""
    hits = misses = 0
    for modname, module in list(sys.modules.items()):
        if modname.startswith(f"{cache.PREFIX}{name}_"):
            for value in vars(module).values():
                if getattr(getattr(value, "py_func", None), "__module__", None) == modname:
                    hits += sum(value.stats.cache_hits.values())
                    misses += sum(value.stats.cache_misses.values())
    return hits, misses


def _check(module, tag) -> None:
    """The kernel's values and its gradient (closed form 3 A^2)."""
    A = np.linspace(-1.0, 1.0, 37)
    B = np.zeros_like(A)
    getattr(module, f"cube{tag}")(tg.CPU())(B, A, ndrange=A.size)
    np.testing.assert_allclose(B, A**3 + tag, rtol=1e-14)

    def loss(A):
        B = np.zeros_like(A)
        getattr(module, f"cube{tag}")(tg.CPU())(B, A, ndrange=A.size)
        return tg.sum(B)
    (grad,) = tg.gradient(loss, A)
    np.testing.assert_allclose(grad, 3 * A * A, rtol=1e-14)


def test_first_launches_compile_in_the_compiler_process(fresh):
    module, tag = fresh()
    _check(module, tag)
    hits, misses = _stats(f"cube{tag}")
    assert misses == 0 and hits >= 2            # the kernel and its adjoint: loaded, not built
    assert compiler_process._compiler.proc is not None


def test_a_read_only_cache_new_kernels_compile_in_the_compiler_process_too(fresh, monkeypatch):
    """A cache this process cannot write (one baked into an image): new generated modules go
    to its private folder, and the compiler process compiles them there (a kernel compiled
    in the process that runs it can run slower there: docs/language.md)."""
    module, tag = fresh()
    root = Path(os.environ["TAPEGRAD_CACHE_DIR"])
    # (tests may run as root, whom chmod does not stop: writability is asked of cachedir)
    monkeypatch.setattr(cachedir, "writable", lambda folder: not folder.is_relative_to(root))
    _check(module, tag)
    hits, misses = _stats(f"cube{tag}")
    assert misses == 0 and hits >= 2
    generated = [m for name, m in sys.modules.items()
                 if name.startswith(f"{cache.PREFIX}cube{tag}_")]
    assert generated and all(Path(m.__file__).parent == cachedir.private_dir()
                             for m in generated)
    assert not list(root.rglob(f"*cube{tag}*"))         # nothing written into the cache


def test_switched_off_compiles_here(fresh, monkeypatch):
    monkeypatch.setenv("TAPEGRAD_COMPILE_PROCESS", "0")
    module, tag = fresh()
    _check(module, tag)
    hits, misses = _stats(f"cube{tag}")
    assert hits == 0 and misses >= 2


def test_a_dead_compiler_process_is_replaced(fresh):
    module, tag = fresh()
    _check(module, tag)
    proc = compiler_process._compiler.proc
    proc.kill()
    proc.wait()
    module, tag = fresh()
    _check(module, tag)
    hits, misses = _stats(f"cube{tag}")
    assert misses == 0 and hits >= 2
    assert compiler_process._compiler.proc not in (None, proc)


def test_a_large_compiler_process_is_retired(fresh, monkeypatch):
    monkeypatch.setattr(compiler_process, "RETIRE_MB", 0)
    module, tag = fresh()
    _check(module, tag)
    assert compiler_process._compiler.proc is None        # replaced at its next request
    assert _stats(f"cube{tag}")[1] == 0


def test_what_the_compiler_process_refuses_is_compiled_here(fresh, monkeypatch):
    """A generated file changed on disk after this process wrote it: the compiler process
    refuses to load it, and the kernel is compiled here from the code in memory."""
    ask = compiler_process._compiler.run

    def tampered(request):
        with open(request[1], "a") as f:
            f.write("# changed\n")
        return ask(request)
    monkeypatch.setattr(compiler_process._compiler, "run", tampered)
    module, tag = fresh()
    _check(module, tag)
    hits, misses = _stats(f"cube{tag}")
    assert hits == 0 and misses >= 2


def test_only_verified_files_are_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    source = "VALUE = 41 + 1\n"
    module, path = cache.load_source(source, "verify_me")
    assert module.VALUE == 42
    sys.modules.pop(path.stem)
    assert cache.load_file(path).VALUE == 42          # read back: the same module
    sys.modules.pop(path.stem)

    path.write_text("VALUE = 666\n")                   # not what its name's hash stands for
    with pytest.raises(ImportError, match="does not hold"):
        cache.load_file(path)
    assert path.stem not in sys.modules

    path.write_text(source)
    os.chmod(path, 0o666)                              # others may write it
    with pytest.raises(ImportError, match="writable"):
        cache.load_file(path)


def test_generated_modules_import_each_other_in_the_compiler_process(tmp_path, monkeypatch):
    """The reverse sweep's chains import a kernel's module by name: the compiler process finds
    it in the cache folder."""
    monkeypatch.setenv("TAPEGRAD_CACHE_DIR", str(tmp_path / "cache"))
    finder = compiler_process._GeneratedFinder()
    _, path = cache.load_source(f"VALUE = {uuid.uuid4().int % 1000}\n", "imported")
    expected = sys.modules.pop(path.stem).VALUE
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    try:
        module = importlib.import_module(path.stem)
        assert module.VALUE == expected and Path(module.__file__) == path
    finally:
        sys.modules.pop(path.stem, None)


def test_a_compiler_process_that_cannot_run_is_tried_once(fresh, monkeypatch):
    """No usable Python to start (an embedded interpreter, say): one try, then every kernel
    compiles here."""
    compiler = compiler_process._Compiler()
    monkeypatch.setattr(compiler_process, "_compiler", compiler)
    monkeypatch.setattr(sys, "executable", "/bin/false")
    starts = []
    start = compiler.start
    monkeypatch.setattr(compiler, "start", lambda: (starts.append(1), start())[1])
    for _ in range(2):
        module, tag = fresh()
        _check(module, tag)
        hits, misses = _stats(f"cube{tag}")
        assert hits == 0 and misses >= 2
    assert compiler.broken and len(starts) == 1
