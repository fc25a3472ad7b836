"""Move the body of a kernel's parallel loop into a function of its own, compiled serially.

The CPU kernel is one ``numba.prange`` loop over parallel tasks.  Numba's parallel-loop
passes (reduction search, copy propagation, hoisting, the function they build from the body
for the threads) deep-copy, re-analyse and re-type the loop's whole body; their cost grows
faster than the body and dominates a large adjoint's compile time (docs/performance.md,
"Compile time").  Written as

    @numba.njit(cache=True, nogil=True, error_model='numpy')
    def saxpy__task(_c, Y, a, X, _n0, _nchunks, _total):
        for _g in range(_c * _total // _nchunks, (_c + 1) * _total // _nchunks):
            ...

    @numba.njit(cache=True, nogil=True, error_model='numpy', parallel=True)
    def saxpy(Y, a, X, _n0, _groups0, _nchunks):
        _total = _groups0
        for _c in numba.prange(_nchunks):
            saxpy__task(np.int64(_c), Y, a, X, _n0, _nchunks, _total)

the parallel passes see one call, and the body goes through Numba's serial pipeline once.
A task runs many workgroups, so the call costs nothing measurable at run time.

What the body reads from outside (the kernel's parameters and what the kernel assigned
before the loop) becomes the task's parameters; a name the body assigns is the task's own
local, as it was the parallel loop's private variable.

A launch of one workgroup calls the task itself (``one_group_call``: from Python, and in a
captured program's compiled stretches), the one the kernel would run it in, where a
parallel launch would wake the threads for one task.
"""

from __future__ import annotations

import ast
import textwrap

from tapegrad.backends.numba_lower import Printer

INDENT = "    "


def outline_task(out: Printer, loop: int, end: int) -> list[str]:
    """Rewrite ``out`` so that the body of the ``prange`` loop at line index ``loop`` (its
    block ends before line index ``end``) is a serial ``<kernel>__task`` function placed
    before the kernel, called from the loop; the task's parameters after ``_c``.  Which user
    line each generated line came from moves with it."""
    lines = out.lines
    pairs = [(text, out.user_line.get(k + 1)) for k, text in enumerate(lines)]
    header = max(k for k in range(loop) if lines[k].startswith("def "))
    decorator = header - 1
    name = lines[header][len("def "):lines[header].index("(")]
    params = [p.strip() for p in
              lines[header][lines[header].index("(") + 1:lines[header].rindex(")")].split(",")]
    prologue = textwrap.dedent("\n".join(lines[header + 1:loop]))
    assigned = _stored(ast.parse(prologue)) if prologue.strip() else set()
    body = [(text[len(INDENT):], user) for text, user in pairs[loop + 1:end]]
    read = _names(ast.parse(textwrap.dedent("\n".join(text for text, _ in body))))
    free = [p for p in params if p in read] + sorted((assigned & read) - set(params))
    serial = lines[decorator].replace(", parallel=True", "").replace("parallel=True, ", "")
    task = [(serial, None),
            (f"def {name}__task({', '.join(['_c', *free])}):", None), *body, ("", None),
            ("", None)]
    # (the task number as int64: Numba types the loop's index int64 where it types the
    # kernel and uint64 in the parallel function it builds, and would compile the task twice)
    inside = " " * (len(lines[loop]) - len(lines[loop].lstrip())) + INDENT
    call = [(inside + "# one parallel task: its run of workgroups, compiled apart (outline.py)",
             None),
            (inside + f"{name}__task({', '.join(['np.int64(_c)', *free])})", None)]
    pairs = pairs[:decorator] + task + pairs[decorator:loop + 1] + call + pairs[end:]
    out.lines = [text for text, _ in pairs]
    out.user_line = {k + 1: user for k, (_, user) in enumerate(pairs) if user is not None}
    return free


def one_group_call(params: list[str], free: list[str], n_args: int) -> tuple | None:
    """The task's arguments for a launch of one workgroup (``_Launcher.one_group``, a
    captured stretch's line): after the task's number ``n - 1`` (``n`` the tasks the kernel
    would run: the last is the one that would run the one group, so it adds into the same
    slots of its sums), each ``("arg", k)`` (the launch's argument ``k``, the kernel's first
    ``n_args`` parameters being ``params``), ``("nd", d)`` (the ndrange's extent ``d``),
    ``("tasks",)`` (``n``) or ``("one",)``.  None where the task reads what the kernel makes
    before its loop (per-thread copies, transposed arrays)."""
    parts: list[tuple] = []
    for name in free:
        k = params.index(name) if name in params else -1
        if 0 <= k < n_args:
            parts.append(("arg", k))
        elif name.startswith("_n") and name[2:].isdigit():
            parts.append(("nd", int(name[2:])))
        elif name == "_nchunks":
            parts.append(("tasks",))
        elif name == "_total" or name.startswith("_groups"):
            parts.append(("one",))
        else:
            return None
    return tuple(parts)


def one_group_line(parts: tuple, task: str, args: list[str], nd: list[str], tasks: str) -> str:
    """``one_group_call``'s call written out: ``task`` the task's name, ``args``, ``nd`` and
    ``tasks`` the text of the launch's arguments, extents and task count."""
    text = {"tasks": tasks, "one": "1"}
    out = [f"{tasks} - 1"] + [args[p[1]] if p[0] == "arg" else nd[p[1]] if p[0] == "nd"
                              else text[p[0]] for p in parts]
    return f"{task}({', '.join(out)})"


def _stored(tree: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Store)}


def _names(tree: ast.AST) -> set[str]:
    """Every name the code uses (one it assigns may also be read before it is)."""
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
