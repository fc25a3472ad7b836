"""tapegrad: write compute kernels once in Python, run them on the CPU or an NVIDIA GPU, and
differentiate whole programs built from them.

>>> import numpy as np, tapegrad as tg
>>> @tg.kernel
... def axpy(Y, a, X):
...     i = tg.index()
...     Y[i] += a * X[i]
>>> Y = np.ones(3); axpy(tg.get_backend(Y))(Y, 2.0, np.arange(3.0), ndrange=3); Y.tolist()
[1.0, 3.0, 5.0]
"""

from __future__ import annotations

from tapegrad._version import __version__
from tapegrad.backends import (
                               CPU,
                               CUDA,
                               Backend,
                               OpenCL,
                               allocate,
                               asarray,
                               get_backend,
                               ones,
                               to_numpy,
                               zeros,
)
from tapegrad.errors import (
                               BackendError,
                               CaptureError,
                               InplaceModificationError,
                               KernelActivityError,
                               KernelCompileError,
                               KernelError,
                               KernelIndexError,
                               KernelSyntaxError,
                               KernelTypeError,
                               LaunchError,
                               NonFiniteError,
                               OutsideKernelError,
                               TapegradError,
)
from tapegrad.kernels import ConfiguredKernel, Func, Kernel, func, kernel
from tapegrad.lang.intrinsics import (
                               MATH_FUNCTIONS,
                               Global,
                               Group,
                               Linear,
                               Local,
                               NTuple,
                               atomic_add,
                               atomic_max,
                               atomic_min,
                               atomic_sub,
                               groupsize,
                               index,
                               localmem,
                               ndrange,
                               private,
                               synchronize,
                               where,
)

globals().update(MATH_FUNCTIONS)   # tg.sin, tg.exp, ... (math names, usable in kernels and on the host)

__all__ = [
    "__version__", "kernel", "func", "Kernel", "Func", "ConfiguredKernel",
    "index", "groupsize", "ndrange", "localmem", "private", "synchronize",
    "atomic_add", "atomic_sub", "atomic_min", "atomic_max", "where",
    "Global", "Local", "Group", "Linear", "NTuple",
    "Backend", "CPU", "CUDA", "OpenCL", "get_backend", "allocate", "zeros", "ones", "asarray", "to_numpy",
    "TapegradError", "KernelError", "KernelSyntaxError", "KernelTypeError", "KernelCompileError",
    "KernelActivityError", "KernelIndexError", "NonFiniteError", "LaunchError", "BackendError", "OutsideKernelError", "CaptureError",
    "InplaceModificationError",
] + sorted(MATH_FUNCTIONS)

# (autodiff_deferred: Enzyme's name, which says what to call instead)
from tapegrad.api import (  # noqa: E402
    AdjointStackOverflow,
    autodiff,
    autodiff_deferred,  # noqa: F401
    gradient,
    hvp,
    jacobian,
    jvp,
    vjp,
)
from tapegrad.backends.determinism import deterministic  # noqa: E402
from tapegrad.capturing import capture  # noqa: E402
from tapegrad.checkpointing.loop import checkpoint_loop  # noqa: E402
from tapegrad.checkpointing.segment import checkpoint  # noqa: E402
from tapegrad.runtime.nans import debug_nans  # noqa: E402
from tapegrad.tape.activity import (  # noqa: E402
                               Active,
                               BatchDuplicated,
                               Const,
                               Duplicated,
                               DuplicatedNoNeed,
                               Forward,
                               ForwardWithPrimal,
                               Reverse,
                               ReverseWithPrimal,
                               make_zero,
                               make_zero_,
)
from tapegrad.tape.hostops import copy, dot, mean, norm, reshape, scale, sum  # noqa: E402, A004
from tapegrad.tape.registry import register_adjoint  # noqa: E402
from tapegrad.tape.tape import Tape  # noqa: E402

__all__ += ["autodiff", "gradient", "jacobian", "vjp", "jvp", "hvp", "Tape", "sum", "dot", "mean", "norm", "copy",
            "reshape", "scale",
            "register_adjoint", "AdjointStackOverflow", "Const", "Active", "Duplicated",
            "DuplicatedNoNeed", "BatchDuplicated", "Forward", "ForwardWithPrimal", "Reverse",
            "ReverseWithPrimal", "make_zero", "make_zero_", "checkpoint_loop", "checkpoint",
            "capture", "debug_nans", "deterministic"]

from tapegrad import testing  # noqa: E402, F401  (tg.testing.check_grad)
