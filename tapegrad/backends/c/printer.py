"""Print a typed kernel as C, in the OpenCL C or CUDA C++ dialect, with Python's semantics.

One printer serves both dialects; a ``Dialect`` says only what the two spell differently
(qualifiers, the work-item's coordinates, barriers).  What Python means is kept exactly:
``//`` and ``%`` round towards minus infinity (for floats too), ``max(a, b)`` is ``b if b > a
else a`` (NaN as Python gives it), ``int(x)`` truncates, an ``int ** int`` is an integer, float
literals take the data's precision, ``and``/``or`` short-circuit, indices are 64-bit.

Generated layout (OpenCL, 1-D, groupsize 256): the ndrange's last dimension runs along the
device's dimension 0, work-items past the ndrange return at once.

    __kernel void saxpy(__global double *Y, const long Y_shape0, const double a, ...,
                        const long _n0) {
        const long _l0 = get_local_id(0);
        const long _g0 = get_group_id(0);
        if (!(_g0 * 256 + _l0 < _n0)) return;
        // file.py:3
        Y[(_g0 * 256 + _l0)] = ((a * X[(_g0 * 256 + _l0)]) + Y[(_g0 * 256 + _l0)]);
    }

Kernels with barriers keep every work-item alive (each must reach each barrier) and guard
the statements between barriers with ``_valid``, as ``structure.BarrierPlan`` splits them.
Atomics call a helper per operation, type and memory (``CPrinter.atomic_helper``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tapegrad.backends.returns import eliminate_returns
from tapegrad.backends.structure import (
    Barrier,
    BarrierPlan,
    GroupStmt,
    Segment,
    contains_barrier,
    memory_decl,
)
from tapegrad.errors import KernelSyntaxError, located
from tapegrad.frontend.ir import tg_name
from tapegrad.frontend.types import Array, DType, Scalar, TupleT, Type, TypedKernel, arith
from tapegrad.lang import primitives
from tapegrad.lang.primitives import is_expression


@dataclass(frozen=True)
class Dialect:
    """What OpenCL C and CUDA C++ spell differently."""

    name: str
    kernel: str              # what starts a kernel's definition
    function: str            # ... and a device function's
    global_ptr: str          # the qualifier of a pointer to global memory
    int64: str
    preamble: str            # pragmas and includes
    local_id: str            # "{}" is the device dimension
    group_id: str
    local_memory: str        # the qualifier of workgroup-shared memory
    local_ptr: str           # ... of a pointer to it (CUDA's pointers are generic)
    barrier: str

    def ctype(self, dtype: str) -> str:
        return {"float64": "double", "float32": "float", "int64": self.int64,
                "int32": "int", "bool": "bool"}[dtype]

    def element_type(self, dtype: str) -> str:
        """An array's element type (bool arrays hold bytes)."""
        return "uchar" if dtype == "bool" and self.name == "opencl" else \
            "unsigned char" if dtype == "bool" else self.ctype(dtype)


OPENCL = Dialect(
    name="opencl", kernel="__kernel void", function="static", global_ptr="__global ",
    int64="long",
    # (no contraction into fma: the results are the CPU's and Python's, rounded per operation)
    preamble="#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n#pragma OPENCL FP_CONTRACT OFF",
    local_id="get_local_id({})", group_id="get_group_id({})", local_memory="__local ",
    local_ptr="__local ", barrier="barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);")

CUDA = Dialect(
    name="cuda", kernel='extern "C" __global__ void', function="static __device__",
    global_ptr="", int64="long long",
    # (NVRTC has no math.h: C's names for the infinite and NaN floats, as CUDA's bits)
    preamble="#ifndef INFINITY\n#define INFINITY __int_as_float(0x7f800000)\n#endif\n"
             "#ifndef NAN\n#define NAN __int_as_float(0x7fffffff)\n#endif",
    local_id="threadIdx.{}", group_id="blockIdx.{}", local_memory="__shared__ ",
    local_ptr="", barrier="__syncthreads();")

_CUDA_AXES = "xyz"

# Names a kernel may not take in C: keywords and type names of C, OpenCL C and CUDA, and the
# built-in functions of OpenCL C (CUDA's math functions are C's: among them).  A kernel
# named ``step`` or ``dot`` (OpenCL's) or ``exp`` (both) is emitted as ``step_kernel``.
_RESERVED = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool half uchar ushort uint ulong size_t ptrdiff_t
    intptr_t uintptr_t kernel global local constant private read_only write_only read_write
    image2d_t image3d_t sampler_t event_t true false class new delete template this
    acos acosh acospi asin asinh asinpi atan atan2 atanh atanpi atan2pi cbrt ceil copysign
    cos cosh cospi erfc erf exp exp2 exp10 expm1 fabs fdim floor fma fmax fmin fmod fract
    frexp hypot ilogb ldexp lgamma lgamma_r log log2 log10 log1p logb mad maxmag minmag modf
    nan nextafter pow pown powr remainder remquo rint rootn round rsqrt sin sincos sinh sinpi
    sqrt tan tanh tanpi tgamma trunc abs abs_diff add_sat hadd rhadd clamp clz ctz mad_hi
    mad_sat max min mul_hi rotate sub_sat upsample popcount mad24 mul24 degrees mix radians
    step smoothstep sign cross dot distance length normalize isequal isnotequal isgreater
    isgreaterequal isless islessequal islessgreater isfinite isinf isnan isnormal isordered
    isunordered signbit any all bitselect select barrier mem_fence read_mem_fence
    write_mem_fence prefetch printf wait_group_events shuffle shuffle2 assert main
    """.split())
_RESERVED_PREFIXES = ("get_", "atomic_", "atom_", "native_", "half_", "convert_", "as_",
                      "vload", "vstore", "async_", "fast_", "__", "_Z")


# C words the printer writes itself (a variable of that name cannot be renamed in the text)
_PRINTED_WORDS = frozenset("""
    auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while bool uchar threadIdx blockIdx blockDim gridDim
    warpSize""".split())


def _renamed(lines: list[str], names: set[str]) -> list[str]:
    """``lines`` of C with the user's variables in ``names`` (named as C reserves: a local
    ``half``, an argument ``local``) renamed ``<name>_``: every whole word that is one, except
    where it is called (the built-in function of that name: variables are never called)."""
    if not names:
        return lines
    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b(?!\s*\()")
    return [line if line.lstrip().startswith("//") else word.sub(r"\1_", line)
            for line in lines]


def kernel_symbol(name: str) -> str:
    """The name kernel ``name`` has in generated C: its own, unless C, OpenCL C or CUDA
    reserves it (a kernel named ``step`` clashed with OpenCL's ``step()``)."""
    reserved = name in _RESERVED or name.startswith(_RESERVED_PREFIXES)
    return f"{name}_kernel" if reserved else name
STATIC_SHARED_LIMIT = 0xC000    # CUDA's static shared memory per block (48 KiB); more is dynamic
_ITEMSIZE = {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "bool": 1}
# An Active scalar's sum goes to 64 slots 128 bytes apart, a workgroup's to slot (its index
# mod 64), and the runtime adds the slots up: atomics on one address wait for each other
# (docs/gpu.md, "Active scalars")
SCALAR_SLOTS, SLOT_STRIDE = 64, 16
SCALAR_SUM_SIZE = SCALAR_SLOTS * SLOT_STRIDE
_GROUP_SLOT = {
    "cuda": "(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))",
    "opencl": "(get_group_id(0) + get_num_groups(0) * (get_group_id(1) + get_num_groups(1) "
              "* get_group_id(2)))",
}

# Python's semantics where C's differ, written once into each module that uses them
_HELPERS = {
    "floordiv_i": """{f} {i} tg_floordiv_i({i} a, {i} b) {{
    {i} q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}""",
    "mod_i": """{f} {i} tg_mod_i({i} a, {i} b) {{
    {i} r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}""",
    "mod_f": """{f} {T} tg_mod_{T}({T} a, {T} b) {{
    {T} r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r != 0 ? r : copysign(({T})0, b);
}}""",
    # (CPython's float floor division: from fmod, exact where floor(a / b) is not)
    "floordiv_f": """{f} {T} tg_floordiv_{T}({T} a, {T} b) {{
    {T} m = fmod(a, b);
    {T} d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d == 0) return copysign(({T})0, a / b);
    {T} f = floor(d);
    return d - f > ({T})0.5 ? f + 1 : f;
}}""",
    "pow_i": """{f} {i} tg_pow_i({i} a, {i} b) {{
    if (b < 0) return (a == 1) ? 1 : (a == -1) ? ((b & 1) ? -1 : 1) : 0;
    {i} r = 1;
    while (b) {{ if (b & 1) r *= a; a *= a; b >>= 1; }}
    return r;
}}""",
}

_C_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.BitAnd: "&", ast.BitOr: "|",
          ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
_C_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


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


def _bare(text: str) -> str:
    """``text`` without one pair of parentheses around all of it (``if ((a == b))`` draws a
    compiler warning)."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for k, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and k < len(text) - 1:
            return text                     # (a) && (b): the first pair closes early
    return text[1:-1]


class CPrinter:
    """Prints one typed kernel (and the device functions it calls) in one dialect."""

    def __init__(self, tk: TypedKernel, dialect: Dialect, dynamic_shared: bool = True):
        self.tk, self.d = tk, dialect
        self.helpers: dict[str, str] = {}
        self.pragmas: set[str] = set()        # OpenCL extensions the module's code uses
        # CUDA takes at most 48 KiB of shared memory declared in the source; beyond that the
        # kernel's local arrays live in dynamic shared memory, whose size the launch passes
        # (``dynamic_bytes``); ``shared_bytes`` is a workgroup's whole (set by ``module``)
        self.allow_dynamic = dynamic_shared and dialect.name == "cuda"
        self.shared_bytes = self.dynamic_bytes = 0

    # -- the module ------------------------------------------------------------------------
    def module(self, callees: list[TypedKernel]) -> str:
        body: list[str] = []
        for callee in callees:
            body += CPrinter._function(callee, self) + [""]
        body += self._kernel()
        head = [f"// Generated by tapegrad from {self.tk.name} ({self.tk.ir.filename}:"
                f"{self.tk.ir.lineno}) for {self.d.name}: rank {self.tk.rank}, groupsize "
                f"{self.tk.groupsize}.", "// Read it to see what runs; edits are overwritten."]
        if self.d.preamble:
            head.append(self.d.preamble)
        head += [f"#pragma OPENCL EXTENSION {e} : enable" for e in sorted(self.pragmas)]
        names = {n for k in [*callees, self.tk] for n in [*k.ir.params, *k.locals]}
        clash = sorted(names & _PRINTED_WORDS)
        if clash:
            raise self._fail(self.tk, None, f"a variable named '{clash[0]}' is a word of C "
                                            "that the generated code uses itself: rename it "
                                            "to run the kernel on a GPU")
        body = _renamed(body, {n for n in names if kernel_symbol(n) != n})
        return "\n".join(head + [""] + list(self.helpers.values()) + [""] + body) + "\n"

    def _kernel(self) -> list[str]:
        tk, d = self.tk, self.d
        params = self._params(tk) + [f"const {d.int64} _n{k}" for k in range(tk.rank)]
        out = [f"{d.kernel} {kernel_symbol(tk.name)}({', '.join(params)}) {{"]
        r, W = tk.rank, tk.groupsize
        for k in range(r):
            axis = r - 1 - k                  # the last dimension runs along the device's first
            where = axis if d.name == "opencl" else _CUDA_AXES[axis]
            out.append(f"    const {d.int64} _l{k} = {d.local_id.format(where)};")
            out.append(f"    const {d.int64} _g{k} = {d.group_id.format(where)};")
        valid = " && ".join(f"_g{k} * {W[k]} + _l{k} < _n{k}" for k in range(r))
        body = tk.ir.body
        decls = [st for st in body if memory_decl(st)]
        sub = _Body(self, tk)
        self.shared_bytes = local_bytes(tk)
        if not any(contains_barrier(st) for st in body):
            out.append(f"    if (!({valid})) return;")
            out += self._memory(tk, decls) + self._declarations(tk, 1)
            sub.statements([st for st in body if not memory_decl(st)], 1)
            return out + sub.lines + ["}"]
        # work-items past the ndrange stay: every one must reach each barrier; one that
        # returns stays too, invalid from there on (returns.py)
        out.append(f"    bool _valid = {valid};")
        plan = BarrierPlan(tk, [st for st in body if not memory_decl(st)], decls)
        self.shared_bytes += 8 * len(plan.runtime_values)
        out += self._memory(tk, decls) + self._declarations(tk, 1)
        if any(isinstance(n, ast.Return) for n in ast.walk(ast.Module(body=body,
                                                                      type_ignores=[]))):
            out.append("    bool _returned = false;")
        if plan.runtime_values:
            out.append(f"    {d.local_memory}{d.int64} _group_values"
                       f"[{len(plan.runtime_values)}];")
        sub.blocks(plan, plan.blocks, 1)
        return out + sub.lines + ["}"]

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
            name = st.targets[0].id
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

    @staticmethod
    def _function(callee: TypedKernel, parent: CPrinter) -> list[str]:
        d = parent.d
        ret = callee.return_type
        rtype = d.ctype(ret.dtype) if isinstance(ret, Scalar) else "void"
        out = []
        if isinstance(ret, TupleT):          # a tuple comes back as a struct of its items
            rtype = f"tg_tuple_{callee.symbol}"
            fields = " ".join(f"{d.ctype(item.dtype)} v{k};" for k, item in enumerate(ret.items))
            out.append(f"typedef struct {{ {fields} }} {rtype};")
        out.append(f"{d.function} {rtype} {callee.symbol}({', '.join(parent._params(callee))}) "
                   "{")
        out += parent._declarations(callee, 1)
        sub = _Body(parent, callee)
        sub.statements(callee.ir.body, 1)
        out += sub.lines
        out.append("}")
        return out

    def _params(self, tk: TypedKernel) -> list[str]:
        out = []
        for p, t in zip(tk.ir.params, tk.argtypes):
            if isinstance(t, Array):
                qualifier = {"global": self.d.global_ptr, "local": self.d.local_ptr,
                             "private": ""}[t.space]
                element = self.d.element_type(t.dtype) if t.space == "global" else \
                    self.d.ctype(t.dtype)
                out.append(f"{qualifier}{element} *{p}")
                out += [f"const {self.d.int64} {p}_shape{k}" for k in range(t.ndim)]
            elif isinstance(t, Scalar):
                ctype = "int" if t.dtype == "bool" else self.d.ctype(t.dtype)
                out.append(f"const {ctype} {p}")
            elif isinstance(t, TupleT) and not tk.ir.is_kernel and all(
                    isinstance(item, Scalar) for item in t.items):
                out += [f"const {self.d.ctype(item.dtype)} {p}_{k}"
                        for k, item in enumerate(t.items)]
            else:
                raise self._fail(tk, tk.ir.body[0] if tk.ir.body else None,
                                 f"argument {p} ({t}) cannot be passed to a C kernel yet")
        return out

    def _declarations(self, tk: TypedKernel, depth: int) -> list[str]:
        out = []
        params = set(tk.ir.params)
        for name, t in sorted(tk.locals.items()):
            if name in params:
                continue
            if isinstance(t, Scalar):
                out.append("    " * depth + f"{self.d.ctype(t.dtype)} {name} = 0;")
            elif isinstance(t, TupleT):
                for k, item in enumerate(t.items):
                    if not isinstance(item, Scalar):
                        raise self._fail(tk, None, f"{name} holds a tuple of {item}: only tuples "
                                                   "of numbers are printed as C so far")
                    out.append("    " * depth + f"{self.d.ctype(item.dtype)} {name}_{k} = 0;")
        return out

    def _fail(self, tk: TypedKernel, node: ast.AST | None, message: str) -> KernelSyntaxError:
        return located(node if node is not None else ast.Pass(lineno=tk.ir.lineno,
                                                              col_offset=0),
                       tk.ir.filename, message)

    def helper(self, key: str, dtype: str | None = None) -> str:
        """The name of a helper (``_HELPERS``), written into the module on first use."""
        T = self.d.ctype(dtype) if dtype else ""
        name = f"tg_{key}" if key.endswith("_i") else f"tg_{key[:-2]}_{T}"
        if name not in self.helpers:
            self.helpers[name] = _HELPERS[key].format(
                f="static inline" if self.d.name == "opencl" else "static __device__ inline",
                i=self.d.int64, T=T)
        return name

    def group_add_helper(self, dtype: str, space: str) -> str:
        """``tg_group_add_<type>_<space>(p, v)``: ``*p += v`` for every work-item, summed first
        (an Active scalar's adjoint: ``tg.group_reduce_add``, into an array of
        ``SCALAR_SUM_SIZE`` elements in global memory, which the runtime sums).  A workgroup
        adds into its slot (``SCALAR_SLOTS`` of them, a cache line apart); on CUDA a full warp
        sums its values with shuffles and adds once, so that a million work-items make 31,250
        atomic updates spread over 64 addresses, not a million on one; a partial warp (the
        ndrange's edge, a branch) adds per work-item.  OpenCL: one atomic per work-item into
        its group's slot, for now."""
        name = f"tg_group_add_{dtype}_{space}"
        if name in self.helpers:
            return name
        atomic = self.atomic_helper("add", dtype, space)
        T = self.d.ctype(dtype)
        slot = (f"p += {SLOT_STRIDE} * ({_GROUP_SLOT[self.d.name]} & {SCALAR_SLOTS - 1});"
                if space == "global" else "")
        if self.d.name == "opencl" or space != "global" or dtype not in ("float64", "float32"):
            qualifier = {"global": "__global ", "local": "__local ", "private": ""}[space] \
                if self.d.name == "opencl" else ""
            volatile = "volatile " if self.d.name == "opencl" and space != "private" else ""
            fn = "static inline" if self.d.name == "opencl" else "static __device__ inline"
            self.helpers[name] = (f"{fn} void {name}({volatile}{qualifier}{T} *p, {T} v) "
                                  f"{{ {slot} {atomic}(p, v); }}")
            return name
        self.helpers[name] = f"""static __device__ inline void {name}({T} *p, {T} v) {{
    {slot}
    const unsigned all = 0xffffffffu;
    if (__activemask() != all) {{ {atomic}(p, v); return; }}
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(all, v, o);
    if ((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32 == 0)
        {atomic}(p, v);
}}"""
        return name

    def atomic_helper(self, op: str, dtype: str, space: str) -> str:
        """``tg_atomic_<op>_<type>_<space>(p, v)``: the old value, ``*p`` updated atomically
        (plainly in private memory, which one work-item owns); a compare-and-swap loop where
        the dialect has no such instruction (floats on OpenCL; float min and max on CUDA)."""
        T = self.d.ctype(dtype)
        name = f"tg_atomic_{op}_{dtype}_{space}"
        if name in self.helpers:
            return name
        opencl = self.d.name == "opencl"
        qualifier = {"global": "__global ", "local": "__local ", "private": ""}[space] \
            if opencl else ""
        # (OpenCL's atomic built-ins take volatile pointers; CUDA's take plain ones)
        ptr = f"{'volatile ' if opencl and space != 'private' else ''}{qualifier}{T} *p"
        fn = "static inline" if opencl else "static __device__ inline"
        new = {"add": "old + v", "sub": "old - v", "min": "(v < old ? v : old)",
               "max": "(v > old ? v : old)"}[op]
        if space == "private":
            body = f"{T} old = *p; *p = {new}; return old;"
        elif dtype in ("int32", "int64") and (opencl or op in ("add", "min", "max")
                                              or dtype == "int32"):
            if opencl:
                call = "atomic" if dtype == "int32" else "atom"
                if dtype == "int64":
                    self.pragmas.add("cl_khr_int64_base_atomics")
                    self.pragmas.add("cl_khr_int64_extended_atomics")
                body = f"return {call}_{op}(p, v);"
            elif dtype == "int32":
                body = "return atomicAdd(p, -v);" if op == "sub" else \
                    f"return atomic{op.capitalize()}(p, v);"
            elif op == "add":
                body = ("return (long long)atomicAdd((unsigned long long *)p, "
                        "(unsigned long long)v);")
            else:
                body = f"return atomic{op.capitalize()}(p, v);"
        elif not opencl and op in ("add", "sub") and dtype != "int64":
            body = "return atomicAdd(p, v);" if op == "add" else "return atomicAdd(p, -v);"
        elif not opencl and dtype == "int64":      # (sub: add the negation, two's complement)
            body = ("return (long long)atomicAdd((unsigned long long *)p, "
                    "(unsigned long long)(-v));")
        else:                                      # compare-and-swap on the bits
            wide = dtype in ("float64", "int64")
            if opencl:
                U = "ulong" if wide else "uint"
                if wide:
                    self.pragmas.add("cl_khr_int64_base_atomics")
                cas = f"{'atom' if wide else 'atomic'}_cmpxchg((volatile {qualifier}{U} *)p, " \
                      "seen.u, next.u)"
                body = (f"union {{ {U} u; {T} f; }} seen, next; "
                        f"do {{ seen.f = *p; {T} old = seen.f; next.f = {new}; }} "
                        f"while ({cas} != seen.u); return seen.f;")
            else:
                U = "unsigned long long" if wide else "unsigned int"
                to_bits = "__double_as_longlong" if dtype == "float64" else "__float_as_uint"
                from_bits = "__longlong_as_double" if dtype == "float64" else "__uint_as_float"
                body = (f"{U} *q = ({U} *)p; {U} seen = *q, was; "
                        f"do {{ was = seen; {T} old = {from_bits}(was); "
                        f"seen = atomicCAS(q, was, ({U}){to_bits}({new})); }} "
                        f"while (seen != was); return {from_bits}(was);")
        self.helpers[name] = f"{fn} {T} {name}({ptr}, {T} v) {{ {body} }}"
        return name

    def primitive_helper(self, row: primitives.Primitive, dtype: str, lowering: str) -> str:
        name = f"tg_{row.name}_{self.d.ctype(dtype)}".replace(" ", "_")
        if name not in self.helpers:
            T = self.d.ctype(dtype)
            params = ", ".join(f"{T} {v}" for v in "xy"[:row.arity])
            fn = "static inline" if self.d.name == "opencl" else "static __device__ inline"
            self.helpers[name] = f"{fn} {T} {name}({params}) {{ return {lowering}; }}"
        return name


class _Body:
    """Statements and expressions of one function body."""

    def __init__(self, printer: CPrinter, tk: TypedKernel):
        self.p, self.tk, self.d = printer, tk, printer.d
        self.lines: list[str] = []

    # -- kernels with barriers: segments per work-item, loops and branches per group --------
    def blocks(self, plan: BarrierPlan, blocks: list, depth: int) -> None:
        slots = list(plan.runtime_values)
        lid = "_l0"
        for k in range(1, self.tk.rank):
            lid = f"({lid} * {self.tk.groupsize[k]} + _l{k})"
        for b in blocks:
            if isinstance(b, Barrier):
                self.emit(self.d.barrier, depth)
            elif isinstance(b, Segment):
                if not b.stmts:
                    continue
                stmts, _ = eliminate_returns(b.stmts)
                if stmts != b.stmts or any(isinstance(n, ast.Return) for st in b.stmts
                                           for n in ast.walk(st)):
                    # (continue leaves the do-while: the rest of the segment is skipped)
                    self.emit("if (_valid) do {", depth)
                    self.statements(stmts, depth + 1)
                    self.emit("} while (0);", depth)
                else:
                    self.emit("if (_valid) {", depth)
                    self.statements(b.stmts, depth + 1)
                    self.emit("}", depth)
                if b.evaluates:       # work-item 0 shares the values group-level code needs
                    self.emit(f"if ({lid} == 0) {{", depth)
                    for v in b.evaluates:
                        self.emit(f"_group_values[{slots.index(v)}] = {v};", depth + 1)
                    self.emit("}", depth)
                    self.emit(self.d.barrier, depth)
            else:
                self.group(plan, b, depth)

    def group(self, plan: BarrierPlan, b: GroupStmt, depth: int) -> None:
        s = b.stmt
        if isinstance(s, (ast.Assign, ast.AugAssign)):
            self.statement(s, depth)
            return
        shared = [f"_group_values[{list(plan.runtime_values).index(v)}]" for v in b.values]
        if isinstance(s, ast.For):
            if shared:
                bounds = (["0"] + shared + ["1"])[:3] if len(shared) == 1 else \
                    (shared + ["1"])[:3]
                start, stop, step = bounds
            else:
                start, stop, step = self.range_bounds(s.iter.args)
            i = s.target.id
            test = f"{i} < {stop}" if not step.startswith("-") else f"{i} > {stop}"
            if not (step.lstrip("-").isdigit()):
                test = f"(({step}) > 0 ? {i} < {stop} : {i} > {stop})"
            self.emit(f"for ({i} = {start}; {test}; {i} += {step}) {{", depth)
        elif isinstance(s, ast.While):
            test = f"{shared[0]} != 0" if shared else _bare(self.truth(s.test))
            self.emit(f"while ({test}) {{", depth)
        else:
            test = f"{shared[0]} != 0" if shared else _bare(self.truth(s.test))
            self.emit(f"if ({test}) {{", depth)
        self.blocks(plan, b.blocks[0], depth + 1)
        if len(b.blocks) > 1 and b.blocks[1]:
            self.emit("} else {", depth)
            self.blocks(plan, b.blocks[1], depth + 1)
        self.emit("}", depth)

    def range_bounds(self, args: list[ast.expr]) -> tuple[str, str, str]:
        if len(args) == 1:
            return "0", self.expr(args[0]), "1"
        if len(args) == 2:
            return self.expr(args[0]), self.expr(args[1]), "1"
        return tuple(self.expr(a) for a in args)

    def T(self, node: ast.AST) -> Type:
        return self.tk.types[id(node)]

    def emit(self, text: str, depth: int) -> None:
        self.lines.append("    " * depth + text)

    # -- statements -------------------------------------------------------------------------
    def statements(self, body: list[ast.stmt], depth: int) -> None:
        for s in body:
            self.statement(s, depth)

    def statement(self, s: ast.stmt, depth: int) -> None:
        if hasattr(s, "lineno") and not isinstance(s, (ast.Break, ast.Continue)):
            self.emit(f"// {self.tk.ir.filename.rsplit('/', 1)[-1]}:{s.lineno}", depth)
        if isinstance(s, ast.Assign) and getattr(s.targets[0], "id", None) == "_returned":
            self.emit("_returned = true;", depth)        # (returns.py: leaving a loop)
        elif isinstance(s, ast.Assign):
            self.assign(s.targets[0], s.value, depth)
        elif isinstance(s, ast.AugAssign):
            combined = ast.BinOp(left=s.target, op=s.op, right=s.value)
            t = self.T(s.target)
            self.tk.types[id(combined)] = arith(s.op, t, self.T(s.value))
            try:
                self.emit(f"{self.target(s.target)} = {self.coerce(combined, t)};", depth)
            finally:
                del self.tk.types[id(combined)]
        elif isinstance(s, ast.Expr):
            if tg_name(s.value) == "synchronize":
                self.emit(self.d.barrier, depth)
            elif not isinstance(s.value, ast.Constant):
                self.emit(f"{self.expr(s.value)};", depth)
        elif isinstance(s, ast.If):
            self.emit(f"if ({_bare(self.truth(s.test))}) {{", depth)
            self.statements(s.body, depth + 1)
            if s.orelse:
                self.emit("} else {", depth)
                self.statements(s.orelse, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, ast.While):
            self.emit(f"while ({_bare(self.truth(s.test))}) {{", depth)
            self.statements(s.body, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, ast.For):
            self.for_range(s, depth)
        elif isinstance(s, ast.Return):
            ret = self.tk.return_type
            if s.value is None or self.tk.ir.is_kernel:
                self.emit("return;", depth)
            elif isinstance(ret, TupleT):
                items = ", ".join(self.cast_text(text, src, item) for (text, src), item
                                  in zip(self.tuple_parts(s.value), ret.items))
                self.emit(f"{{ tg_tuple_{self.tk.symbol} _r = {{{items}}}; return _r; }}", depth)
            else:
                self.emit(f"return {self.coerce(s.value, ret)};", depth)
        elif isinstance(s, ast.Break):
            self.emit("break;", depth)
        elif isinstance(s, ast.Continue):
            if getattr(s, "_tg_item_exit", False):     # a return: invalid from here on
                self.emit("_valid = false;", depth)
            self.emit("continue;", depth)
        elif isinstance(s, ast.Pass):
            pass
        else:
            raise self.p._fail(self.tk, s, f"{type(s).__name__} is not printed as C")

    def for_range(self, s: ast.For, depth: int) -> None:
        args = s.iter.args
        start, stop, step = self.range_bounds(args)
        i, n = s.target.id, f"_stop_{s.target.id}_{s.lineno}"
        # (range's bounds are evaluated once, as in Python; a negative step counts down)
        constant_step = isinstance(args[2], ast.Constant) if len(args) == 3 else True
        self.emit("{", depth)
        self.emit(f"const {self.d.int64} {n} = {stop};", depth + 1)
        if constant_step:
            test = f"{i} < {n}" if not step.startswith("-") else f"{i} > {n}"
        else:
            st = f"_step_{i}_{s.lineno}"
            self.emit(f"const {self.d.int64} {st} = {step};", depth + 1)
            test, step = f"({st} > 0 ? {i} < {n} : {i} > {n})", st
        self.emit(f"for ({i} = {start}; {test}; {i} += {step}) {{", depth + 1)
        self.statements(s.body, depth + 2)
        self.emit("}", depth + 1)
        self.emit("}", depth)

    def assign(self, target: ast.expr, value: ast.expr, depth: int) -> None:
        if isinstance(value, ast.Call) and tg_name(value) is None \
                and isinstance(self.T(value), TupleT):       # a device function's tuple
            callee = self.tk.callees[id(value)]
            self.emit("{", depth)
            self.emit(f"const tg_tuple_{callee.symbol} _t = {self.expr(value)};", depth + 1)
            names = [self.target(e) for e in target.elts] if isinstance(target, ast.Tuple) \
                else [f"{target.id}_{k}" for k in range(len(self.T(value).items))]
            for k, name in enumerate(names):
                self.emit(f"{name} = _t.v{k};", depth + 1)
            self.emit("}", depth)
            return
        if isinstance(target, ast.Tuple):
            parts = self.tuple_parts(value)
            if isinstance(value, ast.Tuple) and len(parts) > 1:
                # a, b = b, a: every value is read before any name is assigned
                self.emit("{", depth)
                for k, (e, part) in enumerate(zip(target.elts, parts)):
                    t = self.T(e)
                    self.emit(f"const {self.d.ctype(t.dtype)} _swap{k} = "
                              f"{self.cast_text(part[0], part[1], t)};", depth + 1)
                for k, e in enumerate(target.elts):
                    self.emit(f"{self.target(e)} = _swap{k};", depth + 1)
                self.emit("}", depth)
                return
            for e, part in zip(target.elts, parts):
                t = self.T(e)
                self.emit(f"{self.target(e)} = {self.cast_text(part[0], part[1], t)};", depth)
            return
        t = self.T(target)
        if isinstance(t, TupleT):
            for k, (text, src) in enumerate(self.tuple_parts(value)):
                self.emit(f"{target.id}_{k} = {self.cast_text(text, src, t.items[k])};", depth)
            return
        self.emit(f"{self.target(target)} = {self.coerce(value, t)};", depth)

    def target(self, node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Subscript):
            return self.subscript(node)
        raise self.p._fail(self.tk, node, "this assignment target is not printed as C")

    # -- tuples: each component printed on its own ------------------------------------------
    def tuple_parts(self, node: ast.expr) -> list[tuple[str, Type]]:
        t = self.T(node)
        name = tg_name(node)
        r, W = self.tk.rank, self.tk.groupsize
        if name == "global_indices":
            return [(f"(_g{k} * {W[k]} + _l{k})", Scalar("int64")) for k in range(r)]
        if name == "local_indices":
            return [(f"_l{k}", Scalar("int64")) for k in range(r)]
        if name == "group_indices":
            return [(f"_g{k}", Scalar("int64")) for k in range(r)]
        if name == "ndrange":
            return [(f"_n{k}", Scalar("int64")) for k in range(r)]
        if name == "groupsize":
            return [(str(w), Scalar("int64")) for w in W]
        if isinstance(node, ast.Attribute) and node.attr == "shape":
            a = node.value.id
            return [(f"{a}_shape{k}", Scalar("int64")) for k in range(self.T(node.value).ndim)]
        if isinstance(node, ast.Name):
            return [(f"{node.id}_{k}", item) for k, item in enumerate(t.items)]
        if isinstance(node, ast.Tuple):
            return [(self.expr(e), self.T(e)) for e in node.elts]
        raise self.p._fail(self.tk, node, "this tuple is not printed as C yet")

    # -- expressions ------------------------------------------------------------------------
    def expr(self, node: ast.expr) -> str:
        method = getattr(self, "expr_" + type(node).__name__, None)
        if method is None:
            raise self.p._fail(self.tk, node, f"{type(node).__name__} is not printed as C")
        return method(node)

    def coerce(self, node: ast.expr, to: Type | None) -> str:
        """``node`` as a value of type ``to`` (float literals take its precision)."""
        if isinstance(to, Scalar) and isinstance(node, ast.Constant) \
                and not isinstance(node.value, bool):
            return self.literal(node.value, to.dtype)
        return self.cast_text(self.expr(node), self.tk.types.get(id(node)), to)

    def cast_text(self, text: str, src: Type | None, to: Type | None) -> str:
        if not (isinstance(to, Scalar) and isinstance(src, Scalar)) or src.dtype == to.dtype:
            return text
        if to.dtype == "bool":
            return f"({text} != 0)"
        return f"(({self.d.ctype(to.dtype)})({text}))"

    def literal(self, value: object, dtype: str) -> str:
        if dtype == "bool":
            return "true" if value else "false"
        if dtype in ("float32", "float64"):
            text = repr(float(value))
            if text in ("inf", "-inf", "nan"):
                text = {"inf": "INFINITY", "-inf": "(-INFINITY)", "nan": "NAN"}[text]
                return f"(({self.d.ctype(dtype)}){text})"
            if "e" not in text and "." not in text:
                text += ".0"
            return text + ("f" if dtype == "float32" else "")
        v = int(value)
        return f"{v}L" if dtype == "int64" and abs(v) >= 2 ** 31 else str(v)

    def truth(self, node: ast.expr) -> str:
        t = self.tk.types.get(id(node))
        text = self.expr(node)
        return text if t == Scalar("bool") else f"({text} != 0)"

    def expr_Constant(self, node: ast.Constant) -> str:
        t = self.T(node)
        return self.literal(node.value, t.dtype) if isinstance(t, Scalar) else repr(node.value)

    def expr_Name(self, node: ast.Name) -> str:
        t = self.tk.types.get(id(node))
        if isinstance(t, Scalar) and t.dtype == "bool" and node.id in self.tk.ir.params:
            return f"({node.id} != 0)"
        return node.id

    def expr_Attribute(self, node: ast.Attribute) -> str:
        base = self.T(node.value)
        if isinstance(base, Array) and node.attr == "size":
            return "(" + " * ".join(f"{node.value.id}_shape{k}"
                                    for k in range(base.ndim)) + ")"
        if isinstance(base, Array) and node.attr == "ndim":
            return str(base.ndim)
        raise self.p._fail(self.tk, node, f".{node.attr} is not printed as C")

    def subscript(self, node: ast.Subscript) -> str:
        a = node.value.id
        t = self.T(node.value)
        idx = node.slice
        if isinstance(idx, ast.Tuple):
            parts = [(self.expr(e), self.T(e)) for e in idx.elts]
        elif isinstance(self.T(idx), TupleT):
            parts = self.tuple_parts(idx)
        else:
            parts = [(self.expr(idx), self.T(idx))]
        flat = f"({parts[0][0]})"
        for k in range(1, len(parts)):
            flat = f"({flat} * {a}_shape{k} + ({parts[k][0]}))"
        if len(parts) != t.ndim:
            raise self.p._fail(self.tk, node, f"{a} has {t.ndim} dimensions: index each")
        return f"{a}[{flat}]"

    def expr_Subscript(self, node: ast.Subscript) -> str:
        base = self.T(node.value)
        if isinstance(base, TupleT):
            parts = self.tuple_parts(node.value)
            try:
                return parts[ast.literal_eval(node.slice) % len(parts)][0]
            except ValueError:         # an index known at run time: pick the component
                k = self.expr(node.slice)
                out = parts[-1][0]
                for j in range(len(parts) - 2, -1, -1):
                    out = f"({k} == {j} ? {parts[j][0]} : {out})"
                return out
        text = self.subscript(node)
        return f"({text} != 0)" if base.dtype == "bool" else text

    def expr_BinOp(self, node: ast.BinOp) -> str:
        t = self.T(node)
        op = type(node.op)
        lt, rt = self.T(node.left), self.T(node.right)
        if op is ast.Div:
            to = t if t.dtype != "float64" or (lt.is_float or rt.is_float) else Scalar("float64")
            return f"({self.coerce(node.left, to)} / {self.coerce(node.right, to)})"
        if op is ast.Pow:
            if isinstance(node.right, ast.Constant) and node.right.value in (2, 3) \
                    and not isinstance(node.right.value, bool):
                base = self.coerce(node.left, t)
                return "(" + " * ".join([base] * int(node.right.value)) + ")"
            if not t.is_float:
                return f"{self.p.helper('pow_i')}({self.expr(node.left)}, {self.expr(node.right)})"
            return f"pow({self.coerce(node.left, t)}, {self.coerce(node.right, t)})"
        if op in (ast.FloorDiv, ast.Mod):
            key = ("floordiv" if op is ast.FloorDiv else "mod") + ("_f" if t.is_float else "_i")
            fn = self.p.helper(key, t.dtype if t.is_float else None)
            return f"{fn}({self.coerce(node.left, t)}, {self.coerce(node.right, t)})"
        if op in (ast.BitAnd, ast.BitOr, ast.BitXor, ast.LShift, ast.RShift):
            return f"({self.expr(node.left)} {_C_OPS[op]} {self.expr(node.right)})"
        return f"({self.coerce(node.left, t)} {_C_OPS[op]} {self.coerce(node.right, t)})"

    def expr_UnaryOp(self, node: ast.UnaryOp) -> str:
        if isinstance(node.op, ast.Not):
            return f"(!{self.truth(node.operand)})"
        t = self.T(node)
        operand = self.coerce(node.operand, t) if isinstance(t, Scalar) else self.expr(node.operand)
        return {ast.USub: f"(-{operand})", ast.UAdd: operand,
                ast.Invert: f"(~{operand})"}[type(node.op)]

    def expr_BoolOp(self, node: ast.BoolOp) -> str:
        op = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + op.join(self.truth(v) for v in node.values) + ")"

    def expr_Compare(self, node: ast.Compare) -> str:
        operands = [node.left] + node.comparators
        kinds = [self.T(o) for o in operands]
        f32 = any(isinstance(k, Scalar) and k.dtype == "float32" for k in kinds)
        texts = [self.coerce(o, Scalar("float32")) if f32 and isinstance(k, Scalar) and (
            k.weak or not k.is_float) else self.expr(o) for o, k in zip(operands, kinds)]
        terms = [f"({texts[k]} {_C_CMP[type(op)]} {texts[k + 1]})"
                 for k, op in enumerate(node.ops)]
        return terms[0] if len(terms) == 1 else "(" + " && ".join(terms) + ")"

    def expr_IfExp(self, node: ast.IfExp) -> str:
        t = self.T(node)
        return (f"({self.truth(node.test)} ? {self.coerce(node.body, t)} : "
                f"{self.coerce(node.orelse, t)})")

    def expr_Call(self, node: ast.Call) -> str:
        name = tg_name(node)
        t = self.tk.types.get(id(node))
        args = node.args
        if name is None:                            # a device function
            callee = self.tk.callees[id(node)]
            texts = []
            for a, at in zip(args, callee.argtypes):
                if isinstance(at, Array):
                    texts += [a.id] + [f"{a.id}_shape{k}" for k in range(at.ndim)]
                elif isinstance(at, TupleT):
                    texts += [self.cast_text(text, src, item) for (text, src), item
                              in zip(self.tuple_parts(a), at.items)]
                else:
                    texts.append(self.coerce(a, at))
            return f"{callee.symbol}({', '.join(texts)})"
        r, W = self.tk.rank, self.tk.groupsize
        if name == "global_index":
            text = f"(_g0 * {W[0]} + _l0)"
            for k in range(1, r):
                text = f"({text} * _n{k} + (_g{k} * {W[k]} + _l{k}))"
            return text
        if name == "local_index":
            text = "_l0"
            for k in range(1, r):
                text = f"({text} * {W[k]} + _l{k})"
            return text
        if name == "group_index":
            text = "_g0"
            for k in range(1, r):
                text = f"({text} * ((_n{k} + {W[k] - 1}) / {W[k]}) + _g{k})"
            return text
        if name in ("float32", "float64", "int32", "int64", "bool"):
            src = self.T(args[0])
            if name == "bool":
                return self.truth(args[0])
            if isinstance(src, DType):
                raise self.p._fail(self.tk, node, "a dtype as a value is not printed as C")
            return f"(({self.d.ctype(name)})({self.expr(args[0])}))"
        if name == "where":
            return (f"({self.truth(args[0])} ? {self.coerce(args[1], t)} : "
                    f"{self.coerce(args[2], t)})")
        if name in ("min", "max"):
            out = self.coerce(args[0], t)
            for a in args[1:]:          # Python's: the first of equal ones, NaN as it falls
                b = self.coerce(a, t)
                op = ">" if name == "max" else "<"
                out = f"(({b}) {op} ({out}) ? ({b}) : ({out}))"
            return out
        if name == "len":
            return f"{args[0].id}_shape0"
        if name.startswith("atomic_") or name == "group_reduce_add":
            arr, idx, value = args
            at = self.T(arr)
            element = self.subscript(ast.Subscript(value=arr, slice=idx, ctx=ast.Load()))
            if name == "group_reduce_add":
                fn = self.p.group_add_helper(at.dtype, at.space)
            else:
                fn = self.p.atomic_helper(name[len("atomic_"):], at.dtype, at.space)
            return f"{fn}(&{element}, {self.coerce(value, Scalar(at.dtype))})"
        row = primitives.lookup(name)
        if row is not None:
            return self.primitive(row, node, t)
        raise self.p._fail(self.tk, node, f"tg.{name} is not printed as C yet")

    def primitive(self, row: primitives.Primitive, node: ast.Call, t: Type) -> str:
        args = node.args
        if row.result == "rounded" and not t.is_float:
            return self.expr(args[0])
        if row.name == "abs":
            x = self.coerce(args[0], t)
            return f"fabs({x})" if t.is_float else f"(({x}) < 0 ? -({x}) : ({x}))"
        if row.result == "bool":
            return f"({row.name}({self.expr(args[0])}) != 0)"
        at = t if isinstance(t, Scalar) and t.is_float else Scalar("float64")
        texts = [self.coerce(a, at) for a in args]
        lowering = row.lowering_c
        if is_expression(lowering):
            return f"{self.p.primitive_helper(row, at.dtype, lowering)}({', '.join(texts)})"
        return f"{lowering}({', '.join(texts)})"
