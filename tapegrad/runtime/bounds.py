"""Out-of-range launches caught before anything runs, at no cost per element.

Most indices in kernels are affine in the work-item's place: ``A[i]``, ``u[i - 1]``,
``B[2 * i + 1]``, ``M[i, j]``, ``X[i * m + k]`` in a loop ``for k in range(m)``.  Their
extremes over a launch follow from the ndrange, the workgroup size, the arrays' shapes and the
int arguments, so one comparison per array dimension at launch decides whether any work-item
would index outside its array.  For such a kernel this module writes a small Python function
(``Check``), compiled once per launch key, that a launch calls first::

    def _in_range(a, n):                      # a: the launch's arguments, n: its ndrange
        return n[0] and (n[0] - 1 + 1 >= a[1].shape[0] or ...)

and, when it answers True, a :class:`~tapegrad.errors.KernelIndexError` names the user's
line, the access, the range of indices it would reach and the array's shape.

Only accesses that *every* work-item certainly makes are checked, so that no correct program
is refused: statements at the kernel's top level (and in top-level ``for k in range(...)``
loops with launch-known bounds), up to the first that may ``return``; not those inside
``if``/``while`` bodies, the branches of ``x if c else y``/``tg.where``, the later operands of
``and``/``or``, or device functions.  An index counts when it is built by ``+``, ``-`` and
``*`` (by launch-known values) from index intrinsics, loop variables, int arguments, shapes,
``tg.ndrange()``/``tg.groupsize()`` and constants, through locals assigned once or only by
top-level statements (which every work-item runs in order: ``off = off + 3``); a form that
mixes a dimension's global, local and group index (whose ranges are not independent) is left
out.  Over the launch's work-items such an index then reaches exactly its computed extremes,
so a failing check is a real out-of-range access.  What is left (gathers ``A[idx[i]]``,
accesses under conditions) is checked per element with ``TAPEGRAD_BOUNDSCHECK=1``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tapegrad.errors import KernelIndexError
from tapegrad.frontend.ir import KernelIR, tg_name
from tapegrad.frontend.params import as_written
from tapegrad.frontend.types import Array, Scalar, Type

Value = int | str            # a launch-known int: a constant, or Python over ``a`` and ``n``


def _add(x: Value, y: Value) -> Value:
    if isinstance(x, int) and isinstance(y, int):
        return x + y
    return y if x == 0 else x if y == 0 else f"({x}) + ({y})"


def _mul(x: Value, y: Value) -> Value:
    if isinstance(x, int) and isinstance(y, int):
        return x * y
    if x == 0 or y == 0:
        return 0
    return y if x == 1 else x if y == 1 else f"({x}) * ({y})"


@dataclass(frozen=True)
class Var:
    """A value that differs between work-items (or loop iterations) over a known range:
    ``kind`` is ``global``, ``local``, ``group`` (per dimension ``dim``), ``linear`` (the
    global linear index of a launch of rank > 1) or ``loop``."""

    kind: str
    dim: int = 0
    lo: Value = 0
    hi: Value = 0       # inclusive


@dataclass
class Form:
    """``const + sum(coef * var)``, every coefficient and the constant launch-known."""

    const: Value = 0
    coefs: dict[Var, Value] = field(default_factory=dict)

    def plus(self, other: Form, sign: int = 1) -> Form:
        coefs = dict(self.coefs)
        for v, c in other.coefs.items():
            coefs[v] = _add(coefs.get(v, 0), _mul(sign, c))
        return Form(_add(self.const, _mul(sign, other.const)),
                    {v: c for v, c in coefs.items() if c != 0})

    def times(self, k: Value) -> Form:
        return Form(_mul(self.const, k), {v: _mul(c, k) for v, c in self.coefs.items()
                                          if _mul(c, k) != 0})

    def independent(self) -> bool:
        """Whether the variables' ranges are independent, so that the extremes computed
        term by term are reached together by one work-item."""
        dims = [v.dim for v in self.coefs if v.kind in ("global", "local", "group")]
        linear = any(v.kind == "linear" for v in self.coefs)
        return len(dims) == len(set(dims)) and not (linear and dims)

    def extremes(self) -> tuple[str, str]:
        """Python expressions for the least and the greatest value over the launch."""
        lo, hi = [self.const], [self.const]
        for v, c in self.coefs.items():
            a, b = _mul(c, v.lo), _mul(c, v.hi)
            if isinstance(c, int):
                lo.append(a if c > 0 else b)
                hi.append(b if c > 0 else a)
            else:
                lo.append(f"min({a}, {b})")
                hi.append(f"max({a}, {b})")
        return _sum(lo), _sum(hi)


def _sum(values: list[Value]) -> str:
    total: Value = 0
    for v in values:
        total = _add(total, v)
    return str(total)


@dataclass
class Access:
    """One certain access ``array[index]`` of the kernel: per dimension its form."""

    array: str
    position: int            # of the array among the launch's arguments
    forms: list[Form | None]
    indices: list[str]       # each dimension's index, as written
    text: str
    line: int
    when: str = ""           # a Python condition for it to happen (a loop that runs)


class _Analysis:
    """Collects the certain accesses of a kernel's body (see the module's docstring)."""

    def __init__(self, ir: KernelIR, argtypes: tuple[Type, ...], rank: int,
                 groupsize: tuple[int, ...], numpy_ints: frozenset[int] = frozenset()):
        self.ir, self.rank, self.W = ir, rank, groupsize
        self.arrays = {p: (k, t.ndim) for k, (p, t) in enumerate(zip(ir.params, argtypes))
                       if isinstance(t, Array)}
        # an int argument by name: ``a[k]``, or for a NumPy integer its Python int ``_ik``
        # (converted once per check: NumPy's arithmetic wraps, 4 * np.int64(2**62) == 0, and
        # an unsigned one refuses negative results)
        self.ints = {p: f"_i{k}" if k in numpy_ints else f"a[{k}]"
                     for k, (p, t) in enumerate(zip(ir.params, argtypes))
                     if isinstance(t, Scalar) and t.dtype in ("int32", "int64")}
        self.once = _assigned_once(ir.body) | _rebound_in_order(ir.body)
        self.env: dict[str, Form | tuple] = {}
        self.accesses: list[Access] = []

    # -- statements --------------------------------------------------------------------
    def block(self, body: list[ast.stmt], when: str) -> bool:
        """Record the certain accesses of ``body``; False once a statement may leave it."""
        for s in body:
            leaves = any(isinstance(n, (ast.Return, ast.Break, ast.Continue))
                         for n in ast.walk(s))
            if isinstance(s, ast.Assign):
                self.expr(s.value, when)
                for t in s.targets:
                    self.target(t, s.value, when)
            elif isinstance(s, ast.AugAssign):
                self.expr(s.value, when)
                if isinstance(s.target, ast.Subscript):
                    self.subscript(s.target, when)
                else:
                    load = ast.Name(id=s.target.id, ctx=ast.Load())
                    self.target(s.target, ast.BinOp(left=load, op=s.op, right=s.value), when)
            elif isinstance(s, ast.Expr):
                self.expr(s.value, when)
            elif isinstance(s, (ast.If, ast.While)):
                self.expr(s.test, when)
            elif isinstance(s, ast.For):
                if not leaves:
                    self.loop(s, when)
                for name in _targets(s):      # (after the loop: its last value, unknown here)
                    self.env.pop(name, None)
            if leaves:
                return False
        return True

    def target(self, t: ast.expr, value: ast.expr, when: str) -> None:
        if isinstance(t, ast.Subscript):
            self.subscript(t, when)
        elif isinstance(t, ast.Name) and t.id in self.once and not when:
            form = self.form(value)
            if form is not None:
                self.env[t.id] = form
            elif (parts := self.parts(value)) is not None:
                self.env[t.id] = parts
            else:
                self.env.pop(t.id, None)     # (rebound to what is not known at launch)
        elif isinstance(t, ast.Tuple) and not when:
            parts = self.parts(value)
            for k, e in enumerate(t.elts):
                if isinstance(e, ast.Name) and e.id in self.once:
                    p = parts[k] if parts is not None and len(parts) == len(t.elts) else None
                    if p is not None:
                        self.env[e.id] = p
                    else:
                        self.env.pop(e.id, None)

    def loop(self, s: ast.For, when: str) -> None:
        """A ``for v in range(...)`` with launch-known bounds and a positive constant step:
        its body's accesses happen when the loop runs, ``v`` over its whole range."""
        it = s.iter
        if not (isinstance(s.target, ast.Name) and s.target.id in self.once
                and isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                and it.func.id == "range" and 1 <= len(it.args) <= 3 and not it.keywords):
            return
        bounds = [self.form(a) for a in it.args]
        if any(b is None or b.coefs for b in bounds):
            return
        values = [b.const for b in bounds]
        start, stop, step = (0, values[0], 1) if len(values) == 1 else (
            values[0], values[1], values[2] if len(values) == 3 else 1)
        if not (isinstance(step, int) and step > 0):
            return
        trips = f"(({stop}) - ({start}) + {step - 1}) // {step}"
        last = _add(start, _mul(step, f"({trips} - 1)"))
        self.env[s.target.id] = Form(0, {Var("loop", id(s), start, last): 1})
        runs = f"({stop}) > ({start})"
        self.block(s.body, f"{when} and {runs}" if when else runs)

    # -- expressions -------------------------------------------------------------------
    def expr(self, e: ast.expr | None, when: str) -> None:
        """Record the accesses ``e`` certainly makes."""
        if e is None:
            return
        if isinstance(e, ast.IfExp):
            return self.expr(e.test, when)
        if isinstance(e, ast.BoolOp):
            return self.expr(e.values[0], when)
        name = tg_name(e)
        if name == "where":
            return self.expr(e.args[0], when)
        if name is not None and name.startswith("atomic_") and len(e.args) >= 2:
            self.access(e.args[0], e.args[1], e, when)
        if isinstance(e, ast.Subscript):
            self.subscript(e, when)
            return
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                self.expr(child, when)

    def subscript(self, e: ast.Subscript, when: str) -> None:
        self.expr(e.slice, when)
        self.access(e.value, e.slice, e, when)

    def access(self, array: ast.expr, index: ast.expr, node: ast.expr, when: str) -> None:
        if not (isinstance(array, ast.Name) and array.id in self.arrays):
            return
        elts = index.elts if isinstance(index, ast.Tuple) else [index]
        if len(elts) != self.arrays[array.id][1]:
            return           # (not one index per dimension: typing says so)
        forms = [self.form(x) for x in elts]
        forms = [f if f is not None and f.independent() else None for f in forms]
        if any(f is not None for f in forms):
            self.accesses.append(Access(array.id, self.arrays[array.id][0], forms,
                                        [as_written(ast.unparse(x)) for x in elts],
                                        as_written(ast.unparse(node)),
                                        getattr(node, "lineno", 0), when))

    def parts(self, e: ast.expr) -> tuple | None:
        """A tuple's elements' forms: ``tg.global_indices()``, ``A.shape``, ``tg.ndrange()``,
        ``tg.groupsize()``, a display."""
        name = tg_name(e)
        r = range(self.rank)
        if name == "global_indices":
            return tuple(self.index_var("global", d) for d in r)
        if name == "local_indices":
            return tuple(self.index_var("local", d) for d in r)
        if name == "group_indices":
            return tuple(self.index_var("group", d) for d in r)
        if name == "ndrange":
            return tuple(Form(f"n[{d}]") for d in r)
        if name == "groupsize":
            return tuple(Form(w) for w in self.W)
        if (isinstance(e, ast.Attribute) and e.attr == "shape"
                and isinstance(e.value, ast.Name) and e.value.id in self.arrays):
            pos, ndim = self.arrays[e.value.id]
            return tuple(Form(f"a[{pos}].shape[{k}]") for k in range(ndim))
        if isinstance(e, ast.Tuple):
            return tuple(self.form(x) for x in e.elts)
        if isinstance(e, ast.Name) and isinstance(self.env.get(e.id), tuple):
            return self.env[e.id]
        return None

    def index_var(self, kind: str, d: int) -> Form:
        n = f"n[{d}]"
        hi = {"global": f"{n} - 1", "local": f"min({self.W[d]}, {n}) - 1",
              "group": f"-(-{n} // {self.W[d]}) - 1"}[kind]
        return Form(0, {Var(kind, d, 0, hi): 1})

    def form(self, e: ast.expr) -> Form | None:
        """``e`` as an affine form, or None."""
        if isinstance(e, ast.Constant) and type(e.value) is int:
            return Form(e.value)
        if (isinstance(e, ast.Attribute) and e.attr == "size"
                and isinstance(e.value, ast.Name) and e.value.id in self.arrays):
            return Form(f"a[{self.arrays[e.value.id][0]}].size")
        if isinstance(e, ast.Name):
            if e.id in self.ints:
                return Form(self.ints[e.id])
            found = self.env.get(e.id)
            return found if isinstance(found, Form) else None
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            inner = self.form(e.operand)
            return None if inner is None else inner.times(-1 if isinstance(e.op, ast.USub) else 1)
        if isinstance(e, ast.BinOp):
            return self.binop(e)
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) \
                and type(e.slice.value) is int:
            parts = self.parts(e.value)
            if parts is not None and 0 <= e.slice.value < len(parts):
                return parts[e.slice.value]
            return None
        name = tg_name(e)
        if name in ("int64", "int32") and len(e.args) == 1:
            return self.form(e.args[0])
        if name == "global_index":
            if self.rank == 1:
                return self.index_var("global", 0)
            total = " * ".join(f"n[{d}]" for d in range(self.rank))
            return Form(0, {Var("linear", 0, 0, f"{total} - 1"): 1})
        if name in ("local_index", "group_index") and self.rank == 1:
            return self.index_var(name[:-len("_index")], 0)
        return None

    def binop(self, e: ast.BinOp) -> Form | None:
        left, right = self.form(e.left), self.form(e.right)
        if left is None or right is None:
            return None
        if isinstance(e.op, ast.Add):
            return left.plus(right)
        if isinstance(e.op, ast.Sub):
            return left.plus(right, -1)
        if isinstance(e.op, ast.Mult):
            if not right.coefs:
                return left.times(right.const)
            if not left.coefs:
                return right.times(left.const)
            return None
        if isinstance(e.op, (ast.FloorDiv, ast.Mod)) and not left.coefs and not right.coefs:
            if isinstance(left.const, int) and isinstance(right.const, int) and right.const:
                return Form(left.const // right.const if isinstance(e.op, ast.FloorDiv)
                            else left.const % right.const)
            symbol = "//" if isinstance(e.op, ast.FloorDiv) else "%"
            # (a zero divisor at launch: the kernel divides by zero too; this check says nothing)
            return Form(f"_div({left.const}, {right.const}, {symbol!r})")
        return None


def _assigned_once(body: list[ast.stmt]) -> set[str]:
    """Locals assigned by exactly one statement of the kernel (loops' variables included)."""
    return {name for name, c in _assignments(body).items() if c == 1}


def _assignments(body: list[ast.stmt]) -> dict[str, int]:
    """How many statements of ``body``, those inside others included, assign each local."""
    count: dict[str, int] = {}
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            elif isinstance(t, ast.Starred):
                targets.append(t.value)
            elif isinstance(t, ast.Name):        # (a store into an element assigns no local)
                count[t.id] = count.get(t.id, 0) + 1
    return count


def _rebound_in_order(body: list[ast.stmt]) -> set[str]:
    """Locals assigned only by statements of the kernel's top level (``off = off + 3``, a
    top-level loop's variable): every work-item runs those in order, so at each statement
    such a local holds what the last of them assigned."""
    top = {n for s in body for n in _targets(s)}
    return top - set(_assignments([c for s in body for c in _nested(s)]))


def _targets(s: ast.stmt) -> list[str]:
    """The locals statement ``s`` itself assigns (not the statements inside it)."""
    targets = list(s.targets) if isinstance(s, ast.Assign) else [s.target] if isinstance(
        s, (ast.AugAssign, ast.For, ast.AnnAssign)) else []
    return [n.id for t in targets for n in ast.walk(t)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _nested(s: ast.stmt) -> list[ast.stmt]:
    return [c for field_ in ("body", "orelse") for c in getattr(s, field_, [])]


def _div(x: int, y: int, symbol: str) -> int:
    if y == 0:
        return 0
    return x // y if symbol == "//" else x % y


def _advice(acc: Access, k: int, form: Form, lo: int) -> str:
    """What to write instead of ``acc``, out of range in dimension ``k`` (least index
    ``lo``): an index that is the same for every work-item is not helped by another ndrange,
    and a negative one is no NumPy index from the end."""
    name, index = acc.array, acc.indices[k]
    if form.coefs:
        guard = f"{index} >= 0" if lo < 0 else f"{index} < {name}.shape[{k}]"
        return (f"Launch over the array's extent (e.g. ndrange={name}.shape) or guard the "
                f"access (if {guard}:).")
    if lo >= 0:
        return (f"{index} is the same for every work-item: no ndrange brings it in range; "
                f"its last index is {name}.shape[{k}] - 1.")
    if not isinstance(form.const, int):
        return ("Indices in kernels never wrap around: an index below 0 is out of range, not "
                "counted from the end as in NumPy.")
    fixed = list(acc.indices)
    fixed[k] = f"{name}.shape[{k}] - {-form.const}"
    return (f"Indices in kernels never wrap around: {index} is out of range, not counted from "
            f"the end as in NumPy; write {name}[{', '.join(fixed)}].")


@dataclass
class Check:
    """The launch check of one kernel specialisation: ``failing(args, ndrange)`` is the
    fast test (True when an access would leave its array); ``error`` says which one."""

    failing: Callable[[tuple, tuple], Any]
    accesses: list[Access]
    kernel: str
    filename: str
    source: str
    numpy_ints: frozenset[int] = frozenset()   # positions of NumPy integers (as Python's)

    def error(self, args: tuple, nd: tuple[int, ...], groupsize: tuple[int, ...]
              ) -> KernelIndexError:
        scope = {"min": min, "max": max, "_div": _div}
        values = {"a": args, "n": nd, **{f"_i{k}": int(args[k]) for k in self.numpy_ints}}
        for acc in self.accesses:
            if acc.when and not eval(acc.when, scope, values):
                continue
            shape = args[acc.position].shape
            for k, f in enumerate(acc.forms):
                if f is None:
                    continue
                lo, hi = (eval(x, scope, values) for x in f.extremes())
                if lo < 0 or hi >= shape[k]:
                    where = "" if len(acc.forms) == 1 else f" in dimension {k}"
                    return KernelIndexError(
                        f"{self.filename}:{acc.line}: kernel {self.kernel}: {acc.text} would "
                        f"index {acc.array}{where} from {lo} to {hi}, but {acc.array}.shape is "
                        f"{tuple(shape)} (ndrange {nd}, workgroupsize {groupsize}); nothing "
                        f"ran. {_advice(acc, k, f, lo)} Indices "
                        "affine in the work-item's index are checked at every launch; "
                        "TAPEGRAD_BOUNDSCHECK=1 checks every access, element by element")
        return KernelIndexError(f"kernel {self.kernel}: an access indexes outside its array "
                                f"(ndrange {nd}); TAPEGRAD_BOUNDSCHECK=1 names it")


def launch_check(ir: KernelIR, argtypes: tuple[Type, ...], rank: int,
                 groupsize: tuple[int, ...], numpy_ints: frozenset[int] = frozenset()
                 ) -> Check | None:
    """The launch check of a kernel specialised to ``argtypes``, rank and workgroup size, or
    None where it has no access to check.  ``numpy_ints``: the positions of the int
    arguments that are NumPy integers (``np.int64(n)``, ``np.uint32(n)``), which the check
    takes as Python ints, whose arithmetic neither wraps nor refuses negative values (the
    launch key has each argument's type: a check serves one kind of each)."""
    analysis = _Analysis(ir, argtypes, rank, groupsize, numpy_ints)
    analysis.block(ir.body, "")
    tests: dict[str, None] = {}
    for acc in analysis.accesses:
        for k, f in enumerate(acc.forms):
            if f is None:
                continue
            lo, hi = f.extremes()
            for test in (f"{hi} >= a[{acc.position}].shape[{k}]", f"{lo} < 0"):
                tests[f"({acc.when} and {test})" if acc.when else test] = None
    tests.pop("0 < 0", None)
    if not tests:
        return None
    items = " and ".join(f"n[{d}]" for d in range(rank))
    used = sorted(k for k in numpy_ints if re.search(rf"\b_i{k}\b", " ".join(tests)))
    source = ("def _out_of_range(a, n):\n"
              + "".join(f"    _i{k} = int(a[{k}])\n" for k in used)
              + f"    return {items} and ({' or '.join(tests)})\n")
    scope: dict[str, Any] = {"_div": _div}
    exec(compile(source, f"<tapegrad launch check of {ir.name}>", "exec"), scope)
    return Check(scope["_out_of_range"], analysis.accesses, ir.name, ir.filename, source,
                 frozenset(numpy_ints))
