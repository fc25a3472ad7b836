"""What the derivative transforms share: the kernel's memory declarations and the activity
analysis (which values carry derivatives), over a typed, normalized kernel."""

from __future__ import annotations

import ast
import copy

from tapegrad.errors import KernelActivityError, KernelError, located
from tapegrad.frontend.ir import tg_call, tg_name
from tapegrad.frontend.types import Array, Scalar, TupleT, TypedKernel

# the calls whose value is one of their arguments: Python's max and min, NumPy's maximum and
# minimum (np.maximum written in a kernel); the derivative goes to the argument returned
SELECTIONS = ("max", "min", "maximum", "minimum")


class Transform:
    """Base of the tangent and adjoint transforms.

    ``activity[k]`` is ``"const"``, ``"dup"`` (an array with a shadow or tangent) or
    ``"active"`` (a float scalar carrying a derivative) for parameter ``k``.
    """

    def __init__(self, tk: TypedKernel, activity: tuple[str, ...]):
        self.tk = tk
        self.ir = tk.ir
        self.activity = dict(zip(self.ir.params, activity))
        self.count = 0
        self.body = self.ir.body
        self.decls = [s for s in self.body if isinstance(s, ast.Assign) and tg_name(s.value) in
                      ("localmem", "private")]
        self.memory_kind = {s.targets[0].id: tg_name(s.value) for s in self.decls}

    def fail(self, node: ast.AST, message: str) -> KernelError:
        return located(node, self.ir.filename, message)

    def activity_error(self, node: ast.AST, message: str) -> KernelError:
        """An annotation that does not fit the kernel (not unsupported code)."""
        return located(node, self.ir.filename, message, KernelActivityError)

    def T(self, node: ast.AST):
        return self.tk.types.get(id(node))

    def clone(self, e: ast.expr) -> ast.expr:
        """A copy of ``e`` whose nodes keep their inferred types (so activity still works)."""
        copied = copy.deepcopy(e)
        for old, new in zip(ast.walk(e), ast.walk(copied)):
            if id(old) in self.tk.types:
                self.tk.types[id(new)] = self.tk.types[id(old)]
        return copied

    def selection(self, e: ast.Call) -> tuple[ast.expr, ast.expr, ast.expr]:
        """``(test, a, b)`` for a call of ``SELECTIONS``: its value is ``a`` where ``test``
        holds, else ``b``, exactly as the printers compute it, NaNs and ties included.

        ``max(x1, ..., xn)`` folds from the left, each step Python's ``max(acc, x)``, ``x if
        x > acc else acc`` (the first of equal ones; a NaN as it falls), so ``a`` is ``xn``
        and ``b`` the fold of the others (``x1`` alone for two); ``min`` with ``<``.
        ``np.maximum(x, y)`` is NumPy's: ``x if x >= y or x != x else y`` (a NaN is the
        result, the first if both are; the first of equal ones); ``minimum`` with ``<=``.
        ``a`` and ``b`` are the call's own argument nodes or a typed call of them; the test
        reads copies."""
        name = tg_name(e)
        args = e.args
        if name in ("maximum", "minimum"):
            a, b = args
            op = ast.GtE() if name == "maximum" else ast.LtE()
            test = ast.Compare(left=copy.deepcopy(a), ops=[op], comparators=[copy.deepcopy(b)])
            if self.is_float(a):          # (an int is never NaN: C warns at i != i)
                test = ast.BoolOp(op=ast.Or(), values=[test, ast.Compare(
                    left=copy.deepcopy(a), ops=[ast.NotEq()], comparators=[copy.deepcopy(a)])])
            return test, a, b
        *rest, a = args
        b = rest[0] if len(rest) == 1 else tg_call(name, [self.clone(x) for x in rest])
        self.tk.types[id(b)] = self.T(e)
        op = ast.Gt() if name == "max" else ast.Lt()
        test = ast.Compare(left=copy.deepcopy(a), ops=[op], comparators=[copy.deepcopy(b)])
        return test, a, b

    def fresh(self, stem: str) -> str:
        # (stems must not make the names the backends' lowering uses for its loops, `_g0`,
        # `_l1`, `_r1`, `_n0`...: a temporary `_g2` once overwrote a 3-D launch's group index)
        self.count += 1
        return f"_{stem}{self.count}"

    # -- activity ---------------------------------------------------------------------------
    def is_float(self, node: ast.AST) -> bool:
        t = self.T(node)
        return isinstance(t, Scalar) and t.is_float

    def activity_analysis(self) -> None:
        ir = self.ir
        self.active_arrays = {p for p, a in self.activity.items() if a == "dup"}
        self.active_names = {p for p, a in self.activity.items() if a == "active"}
        for p in self.active_names:
            t = self.tk.argtypes[ir.params.index(p)]
            if not (isinstance(t, Scalar) and t.is_float):
                raise self.activity_error(
                    ir.body[0] if ir.body else None, f"argument {p} is Active but has type "
                    f"{t}; only float scalars can be Active (pass integers as Const)")
        changed = True
        while changed:
            changed = False
            for n in ast.walk(ast.Module(body=self.body, type_ignores=[])):
                if isinstance(n, ast.Assign):
                    target = n.targets[0]
                    if isinstance(target, ast.Name) and target.id not in self.active_names \
                            and self.is_float(target) and self.active(n.value):
                        self.active_names.add(target.id)
                        changed = True
                    elif isinstance(target, ast.Name) and self.float_tuple(target) \
                            and self.carries(n.value):
                        # a tuple held whole: its elements' derivatives would be lost
                        names = ", ".join(f"{target.id}{k}"
                                          for k in range(len(self.T(target).items)))
                        raise self.fail(n, f"{target.id} holds a tuple of values that depend "
                                           "on the differentiated inputs; tuples cannot carry "
                                           "derivatives: unpack it into scalars where it is "
                                           f"made ({names} = ...)")
                    elif isinstance(target, ast.Subscript):
                        changed |= self.store_activity(n, target.value.id, n.value)
                elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Subscript):
                    changed |= self.store_activity(n, n.target.value.id, n.value)
                elif isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_"):
                    changed |= self.store_activity(n, n.args[0].id, n.args[2])

    def store_activity(self, at: ast.AST, array: str, value: ast.expr) -> bool:
        if not self.active(value) or array in self.active_arrays:
            return False
        if array in self.memory_kind:
            self.active_arrays.add(array)
            return True
        raise self.activity_error(
            at, f"this stores a value that depends on the differentiated inputs into {array}, "
            f"which is Const, so its derivative would be lost; pass Duplicated({array}, "
            f"d{array}) (or DuplicatedNoNeed)")

    def atomic_result_error(self, call: ast.Call) -> KernelError:
        """The value an atomic returns, used where a derivative is computed."""
        return self.fail(call, "the value returned by an atomic depends on the order in which "
                               "work-items run, so a differentiated kernel cannot use it; call "
                               "the atomic as a statement")

    def extremum_error(self, call: ast.Call, why: str = "") -> KernelError:
        """``tg.atomic_min``/``atomic_max`` of a value whose derivative is wanted: the
        derivative would go to whichever work-item won, which depends on the order they run
        (``why``: another reason, for a constant the adjoint cannot follow)."""
        op = tg_name(call)
        why = why or ("of a value whose derivative is wanted cannot be differentiated: the "
                      "derivative would go to whichever work-item won, which depends on the "
                      "order they run")
        error = self.fail(call, f"tg.{op} {why}. Find the extreme without atomics "
                                f"({op[len('atomic_'):]}(...) over a loop, then a plain store), "
                                "which both modes differentiate")
        error.varying_only = True       # (testing/tape.py: with every input varying)
        return error

    def check_rule_arrays(self, call: ast.Call) -> None:
        """A hand-written rule differentiates its scalar arguments only: an array argument
        whose derivative is wanted would lose it silently."""
        for a in call.args:
            if isinstance(a, ast.Name) and a.id in self.active_arrays \
                    and isinstance(self.T(a), Array):
                raise self.fail(call, f"{call.func.id} has a hand-written derivative rule, "
                                      "which covers its scalar arguments only, but it reads "
                                      f"{a.id}, whose derivative is wanted (it would be lost): "
                                      f"pass the elements it needs ({a.id}[i]) as scalars, or "
                                      "remove the rule and let tapegrad differentiate its body")

    def float_tuple(self, node: ast.AST) -> bool:
        t = self.T(node)
        return isinstance(t, TupleT) and any(isinstance(i, Scalar) and i.is_float
                                             for i in t.items)

    def carries(self, e: ast.expr) -> bool:
        """Does a part of ``e`` (a tuple, say) depend on an active input?"""
        return any(self.active(n) for n in ast.walk(e) if isinstance(n, ast.expr))

    def active(self, e: ast.expr) -> bool:
        """Does ``e`` carry a derivative (a float depending on an active input)?"""
        if not self.is_float(e):
            return False
        for n in ast.walk(e):
            if isinstance(n, ast.Name) and n.id in self.active_names:
                return True
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) \
                    and n.value.id in self.active_arrays:
                return True
            if isinstance(n, ast.Call) and tg_name(n) is None and any(   # f(A, i), a rule's
                    isinstance(a, ast.Name) and a.id in self.active_arrays for a in n.args):
                return True
            if isinstance(n, ast.Call) and (tg_name(n) or "").startswith("atomic_") \
                    and n.args[0].id in self.active_arrays:     # (the element it held)
                return True
        return False
