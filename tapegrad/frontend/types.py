"""The inference that specialises a kernel to its arguments' types (typerules.py: the
types and how they combine).

Inference is flow-insensitive: each local has one type, the join of everything assigned to it,
found by iterating to a fixed point.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

from tapegrad.errors import KernelTypeError, located
from tapegrad.frontend.ir import KernelIR, tg_name
from tapegrad.frontend.typerules import (  # noqa: F401  (the types, for importers)
    BOOL,
    DTYPE_NAMES,
    FLOAT32,
    FLOAT64,
    FLOATS,
    INT64,
    INTS,
    NONE,
    WEAK_FLOAT,
    Array,
    DType,
    NoneT,
    Scalar,
    TupleT,
    Type,
    arith,
    float_of,
    join,
)
from tapegrad.lang import primitives


@dataclass
class TypedKernel:
    """A kernel (or device function) specialised to argument types and a launch shape."""

    ir: KernelIR
    argtypes: tuple[Type, ...]
    rank: int
    groupsize: tuple[int, ...]
    types: dict[int, Type] = field(default_factory=dict)        # id(expr node) -> type
    locals: dict[str, Type] = field(default_factory=dict)
    static_shapes: dict[int, tuple[str, tuple[int, ...]]] = field(default_factory=dict)
    callees: dict[int, TypedKernel] = field(default_factory=dict)   # id(call) -> callee
    return_type: Type = NONE
    symbol: str = ""     # its name in generated code (set by the backend)
    launch_groupsize: tuple[int, ...] = ()   # the launch's, where a backend runs another

    def type_of(self, node: ast.AST) -> Type:
        return self.types[id(node)]

    @property
    def name(self) -> str:
        return self.ir.name


_MAX_ROUNDS = 50
_KERNEL_ONLY = {f"{space}_{kind}": "index(...)" for space in ("global", "local", "group")
                for kind in ("index", "indices")}
_KERNEL_ONLY.update(groupsize="groupsize()", ndrange="ndrange()")
# the intrinsics that give one value per dimension of the launch, as the user writes them
_PER_DIMENSION = {f"{space}_indices": f"tg.index(tg.{space.title()}, tg.NTuple)"
                  for space in ("global", "local", "group")}
_PER_DIMENSION.update(groupsize="tg.groupsize()", ndrange="tg.ndrange()")


def specialize(ir: KernelIR, argtypes: tuple[Type, ...], rank: int,
               groupsize: tuple[int, ...], resolve_func: Any = None,
               _stack: tuple[str, ...] = ()) -> TypedKernel:
    """Infer the type of every expression of ``ir`` for the given argument types.

    ``resolve_func(func)`` returns the ``KernelIR`` of a device function.
    """
    tk = TypedKernel(ir, argtypes, rank, groupsize)
    inf = _Inference(tk, resolve_func, _stack + (ir.name,))
    for _ in range(_MAX_ROUNDS):
        tk.types.clear()
        before = dict(inf.env)
        inf.returns = None
        inf.block(ir.body)
        if inf.env == before:
            break
    inf.final = True
    tk.types.clear()
    inf.returns = None
    inf.block(ir.body)
    tk.locals = {k: v for k, v in inf.env.items() if k not in ir.params}
    tk.return_type = inf.returns if inf.returns is not None else NONE
    if not ir.is_kernel and inf.returns is not None and not _always_returns(ir.body):
        raise located(ir.body[-1], ir.filename, f"device function {ir.name} returns a value on "
                                                "some paths but not at its end; end it with a "
                                                "return", KernelTypeError)
    return tk


def _always_returns(body: list[ast.stmt]) -> bool:
    if not body:
        return False
    last = body[-1]
    if isinstance(last, ast.Return):
        return True
    if isinstance(last, ast.If):
        return _always_returns(last.body) and _always_returns(last.orelse)
    return False


class _Inference:
    def __init__(self, tk: TypedKernel, resolve_func: Any, stack: tuple[str, ...]):
        self.tk = tk
        self.ir = tk.ir
        self.resolve_func = resolve_func
        self.stack = stack
        self.env: dict[str, Type] = dict(zip(tk.ir.params, tk.argtypes))
        self.declared: dict[str, int] = {}   # local array name -> its declaration statement
        self.truthy: set[int] = set()        # expressions used only for their truth value
        self.returns: Type | None = None
        self.final = False

    def fail(self, node: ast.AST, message: str) -> KernelTypeError:
        return located(node, self.ir.filename, message, KernelTypeError)

    # -- statements -----------------------------------------------------------------------
    def block(self, body: list[ast.stmt]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            self.assign(s.targets[0], self.expr(s.value), s)
        elif isinstance(s, ast.AugAssign):
            rhs = self.expr(s.value)
            if isinstance(s.target, ast.Name):
                cur = self.env.get(s.target.id)
                if cur is None and self.final:
                    raise self.fail(s, f"{s.target.id} is used before it is assigned")
                if cur is not None:
                    self.assign(s.target, self.binop_type(s, s.op, cur, rhs), s)
            else:
                elem = self.expr(s.target)
                if elem is not None and rhs is not None:
                    self.store_check(s, elem, self.binop_type(s, s.op, elem, rhs))
        elif isinstance(s, ast.Expr):
            self.expr(s.value)
        elif isinstance(s, ast.If):
            self.condition(s.test)
            self.block(s.body)
            self.block(s.orelse)
        elif isinstance(s, ast.While):
            self.condition(s.test)
            self.block(s.body)
        elif isinstance(s, ast.For):
            for arg in s.iter.args:
                t = self.expr(arg)
                if t is not None and not (isinstance(t, Scalar) and not t.is_float):
                    raise self.fail(arg, f"range() needs integers, got {t}; convert with int(...)")
            self.assign(s.target, INT64, s)
            self.block(s.body)
        elif isinstance(s, ast.Return):
            if s.value is not None:
                t = self.expr(s.value)
                if isinstance(t, Array):
                    raise self.fail(s, "device functions return scalars or tuples, not arrays")
                try:
                    self.returns = join(self.returns, t)
                except TypeError as exc:
                    raise self.fail(s, f"{self.ir.name} returns values of different types ({exc})") from None
        elif isinstance(s, (ast.Break, ast.Continue, ast.Pass)):
            pass
        else:  # the syntax check keeps everything else out
            raise self.fail(s, f"{type(s).__name__} is not supported in kernels")

    def condition(self, test: ast.expr) -> None:
        self.truthy.add(id(test))
        t = self.expr(test)
        if t is not None and not isinstance(t, Scalar):
            raise self.fail(test, f"a condition must be a number or a boolean, got {t}")

    def assign(self, target: ast.expr, t: Type | None, at: ast.stmt) -> None:
        if isinstance(target, ast.Name):
            name = target.id
            old = self.env.get(name)
            if isinstance(old, Array) or isinstance(t, Array):
                if name in self.ir.params:
                    raise self.fail(at, f"the array argument {name} cannot be reassigned in a "
                                        "kernel; write into its elements, or use another name")
                declares = isinstance(at, ast.Assign) and tg_name(at.value) in ("localmem",
                                                                               "private")
                if declares and self.declared.setdefault(name, id(at)) != id(at):
                    # (declarations are hoisted: both would be one buffer, of the last shape)
                    raise self.fail(at, f"{name} is declared a second time; give each "
                                        f"tg.{tg_name(at.value)}(...) its own name")
                if isinstance(t, Array) and not declares:
                    # one name per array: derivatives and the CPU's per-thread copies follow
                    # an array by its name (a read through a second name lost its derivative)
                    what = ast.unparse(at.value) if isinstance(at, ast.Assign) else "an array"
                    raise self.fail(at, f"{name} = {what} gives an array a second name; "
                                        f"kernels use each array under one name: index "
                                        f"{what} itself")
                if old is not None and old != t:
                    raise self.fail(at, f"{name} is assigned arrays of different kinds ({old} "
                                        f"and {t}); use two names")
            if isinstance(t, (DType, NoneT)):
                raise self.fail(at, f"{name} cannot hold {t}")
            try:
                self.env[name] = join(old, t)
            except TypeError as exc:
                raise self.fail(at, f"{name} is assigned values of incompatible types ({exc}); "
                                    "use two names") from None
            self.tk.types[id(target)] = self.env[name] if self.env[name] is not None else t
        elif isinstance(target, ast.Tuple):
            if t is not None and not (isinstance(t, TupleT) and len(t.items) == len(target.elts)):
                raise self.fail(at, f"cannot unpack {t} into {len(target.elts)} names"
                                + self.rank_hint(at, len(target.elts)))
            for k, elt in enumerate(target.elts):
                self.assign(elt, None if t is None else t.items[k], at)
        elif isinstance(target, ast.Subscript):
            elem = self.expr(target)
            if isinstance(self.tk.types.get(id(target.value)), TupleT):
                raise self.fail(at, "tuples cannot be changed; use tg.private(dtype, shape) for "
                                    "a small per-work-item array")
            if elem is not None and t is not None:
                self.store_check(at, elem, t)

    def rank_hint(self, at: ast.stmt, names: int) -> str:
        """Where ``at`` unpacks an intrinsic of one value per dimension: the launch's rank."""
        call = _PER_DIMENSION.get(tg_name(at.value) or "") if isinstance(at, ast.Assign) \
            else None
        if call is None:
            return ""
        rank = self.tk.rank
        dims = ", ".join(f"n{d}" for d in range(names))
        return (f": this launch's ndrange is {rank}-D, so {call} gives {rank} "
                f"value{'s' if rank > 1 else ''}; launch with a {names}-D ndrange "
                f"(ndrange=({dims})) or unpack it into {rank} name{'s' if rank > 1 else ''}")

    def store_check(self, at: ast.AST, elem: Type, value: Type) -> None:
        if not isinstance(value, Scalar):
            raise self.fail(at, f"an array element can only hold a number, not {value}")
        if elem.dtype in INTS and value.is_float:
            raise self.fail(at, f"storing a {value.dtype} into an {elem.dtype} array would "
                                "truncate it; convert explicitly with int(...) if you mean that")
        if elem.dtype == "bool" and value.dtype != "bool":
            raise self.fail(at, f"storing a {value.dtype} into a bool array; compare instead "
                                "(x != 0)")

    # -- expressions ----------------------------------------------------------------------
    def expr(self, node: ast.expr) -> Type | None:
        t = self._expr(node)
        if t is not None:
            self.tk.types[id(node)] = t
        return t

    def _expr(self, node: ast.expr) -> Type | None:
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, bool):
                return BOOL
            if isinstance(v, int):
                if not -(2**63) <= v < 2**63:
                    raise self.fail(node, f"the integer {v} does not fit in a 64-bit integer, "
                                          "which kernels compute with (-2**63 to 2**63 - 1; "
                                          "write -2**63 as -9223372036854775807 - 1); for a "
                                          f"quantity, write a float ({float(v):g})")
                return INT64
            if isinstance(v, float):
                return WEAK_FLOAT
            if isinstance(v, str) and v.startswith("dtype:"):
                return DType(v[6:])
            raise self.fail(node, f"the constant {v!r} is not supported in kernels")
        if isinstance(node, ast.Name):
            if node.id.startswith("tg_"):
                raise self.fail(node, f"tg.{node.id[3:]} is only meaningful as an argument of "
                                      "tg.index(space, kind)")
            t = self.env.get(node.id)
            if t is None and self.final:
                raise self.fail(node, f"{node.id} is used before it is assigned")
            return t
        if isinstance(node, ast.Tuple):
            items = [self.expr(e) for e in node.elts]
            for e, t in zip(node.elts, items):
                if _holds_array(t):
                    # (the same rule as a second name: what the kernel writes, its
                    # derivatives and the CPU's loops follow arrays by their names; Numba
                    # also drops stores through such a tuple inside a parallel loop)
                    raise self.fail(node, f"{ast.unparse(e)} is an array inside a tuple: "
                                          "kernels use each array under its own name; pass "
                                          "the arrays separately (f(Y, X), not f((Y, X)))")
            if any(i is None for i in items):
                return None
            return TupleT(tuple(items))
        if isinstance(node, ast.BinOp):
            a, b = self.expr(node.left), self.expr(node.right)
            if a is None or b is None:
                return None
            return self.binop_type(node, node.op, a, b)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                self.truthy.add(id(node.operand))
            t = self.expr(node.operand)
            if t is None:
                return None
            self.need_scalar(node.operand, t)
            if isinstance(node.op, ast.Not):
                return BOOL
            if isinstance(node.op, ast.Invert):
                if t.is_float:
                    raise self.fail(node, "~ needs an integer or boolean")
                return t if t.dtype == "bool" else INT64
            return INT64 if t.dtype in ("bool", "int32") else t
        if isinstance(node, ast.BoolOp):
            tested = id(node) in self.truthy
            for v in node.values:
                if tested:
                    self.truthy.add(id(v))
                t = self.expr(v)
                if t is not None:
                    self.need_scalar(v, t)
                    if not tested and t.dtype != "bool":
                        op = "or" if isinstance(node.op, ast.Or) else "and"
                        raise self.fail(node, f"`{op}` of numbers used as a value: in a kernel "
                                              f"`x {op} y` is a bool (whether it holds), not "
                                              "Python's choice of x or y; write "
                                              f"`{'x if x != 0 else y' if op == 'or' else 'y if x != 0 else x'}`, "
                                              f"or compare (`x != 0 {op} y != 0`) for a bool")
            return BOOL
        if isinstance(node, ast.Compare):
            for v in [node.left] + node.comparators:
                t = self.expr(v)
                if t is not None:
                    self.need_scalar(v, t)
            return BOOL
        if isinstance(node, ast.IfExp):
            self.condition(node.test)
            a, b = self.expr(node.body), self.expr(node.orelse)
            return self.join_at(node, a, b)
        if isinstance(node, ast.Attribute):
            return self.attribute(node)
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.fail(node, f"{type(node).__name__} expressions are not supported in kernels")

    def need_scalar(self, node: ast.expr, t: Type) -> None:
        if not isinstance(t, Scalar):
            raise self.fail(node, f"expected a number here, got {t}")

    def join_at(self, node: ast.AST, *ts: Type | None) -> Type | None:
        out = None
        try:
            for t in ts:
                if t is None:
                    return None
                out = join(out, t)
        except TypeError as exc:
            raise self.fail(node, f"incompatible types: {exc}") from None
        return out

    def binop_type(self, node: ast.AST, op: ast.operator, a: Type, b: Type) -> Type:
        if isinstance(a, TupleT) or isinstance(b, TupleT):
            raise self.fail(node, "arithmetic on tuples is not supported in kernels; index "
                                  "their elements")
        if not isinstance(a, Scalar) or not isinstance(b, Scalar):
            raise self.fail(node, f"arithmetic needs numbers, got {a} and {b}; index arrays "
                                  "element by element")
        try:
            return arith(op, a, b)
        except TypeError as exc:
            raise self.fail(node, str(exc)) from None

    def attribute(self, node: ast.Attribute) -> Type | None:
        base = self.expr(node.value)
        if base is None:
            return None
        if not isinstance(base, Array):
            raise self.fail(node, f".{node.attr} needs an array, {ast.unparse(node.value)} is {base}")
        if node.attr == "shape":
            return TupleT((INT64,) * base.ndim)
        if node.attr in ("size", "ndim"):
            return INT64
        return DType(base.dtype)

    def subscript(self, node: ast.Subscript) -> Type | None:
        base = self.expr(node.value)
        idx = self.expr(node.slice)
        if base is None or idx is None:
            return None
        if isinstance(base, TupleT):
            if not (isinstance(idx, Scalar) and not idx.is_float):
                raise self.fail(node, "tuples are indexed with integers")
            if isinstance(node.slice, ast.Constant) or (
                    isinstance(node.slice, ast.UnaryOp) and isinstance(node.slice.operand, ast.Constant)):
                k = ast.literal_eval(node.slice)
                if not -len(base.items) <= k < len(base.items):
                    raise self.fail(node, f"index {k} is out of range for a tuple of "
                                          f"{len(base.items)}")
                return base.items[k]
            if len(set(base.items)) != 1:
                raise self.fail(node, "a tuple of mixed types needs a constant index")
            return base.items[0]
        if not isinstance(base, Array):
            raise self.fail(node, f"{ast.unparse(node.value)} is {base}, which cannot be indexed")
        parts = idx.items if isinstance(idx, TupleT) else (idx,)
        flat = []
        for p in parts:
            flat.extend(p.items if isinstance(p, TupleT) else (p,))
        for p in flat:
            if not (isinstance(p, Scalar) and not p.is_float and p.dtype != "bool"):
                raise self.fail(node, f"array indices must be integers, got {p} (NumPy takes "
                                      "a bool index for a mask); convert with int(...)")
        if len(flat) != base.ndim:
            names = ", ".join("ijk"[:base.ndim])
            raise self.fail(node, f"{ast.unparse(node.value)} has {base.ndim} dimension(s) but "
                                  f"is indexed with {len(flat)} index(es); kernels read and write "
                                  f"single elements: {ast.unparse(node.value)}[{names}]")
        return Scalar(base.dtype)

    def call(self, node: ast.Call) -> Type | None:
        name = tg_name(node)
        if name is None:
            return self.device_call(node)
        if name in ("localmem", "private"):
            return self.memory(node, name)
        if name == "where" and node.args:       # (its condition: for its truth value)
            self.truthy.add(id(node.args[0]))
        args = [self.expr(a) for a in node.args]
        if any(a is None for a in args):
            return None
        rank = self.tk.rank
        if not self.ir.is_kernel and name in _KERNEL_ONLY:
            raise self.fail(node, f"tg.{_KERNEL_ONLY[name]} is only available in a kernel body; "
                                  "pass what the device function needs as an argument")
        if name in ("global_index", "local_index", "group_index"):
            self.need_args(node, args, 0)
            return INT64
        if name in ("global_indices", "local_indices", "group_indices", "ndrange", "groupsize"):
            self.need_args(node, args, 0)
            return TupleT((INT64,) * rank)
        if name == "synchronize":
            self.need_args(node, args, 0)
            if not self.ir.is_kernel:
                raise self.fail(node, "tg.synchronize() is a workgroup barrier and may only be "
                                      "used in a kernel body, not in a device function")
            return NONE
        for a, arg_node in zip(args, node.args):
            if name.startswith("atomic_") or name == "group_reduce_add":
                break
            self.need_scalar(arg_node, a)
        row = primitives.lookup(name)
        if row is not None:
            self.need_args(node, args, row.arity)
            return self.primitive_result(node, row.result, args)
        if name in ("min", "max"):
            if len(args) < 2:
                raise self.fail(node, f"{name} in a kernel takes two or more numbers")
            return self.join_at(node, *args)
        if name in ("maximum", "minimum"):     # np.maximum(a, b) in a kernel
            if len(args) != 2:
                raise self.fail(node, f"np.{name} in a kernel takes two numbers")
            return self.join_at(node, *args)
        if name == "where":
            self.need_args(node, args, 3)
            return self.join_at(node, args[1], args[2])
        if name in DTYPE_NAMES:
            self.need_args(node, args, 1)
            return Scalar(name)
        if name.startswith("atomic_"):
            return self.atomic(node, name, args)
        if name == "group_reduce_add":   # internal: generated by the reverse transform
            self.atomic(node, name, args)
            return NONE
        raise self.fail(node, f"tg.{name} is not supported here")

    def primitive_result(self, node: ast.Call, rule: str, args: list[Scalar]) -> Scalar:
        """The type of a primitive's result, by its row's type rule (lang/primitives.py)."""
        if rule == "rounded":          # floor of a float stays a float, as in NumPy
            return INT64 if args[0].dtype == "bool" else args[0]
        if rule == "bool":
            return BOOL
        if rule == "abs":              # abs of an int stays an int
            return INT64 if args[0].dtype in ("bool", "int32") else args[0]
        return float_of(self.join_at(node, *args) if len(args) > 1 else args[0])

    def need_args(self, node: ast.Call, args: list[Any], n: int) -> None:
        if len(args) != n:
            raise self.fail(node, f"tg.{tg_name(node)} takes {n} argument(s), got {len(args)}")

    def atomic(self, node: ast.Call, name: str, args: list[Type]) -> Type:
        if len(args) != 3:
            raise self.fail(node, f"tg.{name}(array, index, value) takes three arguments")
        arr, idx, val = args
        if not isinstance(arr, Array):
            raise self.fail(node, f"the first argument of tg.{name} must be an array, got {arr}")
        fake = ast.Subscript(value=node.args[0], slice=node.args[1], ctx=ast.Load())
        ast.copy_location(fake, node)
        elem = self.subscript(fake)
        self.need_scalar(node.args[2], val)
        if arr.dtype == "bool":
            raise self.fail(node, f"tg.{name} needs a numeric array, not bool")
        self.store_check(node, elem, val)
        return elem

    def memory(self, node: ast.Call, name: str) -> Type:
        if not self.ir.is_kernel:
            raise self.fail(node, f"tg.{name} may only be declared in a kernel body; pass the "
                                  "array to the device function as an argument")
        if len(node.args) != 2:
            raise self.fail(node, f"tg.{name}(dtype, shape) takes a dtype and a shape")
        dt = self.expr(node.args[0])
        if not isinstance(dt, DType):
            raise self.fail(node.args[0], f"the first argument of tg.{name} is a dtype such as "
                                          "np.float32 or A.dtype")
        shape = self.static(node.args[1])
        if isinstance(shape, int):
            shape = (shape,)
        if not (isinstance(shape, tuple) and 1 <= len(shape) <= 3
                and all(isinstance(s, int) and s > 0 for s in shape)):
            raise self.fail(node.args[1], f"tg.{name} needs a shape of 1 to 3 positive integers "
                                          f"known at compile time, got {shape}")
        self.tk.static_shapes[id(node)] = (dt.dtype, shape)
        return Array(dt.dtype, len(shape), "local" if name == "localmem" else "private")

    def static(self, node: ast.expr) -> Any:
        """Evaluate a compile-time constant expression (literals, tg.groupsize(), arithmetic)."""
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(self.static(e) for e in node.elts)
        if tg_name(node) == "groupsize":
            return self.tk.groupsize
        if isinstance(node, ast.Subscript):
            return self.static(node.value)[self.static(node.slice)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult,
                                                                ast.FloorDiv)):
            a, b = self.static(node.left), self.static(node.right)
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b,
                    ast.FloorDiv: a // b if b else 0}[type(node.op)]
        raise self.fail(node, f"{ast.unparse(node)} is not known at compile time; local-memory "
                              "shapes use literals, module-level constants and tg.groupsize()")

    def device_call(self, node: ast.Call) -> Type | None:
        fname = node.func.id
        func = self.ir.funcs[fname]
        args = [self.expr(a) for a in node.args]
        if any(a is None for a in args):
            return None
        callee_ir = self.resolve_func(func)
        if len(args) != len(callee_ir.params):
            raise self.fail(node, f"{fname} takes {len(callee_ir.params)} argument(s), got "
                                  f"{len(args)}")
        if fname in self.stack or callee_ir.name in self.stack:
            raise self.fail(node, f"{fname} calls itself (through {' -> '.join(self.stack)}); "
                                  "recursion is not supported on devices: write a loop")
        key = ("typed", tuple(args), self.tk.rank, self.tk.groupsize)
        callee = func.cache.get(key)
        if callee is None:
            callee = specialize(callee_ir, tuple(args), self.tk.rank, self.tk.groupsize,
                                self.resolve_func, self.stack)
            func.cache[key] = callee
        self.tk.callees[id(node)] = callee
        return callee.return_type


def _holds_array(t: Type) -> bool:
    return isinstance(t, Array) or isinstance(t, TupleT) and any(map(_holds_array, t.items))
