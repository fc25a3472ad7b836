"""The helper functions a generated module defines: Python's arithmetic where C's differs,
atomics per operation, type and memory, a workgroup's sum for an Active scalar, and
expression-bodied primitives.  Each is written once into a module, on first use.
"""

from __future__ import annotations

from tapegrad.backends.c.dialects import Dialect
from tapegrad.lang import primitives

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
    # (an integer divided by 0 gives 0, as in NumPy and on the CPU: C leaves it undefined,
    # and on a CPU OpenCL it traps)
    "floordiv_i": """{f} {i} tg_floordiv_i({i} a, {i} b) {{
    if (b == 0) return 0;
    if (b == -1) return ({i})(0 - (unsigned {i})a);   /* (wraps, as NumPy: C's a / -1 overflows) */
    {i} q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}}""",
    "mod_i": """{f} {i} tg_mod_i({i} a, {i} b) {{
    if (b == 0 || b == -1) return 0;       /* (C's INT64_MIN % -1 overflows) */
    {i} r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}}""",
    "mod_f": """{f} {T} tg_mod_{T}({T} a, {T} b) {{
    {T} r = fmod(a, b);
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r != 0 ? r : copysign(({T})0, b);
}}""",
    # (CPython's float floor division: from fmod, exact where floor(a / b) is not; by zero,
    # NumPy's a / b: inf, -inf or nan, where CPython raises)
    "floordiv_f": """{f} {T} tg_floordiv_{T}({T} a, {T} b) {{
    if (b == 0) return a / b;
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


class Helpers:
    """The helpers (and OpenCL extensions) one module uses, in the order first asked for."""

    def __init__(self, dialect: Dialect):
        self.d = dialect
        self.helpers: dict[str, str] = {}
        self.pragmas: set[str] = set()        # OpenCL extensions the module's code uses
        # the user's variables whose C names are not their own, and all of them (names.py)
        self.cnames: dict[str, str] = {}
        self.user_names: set[str] = set()

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

    def extremum_helper(self, name: str, dtype: str) -> str:
        """``tg_max_<dtype>(a, b)`` (or ``min``): Python's ``max(a, b)``, ``b if b > a else a``
        (NaN as it falls), a function so that ``max`` of n arguments prints each once (nested
        conditionals would print the first 2**(n-1) times)."""
        name_c = f"tg_{name}_{dtype}"
        if name_c not in self.helpers:
            T = self.d.ctype(dtype)
            fn = "static inline" if self.d.name == "opencl" else "static __device__ inline"
            op = ">" if name == "max" else "<"
            self.helpers[name_c] = f"{fn} {T} {name_c}({T} a, {T} b) {{ return b {op} a ? b : a; }}"
        return name_c

    def primitive_helper(self, row: primitives.Primitive, dtype: str, lowering: str) -> str:
        name = f"tg_{row.name}_{self.d.ctype(dtype)}".replace(" ", "_")
        if name not in self.helpers:
            T = self.d.ctype(dtype)
            params = ", ".join(f"{T} {v}" for v in primitives.PARAMS[:row.arity])
            fn = "static inline" if self.d.name == "opencl" else "static __device__ inline"
            self.helpers[name] = f"{fn} {T} {name}({params}) {{ return {lowering}; }}"
        return name

