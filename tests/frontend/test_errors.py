"""Every mistake a user can make produces a tapegrad error that says where and what to do.

Syntax errors are raised at decoration; type errors at the first launch; launch errors before
anything runs.  Offending lines carry a ``# ERR:<tag>`` comment so that tests can check that
the error's ``lineno`` points at them.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import tapegrad as tg

GLOBAL_ARRAY = np.arange(4.0)
CPU = tg.CPU()


def line_of(tag: str) -> int:
    """The line of this file carrying the comment ``# ERR:<tag>``."""
    marker = re.compile(rf"# ERR:{re.escape(tag)}(\s|$)")
    with open(__file__) as f:
        hits = [n for n, line in enumerate(f, 1) if marker.search(line)]
    assert len(hits) == 1, f"marker {marker!r} must appear exactly once"
    return hits[0]


def assert_located(err: tg.KernelError, tag: str) -> None:
    assert err.filename == __file__
    assert err.lineno == line_of(tag)
    assert f"{__file__}:{line_of(tag)}" in str(err)


# -- syntax errors at decoration --------------------------------------------------------------

def bad_slice():
    @tg.kernel
    def k(B, A):
        i = tg.index()
        B[i] = A[1:3]  # ERR:slice


def bad_list():
    @tg.kernel
    def k(B):
        v = [1.0, 2.0]  # ERR:list
        B[0] = v[0]


def bad_lambda():
    @tg.kernel
    def k(B):
        f = lambda x: x + 1  # ERR:lambda  # noqa: E731
        B[0] = f(1.0)


def bad_try():
    @tg.kernel
    def k(B):
        try:  # ERR:try
            B[0] = 1.0
        except Exception:
            B[0] = 2.0


def bad_with():
    @tg.kernel
    def k(B):
        with open("x"):  # ERR:with
            B[0] = 1.0


def bad_while_else():
    @tg.kernel
    def k(B):
        n = 0
        while n < 3:  # ERR:while-else
            n += 1
        else:
            B[0] = 1.0


def bad_for_else():
    @tg.kernel
    def k(B):
        for j in range(3):  # ERR:for-else
            B[j] = 1.0
        else:
            B[0] = 2.0


def bad_nested_def():
    @tg.kernel
    def k(B):
        def inner(x):  # ERR:nested-def
            return x
        B[0] = inner(1.0)


def bad_keyword_args():
    @tg.kernel
    def k(B, A):
        i = tg.index()
        B[i] = max(A[i], key=1.0)  # ERR:keyword


def bad_return_value():
    @tg.kernel
    def k(B, A):
        i = tg.index()
        return A[i]  # ERR:return-value


def bad_string():
    @tg.kernel
    def k(B):
        B[0] = "hello"  # ERR:string


def bad_chained():
    @tg.kernel
    def k(B, C):
        B[0] = C[0] = 1.0  # ERR:chained


def bad_list_comp():
    @tg.kernel
    def k(B):
        B[0] = sum([x for x in range(3)])  # ERR:listcomp


def bad_raise():
    @tg.kernel
    def k(B):
        raise ValueError()  # ERR:raise


def bad_for_iterable():
    @tg.kernel
    def k(B, A):
        for x in A:  # ERR:for-iter
            B[0] = x


def bad_matmul_op():
    @tg.kernel
    def k(C, A, B):
        C[0] = A @ B  # ERR:matmul


def bad_default_param():
    @tg.kernel
    def k(B, n=3):  # ERR:default-param
        B[0] = n


def bad_func_slice():
    @tg.func
    def f(A):
        return A[::2]  # ERR:func-slice


def bad_reserved_local():
    @tg.kernel
    def k(B, A):
        i = tg.index()
        a__items = A[i]  # ERR:reserved-local
        B[i] = a__items


def bad_reserved_param():
    @tg.kernel
    def k(B, _A):  # ERR:reserved-param
        B[0] = _A[0]


def bad_reserved_func_local():
    @tg.func
    def f(x):
        y__t = x * x  # ERR:reserved-func-local
        return y__t


SYNTAX_CASES = [
    (bad_slice, "slice", "index single elements"),
    (bad_list, "list", "use a tuple"),
    (bad_lambda, "lambda", "@tg.func"),
    (bad_try, "try", "check values with if"),
    (bad_with, "with", "context managers"),
    (bad_while_else, "while-else", "use a flag variable"),
    (bad_for_else, "for-else", "use a flag variable"),
    (bad_nested_def, "nested-def", "module level and decorate it with @tg.func"),
    (bad_keyword_args, "keyword", "pass them by position"),
    (bad_return_value, "return-value", "write its results into an output array"),
    (bad_string, "string", "only numbers and booleans"),
    (bad_chained, "chained", "one assignment per line"),
    (bad_list_comp, "listcomp", "write a for loop"),
    (bad_raise, "raise", "error flag"),
    (bad_for_iterable, "for-iter", "range(n)"),
    (bad_matmul_op, "matmul", "write the loops out"),
    (bad_default_param, "default-param", "plain positional names"),
    (bad_func_slice, "func-slice", "index single elements"),
    (bad_reserved_local, "reserved-local", "reserved for the code tapegrad generates"),
    (bad_reserved_param, "reserved-param", "or start with an underscore"),
    (bad_reserved_func_local, "reserved-func-local", "contain '__'"),
]


@pytest.mark.parametrize("build, tag, hint", SYNTAX_CASES, ids=[c[1] for c in SYNTAX_CASES])
def test_syntax_errors_at_decoration(build, tag, hint):
    with pytest.raises(tg.KernelSyntaxError) as info:
        build()
    err = info.value
    assert isinstance(err, tg.TapegradError) and isinstance(err, SyntaxError)
    assert_located(err, tag)
    assert hint in str(err)
    # like a SyntaxError, it carries the offending source text for tracebacks
    assert err.text is not None and f"ERR:{tag}" in err.text


def test_return_without_value_is_allowed():
    @tg.kernel
    def k(B):
        return

    assert isinstance(k, tg.Kernel)


# -- type errors at the first launch ------------------------------------------------------------

@tg.kernel
def float_index(B, A):
    i = tg.index()
    B[A[i]] = 1.0  # ERR:float-index


@tg.kernel
def bool_index(B, A):
    i = tg.index()
    B[A[i] > 0.5] = 1.0  # ERR:bool-index


@tg.kernel
def wrong_rank_index(B, A):
    i = tg.index()
    B[i] = A[i]  # ERR:wrong-rank


@tg.kernel
def float_into_int(B, A):
    i = tg.index()
    B[i] = A[i] * 0.5  # ERR:float-into-int


@tg.kernel
def float_augassign_into_int(B):
    i = tg.index()
    B[i] += 0.5  # ERR:float-aug-into-int


@tg.kernel
def reassign_array_arg(B, A):
    i = tg.index()
    A = B  # ERR:reassign-array
    A[i] = 1.0


@tg.kernel
def alias_array(B, A):
    i = tg.index()
    C = A  # ERR:alias-array
    B[i] = C[i] + A[i]


@tg.kernel
def arrays_in_a_tuple(B, A):
    i = tg.index()
    pair = (B, A)  # ERR:array-tuple
    pair[0][i] = A[i]


@tg.func
def first_of(pair, k):
    return pair[0][k]


@tg.kernel
def arrays_in_a_tuple_argument(B, A):
    i = tg.index()
    B[i] = first_of((A, B), i)  # ERR:array-tuple-arg


@tg.kernel
def localmem_declared_twice(B, A):
    i = tg.index()
    li = tg.index(tg.Local)
    t = tg.localmem(A.dtype, tg.groupsize())
    t[li] = A[i]
    tg.synchronize()
    t = tg.localmem(A.dtype, (2,))  # ERR:declared-twice
    B[i] = t[0]


@tg.kernel
def undefined_name(B):
    i = tg.index()
    B[i] = not_defined_anywhere + 1.0  # ERR:undefined  # noqa: F821


@tg.kernel
def calls_print(B):
    i = tg.index()
    print(i)  # ERR:print
    B[i] = 1.0


@tg.kernel
def calls_np_roll(B, A):
    i = tg.index()
    B[i] = np.roll(A, 1)[i]  # ERR:np-roll


@tg.func
def recursive(x):
    if x <= 0:
        return 0
    return recursive(x - 1) + 1  # ERR:recursion


@tg.kernel
def uses_recursion(B):
    i = tg.index()
    B[i] = recursive(i)


@tg.func
def ping(x):
    return pong(x - 1)


@tg.func
def pong(x):
    return ping(x)  # ERR:mutual


@tg.kernel
def uses_mutual_recursion(B):
    i = tg.index()
    B[i] = ping(i)


@tg.kernel
def uses_global_array(B):
    i = tg.index()
    B[i] = GLOBAL_ARRAY[i]  # ERR:global-array


@tg.kernel
def localmem_runtime_shape(B, n):
    i = tg.index()
    tmp = tg.localmem(np.float64, (n,))  # ERR:localmem-shape
    tmp[0] = 1.0
    B[i] = tmp[0]


@tg.kernel
def barrier_in_item_loop(B):
    i = tg.index()
    for _k in range(i):  # ERR:item-bound
        tg.synchronize()
    B[i] = 1.0


@tg.kernel
def barrier_in_item_if(B, A):
    i = tg.index()
    if A[i] > 0.0:  # ERR:item-if
        tg.synchronize()
    B[i] = 1.0


@tg.kernel
def barrier_in_mixed_tuple_loop(B, A):
    i = tg.index()
    n, k = (A.shape[0], i)    # judged name by name: n is uniform, k is not
    for _j in range(n):
        tg.synchronize()
    for _j in range(k):  # ERR:mixed-tuple-bound
        tg.synchronize()
    B[i] = 1.0


@tg.kernel
def barrier_in_loop_over_half_reused_unpack(B, A):
    i = tg.index()
    n, k = A.shape            # one statement computes n and k: they are uniform together
    n = i                     # ... or not at all (conservative: k is refused too)
    for _j in range(A.shape[1]):
        tg.synchronize()
    for _j in range(k):  # ERR:half-reused-unpack
        tg.synchronize()
    B[n] = 1.0


@tg.kernel
def barrier_in_item_tuple_element_loop(B):
    i = tg.index()
    local = tg.index(tg.Local, tg.NTuple)
    for _k in range(local[0]):  # ERR:item-tuple-element
        tg.synchronize()
    B[i] = 1.0


@tg.kernel
def barrier_in_localmem_element_loop(B):
    i = tg.index()
    tmp = tg.localmem(np.int64, (4,))
    tmp[0] = 2
    tg.synchronize()
    for _k in range(tmp[0]):  # ERR:localmem-element-bound
        tg.synchronize()
    B[i] = 1.0


@tg.kernel
def assigns_a_barrier(B):
    i = tg.index()
    x = tg.synchronize()  # ERR:assign-barrier
    B[i] = x


@tg.kernel
def barrier_in_an_expression(B):
    i = tg.index()
    B[i] = float(tg.synchronize())  # ERR:barrier-in-expression


@tg.func
def func_with_barrier(x):
    tg.synchronize()  # ERR:func-barrier
    return x


@tg.kernel
def calls_func_with_barrier(B):
    i = tg.index()
    B[i] = func_with_barrier(1.0)


@tg.kernel
def return_before_barrier(B):
    i = tg.index()
    if i > 2:
        return  # ERR:return-before-barrier
    tg.synchronize()
    B[i] = 1.0


@tg.kernel
def calls_a_kernel(B):
    float_index(B, B)  # ERR:kernel-call


@tg.kernel
def wrong_arg_count_to_func(B):
    i = tg.index()
    B[i] = recursive(i, i)  # ERR:func-args


@tg.kernel
def tuple_arithmetic(B):
    i = tg.index()
    t = (i, i)
    B[i] = t * 2  # ERR:tuple-arith


@tg.kernel
def bool_from_float(B, A):
    i = tg.index()
    B[i] = A[i]  # ERR:bool-store


@tg.kernel
def or_as_a_value(B, A):
    i = tg.index()
    B[i] = A[i] or 7.0  # ERR:or-value


@tg.kernel
def int_past_64_bits(B):
    i = tg.index()
    B[i] = 18446744073709551616 + i  # ERR:int-literal-64


def _fake_host_api():
    def gradient(*args):
        return None
    gradient.__module__ = "tapegrad.ad"
    return gradient


gradient = _fake_host_api()


@tg.kernel
def calls_host_api(B):
    i = tg.index()
    B[i] = gradient(B)  # ERR:host-api


F64 = np.zeros(4)
I64 = np.zeros(4, np.int64)

TYPE_CASES = [
    # kernel, args, tag, message fragment
    (float_index, (F64, F64), "float-index", "int(...)"),
    (bool_index, (F64, F64), "bool-index", "NumPy takes a bool index for a mask"),
    (wrong_rank_index, (F64, np.zeros((2, 2))), "wrong-rank", "2 dimension(s)"),
    (float_into_int, (I64, F64), "float-into-int", "int(...)"),
    (float_augassign_into_int, (I64,), "float-aug-into-int", "int(...)"),
    (reassign_array_arg, (F64, F64), "reassign-array", "another name"),
    (alias_array, (F64, np.zeros(4)), "alias-array", "C = A gives an array a second name"),
    (arrays_in_a_tuple, (F64, np.zeros(4)), "array-tuple",
     "B is an array inside a tuple: kernels use each array under its own name"),
    (arrays_in_a_tuple_argument, (F64, np.zeros(4)), "array-tuple-arg", "f(Y, X), not f((Y, X))"),
    (localmem_declared_twice, (F64, np.zeros(4)), "declared-twice", "its own name"),
    (undefined_name, (F64,), "undefined", "not_defined_anywhere"),
    (calls_print, (F64,), "print", "print"),
    (calls_np_roll, (F64, np.zeros(4)), "np-roll",
     "np.roll cannot be called in a kernel: it is a NumPy function on whole arrays"),
    (uses_recursion, (I64,), "recursion", "recursion"),
    (uses_mutual_recursion, (I64,), "mutual", "recursion"),
    (uses_global_array, (F64,), "global-array", "pass it as a kernel argument"),
    (localmem_runtime_shape, (F64, 3), "localmem-shape", "compile time"),
    (barrier_in_item_loop, (F64,), "item-bound", "same value for every"),
    (barrier_in_item_if, (F64, F64), "item-if", "same value for every"),
    (barrier_in_mixed_tuple_loop, (F64, F64), "mixed-tuple-bound", "same value for every"),
    (barrier_in_loop_over_half_reused_unpack, (F64, np.zeros((4, 4))), "half-reused-unpack",
     "same value for every"),
    (barrier_in_item_tuple_element_loop, (F64,), "item-tuple-element", "same value for every"),
    (barrier_in_localmem_element_loop, (F64,), "localmem-element-bound", "same value for every"),
    (assigns_a_barrier, (F64,), "assign-barrier",
     "tg.synchronize() is a workgroup barrier and returns nothing: it must be a statement of "
     "its own"),
    (barrier_in_an_expression, (F64,), "barrier-in-expression", "returns nothing"),
    (calls_func_with_barrier, (F64,), "func-barrier", "device function"),
    (return_before_barrier, (F64,), "return-before-barrier", "barrier"),
    (calls_a_kernel, (F64,), "kernel-call", "@tg.func"),
    (wrong_arg_count_to_func, (I64,), "func-args", "argument"),
    (tuple_arithmetic, (I64,), "tuple-arith", "tuple"),
    (bool_from_float, (np.zeros(4, bool), F64), "bool-store", "compare"),
    (calls_host_api, (F64,), "host-api", "tg.gradient cannot be called inside a kernel"),
    # (both ran: `or` gave 1.0 where Python gives 7.0; the literal failed in Numba, unlocated,
    # as a tapegrad bug, and OpenCL computed with 0)
    (or_as_a_value, (F64, F64), "or-value", "write `x if x != 0 else y`"),
    (int_past_64_bits, (I64,), "int-literal-64", "does not fit in a 64-bit integer"),
]
TYPE_IDS = [c[2] for c in TYPE_CASES]


@pytest.mark.parametrize("kern, args, tag, fragment", TYPE_CASES, ids=TYPE_IDS)
def test_errors_at_first_launch(kern, args, tag, fragment):
    # decoration succeeded (the module imported); the error comes at the first launch
    assert isinstance(kern, tg.Kernel)
    before = [a.copy() for a in args if isinstance(a, np.ndarray)]
    for _ in range(2):   # a failed compilation is not cached as a success
        with pytest.raises(tg.KernelError) as info:
            kern(CPU, 4)(*args, ndrange=4)
        err = info.value
        assert not isinstance(err, tg.KernelCompileError), "a user error, not a tapegrad bug"
        assert_located(err, tag)
        assert fragment in str(err)
    after = [a for a in args if isinstance(a, np.ndarray)]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(a, b)


# what the code is (names, calls, where barriers and returns stand): KernelSyntaxError, even
# when it can only be judged at the first launch, once names are resolved
STRUCTURE_TAGS = {"undefined", "print", "np-roll", "item-bound", "item-if", "return-before-barrier",
                  "kernel-call", "host-api", "global-array", "mixed-tuple-bound",
                  "item-tuple-element", "localmem-element-bound", "assign-barrier",
                  "barrier-in-expression", "half-reused-unpack"}


@pytest.mark.parametrize("kern, args, tag, fragment", TYPE_CASES, ids=TYPE_IDS)
def test_first_launch_errors_have_the_documented_class(kern, args, tag, fragment):
    """docs/language.md: unsupported code is a KernelSyntaxError, values of the wrong type a
    KernelTypeError; both are KernelErrors."""
    expected = tg.KernelSyntaxError if tag in STRUCTURE_TAGS else tg.KernelTypeError
    with pytest.raises(expected):
        kern(CPU, 4)(*args, ndrange=4)


@tg.kernel
def barrier_in_global_tuple_loop(B):
    i, j = tg.index(tg.Global, tg.NTuple)
    for _k in range(i):  # ERR:global-tuple-bound
        tg.synchronize()
    B[i, j] = 1.0


@tg.kernel
def barrier_in_local_tuple_if(B):
    i, j = tg.index(tg.Global, tg.NTuple)
    li, lj = tg.index(tg.Local, tg.NTuple)
    if lj > 0:  # ERR:local-tuple-if
        tg.synchronize()
    B[i, j] = 1.0


@pytest.mark.parametrize("kern, tag", [(barrier_in_global_tuple_loop, "global-tuple-bound"),
                                       (barrier_in_local_tuple_if, "local-tuple-if")],
                         ids=["global", "local"])
def test_item_indices_unpacked_from_a_tuple_cannot_steer_a_barrier(kern, tag):
    """Unpacking is judged name by name, but global and local indices still vary."""
    with pytest.raises(tg.KernelSyntaxError) as info:
        kern(CPU, (2, 2))(np.zeros((4, 4)), ndrange=(4, 4))
    assert_located(info.value, tag)
    assert "must have the same value for every work-item of the group" in str(info.value)


def test_failed_launch_leaves_arrays_untouched():
    B = np.full(4, 3.0)
    A = np.full(4, 5.0)

    @tg.kernel
    def writes_then_fails(B, A):
        i = tg.index()
        B[i] = 1.0
        A[i] = B[i]
        B[A[i]] = 2.0    # float index: a type error after two valid writes

    with pytest.raises(tg.KernelTypeError):
        writes_then_fails(CPU, 4)(B, A, ndrange=4)
    assert (B == 3.0).all() and (A == 5.0).all()


# -- host API inside kernels ----------------------------------------------------------------

def test_autodiff_inside_kernel_is_rejected():
    @tg.kernel
    def k(B):
        tg.autodiff(B)  # ERR:autodiff

    with pytest.raises(tg.KernelError) as info:
        k(CPU, 4)(np.zeros(4), ndrange=4)
    assert_located(info.value, "autodiff")
    assert "host function" in str(info.value)


# -- device functions and kernel-only intrinsics --------------------------------------------------

@tg.func
def item_index():
    return tg.index()


@tg.kernel
def index_via_func(B):
    i = tg.index()
    B[i] = item_index()


def test_index_in_device_function_works_or_is_rejected_clearly():
    B = np.full(6, -1, np.int64)
    try:
        index_via_func(CPU, 4)(B, ndrange=6)
    except tg.KernelCompileError as exc:   # "if your kernel is valid, this is a tapegrad bug"
        pytest.fail(f"tg.index() in a @tg.func neither works nor is rejected clearly: {exc}")
    except (tg.KernelTypeError, tg.KernelSyntaxError):
        return
    np.testing.assert_array_equal(B, np.arange(6))


# -- launch errors ---------------------------------------------------------------------------

@tg.kernel
def copy(B, A):
    i = tg.index()
    B[i] = A[i]


@tg.kernel
def copy2d(B, A):
    i, j = tg.index(tg.Global, tg.NTuple)
    B[i, j] = A[i, j]


def test_missing_ndrange():
    B, A = np.zeros(4), np.ones(4)
    with pytest.raises(tg.LaunchError, match="ndrange="):
        copy(CPU, 4)(B, A)
    assert (B == 0).all()


@pytest.mark.parametrize("nd", [-1, (4, -2), (1, 1, 1, 1), (), 2.5, (2.0,), "4"], ids=repr)
def test_bad_ndrange(nd):
    B = np.zeros(4)
    with pytest.raises(tg.LaunchError, match="ndrange"):
        copy(CPU, 4)(B, np.ones(4), ndrange=nd)
    assert (B == 0).all()


@pytest.mark.parametrize("args", [(np.zeros(4),), (np.zeros(4), np.ones(4), np.ones(4))],
                         ids=["too-few", "too-many"])
def test_wrong_number_of_args(args):
    with pytest.raises(tg.LaunchError, match=r"takes 2 argument\(s\) \(B, A\), got"):
        copy(CPU, 4)(*args, ndrange=4)
    assert (args[0] == 0).all()


@pytest.mark.parametrize("dtype", [np.complex128, np.uint8, np.float16, np.int8, np.uint64],
                         ids=lambda d: d.__name__)
def test_unsupported_dtype(dtype):
    B = np.zeros(4)
    with pytest.raises(tg.LaunchError, match="dtype") as info:
        copy(CPU, 4)(B, np.ones(4, dtype), ndrange=4)
    assert "astype" in str(info.value)
    assert (B == 0).all()


def test_non_native_byte_order_is_a_launch_error():
    B = np.zeros(4)
    copy(CPU, 4)(B, np.ones(4), ndrange=4)          # compiled for native float64 once
    B[:] = 0
    big_endian = np.arange(4.0).astype(">f8")
    with pytest.raises(tg.LaunchError):
        copy(CPU, 4)(B, big_endian, ndrange=4)
    assert (B == 0).all()


def test_read_only_output_after_first_compile_is_a_tapegrad_error():
    B = np.zeros(4)
    copy(CPU, 4)(B, np.ones(4), ndrange=4)
    frozen = np.zeros(4)
    frozen.flags.writeable = False
    with pytest.raises(tg.TapegradError):
        copy(CPU, 4)(frozen, np.ones(4), ndrange=4)
    assert (frozen == 0).all()


def test_read_only_input_works():
    A = np.arange(4.0)
    A.flags.writeable = False
    B = np.zeros(4)
    copy(CPU, 4)(B, A, ndrange=4)
    np.testing.assert_array_equal(B, A)


@pytest.mark.parametrize("shape", [(2, 2, 2, 2), ()], ids=["4-D", "0-D"])
def test_unsupported_array_rank(shape):
    B = np.zeros(4)
    with pytest.raises(tg.LaunchError, match="dimensions"):
        copy(CPU, 4)(B, np.ones(shape), ndrange=4)
    assert (B == 0).all()


@pytest.mark.parametrize("arg", ["text", [1.0, 2.0], None, 1 + 2j], ids=repr)
def test_unsupported_argument_kinds(arg):
    B = np.zeros(4)
    with pytest.raises(tg.LaunchError, match="argument A"):
        copy(CPU, 4)(B, arg, ndrange=4)


def test_workgroupsize_rank_mismatch():
    B = np.zeros((4, 4))
    with pytest.raises(tg.LaunchError, match="same rank"):
        copy2d(CPU, 16)(B, np.ones((4, 4)), ndrange=(4, 4))
    with pytest.raises(tg.LaunchError, match="same rank"):
        copy(CPU, (4, 4))(np.zeros(4), np.ones(4), ndrange=4)
    assert (B == 0).all()


@pytest.mark.parametrize("wgs", [0, -4, (4, 0)], ids=repr)
def test_bad_workgroupsize(wgs):
    rank = 1 if isinstance(wgs, int) else len(wgs)
    nd = (4,) * rank
    kern = copy if rank == 1 else copy2d
    with pytest.raises(tg.LaunchError, match="workgroupsize"):
        kern(CPU, wgs)(np.zeros(nd), np.ones(nd), ndrange=nd)


@pytest.mark.parametrize("not_a_backend", [np.zeros(3), "cpu", 64, None], ids=repr)
def test_first_call_must_be_a_backend(not_a_backend):
    with pytest.raises(tg.LaunchError, match="takes a backend first"):
        copy(not_a_backend)


def test_calling_a_kernel_with_arrays_directly():
    B, A = np.zeros(4), np.ones(4)
    with pytest.raises(tg.LaunchError, match="backend"):
        copy(B, A)
    assert (B == 0).all()


# -- kernel-language functions on the host ---------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda: tg.index(),
    lambda: tg.index(tg.Local, tg.NTuple),
    lambda: tg.groupsize(),
    lambda: tg.ndrange(),
    lambda: tg.localmem(np.float32, 4),
    lambda: tg.private(np.float32, 4),
    lambda: tg.atomic_add(np.zeros(2), 0, 1.0),
    lambda: tg.atomic_sub(np.zeros(2), 0, 1.0),
    lambda: tg.atomic_min(np.zeros(2), 0, 1.0),
    lambda: tg.atomic_max(np.zeros(2), 0, 1.0),
], ids=["index", "index-args", "groupsize", "ndrange", "localmem", "private", "atomic_add",
        "atomic_sub", "atomic_min", "atomic_max"])
def test_kernel_language_on_host_raises(call):
    with pytest.raises(tg.OutsideKernelError, match="only has a meaning inside"):
        call()


def test_synchronize_without_backend_on_host():
    with pytest.raises(tg.OutsideKernelError) as info:
        tg.synchronize()
    assert "tg.synchronize(backend)" in str(info.value)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, tg.TapegradError)


def test_atomics_do_not_touch_arrays_on_host():
    H = np.zeros(2)
    with pytest.raises(tg.OutsideKernelError):
        tg.atomic_add(H, 0, 1.0)
    assert (H == 0).all()


# -- bounds checks: indices never wrap around -------------------------------------------------------

def test_negative_index_is_out_of_bounds_with_boundscheck(monkeypatch):
    """With TAPEGRAD_BOUNDSCHECK=1, A[i - 1] at i == 0 is an error, not A[-1] (under a
    condition, where the launch's own range check does not look)."""
    monkeypatch.setenv("TAPEGRAD_BOUNDSCHECK", "1")

    @tg.kernel
    def shift_left(B, A):
        i = tg.index()
        if A[i] > 0.0:
            B[i] = A[i - 1]

    B, A = np.zeros(4), np.arange(1.0, 5.0)
    with pytest.raises(tg.KernelIndexError) as info:
        shift_left(CPU, 4)(B, A, ndrange=4)
    assert isinstance(info.value, IndexError)
    assert B[0] == 0.0          # A[-1] (== 4.0) was never read into B[0]
    assert f"{__file__}:{_line_of('B[i] = A[i - 1]')}:" in str(info.value)
    assert "A[i - 1] with index -1, but A has shape (4,)" in str(info.value)


def _line_of(code: str) -> int:
    """The line of this file that holds ``code`` (its first)."""
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1) if text.strip() == code)


def test_boundscheck_names_the_line_the_array_and_the_index_in_loops_and_2d(monkeypatch):
    """The replay finds the subscript out of range in a loop and in 2-D: the user's line,
    the array, the index values and the shape; the user's arrays are left as the checked
    launch left them."""
    monkeypatch.setenv("TAPEGRAD_BOUNDSCHECK", "1")

    # (the reads are under conditions, where the launch's own range check does not look)
    @tg.kernel
    def row_sums(B, A, n):
        i = tg.index()
        s = 0.0
        for k in range(n):
            if k >= 0:
                s += A[i * n + k]
        B[i] = s

    @tg.kernel
    def left(B, A):
        i, j = tg.index(tg.Global, tg.NTuple)
        if A[i, j] > 0.0:
            B[i, j] = A[i, j - 1] + A[i, j]

    A = np.ones(10)
    with pytest.raises(tg.KernelIndexError, match=r"A\[i \* n \+ k\] with index 10, but A has "
                       r"shape \(10,\)") as info:
        row_sums(CPU, 4)(np.zeros(4), A, 3, ndrange=4)
    assert f"{__file__}:{_line_of('s += A[i * n + k]')}:" in str(info.value)
    assert (A == 1.0).all()
    with pytest.raises(tg.KernelIndexError, match=r"A\[i, j - 1\] with index 0, -1, but A has "
                       r"shape \(3, 4\)"):
        left(CPU, (1, 4))(np.zeros((3, 4)), np.ones((3, 4)), ndrange=(3, 4))


def test_math_module_is_not_mistaken_for_a_value():
    @tg.kernel
    def uses_module(B):
        i = tg.index()
        B[i] = math  # ERR:module-value

    with pytest.raises(tg.KernelError) as info:
        uses_module(CPU, 4)(np.zeros(4), ndrange=4)
    assert_located(info.value, "module-value")


@tg.kernel
def stores_into_its_output(B, A):
    i = tg.index()
    B[i] = 2.0 * A[i]  # ERR:const-output


def test_an_active_value_stored_into_a_const_array_is_an_activity_error():
    """(an annotation that does not fit the kernel: not unsupported code, so not a
    KernelSyntaxError)"""
    A, B, dA = np.ones(4), np.zeros(4), np.zeros(4)
    with pytest.raises(tg.KernelActivityError, match=r"into B, which is Const.*"
                       r"Duplicated\(B, dB\)") as info:
        tg.autodiff(tg.Reverse, stores_into_its_output(CPU), tg.Const, tg.Const(B),
                    tg.Duplicated(A, dA), ndrange=4)
    assert not isinstance(info.value, tg.KernelSyntaxError)
    assert isinstance(info.value, tg.KernelError)
    assert_located(info.value, "const-output")
    np.testing.assert_array_equal(B, 0.0)
