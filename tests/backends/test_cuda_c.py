"""The CUDA C++ dialect of the C printer: every kernel of the OpenCL corpus and every row of
the primitive table compiles with NVRTC to an sm_90 cubin (no GPU needed), and its source
differs from the OpenCL C one only where the two languages must."""

from __future__ import annotations

import ast

import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.c.printer import CUDA, OPENCL, CPrinter, kernel_symbol
from tapegrad.backends.c.statements import Body
from tapegrad.backends.cuda.nvrtc import compile_cuda
from tapegrad.backends.structure import device_functions
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import specialize
from tapegrad.runtime.arguments import check_args
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul
from tests.backends import test_opencl as corpus
from tests.backends.dialects import as_cuda, without_atomic_helpers
from tests.test_primitives import ROWS, load_every_row

CASES = {
    "control_flow": (corpus.control_flow, (np.zeros((4, 4)), np.zeros((4, 4)), 3), 2, (4, 8)),
    "python_arithmetic": (corpus.python_arithmetic,
                          (np.zeros(3), np.zeros(4, np.int64), 1, 2, 1.0, 2.0), 1, (1,)),
    "float32_literals": (corpus.float32_literals,
                         (np.zeros(3, np.float32), np.zeros(3, np.float32)), 1, (64,)),
    "saxpy": (corpus.saxpy, (np.zeros(3), 1.0, np.zeros(3)), 1, (256,)),
    "named_step": (corpus.step, (np.zeros(3), np.zeros(3), 0.5), 1, (64,)),
    "named_exp": (corpus.exp, (np.zeros(3), np.zeros(3)), 1, (64,)),
    "variables_named_as_c_words": (corpus.halve, (np.zeros(3), np.zeros(3), 1.0, 0.5), 1,
                                   (64,)),
    "tree_sums": (corpus.tree_sums, (np.zeros(2), np.zeros(128)), 1, (64,)),
    "private_slots": (corpus.private_slots, (np.zeros(3), np.zeros(3)), 1, (64,)),
    "tiled_matmul": (tiled_matmul, (np.zeros((8, 8)),) * 3, 2, (TILE, TILE)),
    "atomics_64": (corpus.histograms, (np.zeros(2), np.zeros(2, np.int64), np.zeros(2),
                                       np.zeros(4, np.int64), np.zeros(4)), 1, (64,)),
    "atomics_32": (corpus.histograms, (np.zeros(2, np.float32), np.zeros(2, np.int32),
                                       np.zeros(2, np.float32), np.zeros(4, np.int64),
                                       np.zeros(4, np.float32)), 1, (64,)),
}


def _printed(kernel, args, rank, groupsize, dialect) -> tuple[str, str]:
    tk = specialize(kernel_ir(kernel), check_args(kernel, tg.CPU(), args), rank, groupsize,
                    kernel_ir)
    # (kernels named as C reserves, step or exp, are step_kernel and exp_kernel in C)
    return kernel_symbol(tk.name), CPrinter(tk, dialect).module(device_functions(tk))


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    rows = np.zeros((8, len(ROWS)))
    every_row = load_every_row(tmp_path_factory.mktemp("cuda_rows"))
    return {**CASES, "every_row": (every_row, (rows,) * 4, 1, (32,))}


@pytest.mark.parametrize("name", [*CASES, "every_row"])
def test_the_cuda_dialect_compiles_to_an_sm90_cubin(cases, name):
    kernel, args, rank, groupsize = cases[name]
    symbol, source = _printed(kernel, args, rank, groupsize, CUDA)
    assert f'extern "C" __global__ void {symbol}(' in source
    binary = compile_cuda(source, symbol, 90)
    assert binary.kind == "cubin" and binary.data[:4] == b"\x7fELF" and len(binary.data) > 1000


@pytest.mark.parametrize("name", [*CASES, "every_row"])
def test_the_two_dialects_differ_only_where_the_languages_must(cases, name):
    kernel, args, rank, groupsize = cases[name]
    _, opencl = _printed(kernel, args, rank, groupsize, OPENCL)
    _, cuda = _printed(kernel, args, rank, groupsize, CUDA)
    assert as_cuda(without_atomic_helpers(opencl)).strip() == \
        without_atomic_helpers(cuda).strip()


def test_a_statement_without_a_type_is_a_tapegrad_error_not_a_key_error():
    """(a pass that adds statements after typing must give them types, as barriers.py does
    for the shared loop bounds; one that does not gets a tapegrad error naming the line)"""
    kernel, args, rank, groupsize = CASES["saxpy"]
    tk = specialize(kernel_ir(kernel), check_args(kernel, tg.CPU(), args), rank, groupsize,
                    kernel_ir)
    body = Body(CPrinter(tk, OPENCL), tk)
    untyped = ast.Assign(targets=[ast.Name(id="_added", ctx=ast.Store())],
                         value=ast.Constant(1), lineno=tk.ir.lineno, col_offset=0)
    with pytest.raises(tg.KernelCompileError, match="an expression without a type"):
        body.statement(untyped, 1)


def test_the_tapes_fingerprint_kernel_compiles_to_sm_90():
    """(its block-wide sum: tapegrad/backends/cuda/fingerprint.py; its hash against the
    host's is checked on a GPU, tests/gpu/test_gpu.py)"""
    from tapegrad.backends.cuda.fingerprint import BLOCK, SOURCE
    assert f"#define BLOCK {BLOCK}" in SOURCE and "__shfl_down_sync" in SOURCE
    assert compile_cuda(SOURCE, "tg_fingerprint", 90).data
