"""The code base stays ruff-clean, and its examples (scripts and docstrings) run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    if shutil.which("ruff") is None:
        pytest.skip("ruff is not installed (it comes with the [test] extra)")
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "tapegrad", "tests", "examples"],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_examples_run():
    """Every example runs as written.  Two at a time: each is mostly a single-threaded compile
    (with a cold kernel cache, 39 s one after the other, 21 s two at a time), and each runs
    its kernels on one thread, so that the two do not spin against each other on 2 cores."""
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ, NUMBA_NUM_THREADS="1", STEPS="2000")   # (long_simulation.py: fewer)

    def run(example: Path) -> tuple[str, subprocess.CompletedProcess]:
        return example.name, subprocess.run([sys.executable, str(example)], capture_output=True,
                                            text=True, timeout=300, env=env)

    examples = sorted((ROOT / "examples").glob("*.py"))
    assert len(examples) >= 5
    with ThreadPoolExecutor(max_workers=2) as pool:
        for name, proc in pool.map(run, examples):
            assert proc.returncode == 0, f"{name}:\n{proc.stdout}\n{proc.stderr}"


def test_docstring_examples_run():
    """Every ``>>>`` example in the package's docstrings runs as written."""
    import doctest
    import importlib

    attempted = 0
    for path in sorted((ROOT / "tapegrad").rglob("*.py")):
        if ">>>" not in path.read_text():
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        result = doctest.testmod(importlib.import_module(name))
        assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"
        attempted += result.attempted
    assert attempted > 50          # the public API's examples were found and run
