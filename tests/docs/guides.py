"""The ``python`` code blocks of a Markdown guide, and a program that runs them in order.

A guide's blocks run as one session, top to bottom, in one namespace (a reader types them in
that order).  A comment line just before a block's fence changes that:

- ``<!-- not run: why -->``: the block is compiled, not run (a fragment of generated code, a
  row of a table inside tapegrad);
- ``<!-- needs: cupy -->``: the block runs where those modules import and a GPU is there
  (tests/gpu/run_gpu_checks.sh), and is compiled elsewhere.

Errors point at the guide's own lines: each block is compiled under the guide's file name with
its line numbers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
MARK = re.compile(r"<!--\s*(not run|needs):\s*(.*?)\s*-->\s*\Z")


@dataclass(frozen=True)
class Block:
    guide: str
    line: int            # the line of the block's first line of code
    source: str
    not_run: str = ""    # why it is only compiled
    needs: tuple = ()    # modules it needs


def blocks(path: Path, root: Path) -> list[Block]:
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = MARK.search(before)
        kind, what = mark.groups() if mark else ("", "")
        found.append(Block(str(path.relative_to(root)), text.count("\n", 0, match.start(1)) + 1,
                           match.group(1), not_run=what if kind == "not run" else "",
                           needs=tuple(what.replace(",", " ").split()) if kind == "needs" else ()))
    return found


def program(found: list[Block], root: Path) -> str:
    """A script that runs (or compiles) each block and prints ``@@block ran|compiled guide:line``
    after each."""
    return RUNNER.format(root=str(root), blocks=[(b.guide, b.line, b.source, bool(b.not_run), b.needs)
                                                  for b in found])


RUNNER = '''
import importlib, os, sys
ROOT = {root!r}

def available(modules):
    try:
        for name in modules:
            importlib.import_module(name)
        if "cupy" in modules:
            import cupy
            return cupy.cuda.runtime.getDeviceCount() > 0
        return True
    except Exception:
        return False

namespace = {{"__name__": "__main__"}}
for guide, line, source, not_run, needs in {blocks!r}:
    code = compile("\\n" * (line - 1) + source, os.path.join(ROOT, guide), "exec")
    if not_run or not available(needs):
        print(f"@@block compiled {{guide}}:{{line}}", flush=True)
        continue
    exec(code, namespace)
    print(f"@@block ran {{guide}}:{{line}}", flush=True)
'''
