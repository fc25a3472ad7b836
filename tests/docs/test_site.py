"""The documentation site builds with no warning, and its API reference names every public
name: ``tapegrad.__all__`` and the ``__all__`` of ``tapegrad.torch``, ``tapegrad.jax``,
``tapegrad.mpi`` and ``tapegrad.testing``."""

from __future__ import annotations

import importlib
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tapegrad", "tapegrad.torch", "tapegrad.jax", "tapegrad.mpi", "tapegrad.testing"]


def documented(inventory: Path) -> set[str]:
    """The object names in a Sphinx ``objects.inv`` (four header lines, then zlib)."""
    raw = inventory.read_bytes()
    body = raw.split(b"\n", 4)[4]
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    pytest.importorskip("sphinx", reason="Sphinx comes with the [test] and [docs] extras")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "", proc.stderr          # -W: not one warning
    return out


def test_site_builds(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("*.html")}
    guides = {p.stem + ".html" for p in (ROOT / "docs").glob("*.md")}
    assert guides <= pages and "api/index.html" in pages


def test_every_public_name_is_in_the_reference(site):
    names = documented(site / "objects.inv")
    public = {f"{m}.{n}" for m in MODULES for n in importlib.import_module(m).__all__}
    assert len(public) > 110
    assert sorted(public - names) == []


def test_inventory_reader(tmp_path):
    body = zlib.compress(b"tapegrad.kernel py:function 1 api/kernels.html#$ -\n")
    path = tmp_path / "objects.inv"
    path.write_bytes(b"# Sphinx inventory version 2\n# Project: x\n# Version: 1\n# zlib\n" + body)
    assert documented(path) == {"tapegrad.kernel"}
