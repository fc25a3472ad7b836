"""Print a typed kernel as C, in the OpenCL C or CUDA C++ dialect, with Python's semantics.

One printer serves both dialects; a ``Dialect`` says only what the two spell differently
(``dialects.py``).  The printer is split by concern, each module importing only those before
it: ``dialects`` (spellings, reserved names) -> ``names`` (the C names of user variables
named like the printer's own or C's macros) -> ``helpers`` (the module's helper functions:
Python's arithmetic, atomics) -> ``expressions`` (Python's semantics in C expressions) ->
``statements`` (one function body) -> ``barriers`` (a body split at its barriers) -> this
module (the module, a kernel's signature and declarations, local and private memory).

Generated layout (CUDA, 1-D, groupsize 256): the ndrange's last dimension runs along the
device's dimension 0, work-items past the ndrange return at once.  (OpenCL's kernels also
take each array's offset into its buffer, ``opencl/printer.py``.)

    extern "C" __global__ void saxpy(double *Y, const long long Y_shape0, const double a,
                                     double *X, const long long X_shape0, const long long _n0) {
        const long long _l0 = threadIdx.x;
        const long long _g0 = blockIdx.x;
        if (!(_g0 * 256 + _l0 < _n0)) return;
        long long i = 0;
        // file.py:3
        i = (_g0 * 256 + _l0);
        // file.py:4
        Y[(i)] = ((a * X[(i)]) + Y[(i)]);
    }

That is the layout of ``TAPEGRAD_ITEMS_PER_THREAD=1``.  A kernel without barriers and local
memory runs several work-items per thread by default: its body becomes ``tg_item(...)`` (the
kernel's arguments and one work-item's coordinates), called for the thread's work-items, each
under the range check above; its ``restrict`` variant qualifies the array pointers
(``items.py`` says why both keep the results).

Kernels with barriers keep every work-item alive (each must reach each barrier) and guard
the statements between barriers with ``_valid``, as ``structure.BarrierPlan`` splits them
(``barriers.py``).  Atomics call a helper per operation, type and memory
(``Helpers.atomic_helper``).
"""

from __future__ import annotations

import ast
import os

from tapegrad.backends.c.barriers import BarrierBody
from tapegrad.backends.c.dialects import (
    CUDA,
    CUDA_AXES,
    OPENCL,
    PRINTED_WORDS,
    Dialect,
    kernel_symbol,
    renamed,
)
from tapegrad.backends.c.expressions import fail
from tapegrad.backends.c.helpers import SCALAR_SLOTS, SCALAR_SUM_SIZE, SLOT_STRIDE, Helpers
from tapegrad.backends.c.items import independent_items, items_per_thread
from tapegrad.backends.c.names import assigned_names, c_names, user_names
from tapegrad.backends.c.statements import Body
from tapegrad.backends.structure import (
    BarrierPlan,
    contains_barrier,
    device_functions,
    memory_decl,
)
from tapegrad.frontend.types import Array, Scalar, TupleT, TypedKernel

# (the names callers import from here: the backends, the tests)
__all__ = ["CUDA", "OPENCL", "SCALAR_SLOTS", "SCALAR_SUM_SIZE", "SLOT_STRIDE",
           "STATIC_SHARED_LIMIT", "CPrinter", "Dialect", "kernel_symbol", "local_bytes"]

STATIC_SHARED_LIMIT = 0xC000    # CUDA's static shared memory per block (48 KiB); more is dynamic
_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "bool": 1}


def _count(shape: tuple[int, ...]) -> int:
    size = 1
    for n in shape:
        size *= n
    return size


def local_bytes(tk: TypedKernel) -> int:
    """The bytes of local (shared) memory a workgroup of ``tk`` declares, each array rounded up
    to 16 bytes as dynamic shared memory lays them out."""
    total = 0
    for st in tk.ir.body:
        if memory_decl(st) == "localmem":
            dtype, shape = tk.static_shapes[id(st.value)]
            total += -(-_count(shape) * _ITEMSIZE[dtype] // 16) * 16
    return total


class CPrinter(Helpers):
    """Prints one typed kernel (and the device functions it calls) in one dialect."""

    def __init__(self, tk: TypedKernel, dialect: Dialect, dynamic_shared: bool = True,
                 items: int | None = None, restrict: bool = False):
        super().__init__(dialect)
        self.tk = tk
        # a kernel of independent work-items runs ``items`` of them per thread (default:
        # TAPEGRAD_ITEMS_PER_THREAD) and may take restrict pointers (items.py); others one
        independent = independent_items(tk)
        self.items = (items_per_thread() if items is None else items) if independent else 1
        self.restrict = restrict and independent
        # CUDA takes at most 48 KiB of shared memory declared in the source; beyond that the
        # kernel's local arrays live in dynamic shared memory, whose size the launch passes
        # (``dynamic_bytes``); ``shared_bytes`` is a workgroup's whole (set by ``module``)
        self.allow_dynamic = dynamic_shared and dialect.name == "cuda"
        self.shared_bytes = self.dynamic_bytes = 0
        functions = [*device_functions(tk), tk]
        self.cnames, self.user_names = c_names(tk, functions), user_names(functions)

    # -- the module ------------------------------------------------------------------------
    def module(self, callees: list[TypedKernel]) -> str:
        body: list[str] = []
        for callee in callees:
            body += self._function(callee) + [""]
        body += self._kernel()
        # (the file's name, not its folder: compiled code is cached by the source's hash)
        head = [f"// Generated by tapegrad from {self.tk.name} ("
                f"{os.path.basename(self.tk.ir.filename)}:"
                f"{self.tk.ir.lineno}) for {self.d.name}: rank {self.tk.rank}, groupsize "
                f"{self.tk.groupsize}{self._variant()}.",
                "// Read it to see what runs; edits are overwritten."]
        if self.d.preamble:
            head.append(self.d.preamble)
        head += [f"#pragma OPENCL EXTENSION {e} : enable" for e in sorted(self.pragmas)]
        names = {self.cnames.get(n, n) for n in self.user_names}
        clash = sorted(names & PRINTED_WORDS)
        if clash:
            raise fail(self.tk, None, f"a variable named '{clash[0]}' is a word of C that "
                                      "the generated code uses itself: rename it to run the "
                                      "kernel on a GPU")
        body = renamed(body, {n for n in names if kernel_symbol(n) != n})
        return "\n".join(head + [""] + list(self.helpers.values()) + [""] + body) + "\n"

    def _variant(self) -> str:
        """What the header says of the items per thread and the pointers (items.py)."""
        items = f", {self.items} work-items per thread" if self.items > 1 else ""
        return items + (", restrict pointers" if self.restrict else "")

    def _kernel(self) -> list[str]:
        tk, d = self.tk, self.d
        params = self._params(tk, entry=True, restrict=self.restrict) + \
            [f"const {d.int64} _n{k}" for k in range(tk.rank)]
        out = [f"{d.kernel} {kernel_symbol(tk.name)}({', '.join(params)}) {{"]
        out += self._prologue() + self._coordinates()
        if self.items > 1:
            return self._item_function() + [""] + out + self._items() + ["}"]
        r, W = tk.rank, tk.groupsize
        valid = " && ".join(f"_g{k} * {W[k]} + _l{k} < _n{k}" for k in range(r))
        body = tk.ir.body
        decls = [st for st in body if memory_decl(st)]
        self.shared_bytes = local_bytes(tk)
        if not any(contains_barrier(st) for st in body):
            out.append(f"    if (!({valid})) return;")
            return out + self._body(tk) + ["}"]
        # work-items past the ndrange stay: every one must reach each barrier; one that
        # returns stays too, invalid from there on (returns.py)
        out.append(f"    bool _valid = {valid};")
        plan = BarrierPlan(tk, [st for st in body if not memory_decl(st)], decls)
        sub = BarrierBody(self, tk, plan)
        self.shared_bytes += sub.shared_bytes
        out += self._memory(tk, decls) + self._declarations(tk, 1)
        if any(isinstance(n, ast.Return) for n in ast.walk(ast.Module(body=body,
                                                                      type_ignores=[]))):
            out.append("    bool _returned = false;")
        out += sub.declarations(1)
        sub.blocks(plan.blocks, 1)
        return out + sub.lines + ["}"]

    def _prologue(self) -> list[str]:
        """What a kernel does first (the OpenCL dialect moves its pointers to their views)."""
        return []

    def _coordinates(self) -> list[str]:
        """The work-item's coordinates: ``_l<k>``, ``_g<k>`` (``_b0`` for a thread of several
        work-items, whose ``_g0`` are ``items * _b0 + 0 .. items - 1``)."""
        r, d, out = self.tk.rank, self.d, []
        for k in range(r):
            axis = r - 1 - k                  # the last dimension runs along the device's first
            where = axis if d.name == "opencl" else CUDA_AXES[axis]
            group = "_b0" if k == 0 and self.items > 1 else f"_g{k}"
            out.append(f"    const {d.int64} _l{k} = {d.local_id.format(where)};")
            out.append(f"    const {d.int64} {group} = {d.group_id.format(where)};")
        return out

    def _body(self, tk: TypedKernel) -> list[str]:
        """The declarations and statements of a kernel without barriers."""
        decls = [st for st in tk.ir.body if memory_decl(st)]
        sub = Body(self, tk)
        sub.statements([st for st in tk.ir.body if not memory_decl(st)], 1)
        return self._memory(tk, decls) + self._declarations(tk, 1) + sub.lines

    def _item_function(self) -> list[str]:
        """One work-item's body as a function (its ``return`` ends that work-item only),
        taking the kernel's arguments and the work-item's coordinates."""
        tk, d = self.tk, self.d
        params = self._params(tk, restrict=self.restrict) + [
            f"const {d.int64} _{v}{k}" for v in "ngl" for k in range(tk.rank)]
        return [f"{d.item_function} void tg_item({', '.join(params)}) {{"] + \
            self._body(tk) + ["}"]

    def _items(self) -> list[str]:
        """Each thread's ``items`` work-items (items.py): unguarded where the last one is in the
        ndrange (then all are), else each under the one-item launch's range check."""
        tk, d, K = self.tk, self.d, self.items
        r, W = tk.rank, tk.groupsize
        rest = " && ".join(f"_g{k} * {W[k]} + _l{k} < _n{k}" for k in range(1, r))
        out = [f"    if (!({rest})) return;"] if rest else []
        names = [text.split()[-1].lstrip("*") for text in self._params(tk)]
        call = f"tg_item({', '.join(names + [f'_{v}{k}' for v in 'ngl' for k in range(r)])});"
        first = f"            const {d.int64} _g0 = _b0 * {K} + _m;"
        return out + [
            f"    // {K} work-items per thread, {W[0]} apart: workgroups _b0 * {K} + 0 .. {K - 1} "
            "(c/items.py)",
            f"    if ((_b0 * {K} + {K - 1}) * {W[0]} + _l0 < _n0) {{",
            "        #pragma unroll",
            f"        for (int _m = 0; _m < {K}; _m++) {{",
            first,
            f"            {call}",
            "        }",
            "    } else {",
            f"        for (int _m = 0; _m < {K}; _m++) {{",
            first,
            f"            if (_g0 * {W[0]} + _l0 < _n0) {call}",
            "        }",
            "    }"]

    def _memory(self, tk: TypedKernel, decls: list[ast.stmt]) -> list[str]:
        """Local memory (one per workgroup) and private arrays (one per work-item), flat, with
        their extents as constants (indexed like arguments)."""
        out = []
        offset = 0
        dynamic = self.allow_dynamic and self.shared_bytes > STATIC_SHARED_LIMIT
        self.dynamic_bytes = local_bytes(tk) if dynamic else 0
        if dynamic:
            out.append("    extern __shared__ __align__(16) unsigned char _tg_shared[];")
        for st in decls:
            name = self.cnames.get(st.targets[0].id, st.targets[0].id)
            dtype, shape = tk.static_shapes[id(st.value)]
            size = _count(shape)
            ctype = self.d.ctype(dtype)
            if memory_decl(st) == "localmem" and dynamic:
                out.append(f"    {ctype} *{name} = ({ctype} *)(_tg_shared + {offset});")
                offset += -(-size * _ITEMSIZE[dtype] // 16) * 16
            else:
                where = self.d.local_memory if memory_decl(st) == "localmem" else ""
                out.append(f"    {where}{ctype} {name}[{size}];")
            out += [f"    const {self.d.int64} {name}_shape{k} = {n};"
                    for k, n in enumerate(shape)]
        return out

    def _function(self, callee: TypedKernel) -> list[str]:
        d = self.d
        ret = callee.return_type
        rtype = d.ctype(ret.dtype) if isinstance(ret, Scalar) else "void"
        out = []
        if isinstance(ret, TupleT):          # a tuple comes back as a struct of its items
            rtype = f"tg_tuple_{callee.symbol}"
            fields = " ".join(f"{d.ctype(item.dtype)} v{k};" for k, item in enumerate(ret.items))
            out.append(f"typedef struct {{ {fields} }} {rtype};")
        out.append(f"{d.function} {rtype} {callee.symbol}({', '.join(self._params(callee))}) "
                   "{")
        out += self._declarations(callee, 1)
        sub = Body(self, callee)
        sub.statements(callee.ir.body, 1)
        out += sub.lines
        out.append("}")
        return out

    def _params(self, tk: TypedKernel, entry: bool = False, restrict: bool = False
                ) -> list[str]:
        """``tk``'s parameters in C (``entry``: as the kernel itself takes them), each ending
        with its name; ``restrict``: its arrays' pointers restrict-qualified."""
        out = []
        # (a device function may assign its scalar parameters, its own copies: no const)
        assigned = set() if tk.ir.is_kernel else assigned_names(tk)
        for p, t in zip(tk.ir.params, tk.argtypes):
            const = "" if p in assigned else "const "
            p = self.cnames.get(p, p)
            if isinstance(t, Array):
                qualifier = {"global": self.d.global_ptr, "local": self.d.local_ptr,
                             "private": ""}[t.space]
                element = self.d.element_type(t.dtype) if t.space == "global" else \
                    self.d.ctype(t.dtype)
                out.append(f"{qualifier}{element} *{self.d.restrict + ' ' if restrict else ''}"
                           f"{p}")
                out += [f"const {self.d.int64} {p}_shape{k}" for k in range(t.ndim)]
            elif isinstance(t, Scalar):
                ctype = "int" if t.dtype == "bool" else self.d.ctype(t.dtype)
                out.append(f"{const}{ctype} {p}")
            elif isinstance(t, TupleT) and not tk.ir.is_kernel and all(
                    isinstance(item, Scalar) for item in t.items):
                out += [f"{const}{self.d.ctype(item.dtype)} {p}_{k}"
                        for k, item in enumerate(t.items)]
            else:
                raise fail(tk, tk.ir.body[0] if tk.ir.body else None,
                           f"argument {p} ({t}) cannot be passed to a C kernel yet")
        return out

    def _declarations(self, tk: TypedKernel, depth: int) -> list[str]:
        out = []
        params = set(tk.ir.params)
        for name, t in sorted(tk.locals.items()):
            if name in params:
                continue
            name = self.cnames.get(name, name)
            if isinstance(t, Scalar):
                out.append("    " * depth + f"{self.d.ctype(t.dtype)} {name} = 0;")
            elif isinstance(t, TupleT):
                for k, item in enumerate(t.items):
                    if not isinstance(item, Scalar):
                        raise fail(tk, None, f"{name} holds a tuple of {item}: only "
                                             "tuples of numbers are printed as C so far")
                    out.append("    " * depth + f"{self.d.ctype(item.dtype)} {name}_{k} = 0;")
        return out
