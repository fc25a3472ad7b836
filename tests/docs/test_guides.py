"""Every guide's code blocks run as written (tests/docs/guides.py says how a block is run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.guides import blocks, program

ROOT = Path(__file__).resolve().parents[2]
GUIDES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_guide_examples_run(guide, tmp_path):
    found = blocks(guide, ROOT)
    if not found:
        assert "```python" not in guide.read_text()
        return
    env = dict(os.environ, NUMBA_NUM_THREADS="1", MPLBACKEND="Agg")
    proc = subprocess.run([sys.executable, "-c", program(found, ROOT)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, f"{guide.name}:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    done = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("@@block ")]
    assert len(done) == len(found) and "ran" in done, proc.stdout


def test_marks_are_read(tmp_path):
    guide = tmp_path / "g.md"
    guide.write_text("text\n<!-- not run: a fragment -->\n```python\nx = undefined\n```\n"
                     "<!-- needs: cupy -->\n```python\nimport cupy\n```\n```python\ny = 1\n```\n")
    a, b, c = blocks(guide, tmp_path)
    assert (a.not_run, a.line, b.needs, c.line, c.not_run) == ("a fragment", 4, ("cupy",), 11, "")
