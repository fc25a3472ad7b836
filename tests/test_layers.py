"""tapegrad's modules import only their own layer and the layers below it, and no two modules
import each other, directly or around a circle (deferred imports inside functions count too).

The layers, from the bottom (README's Layout section says what each does):
"""

from __future__ import annotations

import ast
from pathlib import Path

import tapegrad

PACKAGE = Path(tapegrad.__file__).resolve().parent

LAYERS = [                       # lowest first; a module belongs to the longest prefix listed
    ["tapegrad.errors", "tapegrad._version", "tapegrad.callers", "tapegrad.tracebacks"],
    ["tapegrad.lang"],
    ["tapegrad.frontend"],
    ["tapegrad.ad"],
    ["tapegrad.backends"],
    ["tapegrad.runtime"],
    ["tapegrad.kernels"],
    ["tapegrad.tape"],
    ["tapegrad.capturing"],
    ["tapegrad.api"],
    ["tapegrad.testing"],
    ["tapegrad"],                # the package's face: tg.*
    ["tapegrad.demo", "tapegrad.bench"],
    ["tapegrad.cli"],
    ["tapegrad.__main__"],
]
__doc__ += "\n".join("  " + ", ".join(names) for names in reversed(LAYERS))


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The tapegrad modules that module ``name`` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:       # a module imported by name, or a name of a module
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> int:
    best, level = -1, None
    for k, names in enumerate(LAYERS):
        for prefix in names:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), k
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def test_no_import_from_a_lower_layer_to_a_higher_one():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets
                    if layer(b) > layer(a))
    assert not upward, "imports that run up the layers:\n" + "\n".join(upward)


def test_no_import_cycles():
    cycles = []
    state: dict[str, int] = {}          # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m]):
            if state.get(n) == 1:
                cycles.append(" -> ".join(path[path.index(n):] + [n]))
            elif n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_check_sees_imports():
    """The parser finds what it must: a deferred import, a relative one, a module by name."""
    assert "tapegrad.runtime.launch" in GRAPH["tapegrad.kernels"]
    assert "tapegrad.frontend" in GRAPH["tapegrad.runtime.launch"]
    assert layer("tapegrad.backends.cpu.lower") == layer("tapegrad.backends")
    assert layer("tapegrad.api") > layer("tapegrad.tape.tape") > layer("tapegrad.runtime.adjoint")
