"""``normalize`` works on copies: the kernel's own IR, which every compile starts from and
which typed kernels refer to node by node, stays as it was."""

from __future__ import annotations

import ast

import numpy as np

import tapegrad as tg
from tapegrad.ad.normalize import normalize
from tapegrad.backends.cpu.lower import lower_kernel
from tapegrad.frontend import kernel_ir
from tapegrad.frontend.types import specialize
from tapegrad.runtime.arguments import check_args


@tg.func
def twice(v):
    return 2.0 * v


@tg.kernel
def stencil_with_calls(Y, X, a):
    i, j = tg.index(tg.Global, tg.NTuple)
    n, m = X.shape
    if 0 < i < n - 1 and 0 < j < m - 1:
        Y[i, j] = X[i, j] + a * twice(X[i - 1, j] - X[i, j])
    else:
        Y[i, (j + 1) % m] += X[i, j]
        if i == 0:
            return


def _nodes(ir) -> list[int]:
    return [id(n) for s in ir.body for n in ast.walk(s)]


def test_normalize_leaves_the_kernels_ir_node_for_node():
    ir = kernel_ir(stencil_with_calls)
    before, text = _nodes(ir), ast.unparse(ast.Module(body=ir.body, type_ignores=[]))
    x = np.zeros((4, 5))
    argtypes = check_args(stencil_with_calls, tg.CPU(), (x, x, 0.5))
    typed = specialize(ir, argtypes, 2, (2, 4), kernel_ir)
    normalize(ir, kernel_ir)
    assert _nodes(ir) == before
    assert ast.unparse(ast.Module(body=ir.body, type_ignores=[])) == text
    lower_kernel(typed)          # a kernel typed before still lowers (its types by node)
