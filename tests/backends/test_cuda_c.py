"""The CUDA C++ dialect of the C printer: every kernel of the OpenCL corpus and every row of
the primitive table compiles with NVRTC to an sm_90 cubin (no GPU needed), and its source
differs from the OpenCL C one only where the two languages must."""

from __future__ import annotations

import re

import numpy as np
import pytest
from cuda.bindings import nvrtc

import tapegrad as tg
from tapegrad.backends.c.printer import CUDA, OPENCL, CPrinter
from tapegrad.backends.structure import device_functions
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import specialize
from tapegrad.runtime.arguments import check_args
from tests.ad.test_reverse import TILE
from tests.ad.test_reverse import matmul as tiled_matmul
from tests.backends import test_opencl as corpus
from tests.test_primitives import ROWS, load_every_row

CASES = {
    "control_flow": (corpus.control_flow, (np.zeros((4, 4)), np.zeros((4, 4)), 3), 2, (4, 8)),
    "python_arithmetic": (corpus.python_arithmetic,
                          (np.zeros(3), np.zeros(4, np.int64), 1, 2, 1.0, 2.0), 1, (1,)),
    "float32_literals": (corpus.float32_literals,
                         (np.zeros(3, np.float32), np.zeros(3, np.float32)), 1, (64,)),
    "saxpy": (corpus.saxpy, (np.zeros(3), 1.0, np.zeros(3)), 1, (256,)),
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
    return tk.name, CPrinter(tk, dialect).module(device_functions(tk))


def _cubin_size(source: str, name: str) -> int:
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    options = [b"--gpu-architecture=sm_90", b"--fmad=false"]
    (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
    _, size = nvrtc.nvrtcGetProgramLogSize(program)
    log = b" " * size
    nvrtc.nvrtcGetProgramLog(program, log)
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, log.decode() + "\n" + source
    _, size = nvrtc.nvrtcGetCUBINSize(program)
    return size


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    rows = np.zeros((8, len(ROWS)))
    every_row = load_every_row(tmp_path_factory.mktemp("cuda_rows"))
    return {**CASES, "every_row": (every_row, (rows, rows, rows), 1, (32,))}


@pytest.mark.parametrize("name", [*CASES, "every_row"])
def test_the_cuda_dialect_compiles_to_an_sm90_cubin(cases, name):
    kernel, args, rank, groupsize = cases[name]
    symbol, source = _printed(kernel, args, rank, groupsize, CUDA)
    assert f'extern "C" __global__ void {symbol}(' in source
    assert _cubin_size(source, symbol) > 1000


def _without_atomic_helpers(source: str) -> str:
    """The source without the atomics' helper functions, whose bodies differ as the two
    languages' atomic instructions do (a compare-and-swap loop where one has none)."""
    return "\n".join(ln for ln in source.splitlines() if " tg_atomic_" not in ln
                     or not ln.startswith("static"))


def _as_cuda(opencl: str) -> str:
    """The OpenCL C source with each of the dialects' differences respelled as CUDA's."""
    text = "\n".join(ln for ln in opencl.splitlines() if not ln.startswith("#pragma"))
    text = text.replace("for opencl:", "for cuda:").replace("__global ", "")
    text = text.replace("__kernel void", 'extern "C" __global__ void')
    text = text.replace("static inline", "static __device__ inline")
    text = re.sub(r"^static (\w+ \w+\()", r"static __device__ \1", text, flags=re.M)
    text = text.replace("__local ", "__shared__ ")
    text = text.replace("barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);", "__syncthreads();")
    text = re.sub(r"\blong\b", "long long", text)
    text = re.sub(r"\buchar\b", "unsigned char", text)
    axes = "xyz"
    text = re.sub(r"get_local_id\((\d)\)", lambda m: f"threadIdx.{axes[int(m.group(1))]}", text)
    return re.sub(r"get_group_id\((\d)\)", lambda m: f"blockIdx.{axes[int(m.group(1))]}", text)


@pytest.mark.parametrize("name", [*CASES, "every_row"])
def test_the_two_dialects_differ_only_where_the_languages_must(cases, name):
    kernel, args, rank, groupsize = cases[name]
    _, opencl = _printed(kernel, args, rank, groupsize, OPENCL)
    _, cuda = _printed(kernel, args, rank, groupsize, CUDA)
    assert _as_cuda(_without_atomic_helpers(opencl)).strip() == \
        _without_atomic_helpers(cuda).strip()
